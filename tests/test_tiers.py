"""Cache tiers below the GPU: metrics of each engine generation, the report's split, the counter check.

The CPU builds of vLLM and SGLang run no host tier (docs/testing.md says
why), so the accounting is tested against a fake engine that exports each
generation's metrics: vLLM 0.32 (tokens by source and external hits),
vLLM 0.24 (tokens by source and transfer bytes, as its /metrics held them on
the H200), a vLLM counting transfer bytes only, and SGLang HiCache (tokens by cache source,
and per request ``sglext.cached_tokens_details``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import httpx2
import pytest
from fake_engine import FakeEngine

from longctx.backends.base import connect
from longctx.backends.engines import SGLANG, VLLM
from longctx.backends.http import HttpEndpoint
from longctx.backends.metrics import parse_metrics
from longctx.backends.tiers import HostTier, read_tiers
from longctx.options.groups import RequestOptions
from longctx.report import CounterCheck, build_report
from longctx.serving.doctor import diagnose
from longctx.sessions import Session
from longctx.store import CounterCheckRecord, RequestRecord, Store, StoredPack
from longctx.usage import Usage
from longctx.verification import counters
from longctx.verification.counters import combine_checks

URL = "http://tiers.test/v1"


def _pack(letter: str) -> StoredPack:
    return StoredPack(
        fingerprint=letter * 64,
        format_version="test/1",
        system="You answer questions about the documents.",
        prefix=f"<documents>\n{letter} " + f"the {letter} fox jumps\n" * 200 + "</documents>\n\n",
        summary={"title": letter},
    )


# -- the metrics of each generation ---------------------------------------------------------

VLLM_032 = """
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1000.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 600.0
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="device"} 1000.0
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="host"} 500.0
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="disk"} 60.0
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="p2p"} 40.0
vllm:kv_offload_load_bytes_total{engine="0",model_name="m"} 32000.0
"""

# vLLM 0.24.0 on the H200 after the canary's runs (docs/benchmarks.md, gpu-canary): 77,040 tokens came
# back from the CPU tier, 5,048,893,440 bytes at 65,536 bytes per token (fp8 8B Llama).
VLLM_024 = """
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 17968.0
vllm:kv_offload_total_bytes_total{engine="0",model_name="m",transfer_type="CPU_to_GPU"} 5048893440.0
vllm:kv_offload_total_bytes_total{engine="0",model_name="m",transfer_type="GPU_to_CPU"} 13442744320.0
vllm:kv_offload_load_bytes_total{engine="0",model_name="m"} 5048893440.0
vllm:kv_offload_store_bytes_total{engine="0",model_name="m"} 13442744320.0
vllm:kv_offload_load_time_total{engine="0",model_name="m"} 0.18098368072509766
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 205172.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 17968.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 77040.0
"""

# A vLLM whose offloading counts bytes only (no tokens by source).
VLLM_BYTES_ONLY = """
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1000.0
vllm:kv_offload_total_bytes_total{engine="0",model_name="m",transfer_type="CPU_to_GPU"} 65536.0
vllm:kv_offload_total_bytes_total{engine="0",model_name="m",transfer_type="GPU_to_CPU"} 131072.0
vllm:kv_offload_total_time_total{engine="0",model_name="m",transfer_type="CPU_to_GPU"} 0.5
"""

SGLANG_METRICS = """
sglang:cached_tokens_total{cache_source="device",model_name="m"} 700.0
sglang:cached_tokens_total{cache_source="host",model_name="m"} 250.0
sglang:cached_tokens_total{cache_source="storage",model_name="m"} 50.0
sglang:hicache_host_total_tokens{model_name="m"} 393216.0
"""


def test_vllm_032_counts_tokens_by_source() -> None:
    reading = read_tiers(parse_metrics(VLLM_032), VLLM.tiers_for("0.32.0"), "m")
    assert reading is not None and reading.source == "by_source"
    assert (reading.device, reading.host, reading.external) == (1000, 500, 100)
    assert reading.connector == 600 and reading.load_bytes == 32000


def test_vllm_024_counts_host_tokens_by_source_equal_to_its_bytes() -> None:
    reading = read_tiers(parse_metrics(VLLM_024), VLLM.tiers_for("0.24.0"), "m")
    assert reading is not None and reading.source == "by_source"
    assert (reading.device, reading.host, reading.external) == (17_968, 77_040, 0)
    assert reading.connector == 77_040
    # The host tokens are the bytes loaded back over the bytes per token, exactly.
    assert reading.load_bytes == 77_040 * 65_536 and reading.store_bytes == 13_442_744_320
    endpoint = HttpEndpoint(
        "http://x.test/v1",
        timeout=5.0,
        transport=httpx2.MockTransport(lambda _: httpx2.Response(200, text=VLLM_024)),
    )
    counters_now = VLLM.read_counters(endpoint, "m", "0.24.0")
    assert counters_now is not None and counters_now.hits == 17_968 + 77_040
    assert counters_now.counter == (
        'vllm:prefix_cache_hits_total + vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}'
    )


def test_a_vllm_counting_bytes_only_gives_transfers() -> None:
    reading = read_tiers(parse_metrics(VLLM_BYTES_ONLY), VLLM.tiers_for("0.24.0"), "m")
    assert reading is not None and reading.source == "transfers"
    assert (reading.device, reading.host, reading.external) == (None, None, None)
    assert (reading.load_bytes, reading.store_bytes) == (65536, 131072)


def test_sglang_counts_tokens_by_cache_source() -> None:
    reading = read_tiers(parse_metrics(SGLANG_METRICS), SGLANG.tiers_for("0.5.23"), "m")
    assert reading is not None and reading.source == "by_source"
    assert (reading.device, reading.host, reading.external) == (700, 250, 50)


def test_a_server_without_tiers_gives_no_reading() -> None:
    plain = 'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 5.0\n'
    assert read_tiers(parse_metrics(plain), VLLM.tiers_for("0.24.0"), "m") is None
    # SGLang without HiCache labels its hits "total" (or device only): nothing below the GPU.
    total_only = 'sglang:cached_tokens_total{cache_source="total",model_name="m"} 5.0\n'
    assert read_tiers(parse_metrics(total_only), SGLANG.tiers_for(None), "m") is None
    # vLLM 0.32 without a connector: GPU hits by source, host 0.
    device_only = 'vllm:prompt_tokens_cached_by_source_total{model_name="m",source="device"} 5.0\n'
    idle = read_tiers(parse_metrics(device_only), VLLM.tiers_for("0.32.0"), "m")
    assert idle is not None and (idle.device, idle.host) == (5, 0)


def test_two_workers_readings_sum_by_tier_and_a_mixed_pair_sums_as_transfers() -> None:
    """A router's workers are summed (CacheCounters.plus): their tiers too."""
    new = read_tiers(parse_metrics(VLLM_032), VLLM.tiers_for("0.32.0"), "m")
    old = read_tiers(parse_metrics(VLLM_BYTES_ONLY), VLLM.tiers_for("0.24.0"), "m")
    assert new is not None and old is not None
    both = new.plus(new)
    assert both.source == "by_source" and (both.device, both.host, both.external) == (2000, 1000, 200)
    assert both.connector == 1200 and both.load_bytes == 64000 and both.store_bytes is None
    mixed = new.plus(old)
    assert mixed.source == "transfers" and (mixed.device, mixed.host) == (None, None)
    assert mixed.load_bytes == 32000 + 65536 and mixed.connector is None
    endpoint = HttpEndpoint(
        "http://x.test/v1",
        timeout=5.0,
        transport=httpx2.MockTransport(lambda _: httpx2.Response(200, text=VLLM_032)),
    )
    one = VLLM.read_counters(endpoint, "m", "0.32.0")
    assert one is not None
    summed = one.plus(one)
    assert summed.hits == 3200 and summed.tiers == new.plus(new)


