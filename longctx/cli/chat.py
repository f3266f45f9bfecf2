"""``longctx chat``'s conversation: the prompt, its commands, streamed answers, a server that goes away.

A line is a question for the model, unless it starts with ``/``: then it is
a chat command (:data:`COMMANDS`), answered here and never sent. ``//``
sends a question that starts with ``/`` (``//etc/hosts?`` asks
``/etc/hosts?``); an unknown command is an error line. An empty line, end of
input (Ctrl-D), ``/quit`` or ``/exit`` end the chat.

Turns are numbered from 1, as the savings report numbers them. A resumed
session (``--session``) shows its earlier turns first, one line each (the
question and the start of its answer); ``/history`` prints them in full.

Ctrl-C while a turn runs (its answer streaming, or a server away) stops
it and returns to the prompt: the stopped answer is not stored, and the
question stays in the input history, so the Up arrow offers it again. A
Ctrl-C at the prompt says how to end; a second one in a row (or Ctrl-D, or
an empty line) ends the chat as ``/quit`` does. From a script (stdin no
terminal) a Ctrl-C ends the chat (exit 130).

A question that is not answered (Ctrl-C, or an error that ends the chat) is
not lost: the closing line repeats it, and on a terminal it stays in the
chat's input history (``chat_history`` beside the store, read by the next
chat), so the Up arrow offers it again. A server that goes away is said so
in one line; the tries that follow update one status line (on a terminal)
instead of repeating it, and the same question is asked again when the
server is back.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

from longctx.cli.app import note
from longctx.cli.streaming import Printing, print_answer, spinning
from longctx.cli.terminal import shown
from longctx.errors import ServerUnreachable
from longctx.recordtypes import record_type
from longctx.sessions import Answer, Conversation, Session, answer_reuse
from longctx.store import TurnRecord
from longctx.store.permissions import create_private_file

#: The chat commands and what each does (``/help`` prints this table).
COMMANDS: dict[str, str] = {
    "/help": "this list",
    "/history": "the turns so far, in full (numbered as the report numbers them)",
    "/tokens": "the session's tokens so far: prompt, cached, completion",
    "/report": "the savings report so far",
    "/quit": "end the chat (also /exit, Ctrl-D, an empty line or Ctrl-C twice at the prompt)",
    "/exit": "end the chat",
}

#: The chat's input history, kept beside the store's database.
HISTORY_FILE = "chat_history"
_HISTORY_LENGTH = 1000

# The waits between tries of a question whose server went away: doubling from the first, capped.
_OUTAGE_FIRST_WAIT = 2.0
_OUTAGE_MAX_WAIT = 30.0


@record_type
class ChatOutput:
    """How the chat speaks: ``--json`` answers, ``--quiet``, streaming on a terminal (``--no-stream``)."""

    as_json: bool = False
    quiet: bool = False
    stream: bool = True


def _wait(seconds: float) -> None:
    """The pause between tries of a chat turn whose server went away (a test replaces it)."""
    time.sleep(seconds)


class _Input:
    """Where questions come from: the terminal (line editing, a kept history) or lines of stdin."""

    def __init__(self, history: Path | None) -> None:
        self.interactive = sys.stdin.isatty()
        self._readline = None
        self._history = history
        if self.interactive and sys.stdout.isatty():
            try:
                import readline  # only a terminal needs line editing
            except ImportError:  # a Python built without it: plain lines
                readline = None  # type: ignore[assignment]
            self._readline = readline
        if self._readline is not None and history is not None and history.exists():
            with contextlib.suppress(OSError):  # an unreadable history is no reason not to chat
                self._readline.read_history_file(history)

    def read(self) -> str | None:
        """The next line, stripped; None at the end of input (Ctrl-D); a Ctrl-C is raised on."""
        if self._readline is not None:
            try:
                return input("> ").strip()
            except EOFError:
                click.echo(err=True)
                return None
        if self.interactive:
            click.echo("> ", err=True, nl=False)
        line = sys.stdin.readline()
        return line.strip() if line else None

    def keep(self, question: str) -> None:
        """Put ``question`` (not answered) last in the input history, so the Up arrow offers it."""
        if self._readline is not None:
            length = self._readline.get_current_history_length()
            if not length or self._readline.get_history_item(length) != question:
                self._readline.add_history(question)

    def save(self) -> None:
        """Write the input history for the next chat (a private file; a failure is only said)."""
        if self._readline is None or self._history is None:
            return
        try:
            create_private_file(self._history)
            self._readline.set_history_length(_HISTORY_LENGTH)
            self._readline.write_history_file(self._history)
        except OSError as error:
            note(f"longctx: the chat history was not saved: {error}")


@record_type(frozen=False)
class _Chat:
    """One chat's state: the session, how it speaks, its input and the question in flight."""

    session: Session
    options: ChatOutput
    input: _Input
    previous: Answer | None = None
    unsent: str | None = None
    warm_noted: bool = False

    def say(self, message: str) -> None:
        note(message, quiet=self.options.quiet)


