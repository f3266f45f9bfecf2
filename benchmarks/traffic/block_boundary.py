"""Does ending the shared prefix on a cache block boundary pay? Siblings as longctx sends them, and padded.

longctx's siblings share the pack's prefix and part in the question. vLLM
caches full blocks only, so the block holding the prefix's last tokens also
holds the question's first ones, and every sibling computes that block again:
up to ``block - 1`` tokens (15 at a GPU's 16, 127 at the CPU build's 128).
Padding the shared part with filler to the next boundary would save them.

Two variants over one pack, each under a cache_salt of its own (a cold cache):

- ``as is``: ``pack.messages(question)``, the bytes longctx sends;
- ``padded``: the same with filler between the prefix and the question (the
  same filler in every sibling, so it joins the shared part), sized with the
  server's tokenizer so that the shared tokens end on a block boundary.

For each: the first question cold, then ``--siblings`` more; their cached
tokens and times to the first token. Usage: ``block_boundary.py --base-url
URL [--folder PATH] [--siblings N]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from longctx import ChatRequest, CorpusOptions, connect, pack
from longctx.lint.prefixes import common_prefix

QUESTIONS = [f"Question {n}: which function handles case {n}, and what does it return?" for n in range(12)]
FILLER = "~ "


def shared_tokens(tokenizer: Any, messages_a: list[dict[str, Any]], messages_b: list[dict[str, Any]]) -> int:
    return common_prefix(tokenizer.tokenize_messages(messages_a), tokenizer.tokenize_messages(messages_b))


def messages(system: str, prefix: str, filler: str, question: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": prefix + filler + question}]


def run(backend: Any, system: str, prefix: str, filler: str, siblings: int) -> dict[str, Any]:
    salt = uuid.uuid4().hex
    rows = []
    for question in QUESTIONS[: siblings + 1]:
        request = ChatRequest(
            messages=tuple(messages(system, prefix, filler, question)),
            max_tokens=1,
            temperature=0.0,
            cache_salt=salt,
        )
        started = time.perf_counter()
        usage = backend.complete(request).completion.usage
        rows.append(
            (usage.prompt_tokens, usage.cached_tokens, usage.ttft_seconds or time.perf_counter() - started)
        )
    follow = rows[1:]
    return {
        "prompt": statistics.mean(r[0] for r in follow),
        "uncached": statistics.mean(r[0] - r[1] for r in follow),
        "ttft_median": statistics.median(r[2] for r in follow),
        "cold_ttft": rows[0][2],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--folder", default=str(Path(__file__).resolve().parents[2] / "longctx" / "lint"))
    parser.add_argument("--siblings", type=int, default=8)
    arguments = parser.parse_args()
    built = pack([arguments.folder], CorpusOptions()).pack
    with connect(arguments.base_url) as backend:
        block = backend.info.cache_block_tokens or 16
        tokenizer = backend.tokenizer()
        system = built.system
        base = shared_tokens(tokenizer, messages(system, built.prefix, "", QUESTIONS[0]),
                             messages(system, built.prefix, "", QUESTIONS[1]))  # fmt: skip
        filler, padded_shared = "", base
        for units in range(0, 2 * block):  # "~ " is two tokens here, "~" one: together any count
            for tail in ("", "~", "~~"):
                candidate = FILLER * units + tail
                padded_shared = shared_tokens(
                    tokenizer,
                    messages(system, built.prefix, candidate, QUESTIONS[0]),
                    messages(system, built.prefix, candidate, QUESTIONS[1]),
                )
                if padded_shared % block == 0 and padded_shared > base:
                    filler = candidate
                    break
            if filler:
                break
        print(f"block {block}; shared tokens as is {base} ({base % block} past a boundary); "
              f"padded with {len(filler)} filler characters: {padded_shared} ({padded_shared % block} past)")  # fmt: skip
        for name, filler in (
            ("as is", ""),
            ("padded", FILLER * units),
            ("as is", ""),
            ("padded", FILLER * units),
        ):
            result = run(backend, system, built.prefix, filler, arguments.siblings)
            print(
                f"{name:>7}: follow-ups {result['prompt']:.0f} prompt tokens, {result['uncached']:.1f} computed, "
                f"TTFT median {result['ttft_median'] * 1000:.1f} ms (cold {result['cold_ttft']:.2f} s)"
            )


if __name__ == "__main__":
    main()