def test_vllm_hit_counter_reads_with_what_the_connector_supplied() -> None:
    """vLLM's prefix_cache_hits leaves out host hits its responses count: the reading adds them."""
    endpoint = HttpEndpoint(
        "http://x.test/v1",
        timeout=5.0,
        transport=httpx2.MockTransport(lambda _: httpx2.Response(200, text=VLLM_032)),
    )
    reading = VLLM.read_counters(endpoint, "m", "0.32.0")
    assert reading is not None
    assert reading.hits == 1600
    assert reading.counter == "vllm:prefix_cache_hits_total + vllm:external_prefix_cache_hits_total"
    assert reading.tiers is not None and reading.tiers.host == 500


def test_doctor_reads_the_host_tier_from_the_server(tmp_path: Path) -> None:
    """vLLM: the offloading labels of cache_config_info; SGLang: server_info and its capacity gauge."""
    vllm = FakeEngine(engine="vllm", tiers="vllm-by-source")
    with connect(URL, transport=vllm.transport()) as backend:
        (info,) = backend.servers
        assert info.host_tier == HostTier("native", size_bytes=24 << 30)
        text = diagnose(backend, probe=False).to_text()
    assert "host tier native, 24.0 GiB" in text
    sglang = FakeEngine(engine="sglang", tiers="sglang-hicache")
    with connect(URL, transport=sglang.transport()) as backend:
        (info,) = backend.servers
        assert info.host_tier == HostTier("hicache", size_bytes=24 * 10**9, size_tokens=393_216)
        assert diagnose(backend, probe=False).to_dict()["servers"][0]["host_tier"]["size_tokens"] == 393_216
    # --hicache-size is per rank: a server of 4 tensor-parallel ranks keeps 4 times as much.
    with connect(
        URL, transport=FakeEngine(engine="sglang", tiers="sglang-hicache", tp_size=4).transport()
    ) as backend:
        assert backend.servers[0].host_tier == HostTier(
            "hicache", size_bytes=4 * 24 * 10**9, size_tokens=393_216
        )
    with connect(URL, transport=FakeEngine(engine="vllm").transport()) as backend:
        assert backend.servers[0].host_tier is None
        assert "host tier: none seen" in diagnose(backend, probe=False).to_text()
    assert "write-back" in HostTier("hicache", inclusive=False).describe()


