"""longctx over two real vLLM CPU replicas: behind real routers from PyPI, and with a replica killed.

- Behind ``vllm-router`` (consistent_hash, cache_aware) and SGLang's
  gateway ``smg`` (consistent_hashing, cache_aware), every pack stays
  on one replica: the cached share of prompt tokens is at least 99% of what
  one replica alone caches on the same workload (the ceiling: each pack's
  first request is cold). round_robin is measured as the baseline and
  caches visibly less.
- A job (``longctx.Job``) over both replica URLs keeps every pack on one
  replica and caches as much as on one replica alone.

A replica killed mid-batch (its batches finish on the survivor, and it gets
its packs back once restarted) is in tests/test_outages_engines.py, where one
kill serves every client that must outlive one.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from engine_helpers import make_packs

from longctx import Job, JobItem
from longctx.backends.base import Backend, connect
from longctx.options.groups import RequestOptions, ServerOptions
from longctx.serving.doctor import diagnose
from longctx.sessions import Session
from longctx.store import RequestRecord, Store, StoredPack
from longctx.testing.fleet import Fleet

# Odd: with an even number, round robin's alternation would send every round
# of a pack to the same replica, and the baseline would keep the cache too.
PACKS = 5
ROUNDS = 4
REQUEST = RequestOptions(max_tokens=4, temperature=0.0)


def cached_share(backend: Backend, store: Store, packs: list[StoredPack]) -> float:
    """Rounds of one question per pack, each from a new session: cached / prompt tokens."""
    prompt = cached = 0
    for round_number in range(ROUNDS):
        for pack in packs:
            session = Session(backend=backend, pack=pack, store=store, request=REQUEST)
            answer = session.ask(f"Round {round_number}: what does f3 return?")
            prompt += answer.usage.prompt_tokens or 0
            cached += answer.usage.cached_tokens or 0
    return cached / prompt


@pytest.fixture(scope="module")
def ceiling(vllm_fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> float:
    """The cached share on one replica alone: every pack's later rounds fully cached."""
    with (
        connect(vllm_fleet.urls[0]) as backend,
        Store.open(tmp_path_factory.mktemp("ceiling")) as store,
    ):
        return cached_share(backend, store, make_packs("ceiling", PACKS))


@pytest.mark.parametrize(
    ("router", "policy", "keeps_packs"),
    [
        ("vllm-router", "consistent_hash", True),
        ("vllm-router", "cache_aware", True),
        ("vllm-router", "round_robin", False),
        ("smg", "consistent_hashing", True),
        ("smg", "cache_aware", True),
        # Not smg's round_robin: with longctx's X-SMG-Routing-Key, smg 1.13's kept the ceiling
        # (72.6% vs 72.8%; why is not established, docs/testing.md), so there is nothing to assert
        # of it; doctor's warning on it is held by tests/test_replicas.py.
    ],
)
def test_a_router_policy_keeps_each_pack_on_one_replica(
    vllm_fleet: Fleet, ceiling: float, tmp_path: Path, *, router: str, policy: str, keeps_packs: bool
) -> None:
    server = vllm_fleet.start_router(router, policy)
    try:
        options = ServerOptions(base_url=server.api_base, router_policy=f"{router}:{policy}")
        with connect(options) as backend, Store.open(tmp_path / "home") as store:
            share = cached_share(backend, store, make_packs(f"{router}-{policy}", PACKS))
            findings = [f for f in diagnose(backend, probe=False).findings if f.setting == "router policy"]
    finally:
        vllm_fleet.stop_routers()
    print(f"{router} {policy}: cached share {share:.1%}, single-replica ceiling {ceiling:.1%}")
    assert ceiling > 0.5  # the workload caches at all: rounds 2-4 of every pack
    if keeps_packs:
        assert share >= 0.99 * ceiling
        assert findings == []
    else:
        # Round robin sends each pack's second round to the other replica, cold.
        assert share < 0.9 * ceiling
        assert findings and findings[0].severity == "warning"


def _job_folders(root: Path, count: int) -> list[Path]:
    folders = []
    for number in range(count):
        folder = root / f"pack{number}"
        folder.mkdir(parents=True)
        body = "".join(f"def g{number}_{line}(x):\n    return x - {line}\n" for line in range(100))
        (folder / "code.py").write_text(body)
        folders.append(folder)
    return folders


