"""``longctx lint`` beside kvlint on the same logs; writes the ``traffic-kvlint`` section of docs/benchmarks.md.

Standalone (not run by ``benchmarks/run``): kvlint lives in a virtual
environment of its own, and none of its code is used here, only its command
and its JSON report. Usage::

    python -m venv /tmp/kvlint-venv && /tmp/kvlint-venv/bin/pip install kvlint==0.1.1
    benchmarks/traffic/kvlint_side_by_side.py --kvlint /tmp/kvlint-venv/bin/kvlint \\
        --model-dir .cache/harness/models/tiny-llama-* [--write]

The logs: ``make_logs.py``'s four and kvlint's own demo log (``kvlint demo``),
tokenized by both with the model folder's tokenizer and chat template, vLLM's
block 16, an unbounded KV cache.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench import machine, write_section  # type: ignore[import-not-found]  # noqa: E402 - the benchmarks' own helpers
from make_logs import main as make_logs  # noqa: E402

LOGS = ("kvlint-demo", "longctx-siblings", "plain-client", "agent-loop", "tool-order")


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=False, capture_output=True)
    return time.perf_counter() - started


def row(name: str, ours: dict[str, Any], theirs: dict[str, Any], seconds: tuple[float, float]) -> str:
    sims = {sim["engine"]: sim["per_request"] for sim in theirs["sims"]}
    requests = ours["requests"]
    n = len(requests)
    engines = [model["engine"] for model in ours["models"]]
    same_prompt = sum(
        r["prompt_tokens"] == k["prompt_tokens"] for r, k in zip(requests, sims["vllm"], strict=True)
    )
    total = sum(r["prompt_tokens"] for r in requests)
    theirs_total = sum(k["prompt_tokens"] for k in sims["vllm"])
    cells = []
    for engine in engines:
        same = sum(
            r["cached"][engine] == k["cached_tokens"] for r, k in zip(requests, sims[engine], strict=True)
        )
        mine = sum(r["cached"][engine] for r in requests) / total
        other = sum(k["cached_tokens"] for k in sims[engine]) / theirs_total
        cells.append(f"{mine:.1%} / {other:.1%} ({same}/{n})")
    causes = Counter(f["cause"] for r in requests for f in r["findings"])
    rules = {f["rule_id"]: len(f["affected_request_ids"]) for f in theirs["findings"]}
    return (
        f"| {name} | {n} | {total:,} / {theirs_total:,} ({same_prompt}/{n}) | {' | '.join(cells)} "
        f"| {', '.join(f'{c} {k}' for c, k in sorted(causes.items())) or '-'} "
        f"| {', '.join(f'{c} {k}' for c, k in sorted(rules.items())) or '-'} "
        f"| {seconds[0]:.1f} / {seconds[1]:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kvlint", required=True, help="kvlint's command, in its own virtual environment")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--write", action="store_true", help="rewrite the section of docs/benchmarks.md")
    arguments = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvlint-side-by-side-"))
    make_logs(work)
    subprocess.run([arguments.kvlint, "demo", "--out", str(work / "kvlint-demo.jsonl"), "--model", arguments.model_dir],
                   check=True, capture_output=True)  # fmt: skip
    longctx = [sys.executable, "-m", "longctx", "lint"]
    version = subprocess.run(
        [arguments.kvlint, "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    rows = []
    for name in LOGS:
        log = work / f"{name}.jsonl"
        ours_json, theirs_json = work / f"{name}.longctx.json", work / f"{name}.kvlint.json"
        ours_seconds = timed(
            [*longctx, str(log), "--model-dir", arguments.model_dir, "--format", "json", "-o", str(ours_json)]
        )
        theirs_seconds = timed(
            [arguments.kvlint, "lint", str(log), "--model", arguments.model_dir, "--json", str(theirs_json)]
        )
        rows.append(
            row(
                name,
                json.loads(ours_json.read_text()),
                json.loads(theirs_json.read_text()),
                (ours_seconds, theirs_seconds),
            )
        )
    body = "\n".join(
        [
            "## Traffic lint: `longctx lint` beside kvlint on the same logs",
            "",
            f"`benchmarks/traffic/kvlint_side_by_side.py` ({version or 'kvlint'}, in its own virtual environment): five "
            "request logs, each tokenized by both tools with the test model's tokenizer and chat template "
            "(offline, a model folder), vLLM's block 16, SGLang's page 1, no KV limit. *longctx-siblings*: six "
            "questions over one pack of `longctx/lint`, as longctx sends them; *plain-client*: the same questions "
            "first, then the files; *agent-loop*: an agent's growing conversation with a clock in its system "
            "prompt; *tool-order*: one tool list with its keys in another order each time (the test model's "
            "template does not render tools); *kvlint-demo*: kvlint's own synthetic support workload "
            f"(`kvlint demo`). Each cell: longctx / kvlint, and in brackets the requests whose figure is the same. "
            f"Machine: {machine()}.",
            "",
            "| log | requests | prompt tokens | vLLM hit rate | SGLang hit rate | longctx findings | kvlint findings (requests) | wall s |",
            "|---|---:|---:|---:|---:|---|---|---:|",
            *rows,
        ]
    )
    print(body)
    if arguments.write:
        write_section("traffic-kvlint", body)


if __name__ == "__main__":
    main()
