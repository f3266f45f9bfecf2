"""A server that accepts connections and never answers, and one where nothing listens: what the CLI says.

The commands run as subprocesses against a real listener (a socket server
thread that reads and never replies), stderr read line by line as it comes,
so the test sees when each line arrives: within a second the command says
what it waits on, and it gives up after the bound given with ``--timeout``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from longctx.cli.app import EXIT_UNREACHABLE
from longctx.options.groups import ServerOptions

# Python's own start and the imports a command needs, on this shared machine, before it can say
# anything: in the bounds of a whole run's time.
START_UP = 1.5
# A waiting line is due one second after the request went out; this much later still passes (a
# loaded machine schedules the command's timer late).
SLACK = 0.5


class SilentServer:
    """Accepts every connection, reads what comes, never writes a byte; closes all at the end."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections: list[socket.socket] = []
        self.first_contact: float | None = None  # time.monotonic() of the first connection accepted
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        self.listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.first_contact is None:
                self.first_contact = time.monotonic()
            self.connections.append(connection)  # kept open, never answered

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for connection in self.connections:
            connection.close()
        self.listener.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Run:
    code: int
    elapsed: float
    lines: list[tuple[float, str]]  # (seconds since the start, stderr line)
    stdout: str
    started: float  # time.monotonic() when the process was started

    @property
    def stderr(self) -> str:
        return "".join(line for _, line in self.lines)


def longctx(*args: str, cwd: Path, home: Path) -> Run:
    """Run ``python -m longctx ARGS``, stamping each stderr line with when it arrived."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LONGCTX_")}
    environment["LONGCTX_HOME"] = str(home)
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "longctx", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
        cwd=cwd,
    )
    assert process.stderr is not None
    lines = [(time.monotonic() - started, line) for line in process.stderr]
    code = process.wait(timeout=60)
    elapsed = time.monotonic() - started
    assert process.stdout is not None
    return Run(code, elapsed, lines, process.stdout.read(), started)


def first_wait(run: Run, server: SilentServer, url: str) -> float:
    """Seconds from the command's first connection to ``server`` to its line saying it waits on ``url``.

    Counted from the connection, not from the process's start: what the command holds itself to is
    one second of silence before it says so, and a loaded machine's interpreter start is not in it.
    """
    waits = [at for at, line in run.lines if f"waiting for {url}" in line and "gives up after 3 s" in line]
    assert waits and server.first_contact is not None, run.stderr
    return run.started + waits[0] - server.first_contact


def test_doctor_says_what_it_waits_on_within_a_second_and_gives_up_after_the_timeout(
    silent: SilentServer, tmp_path: Path
) -> None:
    run = longctx("doctor", "--base-url", silent.url, "--timeout", "3", cwd=tmp_path, home=tmp_path / "h")
    assert first_wait(run, silent, f"{silent.url}/models") < 1.0 + SLACK
    assert run.code == EXIT_UNREACHABLE
    assert 3.0 <= run.elapsed < 3.0 + START_UP + 2.0, run.stderr
    # doctor's report (stdout) names the silence and the flag that bounds it.
    assert "sent nothing" in run.stdout and "--timeout" in run.stdout


def test_ask_says_what_it_waits_on_and_gives_up_after_the_timeout(
    silent: SilentServer, tmp_path: Path
) -> None:
    (tmp_path / "notes.md").write_text("# notes\nthe answer is 42\n")
    run = longctx(
        "ask", "notes.md", "what is the answer?", "--base-url", silent.url, "--timeout", "3",
        cwd=tmp_path, home=tmp_path / "h",
    )  # fmt: skip
    assert first_wait(run, silent, f"{silent.url}/models") < 1.0 + SLACK
    assert run.code == EXIT_UNREACHABLE
    assert 3.0 <= run.elapsed < 3.0 + START_UP + 2.0, run.stderr


def test_the_stall_timeout_flag_bounds_the_wait_as_well(silent: SilentServer, tmp_path: Path) -> None:
    run = longctx(
        "doctor", "--base-url", silent.url, "--stall-timeout", "3", "--timeout", "60",
        cwd=tmp_path, home=tmp_path / "h",
    )  # fmt: skip
    # Each attempt waits 3 s of silence; the retries stop at the first contact's bound.
    assert first_wait(run, silent, f"{silent.url}/models") < 1.0 + SLACK
    assert run.code == EXIT_UNREACHABLE


def test_nothing_listening_is_said_at_once_for_one_replica_or_two(tmp_path: Path) -> None:
    one = f"http://127.0.0.1:{free_port()}/v1"
    two = f"{one},http://127.0.0.1:{free_port()}/v1"
    for urls in (one, two):
        run = longctx("doctor", "--base-url", urls, cwd=tmp_path, home=tmp_path / "h")
        assert run.code == EXIT_UNREACHABLE
        # No retries of a refused connection: one line per URL, at once.
        assert run.elapsed < START_UP + 1.0, run.stderr
        assert run.stdout.count("ConnectError") == urls.count(",") + 1, run.stdout


def test_the_timeouts_are_flags_and_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from longctx.cli import main

    for command in ("ask", "batch", "chat", "doctor", "job", "pack"):
        shown = CliRunner().invoke(main, [command, "--help"]).output
        assert "--timeout SECONDS" in shown and "--stall-timeout SECONDS" in shown, command
    from longctx.options.settings import setting

    monkeypatch.setenv("LONGCTX_STALL_TIMEOUT", "7")
    found = setting(ServerOptions, "stall_timeout")
    assert found is not None and found.value == 7.0