def _job_share(urls: list[str], items: list[JobItem], home: Path) -> tuple[float, dict[str, set[str]]]:
    """Run the job on ``urls`` (its own cache salt): the replicas each pack used, and the cached
    share of each pack's requests but its cold one (cold however the packs are spread; on one
    replica it shares the system header with the packs before it, which two replicas split).
    """
    request = RequestOptions(max_tokens=4, temperature=0.0, cache_salt=uuid.uuid4().hex)
    with connect(ServerOptions(base_url=urls)) as backend, Store.open(home) as store:
        report = Job(items, backend=backend, store=store, request=request).run()
        assert not report.failed
        used: dict[str, set[str]] = {}
        by_pack: dict[str, list[RequestRecord]] = {}
        for result in report.results:
            records = store.sessions.requests(session_ids=[result.session_id or ""])
            used.setdefault(result.item.paths[0], set()).update(r.base_url for r in records)
            by_pack.setdefault(result.item.paths[0], []).extend(records)
    # The cold one is the least cached (siblings go out together: not always the first sent).
    later = [
        r
        for records in by_pack.values()
        for r in sorted(records, key=lambda r: r.usage.cached_tokens or 0)[1:]
    ]
    cached = sum(r.usage.cached_tokens or 0 for r in later)
    return cached / sum(r.usage.prompt_tokens or 0 for r in later), used


def test_a_job_over_two_replicas_keeps_each_pack_on_one_and_caches_as_one_replica(
    vllm_fleet: Fleet, tmp_path: Path
) -> None:
    folders = _job_folders(tmp_path / "packs", 6)
    items = [JobItem((str(f),), f"Question {q}: what does g{q} return?") for q in range(3) for f in folders]
    ceiling, _ = _job_share(vllm_fleet.urls[:1], items, tmp_path / "one")
    share, used = _job_share(vllm_fleet.urls, items, tmp_path / "two")
    print(f"job: cached share {share:.1%} on two replicas, {ceiling:.1%} on one; packs per replica {used}")
    assert ceiling > 0.9  # each pack's later requests read the pack from the cache
    assert all(len(replicas) == 1 for replicas in used.values()), used
    assert share >= 0.99 * ceiling


def _figures(check: object) -> list[str]:
    """Every number and note of a counter check, as text (to look for a negative)."""
    values = vars(check) if check is not None else {}
    return [str(value) for value in values.values()]


@pytest.mark.parametrize(
    ("router", "policy"), [("vllm-router", "consistent_hash"), ("smg", "consistent_hashing")]
)
def test_a_job_and_a_batch_through_an_undeclared_router_check_each_worker_or_say_why(
    vllm_fleet: Fleet, tmp_path: Path, router: str, policy: str
) -> None:
    server = vllm_fleet.start_router(router, policy)
    try:
        request = RequestOptions(max_tokens=4, temperature=0.0, cache_salt=uuid.uuid4().hex)
        # No router_policy: longctx finds the router on its own.
        with connect(server.api_base) as backend, Store.open(tmp_path / "home") as store:
            found = backend.router(backend.replicas[0].api_url)
            folders = _job_folders(tmp_path / "packs", 3)
            items = [
                JobItem((str(f),), f"Question {q}: what does g{q} return?") for q in range(2) for f in folders
            ]
            job = Job(items, backend=backend, store=store, request=request).run()
            session = Session(
                backend=backend, pack=make_packs(f"batch-{router}", 1)[0], store=store, request=request
            )
            batch = session.ask_many([f"Batch question {n}?" for n in range(3)])
            doctor = [f for f in diagnose(backend, probe=False).findings if f.setting == "router"]
    finally:
        vllm_fleet.stop_routers()
    print(f"{router}: job check {job.counter_check}; batch check {batch.report.counter_check}")
    assert found is not None and found.name == router
    assert set(found.workers) == {replica.base_url for replica in vllm_fleet.replicas}
    assert doctor and router in doctor[0].reason
    assert not job.failed
    for check in (job.counter_check, batch.report.counter_check):
        assert check is not None
        # Per worker, read directly: it matches; or it is skipped, and the note says why.
        assert check.matches is True or (check.matches is None and check.note), check
        assert not any(re.search(r"(?<![\w.])-\d", figure) for figure in _figures(check)), check
