"""``longctx ask``, ``batch`` and ``chat``: questions over paths, answers on stdout."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import IO

import click

from longctx.cli.app import (
    corpus_options,
    emit_json,
    main,
    note,
    output_options,
    progress,
    request_options,
    runtime,
    server_options,
)
from longctx.config import CorpusOptions, RequestOptions, ServerOptions
from longctx.errors import ConfigError
from longctx.sessions import RepoSession, Session
from longctx.sessions.session import Answer
from longctx.store import Store


def _open_session(
    paths: Sequence[str],
    store: Store,
    *,
    server: ServerOptions,
    corpus: CorpusOptions,
    request: RequestOptions,
    say: Callable[[str], None],
) -> RepoSession:
    """A session over ``paths`` whose pack is ready (so the progress line covers the packing)."""
    session = RepoSession(
        list(paths),
        backend=runtime().backend,
        server=server,
        store=store,
        corpus=corpus,
        request=request,
        on_progress=say,
    )
    session.full_pack  # noqa: B018 - prepared here, under the progress line
    return session


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.argument("question")
@corpus_options
@server_options
@request_options()
@output_options
def ask(
    paths: tuple[str, ...],
    question: str,
    as_json: bool,
    quiet: bool,
    server: ServerOptions,
    corpus: CorpusOptions,
    request: RequestOptions,
) -> None:
    """Ask QUESTION about PATHS; the answer goes to stdout.

    The session is stored: continue it with `longctx chat --session ID`.
    """
    with runtime().open_store() as store, progress(not (quiet or as_json)) as say:
        session = _open_session(paths, store, server=server, corpus=corpus, request=request, say=say)
        say("waiting for the answer")
        with session:
            answer = session.ask(question)
            report = session.report()
    if as_json:
        emit_json({**answer.to_dict(), "report": report.to_dict()})
    else:
        click.echo(answer.text)
    note(f"session {session.id}: {report.summary_line()}", quiet=quiet)


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option(
    "--questions",
    "questions_file",
    required=True,
    type=click.File("r"),
    help="A file with one question per line ('-' for stdin).",
)
@corpus_options
@server_options
@request_options(concurrency=True)
@output_options
def batch(
    paths: tuple[str, ...],
    questions_file: IO[str],
    as_json: bool,
    quiet: bool,
    server: ServerOptions,
    corpus: CorpusOptions,
    request: RequestOptions,
) -> None:
    """Ask every question of a file about PATHS, as siblings sharing one cached prefix.

    Answers go to stdout in question order, each under its question.
    """
    questions = [line.strip() for line in questions_file if line.strip()]
    if not questions:
        raise ConfigError("the questions file holds no questions")
    with runtime().open_store() as store, progress(not (quiet or as_json)) as say:
        session = _open_session(paths, store, server=server, corpus=corpus, request=request, say=say)
        done = 0

        def answered(_: Answer) -> None:
            nonlocal done
            done += 1
            say(f"answered {done} of {len(questions)} questions")

        say(f"asking {len(questions)} questions")
        with session:
            result = session.ask_many(questions, on_answer=answered)
    if as_json:
        emit_json(
            {
                "session_id": session.id,
                "answers": [answer.to_dict() for answer in result],
                "report": result.report.to_dict(),
            }
        )
    else:
        for answer in result:
            click.echo(f"## {answer.question}\n\n{answer.text}\n")
    note(f"session {session.id}: {result.report.summary_line()}", quiet=quiet)


@main.command()
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--session", "session_id", help="Resume this stored session instead of packing PATHS.")
@corpus_options
@server_options
@request_options()
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
    an interruption. End with an empty line or end of input.
    """
    with runtime().open_store() as store:
        if session_id:
            backend = runtime().backend
            if backend is None and server.base_url:
                backend = runtime().connect(server)
            session: Session = Session.resume(session_id, backend, store=store)
        elif paths:
            with progress(not (quiet or as_json)) as say:
                session = _open_session(paths, store, server=server, corpus=corpus, request=request, say=say)
        else:
            raise ConfigError("give PATHS to pack, or --session ID to resume")
        with session:
            _converse(session, as_json=as_json, quiet=quiet)


def _converse(session: Session, *, as_json: bool, quiet: bool) -> None:
    note(f"session {session.id} ({len(session.turns)} earlier turns); empty line to end", quiet=quiet)
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            click.echo("> ", err=True, nl=False)
        question = sys.stdin.readline().strip()
        if not question:
            break
        answer = session.ask(question)
        if as_json:
            click.echo(json.dumps(answer.to_dict(), sort_keys=True))
        else:
            click.echo(answer.text)
        note(f"[turn {answer.turn}: {answer.usage.summary_line()}]", quiet=quiet)
    note(f"session {session.id}: {session.report().summary_line()}", quiet=quiet)
