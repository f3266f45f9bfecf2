"""``longctx ask``, ``batch`` and ``chat``: questions over paths, answers on stdout."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

import click

from longctx.citations import file_link
from longctx.cli.app import (
    corpus_options,
    emit_json,
    main,
    note,
    output_options,
    progress,
    request_options,
    runtime,
    schema_options,
    server_options,
)
from longctx.cli.flags import flags_of
from longctx.config import CorpusOptions, RequestOptions, ServerOptions
from longctx.corpus import check_sources
from longctx.errors import BackendError, ConfigError, ServerUnreachable
from longctx.report import SavingsReport
from longctx.sessions import RepoSession, Session, ShardedSession
from longctx.sessions.answers import Answer, stored_answers
from longctx.sessions.corpus import CorpusSessionOptions
from longctx.sessions.reuse import answer_reuse
from longctx.sessions.session import Conversation
from longctx.sessions.siblings import batch_keys
from longctx.store import Store

if TYPE_CHECKING:
    from longctx.schemas import AnswerSchema


def _options(
    store: Store,
    server: ServerOptions,
    corpus: CorpusOptions,
    request: RequestOptions,
    say: Callable[[str], None],
) -> CorpusSessionOptions:
    return CorpusSessionOptions(
        backend=runtime().backend, server=server, store=store, corpus=corpus, request=request, on_progress=say
    )


def _open_repo(paths: Sequence[str], options: CorpusSessionOptions) -> RepoSession:
    """A session over ``paths`` whose pack is ready (so the progress line covers the packing)."""
    check_sources(paths)  # a missing or empty path fails here, before the backend is opened
    session = RepoSession(list(paths), **options)
    session.full_pack  # noqa: B018 - prepared here, under the progress line
    return session


def _open(shard: bool, paths: Sequence[str], options: CorpusSessionOptions) -> Conversation:
    """:func:`_open_repo`, or with ``shard`` a map-reduce session over shards that each fit the window."""
    if not shard:
        return _open_repo(paths, options)
    check_sources(paths)
    session = ShardedSession(list(paths), **options)
    count = len(session.shards)
    say = options.get("on_progress") or (lambda message: None)
    say(f"{count} shard{'s' if count != 1 else ''}: each question is asked of every shard, then combined")
    return session


@dataclass(frozen=True)
class _Questions:
    """What ``ask`` and ``batch`` were given besides their questions: the session to open, how to speak."""

    paths: tuple[str, ...]
    shard: bool
    as_json: bool
    quiet: bool
    server: ServerOptions
    corpus: CorpusOptions
    request: RequestOptions

    @contextmanager
    def opened(self, session_id: str | None = None) -> Iterator[_Opened]:
        """The store, the progress line and the session (over the paths, or ``session_id``'s stored batch)."""
        with runtime().open_store() as store, progress(not (self.quiet or self.as_json)) as say:
            yield _Opened(store, say, self._session(store, say, session_id))

    def _session(self, store: Store, say: Callable[[str], None], session_id: str | None) -> Conversation:
        if session_id:
            if self.shard:
                raise ConfigError("--shard cannot be given with --session: a map-reduce batch is not resumed")
            session = _resume(session_id, self.server, store)
            _resumed(session, self.request, self.quiet, batch=True)
            return session
        if self.paths:
            return _open(self.shard, self.paths, _options(store, self.server, self.corpus, self.request, say))
        raise ConfigError("give PATHS to pack, or --session ID to finish a stored batch")

    def finish(
        self,
        session: Conversation,
        report: SavingsReport,
        result: dict[str, Any],
        *,
        reused: str | None = None,
    ) -> None:
        """The closing lines: with --json ``result`` with the session id and report; the summary on stderr.

        ``reused`` (how many of a batch's answers an earlier run gave) is said before the summary.
        """
        if self.as_json:
            emit_json({**result, "session_id": session.id, "report": report.to_dict()})
        if reused is not None:
            note(reused, quiet=self.quiet)
        note(f"{_label(session)}: {report.summary_line()}", quiet=self.quiet)


@dataclass(frozen=True)
class _Opened:
    """A question command's store, progress line and session, open while it asks."""

    store: Store
    say: Callable[[str], None]
    session: Conversation


def _echo_answers(answers: Iterable[Answer], roots: Sequence[str] = ()) -> None:
    """Each answer on stdout under its question, in order (its citations after it, when asked for)."""
    for answer in answers:
        click.echo(f"## {answer.question}\n\n{answer.text}\n")
        _echo_citations(answer, roots)


def _hyperlinks() -> bool:
    """Whether stdout shows OSC 8 hyperlinks: a terminal, and not one that says it is dumb."""
    return sys.stdout.isatty() and os.environ.get("TERM", "") != "dumb"


def _echo_citations(answer: Answer, roots: Sequence[str]) -> None:
    """The citations of an answer asked with --cite, checked: a file link on each found on this machine."""
    if answer.citations is None:
        return
    verified = sum(citation.verified for citation in answer.citations)
    click.echo(f"[citations: {verified} of {len(answer.citations)} verified against the pack]")
    links = _hyperlinks()
    for citation in answer.citations:
        location = citation.location
        url = file_link(citation.path, roots) if links else None
        if url is not None:
            # OSC 8: the terminal shows the location and opens the file on a click.
            location = f"\x1b]8;;{url}\x1b\\{location}\x1b]8;;\x1b\\"
        quote = f' "{citation.quote}"' if citation.quote else ""
        mark = "ok" if citation.verified else f"UNVERIFIED: {citation.reason}"
        click.echo(f"  {location}{quote}  [{mark}]")


def _label(session: Conversation) -> str:
    if isinstance(session, ShardedSession):
        return f"session {session.id} (map-reduce over {len(session.shards)} shards)"
    return f"session {session.id}"


def shard_option(function: Callable[..., Any]) -> Callable[..., Any]:
    """``--shard``: map-reduce over shards that each fit the window."""
    return click.option(
        "--shard",
        is_flag=True,
        help="Split PATHS into shards that each fit the server's window, ask every shard, "
        "and combine their answers (map-reduce): for a pack over the budget.",
    )(function)


def cite_option(function: Callable[..., Any]) -> Callable[..., Any]:
    """``--cite``: each answer cites where it rests, and each citation is checked against the pack."""
    return click.option(
        "--cite",
        is_flag=True,
        help="Ask the model to end each answer with its sources (path:lines and a quote); each one is "
        "checked against the pack and printed after the answer, marked when unverified.",
    )(function)


def _split_question(arguments: tuple[str, ...], question: str | None) -> tuple[tuple[str, ...], str]:
    """PATHS and QUESTION from ``ask``'s arguments: the last one is the question, unless --question is given.

    A forgotten question, or a last argument that is an existing path (``ask
    repoA repoB``), is refused with what to type instead.
    """
    if question is not None:
        if not arguments:
            raise ConfigError("give PATHS to ask about: longctx ask PATHS... --question TEXT")
        return arguments, question
    if not arguments:
        raise ConfigError('give PATHS and a QUESTION: longctx ask PATHS... "QUESTION"')
    *paths, last = arguments
    if os.path.exists(last):
        hint = "a path" if paths else "the only argument"
        raise ConfigError(
            f"the question is missing: {last!r} ({hint}) is an existing path. Put the question last, "
            f'in quotes: longctx ask {" ".join(arguments)} "QUESTION" (or give it with --question)'
        )
    if not paths:
        raise ConfigError(f'give PATHS before the question: longctx ask PATHS... "{last}"')
    return tuple(paths), last


@main.command()
@click.argument("arguments", nargs=-1, metavar="PATHS... QUESTION")
@click.option(
    "--question",
    "question_option",
    help="The question, when it must not be taken for a path (then PATHS only).",
)
@corpus_options
@server_options
@request_options()
@shard_option
@cite_option
@schema_options
@output_options
def ask(
    arguments: tuple[str, ...],
    question_option: str | None,
    shard: bool,
    cite: bool,
    schema: AnswerSchema | None,
    as_json: bool,
    quiet: bool,
    server: ServerOptions,
    corpus: CorpusOptions,
    request: RequestOptions,
) -> None:
    """Ask QUESTION about PATHS; the answer goes to stdout.

    The session is stored: continue it with `longctx chat --session ID`
    (a --shard session: in Python, `ShardedSession.resume`).
    """
    paths, question = _split_question(arguments, question_option)
    given = _Questions(paths, shard, as_json, quiet, server, corpus, request)
    with given.opened() as opened:
        opened.say("waiting for the answer")
        with opened.session as session:
            answer = session.ask(question, cite=cite, schema=schema)
            if not as_json:
                # Printed before the report, which waits for the server's counters to settle.
                click.echo(answer.text)
                _echo_citations(answer, session.source_roots())
            report = session.report()
    given.finish(session, report, answer.to_dict())


@main.command()
@click.argument("paths", nargs=-1, type=click.Path())
@click.option(
    "--questions",
    "questions_file",
    required=True,
    type=click.File("r"),
    help="A file with one question per line ('-' for stdin).",
)
@click.option(
    "--session",
    "session_id",
    help="Finish this stored batch: ask only its questions that have no stored answer (instead of PATHS).",
)
@corpus_options
@server_options
@request_options(concurrency=True)
@shard_option
@cite_option
@schema_options
@output_options
def batch(
    paths: tuple[str, ...],
    questions_file: IO[str],
    session_id: str | None,
    shard: bool,
    cite: bool,
    schema: AnswerSchema | None,
    as_json: bool,
    quiet: bool,
    server: ServerOptions,
    corpus: CorpusOptions,
    request: RequestOptions,
) -> None:
    """Ask every question of a file about PATHS, as siblings sharing one cached prefix.

    Answers go to stdout in question order, each under its question. Each
    answer is stored as it arrives: a batch stopped by Ctrl-C or by a server
    that went away prints the answers stored and its session id; finish it
    with --session ID and the same questions (only those without an answer
    are asked; --max-tokens and --concurrency apply, the pack is kept).
    """
    questions = [line.strip() for line in questions_file if line.strip()]
    if not questions:
        raise ConfigError("the questions file holds no questions")
    given = _Questions(paths, shard, as_json, quiet, server, corpus, request)
    with given.opened(session_id) as opened:
        session, say = opened.session, opened.say
        done: list[Answer] = []

        def answered(answer: Answer) -> None:
            done.append(answer)
            say(f"answered {len(done)} of {len(questions)} questions")

        say(f"asking {len(questions)} questions")
        # Stored under keys of their text, so that --session finds them (a map-reduce batch has none).
        reuse = not isinstance(session, ShardedSession)
        with session:
            try:
                result = session.ask_many(
                    questions, on_answer=answered, reuse_answered=reuse, cite=cite, schema=schema
                )
            except (KeyboardInterrupt, BackendError) as error:
                # Closing the connection ends the requests in flight; the
                # answers printed are those already stored.
                session.close()
                _print_stopped(
                    session, opened.store, questions, done, questions_file.name, as_json=as_json, error=error
                )
                raise
    if not as_json:
        _echo_answers(result, session.source_roots())
    reused = f"{result.reused} of {len(questions)} answers from an earlier run, not asked again"
    answers = {"answers": [answer.to_dict() for answer in result]}
    given.finish(session, result.report, answers, reused=reused if result.reused else None)


def _print_stopped(
    session: Conversation,
    store: Store,
    questions: Sequence[str],
    done: list[Answer],
    questions_name: str,
    *,
    as_json: bool,
    error: BaseException,
) -> None:
    """The answers a stopped batch stored (earlier runs' too), and how to ask the rest."""
    # Those heard of in this run (every one stored), and those stored under the batch's keys by earlier runs.
    stored = {questions.index(answer.question): answer for answer in done}
    if not isinstance(session, ShardedSession):
        stored.update(stored_answers(store, questions, batch_keys(session.id, questions)))
    answers = [stored[index] for index in sorted(stored)]
    if as_json:
        reason = {"interrupted": True} if isinstance(error, KeyboardInterrupt) else {"error": str(error)}
        emit_json({"session_id": session.id, "answers": [a.to_dict() for a in answers], **reason})
    else:
        _echo_answers(answers)
    if not answers:
        click.echo("longctx: no answer was stored, so there is nothing to resume: run it again", err=True)
        return
    where = f"{len(answers)} of {len(questions)} questions answered and stored in session {session.id}"
    if isinstance(session, ShardedSession) or len(answers) == len(questions):
        click.echo(f"longctx: {where}", err=True)
        return
    name = questions_name if questions_name not in ("-", "<stdin>") else "FILE"
    click.echo(
        f"longctx: {where}; ask the rest with: longctx batch --session {session.id} --questions {name}",
        err=True,
    )


def _resume(session_id: str, server: ServerOptions, store: Store) -> Session:
    """The stored session ``session_id``, served where it was unless server options say elsewhere."""
    backend = runtime().backend
    if backend is None and server.names_a_server():
        backend = runtime().connect(server)
    return Session.resume(session_id, backend, store=store)


# The request flags `chat` takes beyond those every command has.
GROUPS = ("follow_changes", "warm_start", "token_history")

# Options of `chat` that a resumed session applies (their fields say on_resume): the
# rest describe a pack, which a stored session keeps (its changed files are appended
# instead). The server options say where it is served. A batch finished with
# --session also takes its own flags: how many questions go out at once, and how.
_APPLIED_ON_RESUME = {flag.parameter for flag in flags_of(RequestOptions, GROUPS) if flag.spec.on_resume}
_BATCH_ON_RESUME = {flag.parameter for flag in flags_of(RequestOptions, ("concurrency",))} - {
    flag.parameter for flag in flags_of(RequestOptions)
}
_SERVER_ON_RESUME = {field.name for field in dataclasses.fields(ServerOptions)}


def _resumed(session: Session, request: RequestOptions, quiet: bool, *, batch: bool = False) -> None:
    """Apply or refuse, one by one, the options given with ``--session`` (of ``chat``, or ``batch``)."""
    context = click.get_current_context()
    given = {
        parameter.name: parameter
        for parameter in context.command.params
        if parameter.name
        and context.get_parameter_source(parameter.name)
        in (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    }
    if given.get("paths") is not None and context.params.get("paths"):
        raise ConfigError(
            "PATHS cannot be given with --session: a resumed session keeps its pack "
            "(files changed since are appended to the next question)"
        )
    stored = session.request
    accepted = _APPLIED_ON_RESUME | (_BATCH_ON_RESUME if batch else set())
    for name, parameter in given.items():
        flag = "/".join(getattr(parameter, "opts", []) or [name])
        # --cite and --schema are how this run asks, not what the stored session is.
        if (
            name in ("paths", "session_id", "as_json", "quiet", "questions_file", "cite", "schema")
            or name in _SERVER_ON_RESUME
        ):
            continue
        if name == "cache_salt":
            if request.cache_salt != stored.cache_salt:
                raise ConfigError(
                    "--cache-salt cannot change on resume: the session's cached prefix lives under "
                    "its own salt; start a new session for another one"
                )
            continue
        if name not in accepted:
            raise ConfigError(f"{flag} cannot be given with --session: it describes the pack, which is kept")
        note(f"applying {flag} {context.params[name]} to the resumed session", quiet=quiet)
    applied = {name: getattr(request, name) for name in accepted if name in given}
    # A chat warms its prefix unless told not to, whatever the stored session did; a batch never.
    applied["warm_start"] = request.warm_start and not batch
    session.request = dataclasses.replace(stored, **applied)
    if not session.request.follow_changes:
        session.stop_following()


@main.command()
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--session", "session_id", help="Resume this stored session instead of packing PATHS.")
@corpus_options
@server_options
@request_options(**dict.fromkeys(GROUPS, True))
@output_options
def chat(
    paths: tuple[str, ...],
    session_id: str | None,
    as_json: bool,
    quiet: bool,
    server: ServerOptions,
    corpus: CorpusOptions,
    request: RequestOptions,
) -> None:
    """Chat about PATHS: one question per line on stdin, answers on stdout.

    Every completed turn is stored at once; resume with --session ID after
    an interruption. A server that goes away is said so and tried again,
    waiting longer each time, until it is back (the session goes on) or
    Ctrl-C (which prints the id to resume). End with an empty line or end
    of input. Files changed
    between turns are appended to the next question (--no-follow-changes
    turns that off). The pack (and history) is prefilled in the background
    while the first question is typed (--no-warm-start turns that off).
    --token-history sends earlier answers as the token ids the model
    generated, so each turn reads the previous answer from the cache. With
    --session, --max-tokens, --follow-changes, --warm-start and
    --token-history apply to the resumed session, server options say where it is served,
    and PATHS, the pack options and another --cache-salt are refused.
    """
    with runtime().open_store() as store:
        if session_id:
            session: Session = _resume(session_id, server, store)
            _resumed(session, request, quiet)
        elif paths:
            with progress(not (quiet or as_json)) as say:
                session = _open_repo(paths, _options(store, server, corpus, request, say))
        else:
            raise ConfigError("give PATHS to pack, or --session ID to resume")
        with session:
            _converse(session, as_json=as_json, quiet=quiet)


def _converse(session: Session, *, as_json: bool, quiet: bool) -> None:
    try:
        _turns(session, as_json=as_json, quiet=quiet)
    except KeyboardInterrupt:
        if session.turns:
            resume = f"resume with: longctx chat --session {session.id}"
            click.echo(
                f"longctx: session {session.id} has {len(session.turns)} turns stored; {resume}", err=True
            )
        else:
            click.echo("longctx: no turn was answered, so no session was stored", err=True)
        raise


# The waits between tries of a question whose server went away: doubling from the first, capped.
_OUTAGE_FIRST_WAIT = 2.0
_OUTAGE_MAX_WAIT = 30.0


def _wait(seconds: float) -> None:
    """The pause between tries of a chat turn whose server went away (a test replaces it)."""
    time.sleep(seconds)


def _ask_through_outages(session: Session, question: str) -> Answer:
    """Ask ``question``; while the server cannot be reached, say so and try again, waiting longer each time.

    Each try is a whole turn with its own retries; a failed one stores
    nothing, so the turn that succeeds is the only one. Ctrl-C stops the
    waiting (see :func:`_converse`); the session keeps its stored turns.
    """
    wait = _OUTAGE_FIRST_WAIT
    while True:
        try:
            return session.ask(question)
        except ServerUnreachable as error:
            kept = f"session {session.id} is kept" if session.turns else "nothing is lost"
            click.echo(
                f"longctx: the server went away ({str(error).splitlines()[0]}); {kept}. Trying again in "
                f"{wait:.0f} s until it is back; Ctrl-C to quit"
                + (f" (resume with: longctx chat --session {session.id})" if session.turns else ""),
                err=True,
            )
            _wait(wait)
            wait = min(wait * 2, _OUTAGE_MAX_WAIT)


def _turns(session: Session, *, as_json: bool, quiet: bool) -> None:
    note(f"session {session.id} ({len(session.turns)} earlier turns); empty line to end", quiet=quiet)
    interactive = sys.stdin.isatty()
    warm_noted = False
    previous: Answer | None = None
    while True:
        if interactive:
            click.echo("> ", err=True, nl=False)
        question = sys.stdin.readline().strip()
        if not question:
            break
        answer = _ask_through_outages(session, question)
        warm_noted = warm_noted or _note_warm_start(session, quiet=quiet)
        if as_json:
            click.echo(json.dumps(answer.to_dict(), sort_keys=True))
        else:
            click.echo(answer.text)
        appended = f"; {answer.appended.summary_line()}" if answer.appended is not None else ""
        reuse = answer_reuse(previous.usage, answer.usage) if previous is not None else None
        reused = f"; {reuse.summary_line()}" if reuse is not None and reuse.answer_tokens else ""
        note(f"[turn {answer.turn}: {answer.usage.summary_line()}{reused}{appended}]", quiet=quiet)
        previous = answer
    if session.warming is not None:
        # Its line is said before the session ends; with no turn, its request is never stored.
        session.warming.wait()
        if not warm_noted:
            _note_warm_start(session, quiet=quiet)
    if not session.turns and not session.branch_ids():
        # Nothing was asked: a new session was never stored (sessions/recording.py);
        # a resumed one that is empty (stored by an older longctx) goes too.
        if session.id in {record.id for record in session.store.sessions.sessions()}:
            session.store.sessions.delete_session(session.id)
        note("no question asked: the session is not kept", quiet=quiet)
        return
    note(f"session {session.id}: {session.report().summary_line()}", quiet=quiet)


def _note_warm_start(session: Session, *, quiet: bool) -> bool:
    """Say what the warm start did, if it is done; True once said."""
    warming = session.warming
    result = warming.result if warming is not None else None
    if result is None:
        return False
    note(f"[{result.summary_line()}]", quiet=quiet)
    return True
