"""Several replica URLs: a dead one is marked down, only its packs move, and they come back.

Fake engines behind one routed transport, so a replica can be "killed"
(every connection to it refused) and "restarted" at will. The same on real
vLLM replicas, killed mid-batch: tests/test_fleet.py.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fake_engine import FakeEngine

from longctx.backends.base import Backend, connect, rendezvous_order
from longctx.backends.chat import ChatRequest
from longctx.errors import ServerUnreachable
from longctx.options.groups import DEFAULT_AFFINITY_HEADERS, RequestOptions, ServerOptions
from longctx.serving.doctor import diagnose
from longctx.sessions import Session
from longctx.sessions.records import request_record
from longctx.store import RequestRecord, Store, StoredPack
from longctx.verification.counters import CounterSnapshot, combine_checks

URLS = [f"http://replica-{i}:8000/v1" for i in range(3)]


class Fleet:
    """Three fake engines, each reachable or not."""

    def __init__(self) -> None:
        self.engines = {url: FakeEngine(block=1) for url in URLS}
        self.down: set[str] = set()
        self.paths: Counter[tuple[str, str]] = Counter()

    def route(self, request: httpx2.Request) -> httpx2.Response:
        url = f"http://{request.url.host}:8000/v1"
        if url in self.down:
            raise httpx2.ConnectError("connection refused (replica stopped)", request=request)
        self.paths[(url, request.url.path)] += 1
        return self.engines[url].handle(request)

    def connect(self, **options: object) -> Backend:
        server = ServerOptions(base_url=URLS, **options)  # type: ignore[arg-type]
        return connect(server, transport=httpx2.MockTransport(self.route))

    def answered(self, url: str) -> int:
        return len(self.engines[url].chat_bodies)


def ask(backend: Backend, key: str) -> str:
    """Send one request for ``key``; the replica that answered it."""
    sent = backend.complete(ChatRequest(messages=({"role": "user", "content": key},), affinity_key=key))
    return sent.server.api_url


KEYS = [f"longctx-pack-{i}" for i in range(30)]


def test_a_dead_url_at_connect_is_marked_down_and_the_others_serve() -> None:
    fleet = Fleet()
    fleet.down.add(URLS[0])
    backend = fleet.connect()

    states = {replica.api_url: replica.up for replica in backend.replicas}
    assert states == {URLS[0]: False, URLS[1]: True, URLS[2]: True}
    for key in KEYS:
        order = rendezvous_order(key, URLS)
        expected = order[1] if order[0] == URLS[0] else order[0]
        assert ask(backend, key) == expected
    assert fleet.answered(URLS[0]) == 0


def test_no_replica_answering_is_server_unreachable() -> None:
    fleet = Fleet()
    fleet.down.update(URLS)
    with pytest.raises(ServerUnreachable, match="no replica answers"):
        fleet.connect()


def test_a_replica_that_dies_hands_over_only_its_packs_and_gets_them_back() -> None:
    fleet = Fleet()
    backend = fleet.connect(replica_retry_seconds=0.2)
    home = {key: ask(backend, key) for key in KEYS}
    assert set(home.values()) == set(URLS)
    victim = URLS[1]

    fleet.down.add(victim)
    during = {key: ask(backend, key) for key in KEYS}
    for key in KEYS:
        if home[key] == victim:
            # The next replica in the key's rendezvous order, not any replica.
            assert during[key] == rendezvous_order(key, URLS)[1]
        else:
            assert during[key] == home[key]
    assert not dict((r.api_url, r.up) for r in backend.replicas)[victim]
    assert any(
        f.setting == "replica" and victim in f.observed for f in diagnose(backend, probe=False).findings
    )

    fleet.down.discard(victim)
    time.sleep(0.3)  # past replica_retry_seconds: the next request for it tries it again
    after = {key: ask(backend, key) for key in KEYS}
    assert after == home
    assert all(replica.up for replica in backend.replicas)


def test_a_down_replica_is_not_tried_again_before_its_wait() -> None:
    fleet = Fleet()
    backend = fleet.connect(replica_retry_seconds=60)
    victim_keys = [key for key in KEYS if rendezvous_order(key, URLS)[0] == URLS[0]]
    fleet.down.add(URLS[0])
    for key in victim_keys:
        ask(backend, key)
    # One refused request marks it down; the later ones go straight to the next replica.
    fleet.down.discard(URLS[0])
    fleet.paths.clear()
    for key in victim_keys:
        assert ask(backend, key) != URLS[0]
    assert fleet.paths[(URLS[0], "/v1/chat/completions")] == 0


def _asked(backend: Backend, key: str, session_id: str, times: int, **hooks: Any) -> list[RequestRecord]:
    """``times`` requests over the same prompt for ``key`` (the later ones read it from the cache)."""
    request = ChatRequest(messages=({"role": "user", "content": f"{key} " * 40},), affinity_key=key)
    return [
        request_record(backend.complete(request, **hooks), session_id=session_id, batch_id=None,
                       purpose="turn", ended_at=time.time())
        for _ in range(times)
    ]  # fmt: skip


WENT_AWAY = "could not be read after the window (it went away, or stopped answering /metrics)"


@pytest.mark.parametrize("survivor_busy", [True, False], ids=["survivor-window-open", "survivor-idle"])
def test_requests_that_fail_over_are_checked_where_they_land(survivor_busy: bool) -> None:
    """A call's home replica dies mid-call: its requests join the survivor's counter window first.

    So they count as this process's there, not as other traffic in a
    window another call has open (a mismatch), nor go unchecked; the
    dead replica's window says why it gave no check.
    """
    fleet = Fleet()
    backend = fleet.connect(replica_retry_seconds=60)
    moved_key = KEYS[0]
    victim, survivor = rendezvous_order(moved_key, URLS)[:2]
    staying_key = next(key for key in KEYS if rendezvous_order(key, URLS)[0] == survivor)
    staying = CounterSnapshot.take(backend, staying_key) if survivor_busy else None  # a call still running
    moved = CounterSnapshot.take(backend, moved_key)
    fleet.down.add(victim)
    moved_records = _asked(backend, moved_key, "moved", 2, on_away=moved.follow)
    assert {r.base_url for r in moved_records} == {survivor}
    moved_settling = moved.close("moved", None, moved_records)
    if staying is not None:  # its window settles once both calls have left it
        staying_settling = staying.close("staying", None, _asked(backend, staying_key, "staying", 2))
        staying_checks = staying_settling.wait(10)
    checks = moved_settling.wait(10)
    if staying is not None:
        assert staying_checks is not None and checks is not None
        (staying_check,) = staying_checks
        assert staying_check.others_reported == checks[0].reported  # the moved requests, as this process's
        combined = combine_checks(staying_checks)
        assert combined is not None and combined.matches is True, combined
    assert checks is not None
    (moved_check,) = checks
    assert moved_check.base_url == survivor and moved_check.requests == 2 and moved_check.reported
    assert moved_settling.notes == (f"no counter check: {victim} {WENT_AWAY}",)
    check = combine_checks(checks, notes=moved_settling.notes)
    assert check is not None and check.matches is True and victim in check.note, check


def test_requests_answered_where_the_call_reads_no_counter_say_so() -> None:
    fleet = Fleet()
    backend = fleet.connect(replica_retry_seconds=60)
    victim, survivor = rendezvous_order(KEYS[0], URLS)[:2]
    moved = CounterSnapshot.take(backend, KEYS[0])
    fleet.down.add(victim)
    settling = moved.close("moved", None, _asked(backend, KEYS[0], "moved", 1))  # no on_away: not followed
    assert settling.wait(10) == []
    assert settling.notes == (
        f"no counter check: 1 request(s) answered by {survivor}, whose counter this call could not read",
        f"no counter check: {victim} {WENT_AWAY}",
    )


def test_a_warm_start_is_checked_on_the_replica_its_pack_is_homed_on(tmp_path: Path) -> None:
    fleet = Fleet()
    backend = fleet.connect()
    store = Store.open(tmp_path / "home")
    # A pack whose replica is not the first URL (the one a window opened with no key would read).
    session = next(
        session
        for letter in "abcdefgh"
        for session in [Session(backend, StoredPack(letter * 64, "test/1", "s", "<doc>\n" + "a line\n" * 50,
                                                    {"title": "t"}), store=store)]
        if backend.server_for(session.affinity_key).api_url != URLS[0]
    )  # fmt: skip
    warm = session.warm_start().wait(10)
    assert warm is not None and warm.request_id, warm
    check = session.report().counter_check
    assert check is not None and check.matches is True and "could not read" not in check.note, check


def test_counters_are_read_only_from_the_replica_that_serves(tmp_path: Path) -> None:
    fleet = Fleet()
    backend = fleet.connect()
    store = Store.open(tmp_path / "home")
    session = Session(backend=backend, store=store, request=RequestOptions(max_tokens=8))
    session.ask("first question")
    fleet.paths.clear()
    session.ask("second question")
    session.report()  # the check after the call settles off the answer's path: wait for it
    serving = backend.server_for(session.affinity_key).api_url
    metrics = {url: fleet.paths[(url, "/metrics")] for url in URLS}
    # At least the reading after the call; the one before is skipped when the
    # second turn joins the first's counter window while that still settles.
    assert metrics[serving] >= 1
    assert all(count == 0 for url, count in metrics.items() if url != serving)
    # Discovery happened once per replica, at connect, not per ask.
    assert all(fleet.paths[(url, "/v1/models")] == 0 for url in URLS)


def test_affinity_headers_default_set_and_renamed() -> None:
    fleet = Fleet()
    backend = fleet.connect()
    url = ask(backend, "longctx-pack-0")
    headers = fleet.engines[url].chat_headers[-1]
    for name in DEFAULT_AFFINITY_HEADERS:
        assert headers[name.lower()] == "longctx-pack-0"

    fleet = Fleet()
    backend = fleet.connect(affinity_headers=("x-route-me",))
    url = ask(backend, "longctx-pack-0")
    headers = fleet.engines[url].chat_headers[-1]
    assert headers["x-route-me"] == "longctx-pack-0"
    assert "x-session-id" not in headers


def test_affinity_headers_from_the_environment_add_or_replace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LONGCTX_AFFINITY_HEADERS", "+x-mine")
    assert ServerOptions().resolved_affinity_headers() == (*DEFAULT_AFFINITY_HEADERS, "x-mine")
    monkeypatch.setenv("LONGCTX_AFFINITY_HEADERS", "x-only, x-other")
    assert ServerOptions().resolved_affinity_headers() == ("x-only", "x-other")


@pytest.mark.parametrize(
    ("policy", "salt", "warned"),
    [
        ("vllm-router:round_robin", False, True),
        ("smg:round_robin", False, True),
        ("vllm-router:random", False, True),
        ("vllm-router:consistent_hash", False, False),
        ("vllm-router:cache_aware", False, False),
        ("vllm-router:kv_aware", False, False),
        ("vllm-router:kv_aware", True, True),
    ],
)
def test_doctor_flags_a_router_policy_that_loses_the_cache(policy: str, salt: bool, warned: bool) -> None:
    fleet = Fleet()
    backend = fleet.connect(router_policy=policy)
    request = RequestOptions(cache_salt="tenant-a" if salt else None)
    findings = [
        f for f in diagnose(backend, probe=False, request=request).findings if f.setting == "router policy"
    ]
    assert bool(findings) == warned
    if warned:
        assert findings[0].severity == "warning" and "--policy" in findings[0].flag


def test_behind_a_declared_router_no_call_reads_the_counters(tmp_path: Path) -> None:
    """A router answers /metrics with one replica's counters: reading them per call could only fail."""
    fleet = Fleet()
    backend = fleet.connect(router_policy="vllm-router:consistent_hash")
    metrics_reads = sum(n for (url, path), n in fleet.paths.items() if path == "/metrics")
    with Store.open(tmp_path / "home") as store:
        session = Session(backend=backend, store=store, request=RequestOptions(max_tokens=2))
        session.ask("one?")
        session.ask("two?")
        assert session.report().counter_check is None
    assert sum(n for (url, path), n in fleet.paths.items() if path == "/metrics") == metrics_reads
