"""Benchmark: a job over more packs than the GPU holds, with and without a host tier.

One vLLM server whose GPU KV cache holds fewer tokens than all the packs,
and (variant ``native`` or ``lmcache``) a host tier that holds the rest; or
(variant ``none``) no host tier, for comparison. A job of PACKS packs with
QUESTIONS questions each, given in a shuffled order. Two clients do the same
(pack, question) pairs, taking turns, each run under its own ``cache_salt``:

- *longctx job*: ``longctx.Job`` (each pack's questions together, no more
  packs in flight than the GPU holds), reading and packing included;
- *plain client*: the byte-identical prompts sent in the shuffled order,
  CONCURRENCY in flight (``benchmarks/jobs.py``'s ``run_plain``).

Around every run the server's ``/metrics`` are read: the GPU hit counter,
the offloading connector's transfer counters (host -> GPU bytes loaded,
GPU -> host bytes stored) and, on newer vLLM, tokens by source. Printed and
written to JSON per run:

- prefilled tokens against the minimum (one cold prefill per pack);
- wall seconds;
- host-tier tokens as longctx's report counts them (the job's counter
  check: ``CounterCheck.host_tokens``) and as the transfer counter says
  (bytes loaded / BYTES_PER_TOKEN); they agree when the difference is at
  most one block per request.

Goals: with a host tier, longctx prefills at most 1.05x the
minimum and finishes at least 1.3x faster than the plain client on the same
server; host tokens agree with the transfer counter within a block per request.

    python benchmarks/host_tiers.py --url http://127.0.0.1:8780/v1 --variant native --work /tmp/tiers \\
        --bytes-per-token 65536 --json OUT/tiers-native.json
    python benchmarks/host_tiers.py --summarize OUT/tiers-*.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from jobs import ANSWER_TOKENS, SEED, grown, job_items, make_packs, plain_prompts, run_plain

from longctx import Job, JobItem, JobOptions
from longctx.backends.base import ServerInfo, connect
from longctx.backends.http import HttpEndpoint
from longctx.backends.metrics import Sample, parse_metrics, total
from longctx.options.groups import RequestOptions, ServerOptions
from longctx.store import Store

SECTION = "gpu-host-tiers"
PACKS = 12
QUESTIONS = 4
PACK_TOKENS = 44_000
BLOCK = 16


def log(message: str) -> None:
    print(f"[benchmarks] tiers: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Reading:
    """The server's counters at one moment (None: not exported)."""

    gpu_hits: int | None
    counted_hits: int | None
    host_by_source: int | None
    loaded_bytes: int | None
    stored_bytes: int | None
    #: Seconds the offloading connector spent loading host -> GPU (its own timer).
    load_seconds: float | None


# The connector's host -> GPU time: the flat name first (vLLM 0.24 on the H200 kept its labelled
# kv_offload_total_time_total at 0 while kv_offload_load_time_total counted 0.18 s for 5 GB).
_LOAD_TIME: tuple[tuple[str, dict[str, str]], ...] = (
    ("vllm:kv_offload_load_time_total", {}),
    ("vllm:kv_offload_total_time_total", {"transfer_type": "CPU_to_GPU"}),
)


