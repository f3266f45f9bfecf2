"""A real vLLM (CPU) killed once under three clients, then restarted on the same port.

The server is the one of the session kept for killing: the second replica
of the shared ``vllm_fleet`` (the shared ``vllm_server`` is never killed).
The ``kill`` fixture kills it (SIGKILL to its process group, as a crash)
and restarts it on its port, once for the module: a restart costs about
30 s on this CPU, and every client here must outlive the same event. Each
test then judges one client. Against a fake server: tests/test_outages.py.

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
- Four sibling batches in this process over both replica URLs, two packs
  homed on the victim and two on the survivor: the victim's batches finish
  on the survivor, every answer stored once; restarted, the victim gets its
  packs back.

The kill lands mid-flight for each client: the chat has answered once; the
CLI batch has stored three of its ten 200-token answers when the batches in
this process start, so about 700 decode steps are left to it; and the kill
comes with the first answer of a victim's batch, which has five of its six
questions left.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from engine_helpers import packs_homed_on

from longctx.backends.base import connect
from longctx.options.groups import RequestOptions, ServerOptions
from longctx.sessions import Session, resume
from longctx.sessions.siblings import batch_keys
from longctx.store import Store
from longctx.testing.fleet import Fleet

pytestmark = pytest.mark.vllm

ENTRY_POINT = Path(sys.executable).parent / "longctx"
QUESTIONS = [f"Question {n}: what does f{n} return, and why?" for n in range(10)]
SIBLING_QUESTIONS = [f"Question {n}: what does f{n} return?" for n in range(6)]

# The fleet's second replica: booted once per session for the tests that kill a server.
VICTIM = 1


@dataclass
class Kill:
    """What the one kill left, for each client's test to judge."""

    fleet: Fleet
    folder: Path
    questions: Path
    chat_home: Path
    batch_home: Path
    batch_env: dict[str, str]
    first: dict[str, Any]
    away: str
    second: dict[str, Any]
    stored_at_kill: int
    batch_exit: int
    batch_stdout: str
    batch_stderr: str
    store: Store
    sessions: list[Session]
    outcomes: dict[int, object]
    victim_up_after_batches: bool
    restart_seconds: float


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


def _sibling_batches(
    sessions: list[Session],
) -> tuple[list[threading.Thread], dict[int, object], threading.Event]:
    """A thread per session asking the sibling questions; their outcomes; set at a victim's answer."""
    outcomes: dict[int, object] = {}
    victim_answered = threading.Event()

    def batch(index: int) -> Callable[[], None]:
        def on_answer(_: object) -> None:
            if index < 2:  # the first two sessions are homed on the victim
                victim_answered.set()

        def run() -> None:
            try:
                outcomes[index] = sessions[index].ask_many(
                    SIBLING_QUESTIONS, concurrency=2, on_answer=on_answer
                )
            except Exception as error:  # noqa: BLE001 - the test reports any failure
                outcomes[index] = error

        return run

    threads = [threading.Thread(target=batch(index)) for index in range(len(sessions))]
    return threads, outcomes, victim_answered


