"""``longctx ask``, ``batch`` and ``chat``: questions over paths, answers on stdout."""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
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
from longctx.cli.terminal import shown
from longctx.errors import BackendError, ConfigError
from longctx.options import CorpusOptions, RequestOptions, ServerOptions
from longctx.recordtypes import record_type
from longctx.report import SavingsReport
from longctx.sessions import (
    Answer,
    Conversation,
    CorpusSessionOptions,
    RepoSession,
    Session,
    ShardedSession,
    batch_keys,
    checked_ask,
    checked_ask_many,
    stored_answers,
)
from longctx.sources import check_sources
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


def _note_skipped(session: Conversation, paths: Sequence[str], *, quiet: bool) -> None:
    """One line on stderr: how many paths the pack left out, why, and the command that lists them.

    Another when PDF pages had no text (:mod:`longctx.cli.pages`): which, and the flag that sends them.
    """
    if not isinstance(session, RepoSession):
        return
    from longctx.cli.pages import textless_pages_line

    pages = textless_pages_line(session.corpus.manifest, session.corpus_options.pdf_pages)
    if pages is not None:
        note(f"longctx: {pages}", quiet=quiet)
    by_reason = session.corpus.manifest.skipped_by_reason()
    if not by_reason:
        return
    count = sum(by_reason.values())
    reasons = ", ".join(f"{number} {reason}" for reason, number in by_reason.items())
    command = shlex.join(["longctx", "pack", *paths, "--json"])
    note(f"skipped {count} path{'s' if count != 1 else ''} ({reasons}); list them: {command}", quiet=quiet)


@record_type
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
    def opened(
        self, session_id: str | None = None, *, progress_until_open: bool = False
    ) -> Iterator[_Opened]:
        """The store, the progress line and the session (over the paths, or ``session_id``'s stored batch).

        ``progress_until_open``: the progress line ends once the session is
        open (the answer's own spinner follows); its later messages are dropped.
        """
        with runtime().open_store() as store, ExitStack() as shown:
            say = shown.enter_context(progress(not (self.quiet or self.as_json)))
            showing = [say]

            def relay(message: str) -> None:
                for target in showing:
                    target(message)

            session = self._session(store, relay, session_id)
            if progress_until_open:
                showing.clear()
                shown.close()
            yield _Opened(store, relay, session)

    def _session(self, store: Store, say: Callable[[str], None], session_id: str | None) -> Conversation:
        if session_id:
            if self.shard:
                raise ConfigError("--shard cannot be given with --session: a map-reduce batch is not resumed")
            session = _resume(session_id, self.server, store)
            _resumed(session, self.request, self.quiet, batch=True)
            return session
        if self.paths:
            options = _options(store, self.server, self.corpus, self.request, say)
            opened = _open(self.shard, self.paths, options)
            _note_skipped(opened, self.paths, quiet=self.quiet)
            return opened
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


@record_type
class _Opened:
    """A question command's store, progress line and session, open while it asks."""

    store: Store
    say: Callable[[str], None]
    session: Conversation


def note_cut(answers: Sequence[Answer], *, quiet: bool) -> None:
    """One line on stderr when an answer was cut at the token limit (``finish_reason`` ``length``)."""
    cut = [number for number, answer in enumerate(answers, start=1) if answer.finish_reason == "length"]
    if not cut:
        return
    which = (
        "the answer was"
        if len(answers) == 1
        else f"answer{'s' if len(cut) > 1 else ''} "
        + ", ".join(map(str, cut))
        + f" of {len(answers)} {'were' if len(cut) > 1 else 'was'}"
    )
    note(f"longctx: {which} cut at the token limit (finish_reason length): give a larger --max-tokens",
         quiet=quiet)  # fmt: skip


def _echo_answers(answers: Iterable[Answer], roots: Sequence[str] = ()) -> None:
    """Each answer on stdout under its question, in order (its citations after it, when asked for)."""
    for answer in answers:
        # As stored off a terminal (see print_answer); inert on one.
        click.echo(shown(f"## {answer.question}\n\n{answer.text}\n", sys.stdout), color=True)
        _echo_citations(answer, roots)


def _hyperlinks() -> bool:
    """Whether stdout shows OSC 8 hyperlinks: a terminal, and not one that says it is dumb."""
    return sys.stdout.isatty() and os.environ.get("TERM", "") != "dumb"


