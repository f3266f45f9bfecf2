"""Counter checks that know the topology: routers read through their workers, load balancers skipped.

A fake router in front of two fake engines behaves as vllm-router 0.1.17
does (seen over the fleet's replicas, longctx.backends.routers): it lists
its workers on ``/workers``, routes chats by ``x-session-id``, and answers
``/metrics`` with whichever worker it picks, so two readings may come
from two replicas. The check must then read each worker directly (and
match), or be skipped with a note that says why: never a negative "more".
"""

from __future__ import annotations

import itertools
import json
import zlib
from pathlib import Path

import httpx2
import pytest
from fake_engine import FakeEngine

from longctx import Job, JobItem, JobOptions
from longctx.backends.base import connect
from longctx.backends.routers import parse_workers
from longctx.options.groups import RequestOptions
from longctx.report import CounterCheck
from longctx.serving.doctor import diagnose
from longctx.sessions import Session, resume
from longctx.store import CounterCheckRecord, Store, StoredPack
from longctx.verification.counters import combine_checks

ROUTER = "http://router:8000/v1"
WORKERS = ["http://w1:8000", "http://w2:8000"]

# As vllm-router 0.1.17 and smg 1.13.0 answered GET /workers over two workers (trimmed).
VLLM_ROUTER_WORKERS = {
    "workers": [
        {"url": WORKERS[0], "model_id": "unknown", "worker_type": "regular", "is_healthy": True, "load": 0},
        {"url": WORKERS[1], "model_id": "unknown", "worker_type": "regular", "is_healthy": True, "load": 0},
    ]
}
SMG_WORKERS = {
    "workers": [
        {"id": "01a2", "url": WORKERS[1], "runtime_type": "vllm", "is_healthy": True},
        {"id": "01a3", "url": WORKERS[0], "runtime_type": "vllm", "is_healthy": False},
    ],
    "total": 2,
    "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": 2},
}


def test_both_routers_worker_lists_are_read() -> None:
    vllm_router = parse_workers(VLLM_ROUTER_WORKERS, "http://router:8000", "vllm-router")
    assert vllm_router is not None and vllm_router.workers == tuple(WORKERS)
    smg = parse_workers(SMG_WORKERS, "http://gateway:8000", "smg")
    assert smg is not None and smg.workers == (WORKERS[1],)  # the unhealthy one is left out
    assert parse_workers({"detail": "Not Found"}, "http://engine:8000", "") is None
    assert parse_workers([1, 2], "http://engine:8000", "") is None


class FakeFleet:
    """Two fake vLLM engines (distinct process start times) and a router or a plain balancer in front."""

    def __init__(
        self, *, lists_workers: bool = True, workers_reachable: bool = True, tiers: str | None = None
    ) -> None:
        self.engines = {
            url: FakeEngine(block=1, started=1_700_000_000.0 + number, tiers=tiers, gpu_prompts=1)
            for number, url in enumerate(WORKERS)
        }
        self.lists_workers = lists_workers
        self.workers_reachable = workers_reachable
        self._metrics_turn = itertools.count()

    def route(self, request: httpx2.Request) -> httpx2.Response:
        root = f"http://{request.url.host}:8000"
        if root in self.engines:
            if not self.workers_reachable:
                raise httpx2.ConnectError("no route to the worker from here", request=request)
            return self.engines[root].handle(request)
        path = request.url.path
        if path == "/workers":
            if self.lists_workers:
                return httpx2.Response(200, json=VLLM_ROUTER_WORKERS)
            return httpx2.Response(404, json={"detail": "Not Found"})
        if path == "/list_workers" and self.lists_workers:  # vllm-router's own route, not smg's
            return httpx2.Response(200, json={"urls": WORKERS})
        if path == "/metrics":
            # Whichever worker the balancer picks: here each in turn.
            return self.engines[WORKERS[next(self._metrics_turn) % 2]].handle(request)
        if path == "/v1/models" and self.lists_workers:
            # As smg lists models: owned by no engine, so the client sees a generic server.
            return httpx2.Response(
                200, json={"data": [{"id": "fake-model", "owned_by": "self_hosted", "max_model_len": 32768}]}
            )
        if path == "/v1/chat/completions":
            key = request.headers.get("x-session-id", "")
            return self.engines[WORKERS[zlib.crc32(key.encode()) % 2]].handle(request)
        return self.engines[WORKERS[0]].handle(request)


