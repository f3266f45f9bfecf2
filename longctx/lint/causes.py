"""Why a request's prefix parted from the earlier request it shares most with, and the fix.

A request is compared with its *ancestor* (the earlier request sharing the
longest token prefix, :mod:`longctx.lint.prefixes`). Where the two part is a
character offset in their text forms (:func:`longctx.lint.rendering.text_form`);
the rules below read the text on both sides of it, most specific first.

Breaks (a prefix the cache could have kept was lost): ``timestamp``,
``request_id``, ``user_in_system``, ``whitespace``, ``key_order``,
``volatile_few_shot``, ``system_changed``, ``tools_changed``,
``history_rewritten``, ``evicted`` (the prefix was there but the KV budget
could not keep it). Losses inside one block: ``block_straddle`` (the shared
prefix ends inside a cache block: the tokens of that block are computed
again), ``short_prefix`` (what is shared is shorter than one block).
Expected: ``new_turn`` (the request adds to its ancestor), ``question``
(siblings part in their last message), ``cache_salt`` (another namespace),
``first`` (nothing earlier shares a token).
"""

from __future__ import annotations

import json
import re
from typing import Final, Literal

from longctx.lint.logs import LoggedRequest
from longctx.lint.prefixes import common_prefix
from longctx.lint.rendering import Rendered, Span
from longctx.recordtypes import record_type

__all__ = ["BREAK_CAUSES", "CAUSES", "FIXES", "Divergence", "Severity", "classify", "severity_of"]

Severity = Literal["break", "loss", "expected"]

CAUSES: Final[dict[str, Severity]] = {
    "timestamp": "break",
    "request_id": "break",
    "user_in_system": "break",
    "whitespace": "break",
    "key_order": "break",
    "volatile_few_shot": "break",
    "system_changed": "break",
    "tools_changed": "break",
    "history_rewritten": "break",
    "evicted": "break",
    "block_straddle": "loss",
    "short_prefix": "loss",
    "new_turn": "expected",
    "question": "expected",
    "cache_salt": "expected",
    "first": "expected",
}
"""Every cause, and whether it is a break, a loss inside one block, or expected."""

BREAK_CAUSES: Final = tuple(name for name, kind in CAUSES.items() if kind != "expected")

FIXES: Final[dict[str, str]] = {
    "timestamp": "move the date or time out of the prefix (after the document, in the last message), "
    "or pin it to the day",
    "request_id": "keep request and trace ids out of the prompt (headers or metadata instead)",
    "user_in_system": (
        "keep the system prompt the same for every user; put the user's name in the last message"
    ),
    "whitespace": (
        "build the prompt with one fixed template; strip or normalise whitespace the same way each time"
    ),
    "key_order": "serialise JSON with sorted keys (json.dumps(..., sort_keys=True)) and a fixed tool order",
    "volatile_few_shot": "keep the few-shot examples fixed and in one order; put the varying ones last",
    "system_changed": "keep the system prompt fixed; put what changes in the last user message",
    "tools_changed": "send the same tool list, in the same order, on every request of a conversation",
    "history_rewritten": "append to the history instead of truncating, summarising or editing earlier turns",
    "evicted": "a larger KV cache (longctx plan), fewer distinct prefixes in flight, or revisits sooner "
    "(longctx job orders them)",
    "block_straddle": "end the shared prefix on a block boundary (pad it to a multiple of the block size)",
    "short_prefix": "share a longer fixed prefix (at least one block), or accept no reuse",
}
"""What fixes each cause, where a fix is known."""

# Dates and times as programs print them: ISO 8601, clock times, month names, unix epochs.
_TIME: Final = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
    r"|\b\d{1,2}:\d{2}(?::\d{2})?(?:\s?[AaPp][Mm])?\b"
    r"|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.? \d{1,2}(?:st|nd|rd|th)?,? \d{4}\b"
    r"|\b\d{1,2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* \d{4}\b"
    r"|\b1[6-9]\d{8}(?:\d{3})?\b"
    r"|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*day\b"
)
_ID: Final = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
    r"|\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{12,}\b"
    r"|\b(?:req|run|trace|span|sess|session|chatcmpl|msg|call)[-_][A-Za-z0-9]{6,}\b"
    r"|(?i:\b(?:request|trace|session|correlation)[ _-]?id\b\W{0,3}\S+)"
)
_EMAIL: Final = re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+")
_USER_WORDS: Final = re.compile(r"(?i)\b(?:user|name|customer|account|username|member|client)\b[^\n]{0,40}$")
_CONTEXT_CHARS: Final = 60


@record_type
class Divergence:
    """Where a request parts from its ancestor, and why.

    ``token_offset``: the first token they do not share. ``char_offset``: the
    same place in the request's text form; ``part`` names the part of the
    request there (``message 0 (system)``, ``tools``...). ``before``/``after``
    the request's text around it, ``ancestor_after`` the ancestor's text from
    there. ``lost_tokens``: what the break cost, at most (the ancestor's
    tokens past the shared prefix, within this request's length).
    """

    cause: str
    token_offset: int
    char_offset: int
    part: str
    before: str
    after: str
    ancestor_after: str
    lost_tokens: int

    @property
    def severity(self) -> Severity:
        return CAUSES[self.cause]

    @property
    def fix(self) -> str | None:
        return FIXES.get(self.cause)


