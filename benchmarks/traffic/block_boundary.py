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
URL [--folder PATH] [--siblings N] [--repeats N] [--write]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench import machine, write_section  # type: ignore[import-not-found]  # noqa: E402 - the benchmarks' own helpers

from longctx import ChatRequest, CorpusOptions, connect, pack  # noqa: E402
from longctx.lint.prefixes import common_prefix  # noqa: E402

QUESTIONS = [f"Question {n}: which function handles case {n}, and what does it return?" for n in range(12)]
FILLER = "~ "


def shared_tokens(tokenizer: Any, messages_a: list[dict[str, Any]], messages_b: list[dict[str, Any]]) -> int:
    return common_prefix(tokenizer.tokenize_messages(messages_a), tokenizer.tokenize_messages(messages_b))


def messages(system: str, prefix: str, filler: str, question: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": prefix + filler + question}]


def run(backend: Any, system: str, prefix: str, filler: str, siblings: int, *, ids: bool) -> dict[str, Any]:
    """The first question cold, then ``siblings`` more: their prompt, computed tokens and TTFT."""
    salt = uuid.uuid4().hex
    tokenizer = backend.tokenizer()
    rows = []
    for question in QUESTIONS[: siblings + 1]:
        chat = messages(system, prefix, filler, question)
        if ids:  # as longctx's sessions send a pack's follow-ups: the template's token ids
            prompt = tuple(tokenizer.tokenize_messages(chat))
            request = ChatRequest(
                messages=(), prompt_ids=prompt, max_tokens=1, temperature=0.0, cache_salt=salt
            )
        else:
            request = ChatRequest(messages=tuple(chat), max_tokens=1, temperature=0.0, cache_salt=salt)
        started = time.perf_counter()
        usage = backend.complete(request).completion.usage
        rows.append(
            (usage.prompt_tokens, usage.cached_tokens, usage.ttft_seconds or time.perf_counter() - started)
        )
    follow = rows[1:]
    return {
        "prompt": statistics.mean(r[0] for r in follow),
        "computed": statistics.mean(r[0] - r[1] for r in follow),
        "ttft_median": statistics.median(r[2] for r in follow),
    }


def padding(tokenizer: Any, system: str, prefix: str, block: int) -> tuple[int, str, int]:
    """The shared tokens as is, the filler that ends them on a block boundary, and the shared tokens then."""

    def shared(filler: str) -> int:
        first, second = (messages(system, prefix, filler, question) for question in QUESTIONS[:2])
        return common_prefix(tokenizer.tokenize_messages(first), tokenizer.tokenize_messages(second))

    base = shared("")
    for units in range(2 * block):  # "~ " is two tokens with the test model's tokenizer, "~" one
        for tail in ("", "~", "~~"):
            candidate = FILLER * units + tail
            padded = shared(candidate)
            if padded > base and padded % block == 0:
                return base, candidate, padded
    raise SystemExit("no filler ends the shared tokens on a block boundary")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--folder", default=str(HERE.parents[1] / "longctx" / "jobs"))
    parser.add_argument("--siblings", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="rewrite the section of docs/benchmarks.md")
    arguments = parser.parse_args()
    built = pack([arguments.folder], CorpusOptions()).pack
    with connect(arguments.base_url) as backend:
        block = backend.info.cache_block_tokens or 16
        base, filler, padded = padding(backend.tokenizer(), built.system, built.prefix, block)
        print(
            f"block {block}: shared {base} ({base % block} past), padded {padded} with {len(filler)} characters"
        )
        lines = []
        for _ in range(arguments.repeats):
            for form in ("chat", "ids"):
                for name, used in (("as is", ""), ("padded", filler)):
                    result = run(
                        backend, built.system, built.prefix, used, arguments.siblings, ids=form == "ids"
                    )
                    lines.append(
                        f"| {Path(arguments.folder).name} | {block} | {form} | {name} | {result['prompt']:,.0f} "
                        f"| {result['computed']:.0f} | {result['ttft_median'] * 1000:.0f} ms |"
                    )
                    print(lines[-1], flush=True)
        section = _section(base, padded, block, len(filler), lines=lines, info=backend.info)
    print(section)
    if arguments.write:
        write_section("traffic-block-boundary", section)


def _section(base: int, padded: int, block: int, filler: int, *, lines: list[str], info: Any) -> str:
    return "\n".join(
        [
            "## The shared prefix to a block boundary: measured",
            "",
            "`benchmarks/traffic/block_boundary.py`: siblings over one pack as longctx sends them (*as is*), and "
            "with filler between the prefix and the question, the same in every sibling, so that the shared "
            f"tokens end on a block boundary (*padded*: {base:,} shared tokens, {base % block} past a boundary, "
            f"became {padded:,} with {filler} filler characters). Each variant under its own `cache_salt`; the "
            "first question cold, then 8 siblings: their mean prompt and computed (not cached) tokens and median "
            "TTFT. Sent as chat messages, and as the template's token ids (`/v1/completions`), as longctx's "
            f"sessions send a pack's follow-ups. {info.engine} {info.version} on the CPU (block {block}), the "
            f"test model. Machine: {machine()}.",
            "",
            "| pack | block | form | variant | prompt tokens | computed per sibling | TTFT median |",
            "|---|---:|---|---|---:|---:|---:|",
            *lines,
        ]
    )


if __name__ == "__main__":
    main()