# -- sessions against a fake engine with a host tier ------------------------------------------


def _revisit(tiers: str, engine: str, tmp_path: Path) -> tuple[FakeEngine, Session, Session]:
    """Packs A then B then A again on a GPU that holds one prompt: A's second visit hits the host."""
    fake = FakeEngine(engine=engine, tiers=tiers, gpu_prompts=1, block=1)
    store = Store.open(tmp_path / "home")
    backend = connect(URL, transport=fake.transport())
    first, second = Session(backend, _pack("a"), store=store), Session(backend, _pack("b"), store=store)
    first.ask("what does a say?")
    second.ask("what does b say?")
    assert counters.wait_for_checks(10)
    return fake, first, second


@pytest.mark.parametrize(
    ("tiers", "engine"), [("vllm-by-source", "vllm"), ("vllm-024", "vllm"), ("vllm-transfers", "vllm")]
)
def test_a_host_hit_on_vllm_matches_its_counters_and_shows_in_the_report(
    tiers: str, engine: str, tmp_path: Path
) -> None:
    fake, first, _ = _revisit(tiers, engine, tmp_path)
    before = fake.host_hits_total
    answer = first.ask("and what else does a say?")
    assert counters.wait_for_checks(10)
    host = fake.host_hits_total - before
    assert host > 500  # the pack came back from the host, most of it
    # vLLM does not split per request.
    assert answer.usage.host_cached_tokens is None
    report = first.report()
    check = report.counter_check
    assert check is not None and check.matches, check
    assert check.host_tokens == host
    assert check.loaded_bytes == host * fake.bytes_per_token
    assert check.tier_source == ("transfers" if tiers == "vllm-transfers" else "by_source")
    if tiers == "vllm-by-source":
        assert check.counter == "vllm:prefix_cache_hits_total + vllm:external_prefix_cache_hits_total"
    if tiers == "vllm-024":
        assert "external_kv_transfer" in check.counter
    # Only the revisit's window had host hits; the report's split sums its windows.
    tiers_split = report.cached_by_tier
    assert tiers_split is not None and tiers_split.host == host
    assert tiers_split.device + tiers_split.host + tiers_split.external == report.cached_tokens
    text = " ".join(report.to_text().split())
    assert f"host {host:,}" in text and "MISMATCH" not in text
    if tiers == "vllm-transfers":
        assert "from host memory" in check.note and "counts bytes only" in check.note


def test_sglang_reports_the_split_per_request_and_its_counters_agree(tmp_path: Path) -> None:
    fake, first, _ = _revisit("sglang-hicache", "sglang", tmp_path)
    before = fake.host_hits_total
    answer = first.ask("and what else does a say?")
    assert counters.wait_for_checks(10)
    host = fake.host_hits_total - before
    assert fake.chat_bodies[-1]["return_cached_tokens_details"] is True
    assert answer.usage.host_cached_tokens == host > 500
    assert answer.usage.device_cached_tokens == (answer.usage.cached_tokens or 0) - host
    report = first.report()
    assert report.counter_check is not None and report.counter_check.matches
    split = report.cached_by_tier
    assert split is not None and split.source == "responses" and split.host == host
    assert report.to_dict()["cached_by_tier"]["host"] == host
    assert f"({host:,} from host memory)" in answer.usage.summary_line()


