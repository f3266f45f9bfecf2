"""Benchmark: the cache canary on a server, and the divergence figures for docs/benchmarks.md.

For each repeat, ``longctx.verification.canary`` asks its probe (PROBE_LINES records,
about 17 tokens a line) cold, cold again under another salt, from the
cache, and, with ``--host-tier``, once more after filling the device cache
under another salt with FILL_TOKENS tokens, so the probe's blocks are read
back from the host tier on a server that offloads (vLLM
``--kv-offloading-backend native``) and recomputed on one that does not.
Each run's figures (largest logprob difference against the cold run,
cached tokens, the tier the host-tier run was served from, the server's
offload counters) go to ``--json``. ``--section`` renders one or more such
files as the ``gpu-canary`` section of docs/benchmarks.md (``--write``
replaces it there).

On the GPU machine: ``benchmarks/gpu/canary.sh PARTS OUT`` (a server
without and one with native CPU offloading, one after the other). Against
any running server:

    python benchmarks/canary.py --base-url http://127.0.0.1:8000/v1 --label cpu --json /tmp/canary.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

SECTION = "gpu-canary"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from longctx import CanaryOptions, canary, connect

    options = CanaryOptions(
        max_tokens=args.answer_tokens,
        compare_tokens=min(args.answer_tokens, 16),
        host_tier=args.host_tier,
        fill_tokens=args.fill_tokens,
        probe_lines=args.probe_lines,
    )
    runs = []
    with connect(args.base_url) as backend:
        info = backend.info
        for repeat in range(args.repeats):
            started = time.perf_counter()
            result = canary(backend, options=options)
            seconds = time.perf_counter() - started
            row = {"repeat": repeat, "seconds": round(seconds, 2), **result.to_dict()}
            runs.append(row)
            print(result.to_text(), file=sys.stderr)
        offload = {
            f"{s.name}{{{','.join(f'{k}={v}' for k, v in sorted(s.labels.items()) if k != 'model_name')}}}": s.value
            for s in backend.metric_samples()
            if "offload" in s.name or "by_source" in s.name or s.labels.get("cache_source") == "host"
        }
    return {
        "label": args.label,
        "where": args.where,
        "flags": args.flags,
        "engine": info.engine,
        "version": info.version,
        "kv_cache_tokens": info.kv_cache_tokens,
        "options": {
            "answer_tokens": options.max_tokens,
            "compare_tokens": options.compare_tokens,
            "probe_lines": options.probe_lines,
            "host_tier": options.host_tier,
            "fill_tokens": options.fill_tokens,
            "margin": options.margin,
            "floor": options.floor,
        },
        "runs": runs,
        "offload_counters": offload,
        "finished": time.time(),
    }


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def _counted(counters: dict[str, float]) -> dict[str, float]:
    """The counters a reader compares: running totals, without histogram buckets and creation stamps."""
    return {
        name: value
        for name, value in counters.items()
        if name.split("{")[0].endswith(("_total", "_sum")) and "_size_" not in name
    }


def section(results: list[dict[str, Any]]) -> str:
    """The docs/benchmarks.md section for one or more result files (one per server setting)."""
    first = results[0]
    lines = [
        "## The cache canary on the GPU (cold vs cached vs host tier)",
        "",
        f"{first['where']}. The probe: {first['options']['probe_lines']} records (greedy,"
        f" {first['options']['answer_tokens']} answer tokens, logprobs of the first"
        f" {first['options']['compare_tokens']} compared); the host-tier run follows a fill of"
        f" {first['options']['fill_tokens'] or '1.25x the KV cache'} tokens under another salt."
        f" Tolerance: max({first['options']['margin']:g} x the cold-vs-cold spread,"
        f" floor {first['options']['floor']:g} nats). Written by `benchmarks/canary.py --section --write`.",
        "",
        "| server | run | verdict | cold vs cold | cold vs cached | cold vs host tier | host-tier run |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    notes: list[str] = []
    for result in results:
        for run in result["runs"]:
            by_run = {c["run"]: c for c in run["comparisons"]}
            host = by_run.get("host tier")
            tier = next((r["tier"] for r in run["runs"] if r["label"] == "host tier"), None)
            cached = next(r for r in run["runs"] if r["label"] == "cached")
            lines.append(
                f"| {result['label']} (`{result['flags']}`) | {run['repeat'] + 1} | {run['verdict']} |"
                f" {_figure(run['spread']['largest_difference'])} |"
                f" {_figure(by_run['cached']['largest_difference'])}"
                f" ({cached['cached_tokens']:,} of {cached['prompt_tokens']:,} cached) |"
                f" {_figure(host['largest_difference']) if host else 'n/a'} | {tier or 'n/a'} |"
            )
        counted = _counted(result["offload_counters"])
        if counted:
            counters = ", ".join(f"`{name}` {value:,.0f}" for name, value in counted.items())
            notes.append(f"{result['label']}: offload counters at the end: {counters}.")
    # After the table: a line between its rows would end it.
    for note in notes:
        lines += ["", note]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--label", default="server")
    parser.add_argument("--where", default="", help="the machine and server, for the report")
    parser.add_argument("--flags", default="", help="the server's distinguishing flags, for the report")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--probe-lines", type=int, default=2000, help="about 17 tokens a line")
    parser.add_argument("--host-tier", action="store_true", help="add the run after filling the device cache")
    parser.add_argument("--fill-tokens", type=int, default=None)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--section", type=Path, nargs="*", help="render these result files instead")
    parser.add_argument(
        "--write", action="store_true", help="with --section: write it into docs/benchmarks.md"
    )
    args = parser.parse_args()
    if args.section:
        body = section([json.loads(path.read_text()) for path in args.section])
        if args.write:
            from bench import write_section

            write_section(SECTION, body)
        else:
            print(body)
        return
    result = measure(args)
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
