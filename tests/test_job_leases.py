"""One owner per job item (longctx.store.leases, longctx.jobs.ownership): two runs never ask one item twice.

The store's leases alone; two jobs in one process over two connections; two
``longctx job`` processes at once against one fake server over HTTP. The
same with two processes against a real vLLM: tests/test_jobs_engines.py.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fake_engine import FakeEngine

from longctx import Job, JobItem, JobOptions, JobReport
from longctx.backends.base import connect
from longctx.store import LeaseClaim, LeaseHolder, RequestRecord, SessionRecord, Store, TurnRecord
from longctx.usage import Usage

# Each test on both stores: the SQLite file, and a PostgreSQL server (tests/store_backends.py).
pytestmark = pytest.mark.usefixtures("store_backend")
# A lease that ends when its process, on this host, is gone: the embedded store's alone (on a server's
# store the holder may be another machine: time alone ends a lease, tests/test_store_postgres.py).
ONE_HOST = pytest.mark.parametrize("store_backend", ["sqlite"], indirect=True)

FAKE = "http://fake-engine:8000/v1"
ENTRY_POINT = Path(sys.executable).parent / "longctx"


class SlowEngine(FakeEngine):
    """A fake engine that takes ``delay`` seconds per answer and calls ``on_chat`` as each request comes."""

    delay: float = 0.0
    on_chat: Any = None

    def chat(self, request: httpx2.Request) -> httpx2.Response:
        if self.on_chat is not None:
            self.on_chat(len(self.chat_bodies))
        time.sleep(self.delay)
        return super().chat(request)


def questions_asked(fake: FakeEngine) -> Counter[str]:
    """How often each question reached the server (the last line of its last user message)."""
    return Counter(body["messages"][-1]["content"].rsplit("\n", 1)[-1] for body in fake.chat_bodies)


def make_items(root: Path, packs: int = 2, questions: int = 3) -> list[JobItem]:
    items = []
    for number in range(packs):
        folder = root / f"pack{number}"
        folder.mkdir(parents=True)
        (folder / "main.py").write_text(f"def answer():\n    return {number}\n" + "# filler\n" * 30)
        items += [JobItem((str(folder),), f"question {q} about pack{number}?") for q in range(questions)]
    return items


def dead_pid() -> int:
    """The id of a process of this host that has ended."""
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    return int(ended.stdout)


# -- the store's leases -------------------------------------------------------------


@ONE_HOST
def test_a_lease_has_one_holder_until_released_lapsed_or_its_process_is_gone(tmp_path: Path) -> None:
    with Store.open(tmp_path / "home") as store:
        mine, other = LeaseHolder.this_process("mine"), LeaseHolder.this_process("other")
        assert store.leases.take(["k1", "k2"], other, 60)[0].state == "taken"
        held = store.leases.take(["k1"], mine, 60)[0]
        assert held.state == "held" and held.holder == other and "pid" in held.holder.describe()
        store.leases.release("mine", ["k1"])  # not mine: left alone
        assert store.leases.take(["k1"], mine, 60)[0].state == "held"
        store.leases.release("other", ["k1"])
        assert store.leases.take(["k1"], mine, 60)[0].state == "taken"
        assert store.leases.holders() == {"k1": mine, "k2": other}

        # Lapsed: another host's run that stopped renewing.
        away = LeaseHolder("away", 1, "another-host")
        store.leases.take(["k3"], away, 1.0)  # long enough to be held still on a loaded machine
        assert store.leases.take(["k3"], mine, 60)[0].state == "held"
        time.sleep(1.1)
        assert store.leases.take(["k3"], mine, 60)[0].state == "taken"

        # A process of this host that ended holds nothing, however long its lease.
        gone = LeaseHolder("gone", dead_pid(), socket.gethostname())
        store.leases.take(["k4"], gone, 3600)
        assert "k4" not in store.leases.holders()
        assert store.leases.take(["k4"], mine, 60)[0].state == "taken"

        assert store.leases.renew("mine", 60) == 3
        store.leases.release("mine")
        assert store.leases.holders() == {"k2": other}


def test_each_claim_names_its_key_and_a_renewal_pushes_back_the_lapse(tmp_path: Path) -> None:
    with Store.open(tmp_path / "home") as store:
        mine, away = LeaseHolder.this_process("mine"), LeaseHolder("away", 1, "another-host")
        store.sessions.create_session(SessionRecord("s", 0.0, "session", "t", None, None, None))
        request = RequestRecord(
            "r", "s", None, "turn", 0.0, "u", "vllm", "m", Usage(1, 0, None, 1, None, None), 1
        )
        turn = TurnRecord("s", 0, "q?", "a", "a", None, "r", time.time())
        store.sessions.commit_turn(turn, request, key="job:j:2:d:nonce")
        (away_claim,) = store.leases.take(["job:j:1:d"], away, 60)
        before = time.time()
        claims = store.leases.take(["job:j:0:d", "job:j:1:d", "job:j:2:d"], mine, 60)
        after = time.time()
        assert claims == [
            LeaseClaim("job:j:0:d", "taken", mine, claims[0].expires_at),
            LeaseClaim("job:j:1:d", "held", away, away_claim.expires_at),
            LeaseClaim("job:j:2:d", "answered"),
        ]
        assert claims[0].expires_at is not None and before + 60 <= claims[0].expires_at <= after + 60
        assert away_claim.expires_at is not None and away_claim.expires_at <= before + 60
        # An answer made before the run began is not this run's: the item is asked.
        assert store.leases.take(["job:j:2:d"], mine, 60, answered_since=time.time() + 1)[0].state == "taken"

        store.leases.take(["short"], away, 0.3)
        assert store.leases.renew("away", 60) == 2
        time.sleep(0.4)
        assert store.leases.take(["short"], mine, 60)[0].state == "held"
        assert store.leases.holders("sh") == {"short": away}
        assert store.leases.holders("job:j:1") == {"job:j:1:d": away}
        assert store.leases.renew("nobody", 60) == 0


@ONE_HOST
def test_a_holders_process_is_looked_at_never_signalled(tmp_path: Path) -> None:
    # A child that a stray signal would end (the default action, whatever this process ignores).
    script = (
        "import signal, time; signal.signal(signal.SIGHUP, signal.SIG_DFL); print(flush=True); time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert child.stdout is not None
    child.stdout.readline()  # its handler is set
    try:
        with Store.open(tmp_path / "home") as store:
            living = LeaseHolder("living", child.pid, socket.gethostname())
            store.leases.take(["k"], living, 60)
            assert store.leases.take(["k"], LeaseHolder.this_process("mine"), 60)[0].state == "held"
            assert store.leases.holders() == {"k": living}
        time.sleep(0.2)
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


@ONE_HOST
def test_a_lease_of_another_users_process_on_this_host_is_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_yours(pid: int, signal_number: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    with Store.open(tmp_path / "home") as store:
        theirs = LeaseHolder("theirs", 4242, socket.gethostname())
        store.leases.take(["k"], theirs, 60)
        monkeypatch.setattr(os, "kill", not_yours)
        assert store.leases.take(["k"], LeaseHolder.this_process("mine"), 60)[0].state == "held"
        assert store.leases.holders() == {"k": theirs}


# -- two runs of one job in one process ------------------------------------------------


def test_two_runs_at_once_ask_every_item_exactly_once(tmp_path: Path) -> None:
    fake = SlowEngine(engine="generic", block=1)
    fake.delay = 0.05
    items = make_items(tmp_path, packs=3, questions=3)
    reports: list[JobReport] = []
    start = threading.Barrier(2)

    def run() -> None:
        start.wait()
        # Each run with its own connection and store, as two processes have.
        with connect(FAKE, transport=fake.transport()) as backend, Store.open(tmp_path / "home") as store:
            reports.append(
                Job(items, backend=backend, store=store, options=JobOptions(packs_in_flight=1)).run()
            )

    runs = [threading.Thread(target=run) for _ in range(2)]
    for thread in runs:
        thread.start()
    for thread in runs:
        thread.join()
    asked = questions_asked(fake)
    assert sorted(asked) == sorted(item.question for item in items) and set(asked.values()) == {1}, asked
    for report in reports:
        assert not report.failed and [r.answer for r in report.results] == [fake.answer] * len(items)
    # Every item asked by one run; the other took its answer (stored, or as it was stored).
    assert sum(report.asked for report in reports) == len(items)
    assert [
        sum(not r.resumed for r in results) for results in zip(*(rep.results for rep in reports), strict=True)
    ] == [1] * 9


def test_a_run_waits_for_the_answers_another_run_is_asking_and_names_it(tmp_path: Path) -> None:
    fake = SlowEngine(engine="generic", block=1)
    fake.delay = 0.3
    items = make_items(tmp_path, packs=1, questions=2)
    first_asking = threading.Event()
    second_waiting = threading.Event()

    def asking(count: int) -> None:
        # The first run's answers wait until the second has found its items held: on a loaded machine
        # the second could otherwise come after an answer was stored, and reuse it without a holder.
        first_asking.set()
        second_waiting.wait(10)

    fake.on_chat = asking
    reports: dict[str, JobReport] = {}

    def run(name: str) -> None:
        with connect(FAKE, transport=fake.transport()) as backend, Store.open(tmp_path / "home") as store:
            reports[name] = Job(items, backend=backend, store=store).run()

    def told(message: str) -> None:
        messages.append(message)
        if "is being asked by run" in message and message.startswith(f"item {len(items) - 1} "):
            second_waiting.set()

    first = threading.Thread(target=run, args=("first",))
    first.start()
    assert first_asking.wait(10)
    messages: list[str] = []
    with connect(FAKE, transport=fake.transport()) as backend, Store.open(tmp_path / "home") as store:
        second = Job(items, backend=backend, store=store, on_progress=lambda p: told(p.message)).run()
    first.join()
    assert len(fake.chat_bodies) == 2
    assert second.asked == 0 and second.resumed == 2 and not second.failed
    assert all(
        r.asked_by and f"pid {os.getpid()} on {socket.gethostname()}" in r.asked_by for r in second.results
    )
    assert any("is being asked by run" in message for message in messages), messages
    assert "2 asked by another run" in second.summary_line()
    assert reports["first"].asked == 2


@ONE_HOST
def test_an_item_a_dead_run_held_is_taken_over_and_one_given_back_unanswered_is_asked(tmp_path: Path) -> None:
    fake = FakeEngine(engine="generic", block=1)
    items = make_items(tmp_path, packs=1, questions=2)
    with connect(FAKE, transport=fake.transport()) as backend, Store.open(tmp_path / "home") as store:
        job = Job(items, backend=backend, store=store)
        # The leases as a run would have taken them: the item's key without its nonce.
        keys = [key.rsplit(":", 1)[0] for key in _answer_keys(items, backend, store, tmp_path)]
        store.leases.take([keys[0]], LeaseHolder("killed", dead_pid(), socket.gethostname()), 3600)
        other = LeaseHolder.this_process("stopped")  # alive: this process, another run
        store.leases.take([keys[1]], other, 3600)
        threading.Timer(0.5, store.leases.release, args=("stopped",)).start()
        started = time.monotonic()
        report = job.run()
    assert not report.failed and report.asked == 2 and len(fake.chat_bodies) == 2
    assert 0.4 < time.monotonic() - started < 10
    assert all(r.asked_by is None for r in report.results)


def test_a_lapsed_lease_of_another_host_is_asked_after_its_expiry(tmp_path: Path) -> None:
    fake = FakeEngine(engine="generic", block=1)
    items = make_items(tmp_path, packs=1, questions=1)
    with connect(FAKE, transport=fake.transport()) as backend, Store.open(tmp_path / "home") as store:
        (key,) = [key.rsplit(":", 1)[0] for key in _answer_keys(items, backend, store, tmp_path)]
        store.leases.take([key], LeaseHolder("elsewhere", 4242, "another-host"), 1.0)
        started = time.monotonic()
        report = Job(items, backend=backend, store=store, options=JobOptions(lease_seconds=1.0)).run()
        assert store.leases.holders() == {}  # given back once stored
    assert report.asked == 1 and len(fake.chat_bodies) == 1
    assert time.monotonic() - started >= 0.8


def _answer_keys(items: list[JobItem], backend: Any, store: Store, tmp_path: Path) -> list[str]:
    """The answer keys a run of ``items`` would store, found by asking them once in a scratch store."""
    from longctx.jobs.keys import AnswerFacts, item_key
    from longctx.sessions import RepoSession

    with RepoSession(list(items[0].paths), backend=backend, store=Store(tmp_path / "scratch.db")) as session:
        facts = AnswerFacts.of(
            session.full_pack.fingerprint, backend.server_for(session.affinity_key),
            [r.api_url for r in backend.replicas], Job(items).request,
        )  # fmt: skip
    return [item_key(Job(items).id, index, facts) for index in range(len(items))]


# -- two ``longctx job`` processes ---------------------------------------------------


@contextmanager
def over_http(fake: FakeEngine) -> Iterator[str]:
    """``fake`` on a local port: its /v1 URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            content = self.rfile.read(length) if length else b""
            request = httpx2.Request(
                self.command,
                f"http://fake-engine:8000{self.path}",
                headers=dict(self.headers),
                content=content,
            )
            response = fake.handle(request)
            body = response.read()
            self.send_response(response.status_code)
            for name, value in response.headers.items():
                if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_two_job_processes_at_once_ask_every_item_exactly_once(tmp_path: Path) -> None:
    fake = SlowEngine(engine="generic", block=1)
    fake.delay = 0.5  # long enough that the two runs overlap (Python starts in about a second here)
    items = make_items(tmp_path, packs=2, questions=3)
    job_file = tmp_path / "job.jsonl"
    job_file.write_text("".join(json.dumps(item.to_dict()) + "\n" for item in items))
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LONGCTX_")}
    environment |= {"LONGCTX_HOME": str(tmp_path / "home"), "LONGCTX_CONFIG": str(tmp_path / "none.toml")}
    if "LONGCTX_STORE" in os.environ:  # the store of this test's backend
        environment["LONGCTX_STORE"] = os.environ["LONGCTX_STORE"]
    with over_http(fake) as url:
        command = [str(ENTRY_POINT), "job", str(job_file), "--base-url", url, "--packs-in-flight", "1"]
        runs = [
            subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
            )
            for _ in range(2)
        ]
        outputs = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err for _, err in outputs]
    asked = questions_asked(fake)
    assert sorted(asked) == sorted(item.question for item in items) and set(asked.values()) == {1}, asked
    lines = [[json.loads(line) for line in out.splitlines()] for out, _ in outputs]
    for results in lines:
        assert [line["answer"] for line in results] == [fake.answer] * len(items)
    # Each item asked by one process; the other took its answer.
    assert [sum(not line["resumed"] for line in pair) for pair in zip(*lines, strict=True)] == [1] * len(
        items
    )
    with Store.open(tmp_path / "home") as store:
        assert len(store.sessions.answered_under(f"job:{Job(items).id}:")) == len(items)
        assert store.leases.holders() == {}