def test_a_server_without_a_tier_reports_no_split(tmp_path: Path) -> None:
    fake = FakeEngine(block=1)
    with connect(URL, transport=fake.transport()) as backend:
        session = Session(backend, _pack("a"), store=Store.open(tmp_path / "home"))
        session.ask("q?")
        session.ask("q2?")
        assert counters.wait_for_checks(10)
        report = session.report()
    assert report.cached_by_tier is None and report.to_dict()["cached_by_tier"] is None
    assert report.counter_check is not None and report.counter_check.tier_source is None
    assert "return_cached_tokens_details" not in fake.chat_bodies[-1]


# -- combining windows ------------------------------------------------------------------------


def _check(before: int, after: int, reported: int, **tiers: object) -> CounterCheckRecord:
    return CounterCheckRecord("s", None, URL, "c", before, after, reported, 1, **tiers)  # type: ignore[arg-type]


def test_transfer_only_windows_count_the_inferred_host_tokens_once_each() -> None:
    checks = [
        _check(0, 100, 300, window_id="w1", host_tokens=200, loaded_bytes=200 * 64, tier_source="transfers"),
        _check(100, 250, 150, window_id="w2", host_tokens=0, loaded_bytes=0, tier_source="transfers"),
    ]
    combined = combine_checks(checks)
    assert combined is not None and combined.matches
    assert (combined.server_delta, combined.reported, combined.host_tokens) == (450, 450, 200)
    assert combined.loaded_bytes == 200 * 64


def test_a_window_whose_hits_nothing_explains_is_still_a_mismatch() -> None:
    # 0.24, no bytes came back: the reported tokens the GPU counter lacks are not host hits.
    checks = [_check(0, 100, 300, host_tokens=0, loaded_bytes=0, tier_source="transfers")]
    combined = combine_checks(checks)
    assert combined is not None and combined.matches is False
    # A growth below what was reported reads "N tokens fewer", never a negative "more".
    assert "200 tokens fewer" in combined.note and "more" not in combined.note


def test_the_report_splits_a_window_it_shares_no_more_than_its_own_cached_tokens() -> None:
    usage = Usage(1000, 800, None, 3, 1.0, 1.0)
    record = RequestRecord("r", "s", None, "turn", 0.0, URL, "vllm", "m", usage, 1)
    check = CounterCheck("c", 1200, 800, True, host_tokens=1000, external_tokens=0, tier_source="by_source")
    report = build_report([record], title="t", counter_check=check)
    split = report.cached_by_tier
    assert split is not None and (split.device, split.host) == (0, 800)
    assert split.source == "counters (by_source)"
    assert (
        build_report([record], title="t", counter_check=replace(check, tier_source=None)).cached_by_tier
        is None
    )


def test_offload_prefix_only_caps_what_a_request_offloads_to_the_pack(tmp_path: Path) -> None:
    """vLLM's per-request cap: the shared pack goes to host memory, not each question and answer."""
    pack = replace(_pack("a"), summary={"title": "a", "total_tokens": 1234})
    request = RequestOptions(offload_prefix_only=True, extra_body={"kv_transfer_params": {"keep": 1}})
    fake = FakeEngine(engine="vllm", tiers="vllm-by-source", block=1)
    with connect(URL, transport=fake.transport()) as backend:
        Session(backend, pack, store=Store.open(tmp_path / "home"), request=request).ask("q?")
    assert fake.chat_bodies[-1]["kv_transfer_params"] == {"keep": 1, "max_offload_tokens": 1234}
    # Off by default; and a server without a host tier is sent no cap.
    plain = FakeEngine(engine="vllm", block=1)
    with connect(URL, transport=plain.transport()) as backend:
        Session(backend, pack, store=Store.open(tmp_path / "h2"), request=request).ask("q?")
        Session(backend, pack, store=Store.open(tmp_path / "h3")).ask("q?")
    assert plain.chat_bodies[0]["kv_transfer_params"] == {"keep": 1}
    assert "kv_transfer_params" not in plain.chat_bodies[1]
    assert RequestOptions.from_dict(request.to_dict()).offload_prefix_only is True
