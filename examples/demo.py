"""Demo: a local vLLM on the CPU, and the prefix cache at work.

Starts vLLM (CPU build) with the tiny locally-made model, then sends four
questions over the same long document, each as its own request. The server
computes the document once; the later requests reuse it from the prefix
cache, which the server reports as ``cached_tokens``.

Run it with ``scripts/demo`` from a fresh clone.
"""

from __future__ import annotations

import sys
import sysconfig
import time
from pathlib import Path

import httpx2

from longctx.testing import EngineHarness

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = (
    "What does this module define?",
    "Which names does it export?",
    "Where is the generic alias implemented?",
    "What would you test first?",
)


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def main() -> int:
    harness = EngineHarness(ROOT / ".cache" / "harness", on_progress=progress)
    print("Starting vLLM on the CPU with the tiny model (first run builds it: a few minutes)...", file=sys.stderr)
    server = harness.server("vllm")
    model = harness.model()
    try:
        document = (Path(sysconfig.get_paths()["stdlib"]) / "typing.py").read_text()[:60_000]
        print(f"\nvLLM ready at {server.api_base}; document of {len(document):,} characters.\n")
        print(f"{'question':<44} {'prompt':>7} {'cached':>7} {'share':>6} {'seconds':>8}")
        for question in QUESTIONS:
            started = time.perf_counter()
            response = httpx2.post(
                f"{server.api_base}/chat/completions",
                json={
                    "model": model.served_name,
                    "messages": [{"role": "user", "content": f"{document}\n\n{question}"}],
                    "max_tokens": 8,
                },
                timeout=300,
            )
            response.raise_for_status()
            usage = response.json()["usage"]
            prompt = usage["prompt_tokens"]
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            seconds = time.perf_counter() - started
            print(f"{question:<44} {prompt:>7} {cached:>7} {cached / prompt:>6.0%} {seconds:>8.2f}")
    finally:
        harness.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