def _echo_citations(answer: Answer, roots: Sequence[str]) -> None:
    """The citations of an answer asked with --cite, checked: a file link on each found on this machine."""
    if answer.citations is None:
        return
    if not answer.citations:
        click.echo("[citations: the answer gave no sources]")
        return
    verified = sum(citation.verified for citation in answer.citations)
    click.echo(f"[citations: {verified} of {len(answer.citations)} verified against the pack]")
    links = _hyperlinks()
    for citation in answer.citations:
        # What the model wrote is made inert first; the only link is the one longctx made around it.
        location = shown(citation.location, sys.stdout)
        # Linked only when verified: a path the pack does not hold gets no link to click.
        url = file_link(citation.path, roots) if links and citation.verified else None
        if url is not None:
            # OSC 8: the terminal shows the location and opens the file on a click.
            location = f"\x1b]8;;{url}\x1b\\{location}\x1b]8;;\x1b\\"
        quote = f' "{shown(citation.quote, sys.stdout)}"' if citation.quote else ""
        mark = "ok" if citation.verified else f"UNVERIFIED: {shown(str(citation.reason), sys.stdout)}"
        click.echo(f"  {location}{quote}  [{mark}]", color=True)


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


def stream_option(function: Callable[..., Any]) -> Callable[..., Any]:
    """``--stream/--no-stream``: the answer printed as it streams on a terminal."""
    return click.option(
        "--stream/--no-stream",
        default=True,
        show_default=True,
        help="On a terminal, print the answer as it streams (a spinner until its first token); "
        "--no-stream prints it whole once done. Never streamed into --json, or into a pipe.",
    )(function)


def cite_option(function: Callable[..., Any]) -> Callable[..., Any]:
    """``--cite``: each answer cites where it rests, and each citation is checked against the pack.

    ``--require-citations`` (which implies ``--cite``): an answer without
    sources, or with one not verified, is a failure (exit 13) once all is printed.
    """
    function = click.option(
        "--require-citations",
        is_flag=True,
        help="As --cite, and exit 13 when an answer gives no sources or cites one not verified against "
        "the pack (after printing everything as usual): for scripts that must not pass on an unsupported "
        "answer.",
    )(function)
    return click.option(
        "--cite",
        is_flag=True,
        help="Ask the model to end each answer with its sources (path:lines and a quote); each one is "
        "checked against the pack and printed after the answer, marked when unverified.",
    )(function)


