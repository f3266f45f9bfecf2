"""Several replica URLs: a dead one is marked down, only its packs move, and they come back.

Fake engines behind one routed transport, so a replica can be "killed"
(every connection to it refused) and "restarted" at will. The same on real
vLLM replicas, killed mid-batch: tests/test_fleet.py.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import httpx2
import pytest
from fake_engine import FakeEngine

from longctx.backends.base import Backend, connect, rendezvous_order
from longctx.backends.chat import ChatRequest
from longctx.config import DEFAULT_AFFINITY_HEADERS, RequestOptions, ServerOptions
from longctx.errors import ServerUnreachable
from longctx.serving.doctor import diagnose
from longctx.sessions import Session
from longctx.store import Store

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
