"""An answer on the terminal: a spinner on stderr until its first piece, then the text as it streams.

``longctx ask`` and ``longctx chat`` print through :func:`print_answer`. On a
terminal (stdout a tty, no ``--json``, no ``--no-stream``) the pieces are
written to stdout as the server sends them; elsewhere the answer is printed
whole once it is complete, so a script reads exactly the stored text plus a
newline. On a terminal what the model wrote is shown inert (its control
characters and escape sequences visible, never acted on:
:mod:`longctx.cli.terminal`). The spinner is drawn only when stderr is a terminal.

A Ctrl-C while the answer streams closes the stream (which ends the
request and stores no turn: see :mod:`longctx.sessions.streams`), ends the
line, says the answer is not stored, and is raised on: the command says
what the session holds.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from longctx.cli.terminal import shown
from longctx.recordtypes import record_type

if TYPE_CHECKING:
    from longctx.sessions import Answer, Conversation


@record_type
class Printing:
    """How an answer is shown.

    ``stream``: pieces printed as they arrive (else the whole text at the end);
    ``spinner``: a spinner on stderr until the first piece; ``echo``: print the
    text at all (off with ``--json``, whose caller prints the JSON).
    """

    stream: bool
    spinner: bool
    echo: bool = True

    @classmethod
    def for_terminal(cls, *, stream: bool, as_json: bool, quiet: bool) -> Printing:
        """Streamed when asked and stdout is a terminal (never into JSON); a spinner when stderr is one.

        ``--quiet`` and ``--json`` show no spinner, as they show no progress.
        """
        return cls(
            stream=stream and not as_json and sys.stdout.isatty(),
            spinner=not (quiet or as_json) and sys.stderr.isatty(),
            echo=not as_json,
        )


@record_type
class PrintedAnswer:
    """What :func:`print_answer` did: the stored answer, and whether its text went out piece by piece."""

    answer: Answer
    streamed: bool


class Spinner:
    """A transient status line on stderr (rich's spinner); nothing when not enabled."""

    def __init__(self, enabled: bool, message: str) -> None:
        self._status: Any = None
        if enabled:
            from rich.console import Console  # rich is only needed once there is something to show

            self._status = Console(stderr=True, highlight=False).status(message)

    def start(self) -> Spinner:
        if self._status is not None:
            self._status.start()
        return self

    def update(self, message: str) -> None:
        if self._status is not None:
            self._status.update(message)

    def stop(self) -> None:
        """Remove the line (again: a no-op)."""
        if self._status is not None:
            self._status.stop()
            self._status = None


@contextmanager
def spinning(enabled: bool, message: str) -> Iterator[Spinner]:
    """A :class:`Spinner` shown for the block, removed however it ends."""
    spinner = Spinner(enabled, message).start()
    try:
        yield spinner
    finally:
        spinner.stop()


def print_answer(session: Conversation, question: str, printing: Printing, **options: Any) -> PrintedAnswer:
    """Ask ``question`` of ``session`` and show the answer as ``printing`` says; the stored answer.

    ``options`` are the ask's own (``max_tokens``, ``cite``). A Ctrl-C or
    an error closes the stream (the request ends) and is raised on, after
    the line the answer was on is ended.
    """
    if not printing.stream:
        with spinning(printing.spinner, "waiting for the answer"):
            answer = session.ask(question, **options)
        if printing.echo:
            # color=True: click strips what looks like an ANSI sequence from output that is no terminal,
            # and an answer is printed as it is stored, byte for byte, as the streamed path writes it.
            click.echo(shown(answer.text, sys.stdout), color=True)
        return PrintedAnswer(answer, streamed=False)
    stream = session.stream(question, **options)  # refuses its arguments here, before the spinner starts
    spinner = Spinner(printing.spinner, "waiting for the first token").start()
    written = False
    try:
        for piece in stream:
            if piece:
                spinner.stop()
                sys.stdout.write(shown(piece, sys.stdout))  # inert on a terminal, piece by piece
                sys.stdout.flush()
                written = True
    except BaseException as error:
        spinner.stop()
        stream.close()
        if written:  # the cut answer's line is ended before what the command says next
            click.echo()
        if isinstance(error, KeyboardInterrupt):
            # What a stopped stream keeps: nothing (longctx.sessions.streams), so the history is whole.
            click.echo("longctx: the answer was stopped before its end and is not stored", err=True)
        raise
    spinner.stop()
    click.echo()
    return PrintedAnswer(stream.answer, streamed=True)
