"""The cache canary's logic against the fake engine: verdicts, tolerance, evidence, CLI, sessions."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_engine import FakeEngine

from longctx.backends.base import Backend, connect
from longctx.backends.chat import TokenLogprob
from longctx.cli.app import EXIT_CANARY, Runtime, main
from longctx.errors import CanaryDiverged, ConfigError
from longctx.options.groups import RequestOptions
from longctx.sessions import Session
from longctx.store import Store, StoredPack
from longctx.verification.canary import (
    CANARY_QUESTION,
    CanaryOptions,
    CanaryRun,
    _compare,
    acanary,
    canary,
    probe_messages,
)

URL = "http://fake-engine:8000/v1"
PACK = StoredPack(
    fingerprint="c" * 64,
    format_version="test/1",
    system="You answer questions about the documents.",
    prefix="<documents>\n" + "the canary sings in the mine\n" * 300 + "</documents>\n\n",
    summary={"title": "canary fixture"},
)


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(block=1, answer="record 0000 sensor A0 read")


@pytest.fixture
def backend(fake: FakeEngine) -> Backend:
    return connect(URL, transport=fake.transport(), async_transport=fake.transport())


def test_a_clean_cache_gives_the_same_answer_and_each_run_is_where_it_should_be(
    backend: Backend, fake: FakeEngine
) -> None:
    result = canary(backend)
    assert result.verdict == "same"
    assert not result.diverged
    cold, again, cached = result.runs
    assert (cold.cached_tokens, again.cached_tokens) == (0, 0)  # fresh salts: nothing to read
    assert cached.cached_tokens and cached.cached_tokens > 0
    assert cold.salt == cached.salt != again.salt
    # Greedy, logprobs and token ids asked for on every run, one replica's affinity key on all.
    bodies = fake.chat_bodies
    assert all(b["temperature"] == 0.0 and b["logprobs"] is True and b["return_token_ids"] for b in bodies)
    assert {b["user"] for b in bodies} == {"longctx-canary"}
    assert result.spread.largest_difference == 0.0
    assert result.tolerance == CanaryOptions().floor  # no spread measured: the floor
    assert "same" in result.to_text()
    result.raise_for_divergence()  # nothing to raise


def test_a_perturbed_logprob_on_a_cached_answer_diverges_with_the_evidence(
    backend: Backend, fake: FakeEngine
) -> None:
    fake.perturb_cached_logprob = -0.7
    result = canary(backend)
    assert result.verdict == "diverged"
    worst = result.largest_divergence
    assert worst is not None and worst.run == "cached"
    assert worst.first_difference is None  # the same tokens
    assert worst.largest_difference == pytest.approx(0.7)
    assert worst.at == 0
    with pytest.raises(CanaryDiverged) as raised:
        result.raise_for_divergence()
    assert raised.value.result is result
    data = result.to_dict()
    assert data["verdict"] == "diverged"
    assert data["runs"][2]["logprobs"][0] == pytest.approx(data["runs"][0]["logprobs"][0] - 0.7)


def test_a_changed_token_on_a_cached_answer_diverges_and_both_outputs_are_shown(
    backend: Backend, fake: FakeEngine
) -> None:
    fake.flip_cached_token = True
    result = canary(backend)
    assert result.verdict == "diverged"
    worst = result.largest_divergence
    assert worst is not None and worst.first_difference == 0
    text = result.to_text()
    assert "'record 0000 sensor A0 read'" in text  # the cold output, as evidence
    assert "cached ids:" in text


def test_a_difference_under_the_floor_is_within_tolerance(backend: Backend, fake: FakeEngine) -> None:
    fake.perturb_cached_logprob = -0.01
    result = canary(backend)
    assert result.verdict == "within tolerance"
    assert result.comparisons[0].largest_difference == pytest.approx(0.01)
    # A larger floor or a tighter one moves the verdict: the tolerance is what decides.
    assert canary(backend, options=CanaryOptions(floor=0.001)).verdict == "diverged"


def test_a_real_bf16_servers_cached_difference_is_within_the_default_tolerance(
    backend: Backend, fake: FakeEngine
) -> None:
    # Measured on vLLM 0.24 (H100, bf16, a real model): the same tokens, cached logprobs 0.053 nats off.
    fake.perturb_cached_logprob = -0.053
    assert canary(backend).verdict == "within tolerance"
    fake.perturb_cached_logprob = -0.3  # past the floor: a finding
    assert canary(backend).verdict == "diverged"


def test_the_async_driver_runs_the_same_plan(backend: Backend, fake: FakeEngine) -> None:
    fake.perturb_cached_logprob = -0.7
    result = asyncio.run(acanary(backend))
    assert result.verdict == "diverged"
    assert [r.label for r in result.runs] == ["cold", "cold again", "cached"]


def _run(label: str, ids: list[int], logprobs: list[float], top: list[list[tuple[str, float]]]) -> CanaryRun:
    return CanaryRun(
        label=label,
        salt=None,
        server=URL,
        text="",
        token_ids=tuple(ids),
        logprobs=tuple(
            TokenLogprob(str(i), lp, tuple(alts)) for i, lp, alts in zip(ids, logprobs, top, strict=True)
        ),
        prompt_tokens=100,
        cached_tokens=96,
    )


def test_the_tolerance_follows_the_measured_spread_and_a_near_tie_is_not_a_divergence() -> None:
    options = CanaryOptions(margin=4, floor=0.0)
    cold = _run(
        "cold", [1, 2, 3], [-0.1, -0.2, -0.3], [[("1", -0.1)], [("2", -0.2), ("9", -0.21)], [("3", -0.3)]]
    )
    # A spread of 0.02 between two cold runs: a tolerance of 0.08.
    again = _run("cold again", [1, 2, 3], [-0.12, -0.2, -0.3], [[]] * 3)
    spread = _compare(again, cold, options, tolerance=None)
    assert spread.largest_difference == pytest.approx(0.02)
    within = _compare(_run("cached", [1, 2, 3], [-0.15, -0.2, -0.3], [[]] * 3), cold, options, tolerance=0.08)
    assert within.verdict == "within tolerance"
    over = _compare(_run("cached", [1, 2, 3], [-0.2, -0.2, -0.3], [[]] * 3), cold, options, tolerance=0.08)
    assert over.verdict == "diverged"
    # Token 1 flips to the cold answer's runner-up, 0.01 nats behind it: a near tie.
    tie = _compare(_run("cached", [1, 9, 5], [-0.1, -0.21, -1.0], [[]] * 3), cold, options, tolerance=0.08)
    assert tie.verdict == "within tolerance" and tie.first_difference == 1
    assert "near tie" in tie.reason
    # A flip to a token the cold answer did not rank: diverged.
    flip = _compare(_run("cached", [1, 7, 5], [-0.1, -0.5, -1.0], [[]] * 3), cold, options, tolerance=0.08)
    assert flip.verdict == "diverged"


def test_a_cached_run_that_read_nothing_is_inconclusive(backend: Backend, fake: FakeEngine) -> None:
    fake.prefix_caching = False
    result = canary(backend)
    assert result.verdict == "inconclusive"
    assert "no cached token" in result.comparisons[0].reason


def test_the_host_tier_run_fills_the_cache_under_another_salt_first(
    backend: Backend, fake: FakeEngine
) -> None:
    result = canary(backend, options=CanaryOptions(host_tier=True, fill_tokens=3000))
    labels = [r.label for r in result.runs]
    assert labels == ["cold", "cold again", "cached", "host tier"]
    fills = [b for b in fake.chat_bodies if b.get("max_tokens") == 1]
    assert fills and len({b["cache_salt"] for b in fills}) == 1
    assert fills[0]["cache_salt"] not in {r.salt for r in result.runs}
    assert sum(len(json.dumps(b["messages"])) for b in fills) >= 3000 * 3  # about 4 characters a token
    # The fake keeps everything and exports no host-tier counter: the run says so.
    assert result.runs[3].tier == "cached (the server exports no host-tier counter to tell which tier)"
    assert any("filled the device cache" in note for note in result.notes)


@pytest.mark.parametrize(
    ("tiers", "unit"),
    [
        # vLLM 0.32 counts cached tokens by tier; 0.24 counts the connector's tokens by source (and
        # the bytes it moved: the tokens are read); a vLLM counting bytes only; SGLang HiCache.
        ("vllm-by-source", "tokens"),
        ("vllm-024", "tokens"),
        ("vllm-transfers", "bytes"),
        ("sglang-hicache", "tokens"),
    ],
)
def test_the_host_tier_run_says_what_came_back_by_the_engine_versions_counters(tiers: str, unit: str) -> None:
    # Only the last two prompts stay on the GPU: after the fill, the probe's cached tokens are host hits.
    engine = "sglang" if tiers.startswith("sglang") else "vllm"
    fake = FakeEngine(engine=engine, block=1, answer="record 0000 sensor A0 read", tiers=tiers, gpu_prompts=2)
    backend = connect(URL, transport=fake.transport())
    host = canary(backend, options=CanaryOptions(host_tier=True, fill_tokens=3000)).run("host tier")
    moved = host.cached_tokens * (fake.bytes_per_token if unit == "bytes" else 1)
    assert (
        host.cached_tokens and host.tier == f"read from the host tier ({moved:,} {unit} moved to the device)"
    )


def test_a_host_tier_run_the_device_cache_kept_says_so() -> None:
    fake = FakeEngine(block=1, answer="record 0000 sensor A0 read", tiers="vllm-by-source")
    backend = connect(URL, transport=fake.transport())
    host = canary(backend, options=CanaryOptions(host_tier=True, fill_tokens=3000)).run("host tier")
    assert host.tier == "read from the device cache (the fill did not evict it)"


def test_the_host_tier_needs_a_size_when_the_server_reports_none(backend: Backend) -> None:
    with pytest.raises(ConfigError, match="fill_tokens"):
        canary(backend, options=CanaryOptions(host_tier=True))


def test_doctor_canary_exits_10_on_a_divergence_and_prints_the_evidence(fake: FakeEngine) -> None:
    backend = connect(URL, transport=fake.transport())
    runner = CliRunner()
    clean = runner.invoke(main, ["doctor", "--canary", "--json"], obj=Runtime(backend=backend))
    assert clean.exit_code == 0, clean.output
    assert json.loads(clean.output)["replicas"][0]["canary"]["verdict"] == "same"
    fake.flip_cached_token = True
    bad = runner.invoke(main, ["doctor", "--canary"], obj=Runtime(backend=backend))
    assert bad.exit_code == EXIT_CANARY == 10
    assert "diverged" in bad.output and "cached ids:" in bad.output


def test_a_session_runs_the_canary_on_its_own_pack_under_its_own_salt(
    backend: Backend, fake: FakeEngine, tmp_path: Path
) -> None:
    request = RequestOptions(cache_salt="tenant-a", max_tokens=8)
    with Store.open(tmp_path / "home") as store:
        session = Session(backend, PACK, store=store, request=request)
        session.ask("What sings?")
        result = session.canary()
    assert result.verdict == "same"
    probe = fake.chat_bodies[-1]["messages"]
    assert probe[0]["content"] == PACK.system
    assert probe[1]["content"].startswith(PACK.prefix)
    assert probe[-1]["content"].endswith(CANARY_QUESTION)
    assert result.run("cached").salt == "tenant-a"  # the session's own cache entries
    assert fake.chat_bodies[-1]["user"] == session.affinity_key
    assert session.canaries.results == (result,)


def test_canary_every_samples_one_request_in_n(backend: Backend, fake: FakeEngine, tmp_path: Path) -> None:
    with Store.open(tmp_path / "home") as store:
        session = Session(backend, PACK, store=store, request=RequestOptions(canary_every=3, max_tokens=8))
        for number in range(4):
            session.ask(f"Question {number}?")
        assert len(session.canaries.results) == 1
        session.ask_many(["a?", "b?", "c?"])
        assert len(session.canaries.results) == 2
        fake.perturb_cached_logprob = -1.0
        session.ask_many(["d?", "e?", "f?"])
    assert len(session.canaries.diverged) == 1


def test_options_refuse_what_cannot_work() -> None:
    with pytest.raises(ConfigError):
        CanaryOptions(max_tokens=0)
    with pytest.raises(ConfigError):
        RequestOptions(canary_every=0)
    assert probe_messages(3)[1]["content"].count("record ") == 3


def test_a_host_tier_run_that_was_recomputed_is_judged_as_a_cold_run(
    backend: Backend, fake: FakeEngine
) -> None:
    original = fake.cached_for
    fake.cached_for = lambda prompt, salt=None: 0 if len(fake.prompts) > 4 else original(prompt, salt)  # type: ignore[method-assign]
    result = canary(backend, options=CanaryOptions(host_tier=True, fill_tokens=500))
    host = result.run("host tier")
    assert host.cached_tokens == 0 and host.tier == "evicted and recomputed (no host tier held it)"
    assert result.comparisons[-1].verdict == "same"
    assert result.verdict == "same"


def test_a_job_samples_canaries_on_its_packs_and_reports_a_divergence(tmp_path: Path) -> None:
    from longctx import Job, JobItem, JobOptions

    fake = FakeEngine(engine="generic", block=1, answer="w x y z")
    backend = connect(URL, transport=fake.transport())
    folders = []
    for number in range(2):
        folder = tmp_path / f"pack{number}"
        folder.mkdir()
        (folder / "a.py").write_text(f"def f():\n    return {number}\n" + "# line\n" * 40)
        folders.append(folder)
    items = [JobItem((str(f),), f"q{q}?") for q in range(2) for f in folders]
    fake.perturb_cached_logprob = -2.0
    with Store.open(tmp_path / "home") as store:
        report = Job(
            items,
            backend=backend,
            store=store,
            request=RequestOptions(canary_every=2, max_tokens=4),
            options=JobOptions(job_id="canary"),
        ).run()
    assert not report.failed
    assert len(report.canaries) == 2  # each pack asked 2 questions: one canary each
    assert len(report.diverged) == 2
    assert "cache canary DIVERGED on 2 of 2 runs" in report.summary_line()
    assert report.counter_check is None  # the canaries' requests would blur the job's one window
