"""Benchmark: how much of the previous answer the next turn reads from the cache, on the real engines.

A session over a pack of standard-library text asks three questions, each
answered with 1,000 tokens (``ignore_eos``, temperature 0). For every turn
after the first: the previous prompt and answer, the answer's text
re-tokenised by the server, the turn's cached tokens, and how many of the
previous answer's tokens they cover (:mod:`longctx.sessions.reuse`).
"""

from __future__ import annotations

import sysconfig
import uuid
from pathlib import Path

from longctx.backends.base import connect
from longctx.config import RequestOptions
from longctx.sessions import Session
from longctx.sessions.reuse import answer_reuse
from longctx.store import Store, StoredPack
from longctx.testing import EngineHarness

STDLIB = Path(sysconfig.get_paths()["stdlib"])
ANSWER_TOKENS = 1_000
QUESTIONS = ("Explain the file.", "Go on.", "And then?")


def measure(engine: str, harness: EngineHarness, work: Path) -> list[str]:
    """The table rows of one engine."""
    server = harness.server(engine)
    backend = connect(server.api_base)
    tokenizer = backend.tokenizer()
    nonce = uuid.uuid4().hex
    pack = StoredPack(
        fingerprint=nonce + nonce,
        format_version="bench/1",
        system=f"Answer questions about the documents. [{nonce}]",
        prefix=f"<documents>\n{(STDLIB / 'textwrap.py').read_text()[:8_000]}\n</documents>\n\n",
        summary={"title": "answer reuse"},
    )
    request = RequestOptions(max_tokens=ANSWER_TOKENS, temperature=0.0, extra_body={"ignore_eos": True})
    rows = []
    with Store.open(work / f"answer-reuse-{engine}") as store, backend:
        session = Session(backend, pack, store=store, request=request)
        previous = None
        for position, question in enumerate(QUESTIONS):
            answer = session.ask(question)
            if previous is not None:
                reuse = answer_reuse(previous.usage, answer.usage)
                assert reuse is not None, "the server did not report cached tokens"
                rows.append(
                    f"| {engine} | {position} | {previous.usage.prompt_tokens:,} | {reuse.answer_tokens:,} "
                    f"| {tokenizer.count(previous.text):,} | {answer.usage.prompt_tokens:,} "
                    f"| {answer.usage.cached_tokens:,} | {reuse.reused_tokens:,} | {reuse.share:.0%} |"
                )
            previous = answer
    return rows


def section(work: Path, harness_dir: Path) -> str:
    """The markdown of the ``sessions-answer-reuse`` section."""
    harness = EngineHarness(harness_dir)
    try:
        rows = [row for engine in ("vllm", "sglang") for row in measure(engine, harness, work)]
    finally:
        harness.close()
    return "\n".join(
        [
            "## Answer reuse: the previous answer in the next turn's cache",
            "",
            "A session over 8,000 characters of `textwrap.py` asks three questions, each answered with "
            f"{ANSWER_TOKENS:,} tokens (`ignore_eos`, temperature 0), on the CPU builds of the test "
            "harness (tiny random-weight model; its ChatML template renders the generation prompt and "
            "history alike, as real ChatML templates do). *previous answer, re-tokenised* is the "
            "server's count of the answer's text; *answer from the cache* is the turn's cached tokens "
            "past the previous prompt (`longctx.sessions.reuse`).",
            "",
            "| engine | turn | previous prompt | previous answer (generated) | previous answer, re-tokenised"
            " | prompt | cached | answer from the cache | share |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "Why none of it: the random-weight model emits token sequences that are not the tokenizer's "
            "own segmentation of their text (on vLLM the re-tokenised answer differs from the generated "
            "tokens from the third token on), so the history's answer tokens differ from the cached "
            "ones after a few tokens, and the hit ends at the previous prompt (block-rounded: 128 tokens "
            "on vLLM's CPU build). A trained model emits its tokenizer's segmentation almost always, and "
            "the same template then serves the answer from the cache. What longctx could do for models "
            "that do not: send the history as token ids (`/v1/completions` takes them on both engines), "
            "which needs each answer's generated ids kept with its turn: a store migration, not made here.",
        ]
    )