@pytest.fixture(scope="module")
def kill(vllm_fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kill]:
    """Three clients mid-flight, the victim killed once and restarted; it runs again afterwards."""
    root = tmp_path_factory.mktemp("kill")
    folder = root / "code"
    folder.mkdir()
    (folder / "code.py").write_text("".join(f"def f{n}(x):\n    return x * {n} + 7\n" for n in range(120)))
    questions = root / "questions.txt"
    questions.write_text("\n".join(QUESTIONS) + "\n")
    urls = vllm_fleet.urls
    victim = urls[VICTIM]
    # Each client has a store of its own, as three users would.
    chat_home, batch_home = root / "chat-home", root / "home"
    batch_env = _env(batch_home, victim)
    mine, others = packs_homed_on(victim, urls, 2)
    options = ServerOptions(base_url=urls, replica_retry_seconds=1.0)
    try:
        with connect(options) as backend, Store.open(root / "siblings-home") as store:
            sessions = [
                Session(backend=backend, pack=pack, store=store, request=RequestOptions(max_tokens=48))
                for pack in mine + others
            ]
            assert [backend.server_for(s.affinity_key).api_url for s in sessions] == [victim] * 2 + [
                urls[0]
            ] * 2
            threads, outcomes, victim_answered = _sibling_batches(sessions)
            chat = subprocess.Popen(
                [str(ENTRY_POINT), "chat", str(folder), "--json", "--max-tokens", "16"],
                env=_env(chat_home, victim), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, bufsize=1,
            )  # fmt: skip
            assert chat.stdin is not None and chat.stdout is not None and chat.stderr is not None
            out: queue.Queue[str] = queue.Queue()
            err: queue.Queue[str] = queue.Queue()
            for stream, lines in ((chat.stdout, out), (chat.stderr, err)):
                threading.Thread(target=_lines, args=(stream, lines), daemon=True).start()
            seen_out: list[str] = []
            seen_err: list[str] = []
            batch: subprocess.Popen[str] | None = None
            try:
                chat.stdin.write("What does f3 return?\n")
                chat.stdin.flush()
                first = json.loads(_wait_for(out, seen_out, '"answer"', 300))

                # Long answers, two at a time: the kill lands with answers stored and others in flight.
                batch = subprocess.Popen(
                    [str(ENTRY_POINT), "batch", str(folder), "--questions", str(questions),
                     "--concurrency", "2", "--max-tokens", "200"],
                    env=batch_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                )  # fmt: skip
                deadline = time.monotonic() + 300
                while _stored(batch_home) < 3 and batch.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                for thread in threads:
                    thread.start()
                assert victim_answered.wait(timeout=300), "no sibling batch on the victim answered"
                stored_at_kill = _stored(batch_home)
                vllm_fleet.kill(VICTIM)
                killed_at = time.monotonic()
                chat.stdin.write("And f4?\n")
                chat.stdin.flush()
                batch_stdout, batch_stderr = batch.communicate(timeout=300)
                exited = time.monotonic() - killed_at
                print(f"\nbatch exited {exited:.1f} s after the kill ({stored_at_kill} stored then)")
                for thread in threads:
                    thread.join(timeout=600)
                victim_up = {replica.api_url: replica.up for replica in backend.replicas}[victim]
                away = _wait_for(err, seen_err, "the server went away", 120)
                print(away.strip())

                started = time.monotonic()
                vllm_fleet.restart(VICTIM)
                restart_seconds = time.monotonic() - started
                print(f"vLLM restarted in {restart_seconds:.1f} s")
                second = json.loads(_wait_for(out, seen_out, '"answer"', 300))
                chat.stdin.write("\n")
                chat.stdin.flush()
                assert chat.wait(timeout=120) == 0, "".join(seen_err)
            finally:
                for client in (chat, batch):
                    if client is not None and client.poll() is None:
                        client.kill()
                        client.wait(timeout=30)
            yield Kill(
                fleet=vllm_fleet, folder=folder, questions=questions, chat_home=chat_home,
                batch_home=batch_home, batch_env=batch_env, first=first, away=away, second=second,
                stored_at_kill=stored_at_kill, batch_exit=batch.returncode, batch_stdout=batch_stdout,
                batch_stderr=batch_stderr, store=store, sessions=sessions, outcomes=outcomes,
                victim_up_after_batches=victim_up, restart_seconds=restart_seconds,
            )  # fmt: skip
    finally:
        if not vllm_fleet.replicas[VICTIM].alive():
            vllm_fleet.restart(VICTIM)


def test_a_chat_whose_server_is_killed_answers_in_the_same_session_once_it_is_back(kill: Kill) -> None:
    # The chat said so, kept trying, and answered in the same session once the server was back.
    first, second = kill.first, kill.second
    assert f"session {first['session_id']} is kept" in kill.away
    assert f"longctx chat --session {first['session_id']}" in kill.away
    assert second["question"] == "And f4?" and second["session_id"] == first["session_id"]
    assert second["turn"] == first["turn"] + 1
    with Store.open(kill.chat_home) as store:
        turns = store.sessions.turns(first["session_id"])
    assert [turn.question for turn in turns] == ["What does f3 return?", "And f4?"]


