"""Turn the GPU benchmark's results-*.json into docs/benchmarks.md's GPU siblings section.

Usage: python benchmarks/gpu/report.py OUT/results-h200*.json [--write]
Without --write the section is printed; with it, it replaces the section between its markers:
"gpu-siblings" for a vLLM run, "gpu-siblings-sglang" for an SGLang run (the engine is read from
the results). Rows a run did not reach (``bench_gpu.py --deadline``) are named, not left out silently.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import ROWS  # found through the path above

SECTIONS = {"vllm": "gpu-siblings", "sglang": "gpu-siblings-sglang"}
TITLES = {
    "vllm": "## Siblings, sessions and the CLI on a GPU",
    "sglang": "## SGLang on a GPU: siblings, sessions and the CLI",
}
ORDER = (
    "ask_many default",
    "ask_many c8",
    "ask_many c8 lead",
    "ask_many c8 together",
    "ask_many c8 admitted",
    "plain lead then 7",
    "plain all 8 doc-first",
    "plain all 8 question-first",
)
# Every row bench_gpu.py can write, to name those a run did not reach.
ALL_ROWS = tuple(dict.fromkeys((*ORDER, *ROWS)))


def cached_text(requests: list[dict[str, Any]]) -> str:
    values = [r.get("cached") for r in requests]
    if all(v is None for v in values):
        return "not reported"
    # SGLang leaves prompt_tokens_details out when nothing was cached: "n/r" (not reported).
    counts: dict[int, int] = {}
    for value in values:
        counts[-1 if value is None else value] = counts.get(-1 if value is None else value, 0) + 1
    return " + ".join(
        (f"{n} x " if n > 1 else "") + ("n/r" if v < 0 else f"{v:,}") for v, n in sorted(counts.items())
    )


def cached_ttfts(scenarios: dict[str, list[dict[str, Any]]]) -> list[float]:
    """TTFTs of a session's follow-up turns (prompt cached, sent alone): a warm start's yardstick.

    Not the siblings' cached requests: sent together, they wait for the shared prefill."""
    return [turn["ttft"] for run in scenarios.get("session 5 turns", ()) for turn in run["turns"][1:]]


def median_wall(runs: list[dict[str, Any]]) -> float:
    return statistics.median(run["wall_s"] for run in runs)


def context_section(context: dict[str, Any], block: int, dispatches: list[str]) -> list[str]:
    scenarios = context["scenarios"]
    lines = [
        f"### {context['prefix_tokens']:,}-token pack (target {context['target_tokens']:,})",
        "",
        f"Run {context['started']}.",
        "",
    ]
    when: dict[str, list[str]] = {}
    for name, started in context.get("runs", {}).items():
        when.setdefault(started, []).append(name)
    if len(when) > 1:
        lines[2] = (
            "Runs: "
            + "; ".join(f"{started} ({', '.join(names)})" for started, names in sorted(when.items()))
            + "."
        )
    asked = {f"ask_many c8 {d}" for d in dispatches}
    missing = [
        name for name in ALL_ROWS
        if name not in scenarios and not (name.startswith("ask_many c8 ") and name not in asked)
    ]  # fmt: skip
    if missing:
        stop = context.get("stopped_before")
        lines += [
            f"Not run{f' (the time limit came before {stop!r})' if stop else ''}: {', '.join(missing)}.",
            "",
        ]
    if any(name in scenarios for name in ORDER):
        lines += [
            "| client | wall s (each run) | median | cached per request | dispatch |",
            "|---|---:|---:|---|---|",
        ]
    for name in ORDER:
        runs = scenarios.get(name)
        if not runs:
            continue
        walls = ", ".join(f"{run['wall_s']:.2f}" for run in runs)
        lines.append(
            f"| {name} | {walls} | {median_wall(runs):.2f} | {cached_text(runs[-1]['requests'])}"
            f" | {runs[-1].get('dispatch') or ''} |"
        )
    verdicts = []
    if "ask_many default" in scenarios:
        ours = median_wall(scenarios["ask_many default"])
        plain = [
            median_wall(scenarios[n])
            for n in ("plain lead then 7", "plain all 8 doc-first")
            if n in scenarios
        ]
        if plain:
            best = min(plain)
            verdicts.append(
                f"ask_many default {ours:.2f} s against the fastest plain client {best:.2f} s:"
                f" {ours / best - 1:+.1%} ({'within' if ours <= best * 1.05 else 'NOT within'} 5%)"
            )
        if "plain all 8 question-first" in scenarios:
            qf = median_wall(scenarios["plain all 8 question-first"])
            verdicts.append(
                f"question-first / ask_many default: {qf / ours:.1f}x ({'at least' if qf / ours >= 4.5 else 'BELOW'} 4.5x)"
            )
    strategies = [
        (median_wall(scenarios[n]), n) for n in ORDER if n.startswith("ask_many c8") and n in scenarios
    ]
    if len(strategies) > 1:
        ranked = ", ".join(
            f"{n.removeprefix('ask_many c8').strip() or 'auto'} {w:.2f}" for w, n in sorted(strategies)
        )
        verdicts.append(f"dispatch at concurrency 8, fastest first (s): {ranked}")
    if "cli batch" in scenarios and "api batch" in scenarios:
        cli, api = median_wall(scenarios["cli batch"]), median_wall(scenarios["api batch"])
        verdicts.append(
            f"`longctx batch` {cli:.2f} s against the API's {api:.2f} s (both from start, warm store):"
            f" {cli - api:+.2f} s ({'within' if cli - api <= 0.5 else 'NOT within'} 0.5 s)"
        )
    if "cli batch" in scenarios and "api batch new process" in scenarios:
        cli, fresh = median_wall(scenarios["cli batch"]), median_wall(scenarios["api batch new process"])
        verdicts.append(
            f"`longctx batch` {cli:.2f} s against the API's {fresh:.2f} s as a new process too"
            f" (`benchmarks/batch_one.py`): {cli - fresh:+.2f} s"
        )
    lines += ["", *(f"- {v}" for v in verdicts)]
    session = scenarios.get("session 5 turns")
    if session:
        turns = session[-1]["turns"]
        lines += [
            "",
            "| turn | prompt | cached | previous prompt, rounded down to the block | whole | TTFT s |",
            "|---:|---:|---:|---:|---|---:|",
        ]
        previous = None
        for number, turn in enumerate(turns, start=1):
            expected = None if previous is None else previous - previous % block
            cached = turn["cached"]
            whole = "" if expected is None else ("yes" if (turn["cached"] or 0) >= expected else "NO")
            lines.append(
                f"| {number} | {turn['prompt']:,} | {'n/a' if cached is None else f'{cached:,}'}"
                f" | {'' if expected is None else f'{expected:,}'} | {whole} | {turn['ttft']:.3f} |"
            )
            previous = turn["prompt"]
    cold, warm = scenarios.get("first question cold"), scenarios.get("first question warm")
    if cold and warm:
        lines += [
            "",
            "| first question of a new session | runs | TTFT s (each run) | median TTFT s | cached |",
            "|---|---:|---|---:|---|",
        ]
        for name, runs in (
            ("cold (no warm start)", cold),
            (f"warm start, asked {warm[0]['wait_s']:.0f} s after opening", warm),
        ):
            ttfts = [run["requests"][0]["ttft"] for run in runs]
            lines.append(
                f"| {name} | {len(runs)} | {', '.join(f'{t:.3f}' for t in ttfts)}"
                f" | {statistics.median(ttfts):.3f} | {cached_text(runs[-1]['requests'])} |"
            )
        ratio = statistics.median(r["requests"][0]["ttft"] for r in cold) / statistics.median(
            r["requests"][0]["ttft"] for r in warm
        )
        lines += ["", f"- the warm start cut the first question's TTFT {ratio:.1f}x"]
        cached = cached_ttfts(scenarios)
        if cached:
            warm_ttft = statistics.median(r["requests"][0]["ttft"] for r in warm)
            yardstick = statistics.median(cached)
            verdict = "within" if warm_ttft <= 2 * yardstick else "NOT within"
            lines.append(
                f"- warm start's first-question TTFT {warm_ttft:.3f} s against a cached request's"
                f" {yardstick:.3f} s (median of the session's turns 2-5):"
                f" {warm_ttft / yardstick:.1f}x ({verdict} 2x)"
            )
    return lines