def severity_of(cause: str) -> Severity:
    """Whether ``cause`` is a break, a loss inside one block, or expected."""
    return CAUSES[cause]


def classify(
    request: LoggedRequest,
    rendered: Rendered,
    ancestor: LoggedRequest,
    ancestor_rendered: Rendered,
    shared_tokens: int,
) -> Divergence:
    """The cause of the parting of ``request`` from ``ancestor`` after ``shared_tokens`` tokens."""
    text, old = rendered.text, ancestor_rendered.text
    offset = common_prefix(text, old)
    lost = max(0, min(len(ancestor_rendered.tokens), len(rendered.tokens)) - shared_tokens)
    span = rendered.span_at(offset)
    part = span.name if span is not None else ""

    def divergence(cause: str) -> Divergence:
        return Divergence(
            cause=cause,
            token_offset=shared_tokens,
            char_offset=offset,
            part=part,
            before=text[max(0, offset - _CONTEXT_CHARS) : offset],
            after=text[offset : offset + _CONTEXT_CHARS],
            ancestor_after=old[offset : offset + _CONTEXT_CHARS],
            lost_tokens=lost,
        )

    if request.cache_salt != ancestor.cache_salt:
        return divergence("cache_salt")
    if shared_tokens >= len(ancestor_rendered.tokens) or offset >= len(old) - 1:
        return divergence("new_turn")
    return divergence(_cause(request, rendered, ancestor, ancestor_rendered, offset, span))


def _cause(  # noqa: PLR0917 - both requests, their renderings and where they part
    request: LoggedRequest,
    rendered: Rendered,
    ancestor: LoggedRequest,
    ancestor_rendered: Rendered,
    offset: int,
    span: Span | None,
) -> str:
    text, old = rendered.text, ancestor_rendered.text
    if _covers(_TIME, text, offset) and _covers(_TIME, old, offset):
        return "timestamp"
    if _covers(_ID, text, offset) and _covers(_ID, old, offset):
        return "request_id"
    if span is not None and _same_json(text, old, span, ancestor_rendered):
        return "key_order"
    if _whitespace_only(text, old, offset):
        return "whitespace"
    role = span.role if span is not None else ""
    if role == "system":
        if _user_at(request, text, offset) or _user_at(ancestor, old, offset):
            return "user_in_system"
        return "system_changed"
    if role == "tools":
        return "tools_changed"
    theirs = ancestor_rendered.span_at(offset)
    in_last = span is None or span.message_index is None or span.message_index >= len(request.messages) - 1
    was_last = (
        theirs is None or theirs.message_index is None or theirs.message_index >= len(ancestor.messages) - 1
    )
    if in_last and was_last:
        return "question"
    if span is None or span.message_index is None:
        return "history_rewritten"
    if _examples_moved(request, ancestor, span.message_index):
        return "volatile_few_shot"
    return "history_rewritten"


def _covers(pattern: re.Pattern[str], text: str, offset: int) -> bool:
    """Whether a match of ``pattern`` in ``text`` holds ``offset`` (or ends right before it)."""
    start = max(0, offset - 48)
    for match in pattern.finditer(text, start, min(len(text), offset + 48)):
        if match.start() <= offset <= match.end() - 1 or (match.start() < offset and match.end() == offset):
            return True
    return False


def _whitespace_only(text: str, old: str, offset: int) -> bool:
    window = 400
    here, there = text[offset : offset + window], old[offset : offset + window]
    if not (here[:1].isspace() or there[:1].isspace() or text[offset - 1 : offset].isspace()):
        return False
    squeeze = re.compile(r"\s+")
    left, right = squeeze.sub(" ", here).strip(), squeeze.sub(" ", there).strip()
    size = min(len(left), len(right)) - 20  # the windows end at different places
    return size > 0 and left[:size] == right[:size]


def _same_json(text: str, old: str, span: Span, ancestor_rendered: Rendered) -> bool:
    """Whether the part holding the break is the same JSON in both, written in another order."""
    other = next((s for s in ancestor_rendered.spans if s.name == span.name), None)
    if other is None:
        return False
    here, there = text[span.start : span.end], old[other.start : other.end]
    for left, right in ((here, there), (_json_block(here), _json_block(there))):
        if left is None or right is None or left == right:
            continue
        try:
            if json.loads(left) == json.loads(right):
                return True
        except ValueError:
            continue
    return False


def _json_block(text: str) -> str | None:
    start, end = text.find("{"), text.rfind("}")
    return text[start : end + 1] if 0 <= start < end else None


def _user_at(request: LoggedRequest, text: str, offset: int) -> bool:
    if request.user and request.user in text[max(0, offset - 40) : offset + 80]:
        return True
    if _covers(_EMAIL, text, offset):
        return True
    line_start = text.rfind("\n", 0, offset) + 1
    return bool(_USER_WORDS.search(text[line_start:offset]))


def _examples_moved(request: LoggedRequest, ancestor: LoggedRequest, index: int) -> bool:
    """Whether the examples before the last message are the ancestor's, reordered or swapped."""
    mine = request.messages[:-1]
    theirs = ancestor.messages[:-1]
    if len(mine) != len(theirs) or not mine:
        return False
    contents = [str(message.get("content")) for message in theirs]
    if str(request.messages[index].get("content")) in contents:
        return True  # reordered
    roles = [message.get("role") for message in mine]
    return roles == [message.get("role") for message in theirs]  # the same shape, other examples