def test_a_batch_whose_server_is_killed_exits_3_and_asks_only_the_rest_after_the_restart(kill: Kill) -> None:
    # The batch exited 3 with what it had stored, and said how to ask the rest.
    before = kill.stored_at_kill
    assert 3 <= before < len(QUESTIONS), "the kill should land mid-batch"
    assert kill.batch_exit == 3, kill.batch_stderr  # EXIT_UNREACHABLE
    line = next(line for line in kill.batch_stderr.splitlines() if "answered and stored in session" in line)
    session_id = line.split("in session ")[1].split(";")[0]
    stored = _stored(kill.batch_home, session_id)
    assert f"ask the rest with: longctx batch --session {session_id} --questions {kill.questions}" in line
    # Printed: every answer stored, each under its question; nothing else.
    assert kill.batch_stdout.count("## Question") == stored >= before

    # Warm start after a restart: the store knows a recent request over this pack (the
    # batch's), the server says it started after it, so the pack is warmed again.
    chat = [str(ENTRY_POINT), "chat", str(kill.folder)]
    warm = subprocess.run(
        chat, env=kill.batch_env, input="\n", capture_output=True, text=True, timeout=300, check=False
    )
    assert warm.returncode == 0, warm.stderr
    assert "warm start: pack prefilled" in warm.stderr and "the server restarted" in warm.stderr, warm.stderr
    print(next(line for line in warm.stderr.splitlines() if "warm start" in line))

    resumed = subprocess.run(
        [str(ENTRY_POINT), "batch", "--session", session_id, "--questions", str(kill.questions), "--json"],
        env=kill.batch_env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert result["session_id"] == session_id
    assert [answer["question"] for answer in result["answers"]] == QUESTIONS
    assert f"{stored} of {len(QUESTIONS)} answers from an earlier run" in resumed.stderr
    with Store.open(kill.batch_home) as store:
        assert len(store.sessions.answered(batch_keys(session_id, QUESTIONS))) == len(QUESTIONS)
        siblings = [store.sessions.turns(child.id) for child in store.sessions.children(session_id)]
        # One turn per question: nothing asked twice, nothing the kill cut off was kept.
        assert sorted(turns[0].question for turns in siblings) == sorted(QUESTIONS)
        assert all(len(turns) == 1 for turns in siblings)
        served = [r for r in store.sessions.requests() if r.purpose == "sibling"]
    assert len(served) == len(QUESTIONS)

    # The server has run since the last request over the pack: no warm request now.
    skipped = subprocess.run(
        chat, env=kill.batch_env, input="\n", capture_output=True, text=True, timeout=300, check=False
    )
    assert skipped.returncode == 0, skipped.stderr
    assert "warm start skipped" in skipped.stderr and "has run since" in skipped.stderr, skipped.stderr
    print(next(line for line in skipped.stderr.splitlines() if "warm start" in line))
    print(f"{stored} of {len(QUESTIONS)} printed after the kill, the rest asked by batch --session")
    print(f"restart took {kill.restart_seconds:.1f} s")


def test_a_replica_killed_mid_batch_loses_no_answer_and_gets_its_packs_back(kill: Kill) -> None:
    # Every batch finished, the victim's on the survivor, which saw the victim down.
    failures = [outcome for outcome in kill.outcomes.values() if isinstance(outcome, BaseException)]
    assert failures == [] and len(kill.outcomes) == len(kill.sessions)
    assert not kill.victim_up_after_batches
    urls = kill.fleet.urls
    store = kill.store
    # The store is the judge: each batch has every question answered once.
    for session in kill.sessions:
        rows = store.database.query(
            "SELECT t.question, t.request_id FROM turns t JOIN sessions s ON s.id = t.session_id "
            "WHERE s.parent_id = ?",
            (session.id,),
        )
        assert sorted(row["question"] for row in rows) == sorted(SIBLING_QUESTIONS)
        ids = [row["request_id"] for row in rows]
        assert len(set(ids)) == len(ids) == len(SIBLING_QUESTIONS)
    served = store.database.query("SELECT base_url, COUNT(*) AS n FROM requests GROUP BY base_url")
    assert {row["base_url"] for row in served} <= set(urls)

    # Restarted (by the fixture), the victim gets its packs back once replica_retry_seconds (1 s) has
    # passed since it was last tried.
    time.sleep(1.5)
    for session in kill.sessions[:2]:
        session.ask("Back home: what does f1 return?")
    assert all(replica.up for replica in kill.sessions[0].backend.replicas)
    homes = store.database.query(
        "SELECT r.base_url FROM requests r JOIN turns t ON t.request_id = r.id "
        "WHERE t.question = 'Back home: what does f1 return?'"
    )
    assert [row["base_url"] for row in homes] == [urls[VICTIM], urls[VICTIM]]
    # The counters agree with every session: the requests that failed over joined the survivor's
    # window first, so they count there as this process's (before, the survivor's sessions saw
    # them as other traffic: "16,128 tokens more"). The victim gave no check (it died in the
    # window), and its sessions' reports say so. A report read back from the store (`longctx
    # report`, a new process) is the one the session gave.
    for index, session in enumerate(kill.sessions):
        live = session.report().counter_check
        print(f"session {session.id}: counter check {live}")
        assert live is not None and live.matches is True, live
        if index < 2:
            assert f"{urls[VICTIM]} could not be read after the window" in live.note, live
        with resume(session.id, store=store) as resumed:
            assert resumed.report().counter_check == live