def _job_items(tmp_path: Path, packs: int = 4) -> list[JobItem]:
    items = []
    for number in range(packs):
        folder = tmp_path / f"pack{number}"
        folder.mkdir()
        (folder / "code.py").write_text(f"def f{number}():\n    return {number}\n" + "# line\n" * 60)
        items += [JobItem((str(folder),), f"question {q} on pack {number}?") for q in range(3)]
    return items


def _no_negative(check: CounterCheck | None) -> None:
    text = json.dumps(check.__dict__ if check else {})
    assert "-" not in f"{check.server_delta if check else ''}"
    assert "+-" not in text and " -" not in (check.note if check else "")


def test_a_job_through_a_router_that_lists_its_workers_is_checked_on_each_worker(
    tmp_path: Path,
) -> None:
    fleet = FakeFleet()
    backend = connect(ROUTER, transport=httpx2.MockTransport(fleet.route))
    with Store.open(tmp_path / "home") as store:
        report = Job(_job_items(tmp_path), backend=backend, store=store, options=JobOptions(job_id="r")).run()
    assert not report.failed
    assert all(len(engine.prompts) for engine in fleet.engines.values())  # both workers served
    check = report.counter_check
    assert check is not None and check.matches is True, check
    assert check.server_delta == check.reported and check.reported
    _no_negative(check)
    assert backend.router(ROUTER) is not None


def test_a_router_with_host_tiers_sums_each_workers_tier_counters(tmp_path: Path) -> None:
    # Each worker keeps the last prompt on its GPU and the rest on its host tier (vLLM 0.32's
    # counters by source): the job's check sums both workers' host hits as well as their GPU hits.
    fleet = FakeFleet(tiers="vllm-by-source")
    backend = connect(ROUTER, transport=httpx2.MockTransport(fleet.route))
    items = _job_items(tmp_path, packs=4)
    with Store.open(tmp_path / "home") as store:
        Job(items, backend=backend, store=store, options=JobOptions(job_id="t1")).run()
        before = sum(engine.host_hits_total for engine in fleet.engines.values())
        # Asked again (fresh): each pack now comes back from a host tier, on its own worker.
        report = Job(items, backend=backend, store=store, options=JobOptions(job_id="t1", fresh=True)).run()
    assert not report.failed
    host = sum(engine.host_hits_total for engine in fleet.engines.values()) - before
    assert all(engine.host_hits_total for engine in fleet.engines.values())  # both workers' tiers served
    check = report.counter_check
    assert check is not None and check.matches is True, check
    assert check.tier_source == "by_source"
    assert host > 0 and check.host_tokens == host, (check, host)
    _no_negative(check)


def test_a_router_whose_workers_cannot_be_reached_skips_the_check_and_says_why(tmp_path: Path) -> None:
    fleet = FakeFleet(workers_reachable=False)
    # The router itself still answers (it reaches its workers; this client does not).
    fleet_route = fleet.route

    def route(request: httpx2.Request) -> httpx2.Response:
        if request.url.host == "router":
            fleet.workers_reachable = True
            try:
                return fleet_route(request)
            finally:
                fleet.workers_reachable = False
        return fleet_route(request)

    backend = connect(ROUTER, transport=httpx2.MockTransport(route))
    with Store.open(tmp_path / "home") as store:
        report = Job(_job_items(tmp_path), backend=backend, store=store, options=JobOptions(job_id="u")).run()
    check = report.counter_check
    assert check is not None and check.matches is None and check.server_delta is None
    assert "vllm-router" in check.note and "http://w1:8000" in check.note and "cannot be read" in check.note
    _no_negative(check)