def converse(session: Session, options: ChatOutput) -> None:
    """Run the chat over ``session`` until it is ended; Ctrl-C says what is kept and is raised on."""
    chat = _Chat(session, options, _Input(_history_path(session)))
    try:
        _turns(chat)
    except BaseException as error:
        if chat.unsent is not None:
            chat.input.keep(chat.unsent)
            where = " (Up arrow in the next chat offers it again)" if chat.input.interactive else ""
            click.echo(f"longctx: not answered, kept: {chat.unsent}{where}", err=True)
        if isinstance(error, KeyboardInterrupt):
            say_stored(session)
        raise
    finally:
        chat.input.save()


def _history_path(session: Session) -> Path | None:
    try:
        return Path(session.store.path).parent / HISTORY_FILE
    except Exception:  # noqa: BLE001 - a store without a folder (memory) keeps no history
        return None


def say_stored(session: Conversation) -> None:
    """What a Ctrl-C leaves: the session's stored turns and how to go on, or that nothing was stored."""
    turns = getattr(session, "turns", ())  # a map-reduce session keeps no turns of its own
    if turns:
        resume = f"resume with: longctx chat --session {session.id}"
        stored = f"{len(turns)} turn{'' if len(turns) == 1 else 's'}"
        click.echo(f"longctx: session {session.id} has {stored} stored; {resume}", err=True)
    else:
        click.echo("longctx: no turn was answered, so no session was stored", err=True)


def _turns(chat: _Chat) -> None:
    session = chat.session
    _show_earlier_turns(chat)
    count = len(session.turns)
    chat.say(
        f"session {session.id} ({count} earlier turn{'' if count == 1 else 's'}); "
        "/help for commands, /quit or an empty line to end"
    )
    interrupted = False  # the last thing the user did was a Ctrl-C
    while True:
        try:
            line = chat.input.read()
        except KeyboardInterrupt:
            if not chat.input.interactive:
                raise  # from a script: the chat ends (exit 130)
            if interrupted:
                click.echo(err=True)
                break
            interrupted = True
            click.echo("\n(Ctrl-C again, Ctrl-D or an empty line ends the chat)", err=True)
            continue
        interrupted = False
        if not line:
            break
        question = _command(chat, line)
        if question is _QUIT:
            break
        if question is None:
            continue
        chat.unsent = question
        try:
            answer = _ask_through_outages(chat, question)
        except KeyboardInterrupt:
            if not chat.input.interactive:
                raise
            # Back to the prompt: the turn is not stored; its question is offered again by the Up arrow.
            chat.input.keep(question)
            chat.unsent = None
            interrupted = True
            click.echo(
                "longctx: stopped; the question is kept (Up arrow). Ctrl-C again or Ctrl-D ends the chat",
                err=True,
            )
            continue
        chat.unsent = None
        _after_answer(chat, answer)
    _finish(chat)


_QUIT = "\0quit"


def _command(chat: _Chat, line: str) -> str | None:
    """The question ``line`` asks, or None once a command ran (``_QUIT``: end the chat)."""
    if not line.startswith("/"):
        return line
    if line.startswith("//"):
        return line[1:]
    name = line.split(maxsplit=1)[0].lower()
    if name in ("/quit", "/exit"):
        return _QUIT
    handler = {
        "/help": _help,
        "/history": _history,
        "/tokens": _tokens,
        "/report": _report,
    }.get(name)
    if handler is None:
        click.echo(
            f"longctx: unknown command {name}: /help lists them (a question that starts with / "
            "is sent as //...)",
            err=True,
        )
        return None
    handler(chat)
    return None


def _help(chat: _Chat) -> None:
    width = max(len(name) for name in COMMANDS)
    lines = [f"  {name:<{width}}  {what}" for name, what in COMMANDS.items()]
    lines.append(f"  {'//...':<{width}}  a question that starts with / (the first / is dropped)")
    click.echo("\n".join(["chat commands (never sent to the model):", *lines]), err=True)


def _one_line(text: str, width: int = 100) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def _history(chat: _Chat) -> None:
    turns = chat.session.turns
    if not turns:
        click.echo("no turn yet", err=True)
        return
    for number, turn in enumerate(turns, start=1):
        click.echo(shown(_earlier_turn(number, turn, full=True), sys.stderr), err=True, color=True)


def _tokens(chat: _Chat) -> None:
    if not chat.session.turns:
        click.echo("no turn yet: no tokens", err=True)
        return
    click.echo(f"session {chat.session.id}: {chat.session.report().summary_line()}", err=True)


def _report(chat: _Chat) -> None:
    if not chat.session.turns:
        click.echo("no turn yet: nothing to report", err=True)
        return
    with spinning(chat.input.interactive and not chat.options.quiet, "reading the server's counters"):
        report = chat.session.report()
    click.echo(shown(report.to_text(), sys.stderr), err=True, color=True)


