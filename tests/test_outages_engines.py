"""A real vLLM (CPU) killed under a batch and under a chat, then restarted on the same port.

The server is the one of the session kept for killing: the second replica
of the shared ``vllm_fleet`` (the shared ``vllm_server`` is never killed),
which the tests kill (SIGKILL to its process group, as a crash) and restart
on its port; it runs again when a test ends, whatever happened
(``restored_fleet``, tests/conftest.py). Against a fake server:
tests/test_outages.py.

One kill serves both clients (each restart costs 45-70 s on this CPU):

- ``longctx chat`` whose server is killed between two questions says so,
  keeps trying, and answers the second question in the same session once
  the server is back.
- ``longctx batch`` whose server is killed mid-batch exits 3 with the
  answers it stored on stdout and its session id on stderr; after the
  restart, ``batch --session ID`` asks only the questions without an
  answer, and each question is answered once (the store is the judge).
- The warm start asks the server: right after the restart, a chat over the
  same pack warms it (the server started after the store's recent
  request); once the server has run since, the warm start is skipped.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest

from longctx.sessions.siblings import batch_keys
from longctx.store import Store
from longctx.testing.fleet import Fleet

pytestmark = pytest.mark.vllm

ENTRY_POINT = Path(sys.executable).parent / "longctx"
QUESTIONS = [f"Question {n}: what does f{n} return, and why?" for n in range(10)]


# The fleet's second replica: booted once per session for the tests that kill a server.
VICTIM = 1


def _restart(fleet: Fleet) -> float:
    started = time.monotonic()
    fleet.restart(VICTIM)
    seconds = time.monotonic() - started
    print(f"\nvLLM restarted in {seconds:.1f} s")
    return seconds


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "code"
    root.mkdir()
    (root / "code.py").write_text("".join(f"def f{n}(x):\n    return x * {n} + 7\n" for n in range(120)))
    return root


def _env(home: Path, url: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("LONGCTX_")}
    env.update({"LONGCTX_HOME": str(home), "LONGCTX_BASE_URL": url})
    return env


def _stored(home: Path, session_id: str | None = None) -> int:
    """Batch answers stored so far (of ``session_id``, or of any batch)."""
    if not (home / "longctx.db").exists():
        return 0
    with Store.open(home) as store:
        if session_id is not None:
            return len(store.sessions.answered(batch_keys(session_id, QUESTIONS)))
        return len(store.sessions.answered_under("batch:"))


def _lines(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


def _wait_for(lines: queue.Queue[str], seen: list[str], text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            continue
        seen.append(line)
        if text in line:
            return line
    raise AssertionError(f"no line with {text!r} in {timeout:.0f} s; seen: {''.join(seen)[-3000:]}")


def test_a_batch_and_a_chat_outlive_one_kill_of_their_server(
    restored_fleet: Fleet, folder: Path, tmp_path: Path
) -> None:
    # One kill and one restart for both (a restart of vLLM on this CPU takes 45-70 s); each
    # client has a store of its own, as two users would.
    home = tmp_path / "home"
    env = _env(home, restored_fleet.urls[VICTIM])
    chat = subprocess.Popen(
        [str(ENTRY_POINT), "chat", str(folder), "--json", "--max-tokens", "16"],
        env=_env(tmp_path / "chat-home", restored_fleet.urls[VICTIM]), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
    )  # fmt: skip
    assert chat.stdin is not None and chat.stdout is not None and chat.stderr is not None
    out: queue.Queue[str] = queue.Queue()
    err: queue.Queue[str] = queue.Queue()
    for stream, lines in ((chat.stdout, out), (chat.stderr, err)):
        threading.Thread(target=_lines, args=(stream, lines), daemon=True).start()
    seen_out: list[str] = []
    seen_err: list[str] = []
    questions = tmp_path / "questions.txt"
    questions.write_text("\n".join(QUESTIONS) + "\n")
    command = [str(ENTRY_POINT), "batch", str(folder), "--questions", str(questions)]
    process: subprocess.Popen[str] | None = None
    try:
        chat.stdin.write("What does f3 return?\n")
        chat.stdin.flush()
        first = json.loads(_wait_for(out, seen_out, '"answer"', 300))

        # Long answers, two at a time: the kill lands with answers stored and others in flight.
        process = subprocess.Popen(
            [*command, "--concurrency", "2", "--max-tokens", "200"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        while _stored(home) < 3 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        before = _stored(home)
        restored_fleet.kill(VICTIM)
        killed_at = time.monotonic()
        chat.stdin.write("And f4?\n")
        chat.stdin.flush()
        stdout, stderr = process.communicate(timeout=300)
        print(f"\nbatch exited {time.monotonic() - killed_at:.1f} s after the kill ({before} stored then)")
        away = _wait_for(err, seen_err, "the server went away", 120)
        print(away.strip())

        restart_seconds = _restart(restored_fleet)
        second = json.loads(_wait_for(out, seen_out, '"answer"', 300))
        chat.stdin.write("\n")
        chat.stdin.flush()
        assert chat.wait(timeout=120) == 0, "".join(seen_err)
    finally:
        for client in (chat, process):
            if client is not None and client.poll() is None:
                client.kill()
                client.wait(timeout=30)

    # The chat said so, kept trying, and answered in the same session once the server was back.
    assert f"session {first['session_id']} is kept" in away
    assert f"longctx chat --session {first['session_id']}" in away
    assert second["question"] == "And f4?" and second["session_id"] == first["session_id"]
    assert second["turn"] == first["turn"] + 1
    with Store.open(tmp_path / "chat-home") as store:
        turns = store.sessions.turns(first["session_id"])
    assert [turn.question for turn in turns] == ["What does f3 return?", "And f4?"]

    # The batch exited 3 with what it had stored, and said how to ask the rest.
    assert 3 <= before < len(QUESTIONS), "the kill should land mid-batch"
    assert process.returncode == 3, stderr  # EXIT_UNREACHABLE
    line = next(line for line in stderr.splitlines() if "answered and stored in session" in line)
    session_id = line.split("in session ")[1].split(";")[0]
    stored = _stored(home, session_id)
    assert f"ask the rest with: longctx batch --session {session_id} --questions {questions}" in line
    # Printed: every answer stored, each under its question; nothing else.
    assert stdout.count("## Question") == stored >= before

    # Warm start after a restart: the store knows a recent request over this pack (the
    # batch's), the server says it started after it, so the pack is warmed again.
    warm = subprocess.run(
        [str(ENTRY_POINT), "chat", str(folder)], env=env, input="\n", capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert warm.returncode == 0, warm.stderr
    assert "warm start: pack prefilled" in warm.stderr and "the server restarted" in warm.stderr, warm.stderr
    print(next(line for line in warm.stderr.splitlines() if "warm start" in line))

    resumed = subprocess.run(
        [str(ENTRY_POINT), "batch", "--session", session_id, "--questions", str(questions), "--json"],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert result["session_id"] == session_id
    assert [answer["question"] for answer in result["answers"]] == QUESTIONS
    assert f"{stored} of {len(QUESTIONS)} answers from an earlier run" in resumed.stderr
    with Store.open(home) as store:
        assert len(store.sessions.answered(batch_keys(session_id, QUESTIONS))) == len(QUESTIONS)
        siblings = [store.sessions.turns(child.id) for child in store.sessions.children(session_id)]
        # One turn per question: nothing asked twice, nothing the kill cut off was kept.
        assert sorted(turns[0].question for turns in siblings) == sorted(QUESTIONS)
        assert all(len(turns) == 1 for turns in siblings)
        served = [r for r in store.sessions.requests() if r.purpose == "sibling"]
    assert len(served) == len(QUESTIONS)

    # The server has run since the last request over the pack: no warm request now.
    skipped = subprocess.run(
        [str(ENTRY_POINT), "chat", str(folder)], env=env, input="\n", capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert skipped.returncode == 0, skipped.stderr
    assert "warm start skipped" in skipped.stderr and "has run since" in skipped.stderr, skipped.stderr
    print(next(line for line in skipped.stderr.splitlines() if "warm start" in line))
    print(f"{stored} of {len(QUESTIONS)} printed after the kill, the rest asked by batch --session")
    print(f"restart took {restart_seconds:.1f} s")