def test_a_sessions_report_says_why_its_turns_and_batches_were_not_checked(tmp_path: Path) -> None:
    """Why a check was skipped reaches the session's report, and is stored: a resumed session's says it."""
    fleet = FakeFleet(workers_reachable=False)
    fleet_route = fleet.route

    def route(request: httpx2.Request) -> httpx2.Response:
        # The router reaches its workers; this client does not.
        fleet.workers_reachable = request.url.host == "router"
        try:
            return fleet_route(request)
        finally:
            fleet.workers_reachable = False

    pack = StoredPack(
        fingerprint="e" * 64, format_version="test/1", system="s", prefix="<doc>\n" + "a line\n" * 200,
        summary={"title": "t"},
    )  # fmt: skip
    with Store.open(tmp_path / "home") as store:
        session = Session(
            connect(ROUTER, transport=httpx2.MockTransport(route)), pack, store=store,
            request=RequestOptions(max_tokens=4),
        )  # fmt: skip
        session.ask("one?")
        session.ask_many(["two?", "three?"])
        check = session.report().counter_check
        session.close()
        # A new process's view: `longctx report` resumes the session from the store.
        resumed = resume(session.id, store=store).report().counter_check
        assert len(store.sessions.counter_skips([session.id])) == 1  # the same note, kept once
    assert check is not None and check.matches is None and check.server_delta is None
    assert check.note.count("http://w1:8000") == 1 and "cannot be read" in check.note, check.note
    assert resumed == check
    _no_negative(check)


def test_a_balancer_that_answers_metrics_from_either_replica_is_skipped_not_negative(tmp_path: Path) -> None:
    fleet = FakeFleet(lists_workers=False)
    backend = connect(ROUTER, transport=httpx2.MockTransport(fleet.route))
    pack = StoredPack(
        fingerprint="d" * 64,
        format_version="test/1",
        system="s",
        prefix="<doc>\n" + "a line of the document\n" * 200 + "</doc>\n",
        summary={"title": "t"},
    )
    with Store.open(tmp_path / "home") as store:
        session = Session(backend, pack, store=store, request=RequestOptions(max_tokens=4))
        batch = session.ask_many(["one?", "two?", "three?"])
    check = batch.report.counter_check
    assert check is not None and check.matches is None, check
    assert "another server process" in check.note
    _no_negative(check)


def _record(before: int, after: int, reported: int) -> CounterCheckRecord:
    return CounterCheckRecord(
        session_id="s",
        batch_id=None,
        base_url=ROUTER,
        counter="vllm:prefix_cache_hits_total",
        before=before,
        after=after,
        reported=reported,
        requests=1,
        others_reported=0,
        window_id="w",
    )


def test_a_growth_below_what_was_reported_is_never_a_negative_more() -> None:
    check = combine_checks([_record(1_000, 1_100, 1_477_956)])
    assert check is not None and check.matches is False
    assert "1,477,856 tokens fewer than the responses reported" in check.note
    assert "-1,477,856" not in check.note and "more" not in check.note
    over = combine_checks([_record(0, 150, 100)])
    assert over is not None and "50 tokens more" in over.note


@pytest.mark.parametrize(("name", "listing"), [("vllm-router", VLLM_ROUTER_WORKERS), ("smg", SMG_WORKERS)])
def test_doctor_names_a_detected_router(name: str, listing: dict[str, object]) -> None:
    fleet = FakeFleet()

    def route(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/workers":
            return httpx2.Response(200, json=listing)
        if request.url.path == "/list_workers" and name == "smg":
            return httpx2.Response(404, json={"error": {"code": "unknown_url"}})
        return fleet.route(request)

    with connect(ROUTER, transport=httpx2.MockTransport(route)) as backend:
        diagnosis = diagnose(backend, probe=False)
    routers = [f for f in diagnosis.findings if f.setting == "router"]
    assert routers and routers[0].severity == "suggestion" and routers[0].observed == name
    assert "reads each worker's counters" in routers[0].reason


def test_doctor_with_a_salt_reminds_of_kv_aware_behind_an_undeclared_vllm_router() -> None:
    from click.testing import CliRunner

    from longctx.cli.app import Runtime, main

    fleet = FakeFleet()
    backend = connect(ROUTER, transport=httpx2.MockTransport(fleet.route))
    salted = CliRunner().invoke(
        main, ["doctor", "--no-probe", "--cache-salt", "t1"], obj=Runtime(backend=backend)
    )
    plain = CliRunner().invoke(main, ["doctor", "--no-probe"], obj=Runtime(backend=backend))
    assert salted.exit_code == plain.exit_code == 0, salted.output
    assert "kv_aware" in salted.output and "kv_aware" not in plain.output
