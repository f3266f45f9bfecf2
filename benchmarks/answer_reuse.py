"""Benchmark: how much of the previous answer the next turn reads from the cache, on the real engines.

A session over a pack of standard-library text asks three questions, each
answered with 1,000 tokens (``ignore_eos``, temperature 0), once with the
history as text (the default) and once as token ids
(``RequestOptions.token_history``, :mod:`longctx.sessions.token_history`).
For every turn after the first: the previous prompt and answer, the answer's
text re-tokenised by the server, the turn's cached tokens, and how many of
the previous answer's tokens they cover (:mod:`longctx.sessions.reuse`).
"""

from __future__ import annotations

import sysconfig
import uuid
from pathlib import Path

from longctx.backends.base import connect
from longctx.options.groups import RequestOptions
from longctx.sessions import Session
from longctx.sessions.reuse import answer_reuse
from longctx.store import Store, StoredPack
from longctx.testing import EngineHarness

STDLIB = Path(sysconfig.get_paths()["stdlib"])
ANSWER_TOKENS = 1_000
QUESTIONS = ("Explain the file.", "Go on.", "And then?")


def measure(engine: str, harness: EngineHarness, work: Path, *, token_history: bool) -> list[str]:
    """The table rows of one engine, with the history as text or as token ids."""
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
    request = RequestOptions(
        max_tokens=ANSWER_TOKENS,
        temperature=0.0,
        extra_body={"ignore_eos": True},
        token_history=token_history,
    )
    history = "token ids" if token_history else "text"
    rows = []
    with Store.open(work / f"answer-reuse-{engine}-{nonce[:8]}") as store, backend:
        session = Session(backend, pack, store=store, request=request)
        previous = None
        for position, question in enumerate(QUESTIONS):
            answer = session.ask(question)
            if previous is not None:
                reuse = answer_reuse(previous.usage, answer.usage)
                assert reuse is not None, "the server did not report cached tokens"
                rows.append(
                    f"| {engine} | {history} | {position} | {previous.usage.prompt_tokens:,} "
                    f"| {reuse.answer_tokens:,} "
                    f"| {tokenizer.count(previous.text):,} | {answer.usage.prompt_tokens:,} "
                    f"| {answer.usage.cached_tokens:,} | {reuse.reused_tokens:,} | {reuse.share:.0%} |"
                )
            previous = answer
    return rows


def section(work: Path, harness_dir: Path) -> str:
    """The markdown of the ``sessions-answer-reuse`` section."""
    harness = EngineHarness(harness_dir)
    try:
        rows = [
            row
            for engine in ("vllm", "sglang")
            for token_history in (False, True)
            for row in measure(engine, harness, work, token_history=token_history)
        ]
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
            "past the previous prompt (`longctx.sessions.reuse`). *history*: `text` is the default "
            "(chat requests, each answer sent back as its text); `token ids` is "
            "`RequestOptions(token_history=True)` (`longctx chat --token-history`): each turn after the "
            "first goes to `/v1/completions` as the previous prompt's ids, the answer's generated ids and "
            "the template's glue (`longctx.sessions.token_history`).",
            "",
            "| engine | history | turn | previous prompt | previous answer (generated) "
            "| previous answer, re-tokenised | prompt | cached | answer from the cache | share |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "Why the text history gets none of it: the random-weight model emits token sequences that "
            "are not the tokenizer's own segmentation of their text (the re-tokenised answer has "
            "another length, the column above, and in the probe that found this it agreed with the "
            "generated ids for the first 4 tokens only, on both engines), so the history's answer tokens differ from the cached ones after a few tokens, and the hit "
            "ends at the previous prompt (block-rounded: 128 tokens on vLLM's CPU build; SGLang adds the "
            "few tokens that agree). A trained model emits its tokenizer's segmentation almost always, "
            "and the text history then serves the answer from the cache too.",
            "",
            "What the token-id history does about it, and how it was found to work on both engines: the "
            "first turn is a chat request that asks for the ids (vLLM: `return_token_ids: true`, which "
            "streams `prompt_token_ids` in the first chunk and `token_ids` per choice; SGLang: "
            "`return_input_ids_in_sglext` and `return_output_ids_in_sglext`, in the last chunk's "
            "`sglext`, since its chat route refuses `return_token_ids` when streaming). The prompt ids "
            "equal the tokenize route's rendering of the same messages on both. Each later turn goes to "
            "`/v1/completions` with `prompt` a list of ids (both engines take it, and add no BOS: the "
            "reported prompt tokens equal the ids sent) and `return_token_ids: true` (both engines "
            "stream `token_ids` per choice there). The glue is the template's tokens from the end of an "
            "assistant message to the next generation prompt, new user message included: the tokenize "
            'route\'s `[system, user]` subtracted from `[system, user, assistant "", user]` (16 tokens '
            "for `Go on.`). The cache then covers every token the server computed for the "
            "turn before: its prompt and its answer but the last generated token (sampled, never fed "
            "back), block-rounded on vLLM, exact on SGLang. The answer's ids are kept with its turn "
            "(store migration 9), so a resumed session rebuilds the same ids. It is opt-in: "
            "`/v1/completions` skips the server's chat-side parsing (a reasoning parser's separate "
            "field, tool calls), and a trained model, whose answers re-tokenise to the same ids, gains "
            "nothing from it; a turn after an answer whose reasoning the template drops goes out as text.",
        ]
    )