def check_citations(answers: Sequence[Answer], required: bool) -> None:
    """With ``--require-citations``: exit 13 when an answer has no sources or an unverified one."""
    if not required:
        return
    from longctx.cli.app import EXIT_UNVERIFIED_CITATIONS

    failing = [
        number
        for number, answer in enumerate(answers, start=1)
        if not answer.citations or not all(citation.verified for citation in answer.citations)
    ]
    if failing:
        which = (
            "the answer"
            if len(answers) == 1
            else "answer" + ("s " if len(failing) > 1 else " ") + ", ".join(map(str, failing))
        )
        click.echo(
            f"longctx: --require-citations: {which} gave no sources"
            " or cites one not verified against the pack",
            err=True,
        )
        sys.exit(EXIT_UNVERIFIED_CITATIONS)


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
@stream_option
@output_options
def ask(
    arguments: tuple[str, ...],
    question_option: str | None,
    shard: bool,
    cite: bool,
    require_citations: bool,
    schema: AnswerSchema | None,
    stream: bool,
    as_json: bool,
    quiet: bool,
    server: ServerOptions,
    corpus: CorpusOptions,
    request: RequestOptions,
) -> None:
    """Ask QUESTION about PATHS; the answer goes to stdout.

    On a terminal the answer is printed as it streams, a spinner on stderr
    until its first token (--no-stream: printed whole once done; --json:
    never streamed). Ctrl-C while it streams stops the request (exit 130):
    a stopped answer is not stored.

    The session is stored: continue it with `longctx chat --session ID`
    (a --shard session: in Python, `ShardedSession.resume`).
    """
    # Here, not at the top: `batch` prints no stream and holds no chat (measured in docs/benchmarks.md,
    # `cli-inprocess`: each new process pays for what its command's module imports).
    from longctx.cli.chat import say_stored
    from longctx.cli.streaming import Printing, print_answer

    paths, question = _split_question(arguments, question_option)
    cite = cite or require_citations
    # Refused here, as the library refuses them at the call: before the store, the pack or the server.
    checked_ask(request, question, {"cite": cite, "schema": schema})
    given = _Questions(paths, shard, as_json, quiet, server, corpus, request)
    # A cited answer streams as its schema's JSON (the answer, then its sources): printed whole, once read
    # as text.
    printing = Printing.for_terminal(stream=stream and not cite, as_json=as_json, quiet=quiet)
    with given.opened(progress_until_open=True) as opened, opened.session as session:
        try:
            # Printed before the report, which waits for the server's counters to settle.
            answer = print_answer(session, question, printing, cite=cite, schema=schema).answer
        except KeyboardInterrupt:
            say_stored(session)
            raise
        if not as_json:
            _echo_citations(answer, session.source_roots())
        note_cut([answer], quiet=quiet)
        report = session.report()
    given.finish(session, report, answer.to_dict())
    check_citations([answer], require_citations)


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
    require_citations: bool,
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
    cite = cite or require_citations
    questions = [line.strip() for line in questions_file if line.strip()]
    if not questions:
        raise ConfigError("the questions file holds no questions")
    checked_ask_many(request, questions, {"cite": cite, "schema": schema})
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
    note_cut(list(result), quiet=quiet)
    reused = f"{result.reused} of {len(questions)} answers from an earlier run, not asked again"
    answers = {"answers": [answer.to_dict() for answer in result]}
    given.finish(session, result.report, answers, reused=reused if result.reused else None)
    check_citations(list(result), require_citations)


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
        # --cite, --schema and --stream are how this run asks and prints, not what the stored session is.
        if (
            name
            in (
                "paths",
                "session_id",
                "as_json",
                "quiet",
                "questions_file",
                "cite",
                "require_citations",
                "schema",
                "stream",
            )
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
@stream_option
@output_options
def chat(
    paths: tuple[str, ...],
    session_id: str | None,
    stream: bool,
    as_json: bool,
    quiet: bool,
    server: ServerOptions,
    corpus: CorpusOptions,
    request: RequestOptions,
) -> None:
    """Chat about PATHS: one question per line on stdin, answers on stdout.

    On a terminal the answer is printed as it streams, a spinner on stderr
    until its first token (--no-stream: printed whole); from a script each
    answer is one block on stdout (--json: one JSON line a turn). Turns are
    numbered from 1, as in the report.

    A line that starts with / is a chat command, never sent to the model:
    /help, /history (the turns so far), /tokens (tokens so far, cached and
    not), /report (the savings report so far), /quit or /exit (as do Ctrl-D
    and an empty line). An unknown /command is an error; start a question
    with // to send one that begins with / (the first / is dropped).

    Every completed turn is stored at once; resume with --session ID, which
    shows each earlier turn first as one line (/history: in full). On a
    terminal, Ctrl-C while a turn runs stops it and returns to the prompt:
    the stopped answer is not stored, and the question stays in the input
    history (the Up arrow offers it). A second Ctrl-C in a row, Ctrl-D or an
    empty line ends the chat (exit 0) and prints the id to resume. From a
    script, Ctrl-C ends the chat (exit 130). A question not answered (a
    failure that ends the chat) is printed as kept, and on a terminal stays
    in the chat's input history (chat_history beside the store): the Up
    arrow in the next chat offers it.
    A server that goes away is said so once and the same question is asked
    again, waiting longer each time (one status line on a terminal), until
    it is back (the session goes on) or Ctrl-C.

    Files changed between turns are appended to the next question
    (--no-follow-changes turns that off). The pack (and history) is
    prefilled in the background while the first question is typed
    (--no-warm-start turns that off). --token-history sends earlier answers
    as the token ids the model generated, so each turn reads the previous
    answer from the cache. With --session, --max-tokens, --follow-changes,
    --warm-start and --token-history apply to the resumed session, server
    options say where it is served, and PATHS, the pack options and another
    --cache-salt are refused.
    """
    from longctx.cli.chat import ChatOutput, converse  # only the chat's (see `ask`)

    with runtime().open_store() as store:
        if session_id:
            session: Session = _resume(session_id, server, store)
            _resumed(session, request, quiet)
        elif paths:
            with progress(not (quiet or as_json)) as say:
                session = _open_repo(paths, _options(store, server, corpus, request, say))
            _note_skipped(session, paths, quiet=quiet)
        else:
            raise ConfigError("give PATHS to pack, or --session ID to resume")
        with session:
            converse(session, ChatOutput(as_json=as_json, quiet=quiet, stream=stream))