def _show_earlier_turns(chat: _Chat) -> None:
    """A resumed session's turns, one line each (``/history`` prints them in full)."""
    turns = chat.session.turns
    if not turns or chat.options.quiet:
        return
    for number, turn in enumerate(turns, start=1):
        click.echo(shown(_earlier_turn(number, turn, full=False), sys.stderr), err=True, color=True)
    if len(turns) > 0:
        click.echo("(/history shows them in full)", err=True)


def _earlier_turn(number: int, turn: TurnRecord, *, full: bool) -> str:
    """A turn in full, or as one line: its question and the start of its answer."""
    if not full:
        question = _one_line(turn.question, 60)
        return _one_line(f"[turn {number}] > {question} -> {' '.join(turn.answer.split())}", 120)
    return f"[turn {number}] > {turn.question}\n{turn.answer}\n"


def _ask_through_outages(chat: _Chat, question: str) -> Answer:
    """Ask ``question``; while the server cannot be reached, say so once and try again, waiting longer.

    Each try is a whole turn with its own retries; a failed one stores
    nothing, so the turn that succeeds is the only one. The first failure
    is one line; the tries after it update one status line on a terminal
    (nothing elsewhere) and the return of the server is one line. Ctrl-C
    stops the waiting (see :func:`converse`).
    """
    options, session = chat.options, chat.session
    printing = Printing.for_terminal(stream=options.stream, as_json=options.as_json, quiet=options.quiet)
    wait, tries = _OUTAGE_FIRST_WAIT, 0
    while True:
        try:
            answer = print_answer(session, question, printing).answer
        except ServerUnreachable as error:
            tries += 1
            if tries == 1:
                _went_away(chat, error)
            with spinning(printing.spinner, "") as status:
                _count_down(status.update, wait, tries)
            wait = min(wait * 2, _OUTAGE_MAX_WAIT)
            continue
        if tries:
            chat.say(f"longctx: the server is back; asked again after {_tries(tries)}")
        return answer


def _tries(count: int) -> str:
    return f"{count} failed tr{'ies' if count > 1 else 'y'}"


def _went_away(chat: _Chat, error: ServerUnreachable) -> None:
    session = chat.session
    kept = f"session {session.id} is kept" if session.turns else "nothing is lost"
    resume = f" (resume with: longctx chat --session {session.id})" if session.turns else ""
    click.echo(
        f"longctx: the server went away ({str(error).splitlines()[0]}); {kept}. Asking again, waiting longer "
        f"each time, until it is back; Ctrl-C to quit{resume}",
        err=True,
    )


def _count_down(update: Callable[[str], None], wait: float, tries: int) -> None:
    """Wait ``wait`` seconds, the status line saying when the next try goes (a test replaces ``_wait``)."""
    update(f"the server is away ({_tries(tries)}); asking again in {wait:.0f} s")
    _wait(wait)
    update(f"the server is away ({_tries(tries)}); asking again now")


def _after_answer(chat: _Chat, answer: Answer) -> None:
    """The JSON line (``--json``) and the turn's line: its usage, what it reused, what was appended."""
    chat.warm_noted = chat.warm_noted or _note_warm_start(chat)
    if chat.options.as_json:
        click.echo(json.dumps(answer.to_dict(), sort_keys=True))
    appended = f"; {answer.appended.summary_line()}" if answer.appended is not None else ""
    reuse = answer_reuse(chat.previous.usage, answer.usage) if chat.previous is not None else None
    reused = f"; {reuse.summary_line()}" if reuse is not None and reuse.answer_tokens else ""
    chat.say(f"[turn {answer.turn + 1}: {answer.usage.summary_line()}{reused}{appended}]")
    if answer.finish_reason == "length":
        chat.say(
            "longctx: the answer was cut at the token limit (finish_reason length):"
            " give a larger --max-tokens"
        )
    chat.previous = answer


def _finish(chat: _Chat) -> None:
    session = chat.session
    if session.warming is not None:
        # Its line is said before the session ends; with no turn, its request is never stored.
        session.warming.wait()
        if not chat.warm_noted:
            _note_warm_start(chat)
    if not session.turns and not session.branch_ids():
        # Nothing was asked: a new session was never stored (sessions/recording.py);
        # a resumed one that is empty (stored by an older longctx) goes too.
        if session.id in {record.id for record in session.store.sessions.sessions()}:
            session.store.sessions.delete_session(session.id)
        chat.say("no question asked: the session is not kept")
        return
    chat.say(f"session {session.id}: {session.report().summary_line()}")
    chat.say(f"resume with: longctx chat --session {session.id}")


def _note_warm_start(chat: _Chat) -> bool:
    """Say what the warm start did, if it is done; True once said."""
    warming = chat.session.warming
    result = warming.result if warming is not None else None
    if result is None:
        return False
    chat.say(f"[{result.summary_line()}]")
    return True