def _load_seconds(samples: list[Sample], model: str) -> float | None:
    for name, labels in _LOAD_TIME:
        values = [
            s.value
            for s in samples
            if s.name == name
            and s.labels.get("model_name") in (None, model)
            and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        if values:
            return sum(values)
    return None


def read(info: ServerInfo) -> Reading:
    """The server's GPU hit counter, its counter as longctx reads it, and its tier counters, now."""
    endpoint = HttpEndpoint(info.api_url, timeout=30.0)
    try:
        samples = parse_metrics(endpoint.get_text("/metrics"))
        counters = info.profile.read_counters(endpoint, info.model, info.version)
    finally:
        endpoint.close()
    gpu = total(samples, "vllm:prefix_cache_hits_total", model=info.model)
    tiers = None if counters is None else counters.tiers
    return Reading(
        gpu_hits=None if gpu is None else int(gpu),
        counted_hits=None if counters is None else counters.hits,
        host_by_source=None if tiers is None else tiers.host,
        loaded_bytes=None if tiers is None else tiers.load_bytes,
        stored_bytes=None if tiers is None else tiers.store_bytes,
        load_seconds=_load_seconds(samples, info.model),
    )


def _rate(loaded: int | None, before: float | None, after: float | None) -> float | None:
    """GB per second of host -> GPU loading over the run, by the connector's own clock."""
    if not loaded or before is None or after is None or after <= before:
        return None
    return loaded / (after - before) / 1e9


@dataclass(frozen=True)
class Run:
    variant: str
    client: str
    wall_seconds: float
    requests: int
    prompt_tokens: int
    cached_tokens: int
    minimum: int
    gpu_hits: int | None
    loaded_bytes: int | None
    stored_bytes: int | None
    #: Host-tier tokens as longctx counts them: the job's counter check; for the plain
    #: client the same rule by hand (cached tokens reported less the GPU counter's growth).
    host_tokens_reported: int | None
    #: The same from the transfer counter: bytes loaded / bytes per token.
    host_tokens_from_bytes: float | None
    counter_check: dict[str, object] | None = None
    #: Host -> GPU bytes per second of the connector's own load time (the PCIe/NVLink rate it got).
    load_gb_per_second: float | None = None

    @property
    def prefilled(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def host_tokens_agree(self) -> bool | None:
        if self.host_tokens_reported is None or self.host_tokens_from_bytes is None:
            return None
        return abs(self.host_tokens_reported - self.host_tokens_from_bytes) <= BLOCK * self.requests


def run_longctx(*, info: ServerInfo, items: list[JobItem], home: Path, variant: str, per_token: int) -> Run:
    request = RequestOptions(max_tokens=ANSWER_TOKENS, temperature=0.0, cache_salt=uuid.uuid4().hex)
    before = read(info)
    with Store.open(home) as store, connect(ServerOptions(base_url=info.api_url)) as backend:
        started = time.perf_counter()
        report = Job(items, backend=backend, store=store, request=request, options=JobOptions()).run()
        wall = time.perf_counter() - started
    time.sleep(1.0)  # the engine publishes its counters a moment after the last response
    after = read(info)
    if report.failed:
        raise RuntimeError(f"longctx job failed: {report.failed[0].error}")
    firsts: dict[tuple[str, ...], int] = {}
    for result in report.results:
        assert result.usage is not None
        firsts.setdefault(result.item.paths, result.usage.prompt_tokens or 0)
    loaded = grown(before.loaded_bytes, after.loaded_bytes)
    check = report.counter_check
    return Run(
        variant, "longctx job", wall, len(report.results), report.prompt_tokens, report.cached_tokens,
        sum(firsts.values()), grown(before.gpu_hits, after.gpu_hits), loaded,
        grown(before.stored_bytes, after.stored_bytes),
        None if check is None else check.host_tokens,
        None if loaded is None else loaded / per_token,
        None if check is None else asdict(check),
        _rate(loaded, before.load_seconds, after.load_seconds),
    )  # fmt: skip


def run_plain_measured(
    *,
    info: ServerInfo,
    items: list[JobItem],
    prompts: list[list[dict[str, str]]],
    variant: str,
    per_token: int,
) -> Run:
    before = read(info)
    plain = run_plain([info.api_url], items, prompts)
    time.sleep(1.0)
    after = read(info)
    gpu = grown(before.gpu_hits, after.gpu_hits)
    loaded = grown(before.loaded_bytes, after.loaded_bytes)
    # The engine's own host tokens where it counts them (vLLM 0.24's external_kv_transfer), else the
    # report's rule for a server counting bytes only: the cached tokens its GPU counter lacks.
    host = grown(before.host_by_source, after.host_by_source)
    if host is None and gpu is not None and loaded is not None:
        host = max(0, plain.cached_tokens - gpu) if loaded else 0
    return Run(
        variant, "plain client, shuffled", plain.wall_seconds, len(items), plain.prompt_tokens,
        plain.cached_tokens, plain.minimum, gpu, loaded, grown(before.stored_bytes, after.stored_bytes),
        host, None if loaded is None else loaded / per_token, None,
        _rate(loaded, before.load_seconds, after.load_seconds),
    )  # fmt: skip


def measure(args: argparse.Namespace, save: Callable[[list[Run]], None] = lambda runs: None) -> list[Run]:
    """Alternate the two clients for ``args.repetitions`` rounds; ``save`` hears the runs after each one.

    With ``args.stop_by`` (a Unix time) a run that would likely end after it
    is not started: its length is guessed as the longest run so far of the
    same client (the first runs always start), so a device call that must
    end in time keeps what it measured.
    """
    url = args.url
    with connect(ServerOptions(base_url=url)) as backend:
        (server,) = backend.servers
        log(f"{url}: GPU KV {server.kv_cache_tokens or 0:,} tokens; "
            f"{server.host_tier.describe() if server.host_tier else 'no host tier seen'}")  # fmt: skip
    folders = make_packs(args.work / "tier-packs", args.packs, args.pack_tokens)
    items = job_items(folders, args.questions)
    prompts = plain_prompts([url], items, args.work / "tier-home-prompts")
    runs: list[Run] = []
    longest: dict[str, float] = {}
    for number in range(args.repetitions):
        order = ("longctx", "plain") if number % 2 == 0 else ("plain", "longctx")
        for client in order:
            if args.stop_by and client in longest and time.time() + longest[client] * 1.2 > args.stop_by:
                log(f"#{number + 1} {client}: not started, it would end after --stop-by")
                continue
            if client == "longctx":
                with tempfile.TemporaryDirectory(dir=args.work) as home:
                    run = run_longctx(
                        info=server,
                        items=items,
                        home=Path(home),
                        variant=args.variant,
                        per_token=args.bytes_per_token,
                    )
            else:
                run = run_plain_measured(
                    info=server,
                    items=items,
                    prompts=prompts,
                    variant=args.variant,
                    per_token=args.bytes_per_token,
                )
            log(
                f"#{number + 1} {args.variant} {run.client}: {run.wall_seconds:.2f} s, prefilled "
                f"{run.prefilled:,} of {run.prompt_tokens:,} ({run.prefilled / run.minimum:.2f}x the minimum "
                f"{run.minimum:,}); host tokens {run.host_tokens_reported} reported, "
                f"{run.host_tokens_from_bytes} from bytes (agree: {run.host_tokens_agree})"
            )
            runs.append(run)
            longest[client] = max(longest.get(client, 0.0), run.wall_seconds)
            save(runs)
    return runs


def summarize(paths: list[Path]) -> str:
    """A markdown table over the variants' JSON files, with the goals."""
    rows = [
        "| variant | client | runs | median wall s | prefilled vs minimum | host tokens (report) |"
        " host tokens (bytes / bytes per token) | agree within a block per request | host -> GPU GB/s |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    goals: list[str] = []
    for path in paths:
        data = json.loads(path.read_text())
        runs = data["runs"]
        medians: dict[str, float] = {}
        for client in dict.fromkeys(run["client"] for run in runs):
            mine = [run for run in runs if run["client"] == client]
            wall = statistics.median(run["wall_seconds"] for run in mine)
            ratio = statistics.median(
                (run["prompt_tokens"] - run["cached_tokens"]) / run["minimum"] for run in mine
            )
            medians[client], medians[f"{client} ratio"] = wall, ratio
            host = [run["host_tokens_reported"] for run in mine]
            from_bytes = [run["host_tokens_from_bytes"] for run in mine]
            agree = [
                None if r is None or b is None else abs(r - b) <= BLOCK * run["requests"]
                for r, b, run in zip(host, from_bytes, mine, strict=True)
            ]
            rows.append(
                f"| {data['variant']} | {client} | {len(mine)} | {wall:.2f} | {ratio:.2f}x | {host} | "
                f"{[None if b is None else round(b) for b in from_bytes]} | {agree} | "
                f"{[None if r is None else round(r, 1) for r in (run.get('load_gb_per_second') for run in mine)]} |"
            )
        if "longctx job" in medians and "plain client, shuffled" in medians:
            speedup = medians["plain client, shuffled"] / medians["longctx job"]
            ratio = medians["longctx job ratio"]
            goals.append(
                f"- {data['variant']}: longctx {ratio:.2f}x the minimum (goal <= 1.05: "
                f"{'met' if ratio <= 1.05 else 'NOT met'}), {speedup:.2f}x faster than the plain client "
                + (
                    "(no host tier: for comparison)"
                    if data["variant"] == "none"
                    else f"(goal >= 1.3: {'met' if speedup >= 1.3 else 'NOT met'})"
                )
            )
        goals.append(f"- {data['variant']}: {data['where']}{_plan_against_engine(data)}")
        counters = _lmcache_counters(path, data)
        if counters:
            goals.append(counters)
    heading = [
        "## A job larger than the GPU's KV cache, with a host tier and without",
        "",
        "longctx's job against a plain client sending the same (pack, question) pairs shuffled, on one"
        " server per variant. Host tokens: as longctx's report counts them (the job's counter check;"
        " the plain client's by the same rule) and as the engine's transfer counter implies (bytes"
        " loaded back / bytes per token). Written by `benchmarks/host_tiers.py --summarize FILES --write`.",
        "",
    ]
    return "\n".join([*heading, *rows, "", *goals])


def _plan_against_engine(data: dict[str, Any]) -> str:
    """The host tier's tokens at the engine's own bytes per token, against the plan's.

    The engine's bytes per token are the bytes it loaded back host -> GPU
    over the tokens it counted as loaded from the connector (vLLM 0.24:
    ``kv_offload_load_bytes`` over ``prompt_tokens_by_source{external_kv_transfer}``).
    Stored bytes over prefilled tokens would undercount: a request's last,
    partial block is prefilled but never offloaded.
    """
    pairs = [
        (run["loaded_bytes"], run["host_tokens_reported"])
        for run in data["runs"]
        if run.get("loaded_bytes") and run.get("host_tokens_reported")
    ]
    gib = data.get("host_gib")
    if not pairs or not gib:
        return ""
    per_token = sum(b for b, _ in pairs) / sum(t for _, t in pairs)
    implied = int(gib * (1 << 30) // per_token)
    text = (
        f"; the engine moved {per_token:,.0f} bytes per host-tier token (bytes loaded / tokens it"
        f" counted as loaded), so its {gib:g} GiB hold {implied:,} tokens"
    )
    plan = data.get("plan_host_tokens")
    if plan:
        text += f" (`longctx plan`: {plan:,}, {abs(plan - implied) / implied:.1%} apart; goal within 2%)"
    return text


#: LMCache's chunk (its default, which the benchmark keeps: the server logs ``chunk_size=256``).
LMCACHE_CHUNK_TOKENS = 256


def _lmcache_counters(path: Path, data: dict[str, Any]) -> str:
    """The report's host tokens against LMCache's own count of chunks loaded, when the call kept them.

    host-tiers.sh saves LMCache's ``/metrics`` (its HTTP server, :8080)
    before and after the runs as ``lmcache-metrics-start.txt`` and
    ``-end.txt`` beside the JSON; over the whole call, the report's host
    tokens (every run's) should equal the chunks LMCache loaded back times
    its chunk size, within a block per request (a load ends mid-chunk).
    """
    start, end = path.parent / "lmcache-metrics-start.txt", path.parent / "lmcache-metrics-end.txt"
    if not (start.exists() and end.exists()):
        return ""

    def loaded(file: Path) -> float:
        return total(parse_metrics(file.read_text()), "lmcache_mp_num_chunks_loaded_total") or 0.0

    chunks = loaded(end) - loaded(start)
    reported = sum(run["host_tokens_reported"] or 0 for run in data["runs"])
    requests = sum(run["requests"] for run in data["runs"])
    tier_tokens = chunks * LMCACHE_CHUNK_TOKENS
    agree = abs(reported - tier_tokens) <= BLOCK * requests
    return (
        f"- {data['variant']} ({path.parent.name}): LMCache's own counter: {chunks:,.0f} chunks of"
        f" {LMCACHE_CHUNK_TOKENS} tokens loaded back = {tier_tokens:,.0f} tokens; the report's host"
        f" tokens over the same {len(data['runs'])} runs: {reported:,}; difference"
        f" {abs(reported - tier_tokens):,.0f} (a block per request: {BLOCK * requests:,}; agree: {agree})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url")
    parser.add_argument("--variant", default="native", help="native, lmcache or none (a label)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/longctx-tiers"))
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--packs", type=int, default=PACKS)
    parser.add_argument("--pack-tokens", type=int, default=PACK_TOKENS)
    parser.add_argument("--questions", type=int, default=QUESTIONS)
    parser.add_argument(
        "--bytes-per-token", type=int, default=65_536, help="KV bytes per token (longctx plan)"
    )
    parser.add_argument("--plan-host-tokens", type=int, help="the host tier's tokens as `longctx plan` says")
    parser.add_argument("--host-gib", type=float, help="the host tier's size (--kv-offloading-size)")
    parser.add_argument("--where", default="one vLLM server")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--stop-by", type=float, help="a Unix time: start no run likely to end after it")
    parser.add_argument("--summarize", type=Path, nargs="*")
    parser.add_argument(
        "--write",
        action="store_true",
        help=f"with --summarize: write the {SECTION} section of docs/benchmarks.md",
    )
    args = parser.parse_args()
    if args.summarize:
        body = summarize(args.summarize)
        if args.write:
            from bench import write_section

            write_section(SECTION, body)
        print(body)
        return
    if not args.url:
        parser.error("--url is needed (or --summarize FILES)")
    args.work.mkdir(parents=True, exist_ok=True)

    def save(runs: list[Run]) -> None:
        if args.json:
            args.json.write_text(json.dumps(results(args, runs), indent=2))

    runs = measure(args, save)
    save(runs)
    if args.json:
        print(summarize([args.json]))


def results(args: argparse.Namespace, runs: list[Run]) -> dict[str, Any]:
    """What --json holds: the workload, the server, and every run so far."""
    return {
        "variant": args.variant,
        "where": args.where,
        "seed": SEED,
        "workload": {"packs": args.packs, "pack_tokens": args.pack_tokens, "questions": args.questions},
        "bytes_per_token": args.bytes_per_token,
        "plan_host_tokens": args.plan_host_tokens,
        "host_gib": args.host_gib,
        "runs": [
            {**asdict(run), "prefilled": run.prefilled, "host_tokens_agree": run.host_tokens_agree}
            for run in runs
        ],
    }


if __name__ == "__main__":
    main()
