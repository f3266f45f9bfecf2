"""Every break between a request and its ancestor, each proved by undoing it and tokenizing again.

:func:`longctx.lint.causes.classify` names why two requests part where their
text first differs. That place may not be where their tokens part (a chat
template that does not render ``tools`` ignores a change there), and one
request may hold several breaks (a time, then a request id, then the user's
address in one system prompt). :func:`explain` takes the differing line (or,
for the history, the earlier messages) back to the ancestor's, tokenizes the
request again, and keeps the cause only when the tokens shared grow: the
growth is the tokens that cause cost (``lost_tokens``). It goes on from the
repaired request until the two part where they should (their last messages),
at most :data:`MAX_BREAKS` times. A change that moves no token is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

from longctx.lint.causes import Divergence, classify
from longctx.lint.logs import LoggedRequest
from longctx.lint.prefixes import common_prefix
from longctx.lint.rendering import Rendered, text_form

__all__ = ["MAX_BREAKS", "explain"]

MAX_BREAKS: Final = 6
"""The most breaks :func:`explain` names in one request (each costs a tokenization)."""

Retokenize = Callable[[LoggedRequest], Sequence[int]]


def explain(  # noqa: PLR0917 - both requests, their renderings, what they share, the tokenizer
    request: LoggedRequest,
    rendered: Rendered,
    ancestor: LoggedRequest,
    ancestor_rendered: Rendered,
    shared_tokens: int,
    retokenize: Retokenize | None = None,
) -> list[Divergence]:
    """The breaks of ``request`` against ``ancestor`` in order; the last entry may be an expected parting."""
    found: list[Divergence] = []
    current, current_rendered, shared = request, rendered, shared_tokens
    for _ in range(MAX_BREAKS * 2):  # dropped (token-neutral) changes count too, but never loop forever
        divergence = classify(current, current_rendered, ancestor, ancestor_rendered, shared)
        if divergence.severity != "break" or retokenize is None:
            found.append(divergence)
            break
        repaired = _repaired(current, ancestor, current_rendered, divergence)
        if repaired is None:
            found.append(divergence)
            break
        tokens = tuple(retokenize(repaired))
        now_shared = common_prefix(tokens, ancestor_rendered.tokens)
        if now_shared > shared:
            found.append(replace(divergence, token_offset=shared, lost_tokens=now_shared - shared))
        text, spans = text_form(repaired)
        current, current_rendered, shared = repaired, Rendered(tokens, text, spans), now_shared
        if sum(d.severity == "break" for d in found) >= MAX_BREAKS:
            break
    return found


def _repaired(
    request: LoggedRequest, ancestor: LoggedRequest, rendered: Rendered, divergence: Divergence
) -> LoggedRequest | None:
    """``request`` with the line (or part) where it departs from ``ancestor`` made the ancestor's."""
    span = rendered.span_at(divergence.char_offset)
    if span is None:
        return None
    if span.name == "tools":
        return replace(request, tools=ancestor.tools)
    if divergence.cause in ("volatile_few_shot", "history_rewritten"):
        return replace(request, messages=(*ancestor.messages[:-1], request.messages[-1]))
    if span.role == "prompt":
        if not isinstance(request.prompt, str) or not isinstance(ancestor.prompt, str):
            return None
        return replace(
            request,
            prompt=_line_repaired(request.prompt, ancestor.prompt, divergence.char_offset - span.start),
        )
    index = span.message_index
    if index is None or index >= len(ancestor.messages):
        return None
    mine, theirs = request.messages[index], ancestor.messages[index]
    content, old = mine.get("content"), theirs.get("content")
    if isinstance(content, str) and isinstance(old, str):
        new_content: Any = _line_repaired(content, old, divergence.char_offset - span.start)
    else:
        new_content = old
    message: Mapping[str, Any] = {**mine, "content": new_content}
    if message == mine:
        message = dict(theirs)
    if message == mine:
        return None
    messages = list(request.messages)
    messages[index] = message
    return replace(request, messages=tuple(messages))


def _line_repaired(text: str, old: str, offset: int) -> str:
    """``text`` with the line at ``offset`` made ``old``'s line of that number (or the rest of ``old``)."""
    number = text.count("\n", 0, max(0, offset))
    lines, old_lines = text.split("\n"), old.split("\n")
    if number >= len(old_lines) or number >= len(lines) or len(lines) != len(old_lines):
        # Lines added or removed: the rest of the text as the ancestor has it from this line on.
        return "\n".join([*lines[:number], *old_lines[number:]])
    lines[number] = old_lines[number]
    repaired = "\n".join(lines)
    return repaired if repaired != text else old
