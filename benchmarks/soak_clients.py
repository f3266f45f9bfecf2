"""The soak's clients: longctx processes run as a user runs them, with a fault now and then.

Each client is one process (two for a job pair) started with its own
process group, so a signal reaches it as a terminal's would: ``ask``,
``batch`` and ``job`` through the CLI, ``chat`` through a pseudo-terminal
(Ctrl-C is the byte ``\\x03`` typed into it, which the terminal turns into
SIGINT for the foreground group), and MCP calls through the MCP SDK's stdio
client (this file run as ``python soak_clients.py mcp ...``). What a client
printed as answered and stored is collected as :class:`Told` answers, for the
checker (``soak_check.py``) to find in the store.

Every client has a bound: past it, it is killed and counted as hung.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import signal
import sqlite3
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ENTRY_POINT = Path(sys.executable).parent / "longctx"
CTRL_C = b"\x03"
EXIT_INTERRUPTED = 130  # longctx.cli.app.EXIT_INTERRUPTED; not imported, so this process never loads the CLI


@dataclass(frozen=True)
class Told:
    """One answer a client printed as stored: the checker must find it in the store, once."""

    client: str
    question: str
    answer: str
    session_id: str | None = None
    turn: int | None = None


@dataclass
class ClientRun:
    """One client process (or a job pair's one process): what it was, what was done to it, what it said."""

    name: str
    kind: str
    fault: str  # "none", "sigint" or "sigkill": what the plan asked for
    bound_seconds: float
    applied: str = "none"  # the fault sent (a client that finished first got none)
    exit_code: int | None = None
    hung: bool = False
    seconds: float = 0.0
    signal_to_exit: float | None = None
    session_id_printed: bool | None = None  # after a SIGINT with something stored: was the id said
    stdout: str = ""
    stderr: str = ""
    told: list[Told] = field(default_factory=list)


def client_env(home: Path) -> dict[str, str]:
    """The environment of a client: no LONGCTX_* of the caller's, its store ``home``, this checkout first."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("LONGCTX_")}
    env.update(
        {
            "LONGCTX_HOME": str(home),
            "LONGCTX_CONFIG": str(home.parent / "no-user-config.toml"),
            "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
    )
    return env


def stored_under(home: Path, prefix: str) -> int:
    """Turns whose question starts with ``prefix`` in the store at ``home`` (read-only; 0 if none yet)."""
    database = home / "longctx.db"
    if not database.exists():
        return 0
    try:
        with (
            closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5)) as connection,
            connection,
        ):
            row = connection.execute(
                "SELECT COUNT(*) FROM turns WHERE substr(question, 1, ?) = ?", (len(prefix), prefix)
            ).fetchone()
    except sqlite3.Error:
        return 0  # not created yet, or busy: asked again on the next poll
    return int(row[0])


# -- plain processes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Trigger:
    """When to send a client its fault: ``delay`` seconds after ``ready()`` first says true.

    ``fire``, if given, is the fault (filling the store's disk, say) instead of a signal.
    """

    ready: Callable[[], bool]
    delay: float
    fire: Callable[[], None] | None = None


def _signal(process: subprocess.Popen[bytes], name: str) -> None:
    number = signal.SIGINT if name == "sigint" else signal.SIGKILL
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        os.killpg(process.pid, number)


def run_process(
    run: ClientRun, command: list[str], env: dict[str, str], work: Path, trigger: Trigger
) -> None:
    """Run ``command`` to its end (or bound), sending ``run.fault`` once ``trigger`` fires."""
    out, err = work / f"{run.name}.out", work / f"{run.name}.err"
    started = time.monotonic()
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, start_new_session=True
        )
        ready_at: float | None = None
        signalled_at: float | None = None
        while process.poll() is None:
            now = time.monotonic()
            if now - started > run.bound_seconds:
                _signal(process, "sigkill")
                run.hung = True
                process.wait()
                break
            if run.fault != "none" and signalled_at is None:
                if ready_at is None and trigger.ready():
                    ready_at = now
                if ready_at is not None and now - ready_at >= trigger.delay:
                    if trigger.fire is not None:
                        trigger.fire()
                    else:
                        _signal(process, run.fault)
                    run.applied, signalled_at = run.fault, time.monotonic()
            time.sleep(0.02)
        ended = time.monotonic()
    run.exit_code = process.returncode
    run.seconds = ended - started
    if signalled_at is not None:
        run.signal_to_exit = ended - signalled_at
    run.stdout = out.read_text(errors="replace")
    run.stderr = err.read_text(errors="replace")


def stored_position(turn: int | None) -> int | None:
    """The store's position of a turn that longctx printed: printed turns are numbered from 1."""
    return None if turn is None else turn - 1


def told_of_json_answers(client: str, answers: list[dict[str, Any]]) -> list[Told]:
    """The answers of an ``ask``/``batch``/``chat`` JSON output (``Answer.to_dict``)."""
    return [
        Told(
            client,
            answer["question"],
            answer["answer"],
            answer.get("session_id"),
            stored_position(answer.get("turn")),
        )
        for answer in answers
    ]


def parse_ask_or_batch(run: ClientRun) -> str | None:
    """Collect what an ``ask --json`` or ``batch --json`` printed; the session id it printed, if any."""
    try:
        data = json.loads(run.stdout) if run.stdout.strip() else None
    except json.JSONDecodeError:
        data = None  # killed mid-write: nothing it said is whole, so nothing is counted as told
    if not isinstance(data, dict):
        return None
    answers = data.get("answers", [data] if "answer" in data else [])
    run.told.extend(told_of_json_answers(run.name, answers))
    session_id = data.get("session_id")
    return session_id if isinstance(session_id, str) else None


def parse_job_lines(client: str, path: Path) -> list[dict[str, Any]]:
    """The whole lines of a job's ``-o`` file (a killed job's last line may be cut: not counted)."""
    if not path.exists():
        return []
    lines = []
    for text in path.read_text(errors="replace").splitlines():
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            continue
    return lines


def told_of_job(client: str, lines: list[dict[str, Any]]) -> list[Told]:
    return [
        Told(client, line["question"], line["answer"], line.get("session_id"))
        for line in lines
        if line.get("answer") is not None and not line.get("error")
    ]


# -- chat through a pseudo-terminal --------------------------------------------------------------


@dataclass(frozen=True)
class ChatScript:
    """What a chat client types: its questions; Ctrl-C ``ctrl_c_after`` s into the last one, if set."""

    questions: tuple[str, ...]
    ctrl_c_after: float | None
    kill_after: float | None = None


def _controlling_terminal() -> None:
    # Runs in the child after setsid(): the pty on fd 0 becomes its controlling terminal, and the
    # child's group the terminal's foreground group, which a typed Ctrl-C signals.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class _Terminal:
    """The master side of a pty: what the child wrote, line by line."""

    def __init__(self, master: int) -> None:
        self.master = master
        self.text = ""
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return  # the child closed the terminal
            if not chunk:
                return
            with self._lock:
                self.text += chunk.decode(errors="replace").replace("\r", "")

    def answers(self) -> list[dict[str, Any]]:
        with self._lock:
            lines = self.text.splitlines()
        found = []
        for line in lines:
            start = line.find('{"')
            if start < 0:
                continue
            try:
                data = json.loads(line[start:])
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict) and "answer" in data:
                found.append(data)
        return found

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def close(self) -> None:
        self._reader.join(timeout=2)
        os.close(self.master)


def _no_echo(slave: int) -> None:
    attributes = termios.tcgetattr(slave)
    attributes[3] &= ~termios.ECHO  # lflag: what is typed is not printed back among the answers
    termios.tcsetattr(slave, termios.TCSANOW, attributes)


def run_chat(run: ClientRun, command: list[str], env: dict[str, str], script: ChatScript) -> None:
    """``longctx chat --json`` in a pty: each question typed after the previous answer; the fault typed."""
    master, slave = os.openpty()
    _no_echo(slave)
    started = time.monotonic()
    process = subprocess.Popen(
        command, env=env, stdin=slave, stdout=slave, stderr=slave,
        # The one way to give a child a controlling terminal; it calls nothing that takes a lock.
        start_new_session=True, preexec_fn=_controlling_terminal,  # noqa: PLW1509
    )  # fmt: skip
    os.close(slave)
    terminal = _Terminal(master)
    deadline = started + run.bound_seconds
    signalled_at: float | None = None
    try:
        for number, question in enumerate(script.questions):
            terminal.type(question.encode() + b"\n")
            last = number == len(script.questions) - 1
            if last and (script.ctrl_c_after is not None or script.kill_after is not None):
                signalled_at = _fault_chat(run, process, terminal, script)
                break
            while (
                len(terminal.answers()) <= number and process.poll() is None and time.monotonic() < deadline
            ):
                time.sleep(0.05)
        else:
            terminal.type(b"\n")  # an empty line ends the chat
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if process.poll() is None:
            _signal(process, "sigkill")
            run.hung = True
        process.wait()
    finally:
        ended = time.monotonic()
        terminal.close()
    run.exit_code, run.seconds = process.returncode, ended - started
    if signalled_at is not None:
        run.signal_to_exit = ended - signalled_at
    run.stdout = terminal.text
    run.told.extend(told_of_json_answers(run.name, terminal.answers()))


def _fault_chat(
    run: ClientRun, process: subprocess.Popen[bytes], terminal: _Terminal, script: ChatScript
) -> float:
    """Type Ctrl-C (or kill the chat) while its last question is being answered; when it was sent.

    In a terminal the first Ctrl-C stops the answer and returns to the prompt; the second, typed
    right after, ends the chat (exit 0): the time counts from the second.
    """
    time.sleep(script.ctrl_c_after if script.ctrl_c_after is not None else script.kill_after or 0.0)
    if script.ctrl_c_after is not None:
        terminal.type(CTRL_C)
        time.sleep(0.3)
        terminal.type(CTRL_C)
        run.applied = "sigint"
    else:
        _signal(process, "sigkill")
        run.applied = "sigkill"
    return time.monotonic()


# -- an MCP client (this file run as a script) ---------------------------------------------------


async def _mcp_calls(arguments: argparse.Namespace) -> None:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    parameters = StdioServerParameters(
        command=str(ENTRY_POINT),
        args=["mcp", "--max-tokens", str(arguments.max_tokens), "--base-url", arguments.base_url],
        env=client_env(Path(arguments.home)),
        cwd=arguments.path,
    )
    questions: list[str] = arguments.question
    async with stdio_client(parameters) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        # One ask, then the rest as siblings: both tools, one source.
        plan = (
            [("ask", questions[:1]), ("ask_many", questions[1:])]
            if len(questions) > 1
            else [("ask", questions)]
        )
        for tool, asked in plan:
            body: dict[str, Any] = {"path": arguments.path}
            body |= {"question": asked[0]} if tool == "ask" else {"questions": asked}
            result = await session.call_tool(tool, body)
            if result.is_error:
                print(json.dumps({"error": str(result.content)[:500]}), flush=True)
                continue
            data = result.structured_content or {}
            answers = data.get("answers", [data])
            for question, answer in zip(asked, answers, strict=False):
                told = {"question": question, "answer": answer["answer"]}
                told |= {key: data[key] for key in ("session_id", "turn") if key in data and tool == "ask"}
                print(json.dumps(told), flush=True)


def parse_json_lines(run: ClientRun) -> None:
    """Collect the JSON answer lines an API client (MCP, full-batch) printed, each once stored."""
    for line in run.stdout.splitlines():
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and "answer" in data:
            run.told.append(
                Told(
                    run.name,
                    data["question"],
                    data["answer"],
                    data.get("session_id"),
                    stored_position(data.get("turn")),
                )
            )


def api_command(
    mode: str, home: Path, *, folder: Path, base_url: str, questions: list[str], max_tokens: int
) -> list[str]:
    """This file run as an API client: ``mode`` is ``mcp`` or ``full-batch``."""
    command = [sys.executable, str(Path(__file__)), mode, "--home", str(home), "--path", str(folder)]
    command += ["--base-url", base_url, "--max-tokens", str(max_tokens)]
    for question in questions:
        command += ["--question", question]
    return command


# -- a full store without a small filesystem: SQLite's page limit ------------------------------


def _full_batch(arguments: argparse.Namespace) -> None:
    """A batch through the API whose store may grow no further once its first answer is stored.

    Where no small filesystem can be mounted, ``PRAGMA max_page_count`` set
    to the database's size is SQLite's own way to make it full: the next
    write that needs a page fails with SQLITE_FULL, as on a full disk. Each
    answer is printed (a JSON line) once stored.
    """
    from longctx.options.groups import RequestOptions, ServerOptions
    from longctx.sessions import RepoSession
    from longctx.store import Store

    with Store.open(Path(arguments.home)) as store:
        full = threading.Event()

        def answered(answer: Any) -> None:
            print(json.dumps(answer.to_dict()), flush=True)
            if not full.is_set():
                pages = store.database.query("PRAGMA page_count")[0][0]
                store.database.query(f"PRAGMA max_page_count = {int(pages)}")
                full.set()

        server = ServerOptions(base_url=arguments.base_url.split(","))
        request = RequestOptions(max_tokens=arguments.max_tokens)
        with RepoSession(arguments.path, server=server, store=store, request=request) as session:
            session.ask_many(arguments.question, on_answer=answered, reuse_answered=True, concurrency=1)


def main() -> None:
    parser = argparse.ArgumentParser(description="The soak's API clients: JSON lines of the answers stored.")
    parser.add_argument("mode", choices=["mcp", "full-batch"])
    parser.add_argument("--home", required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--question", action="append", required=True)
    arguments = parser.parse_args()
    if arguments.mode == "mcp":
        asyncio.run(_mcp_calls(arguments))
    else:
        _full_batch(arguments)


if __name__ == "__main__":
    main()
