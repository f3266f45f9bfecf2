"""``longctx lint`` beside kvlint on the same logs: prompt and cached tokens per request, and the findings.

Usage: ``compare_kvlint.py LONGCTX_JSON KVLINT_JSON [...pairs]`` with the
JSON reports of ``longctx lint --format json`` and ``kvlint lint --json`` on
the same log (kvlint is installed in a virtual environment of its own; no
code of it is used here, only its report). Prints one markdown row per log.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def row(ours_path: Path, theirs_path: Path) -> str:
    ours, theirs = json.loads(ours_path.read_text()), json.loads(theirs_path.read_text())
    sims = {sim["engine"]: sim["per_request"] for sim in theirs["sims"]}
    requests = ours["requests"]
    same_prompt = sum(
        r["prompt_tokens"] == k["prompt_tokens"] for r, k in zip(requests, sims["vllm"], strict=True)
    )
    same = {
        engine: sum(
            r["cached"][engine] == k["cached_tokens"] for r, k in zip(requests, sims[engine], strict=True)
        )
        for engine in ("vllm", "sglang")
    }
    total = sum(r["prompt_tokens"] for r in requests)
    theirs_total = sum(k["prompt_tokens"] for k in sims["vllm"])

    def rate(cached: int, prompt: int) -> str:
        return f"{cached / prompt:.1%}" if prompt else "-"

    causes = Counter(f["cause"] for r in requests for f in r["findings"])
    rules = {f["rule_id"]: len(f["affected_request_ids"]) for f in theirs["findings"]}
    n = len(requests)
    return (
        f"| {ours_path.stem.removeprefix('lc-')} | {n} | {total:,} / {theirs_total:,} ({same_prompt}/{n} equal) "
        f"| {rate(sum(r['cached']['vllm'] for r in requests), total)} / "
        f"{rate(sum(k['cached_tokens'] for k in sims['vllm']), theirs_total)} ({same['vllm']}/{n}) "
        f"| {rate(sum(r['cached']['sglang'] for r in requests), total)} / "
        f"{rate(sum(k['cached_tokens'] for k in sims['sglang']), theirs_total)} ({same['sglang']}/{n}) "
        f"| {', '.join(f'{c} {k}' for c, k in sorted(causes.items())) or '-'} "
        f"| {', '.join(f'{c} {k}' for c, k in sorted(rules.items())) or '-'} |"
    )


if __name__ == "__main__":
    arguments = [Path(a) for a in sys.argv[1:]]
    print(
        "| log | requests | prompt tokens: longctx / kvlint | vLLM hit rate (requests equal) "
        "| SGLang hit rate (requests equal) | longctx findings | kvlint findings (requests) |"
    )
    print("|---|---:|---:|---:|---:|---|---|")
    for ours, theirs in zip(arguments[::2], arguments[1::2], strict=True):
        print(row(ours, theirs))
