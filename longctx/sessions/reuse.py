"""How much of the previous answer a turn read from the server's cache.

A turn's prompt is the previous turn's prompt, the previous answer as the
chat template renders it in history, then the new question. The server
caches what it computed: the previous prompt and the answer's tokens *as
generated*. The answer is served from the cache again only where
re-tokenising its text gives back the generated tokens, and then in whole
cache blocks (vLLM: 16 tokens on GPUs, 128 on the CPU build; SGLang: 1).

So the previous answer's tokens read from the cache are the turn's cached
tokens past the previous prompt, at most the previous answer's length:
``min(max(cached - previous_prompt, 0), previous_completion)``. A model
whose output re-tokenises to other tokens (the random-weight test model
does so after two tokens; real models emit the canonical tokenisation
almost always) gets none of it back; the figures are in docs/benchmarks.md
(``sessions-answer-reuse``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from longctx.recordtypes import record_type
from longctx.store import RequestRecord
from longctx.usage import Usage

__all__ = ["AnswerReuse", "answer_reuse", "reuse_notes"]


@record_type
class AnswerReuse:
    """The previous answer's tokens (``answer_tokens``) and how many of them were read from the cache."""

    answer_tokens: int
    reused_tokens: int

    @property
    def share(self) -> float:
        """``reused_tokens / answer_tokens`` (0 for an empty answer)."""
        return self.reused_tokens / self.answer_tokens if self.answer_tokens else 0.0

    def summary_line(self) -> str:
        """``R of A tokens of the previous answer from the cache (S%)``."""
        return (
            f"{self.reused_tokens:,} of {self.answer_tokens:,} tokens of the previous answer "
            f"from the cache ({self.share:.0%})"
        )


def answer_reuse(previous: Usage, current: Usage) -> AnswerReuse | None:
    """How much of ``previous``'s answer ``current`` (the next turn) read from the cache.

    None when a count it needs was not reported (cached tokens off, or no
    completion count).
    """
    if current.cached_tokens is None or previous.prompt_tokens is None or previous.completion_tokens is None:
        return None
    past_prompt = current.cached_tokens - previous.prompt_tokens
    return AnswerReuse(previous.completion_tokens, min(max(past_prompt, 0), previous.completion_tokens))


def reuse_notes(turn_requests: Sequence[RequestRecord]) -> list[str]:
    """One report note per turn after the first: the previous answer's reuse (turn requests, in order).

    Turns count from 1, as the report's ``#`` column does: the note on the
    second turn's request says ``turn 2``.
    """
    notes = []
    for position, (previous, current) in enumerate(itertools.pairwise(turn_requests), 2):
        reuse = answer_reuse(previous.usage, current.usage)
        if reuse is not None and reuse.answer_tokens:
            notes.append(f"turn {position}: {reuse.summary_line()}")
    return notes