def section(results: dict[str, Any]) -> str:
    meta = results["meta"]
    block = meta.get("cache_block_tokens") or 16
    settings = meta.get("server_settings") or {}
    reported = ", ".join(f"{k} {v}" for k, v in settings.items())
    lines = [
        TITLES.get(meta["engine"], TITLES["vllm"]),
        "",
        f"{meta['gpu']}; {meta['engine']} {meta['version']}, model `{meta['model']}` (8B-shaped Llama, random"
        f" weights, the test suite's tiny tokenizer), window {meta['context_length']:,}, cache block {block};"
        f" Python {meta['python']}; {meta['answer_tokens']} answer tokens."
        f" Flags: `{meta['flags']}`. Written by `benchmarks/gpu/report.py` from `benchmarks/gpu/run.sh`'s"
        " JSON; every scenario under its own `cache_salt` (cold). ask_many rows time the call (pack ready);"
        " the api/cli batch rows time everything from start (the CLI as a new process).",
        "",
    ]
    if reported:
        lines[2] += f" The server reported: {reported}."
    dispatches = meta.get("dispatches") or ["lead"]  # runs before --dispatches ran lead only
    for context in results["contexts"]:
        lines += [*context_section(context, block, dispatches), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", type=Path, nargs="+", help="one or more results-*.json of one server")
    parser.add_argument("--write", action="store_true", help="write the section into docs/benchmarks.md")
    args = parser.parse_args()
    runs = [json.loads(path.read_text()) for path in args.results]
    # Several runs (one per command, to stay under a time limit) make one section, in context order;
    # a context measured again (after a change to its path) is shown from the later run only.
    # A run with --only adds its rows to the context's earlier ones (the later run's row wins), when
    # its pack is the same size; a pack that changed (the pack format did, between the runs) gets
    # its own table.
    contexts: dict[tuple[int, int], dict[str, Any]] = {}
    for run in sorted(runs, key=lambda run: run["meta"]["started"]):
        for context in run["contexts"]:
            if not context.get("scenarios"):
                continue  # a context the run stopped before
            started = run["meta"]["started"]
            key = (context["target_tokens"], context["prefix_tokens"])
            earlier = contexts.get(key)
            if earlier is None or not run["meta"].get("only"):
                contexts[key] = {**context, "started": started, "runs": {}}
            merged = contexts[key]
            if earlier is not None and run["meta"].get("only"):
                merged["scenarios"] = {**merged["scenarios"], **context["scenarios"]}
                merged["stopped_before"] = context.get("stopped_before")
            for name in context["scenarios"]:
                merged["runs"][name] = started
    merged = {**runs[-1], "contexts": [contexts[key] for key in sorted(contexts)]}
    body = section(merged)
    if args.write:
        from bench import write_section

        write_section(SECTIONS.get(merged["meta"]["engine"], SECTIONS["vllm"]), body)
    else:
        print(body)


if __name__ == "__main__":
    main()
