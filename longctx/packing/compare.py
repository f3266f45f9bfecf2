"""Comparing packs: where two packs part, and whether a question keeps the prefix's tokens.

:func:`compare_packs` names the first section where a new pack departs from
an old one and measures what a server cache can still reuse before it;
:func:`check_cache_boundary` checks with the server tokenizer that appending
a question never changes the prefix's tokens.
"""

from __future__ import annotations

from typing import Final

from longctx.errors import PackError
from longctx.packing.model import BoundaryCheck, Pack, PackComparison
from longctx.tokens.tokenizers import TemplateTokenizer, Tokenizer

__all__ = ["DEFAULT_PROBE_QUESTION", "check_cache_boundary", "compare_packs"]

DEFAULT_PROBE_QUESTION: Final = "Which files define the public API, and what does each of them do?"
"""The question :func:`check_cache_boundary` appends when none is given."""


def _common_prefix_length(old: bytes, new: bytes) -> int:
    length = min(len(old), len(new))
    if old[:length] == new[:length]:
        return length
    low, high = 0, length
    while low < high:
        middle = (low + high + 1) // 2
        if old[:middle] == new[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def compare_packs(old: Pack, new: Pack, *, tokenizer: Tokenizer | None = None) -> PackComparison:
    """Name the first section where ``new`` departs from ``old`` and measure what survives before it.

    With ``tokenizer`` (the one both packs were counted with), the shared
    start of the first differing section is counted too, up to its last
    shared line break (``partial_tokens``).
    """
    same_tokenizer = old.tokenizer is not None and old.tokenizer == new.tokenizer
    surviving_tokens: int | None = 0 if same_tokenizer else None
    surviving_bytes = 0
    index = 0
    for old_section, new_section in zip(old.sections, new.sections, strict=False):
        # Bytes are what a server cache sees: a document that became its
        # own earlier copy (a layered pack) still matches.
        if old_section.fingerprint != new_section.fingerprint:
            break
        surviving_bytes += old_section.size_bytes
        if surviving_tokens is not None:
            surviving_tokens = None if old_section.tokens is None else surviving_tokens + old_section.tokens
        index += 1
    old_total = old.prefix_tokens if same_tokenizer else None
    if index == len(old.sections) == len(new.sections):
        return PackComparison(
            True,
            None,
            "the packs are identical",
            index,
            surviving_bytes,
            old.prefix_tokens if same_tokenizer else None,
            old_total,
        )
    partial: int | None = None
    if index < len(new.sections) and index < len(old.sections):
        old_section, new_section = old.sections[index], new.sections[index]
        old_bytes = old_section.text.encode("utf-8")
        shared = _common_prefix_length(old_bytes, new_section.text.encode("utf-8"))
        surviving_bytes += shared
        if tokenizer is not None and surviving_tokens is not None:
            cut = old_bytes.rfind(b"\n", 0, shared) + 1
            partial = tokenizer.count(old_bytes[:cut].decode("utf-8")) if cut else 0
        name = new_section.name
        if old_section.name == new_section.name:
            detail = f"{name} changed"
        elif any(section.name == new_section.name for section in old.sections[index:]):
            detail = f"{old_section.name} was removed or moved (now {name} follows)"
        else:
            detail = f"{name} is new, before {old_section.name}"
    elif index < len(new.sections):
        name = new.sections[index].name
        detail = f"{name} was added at the end"
    else:
        name = old.sections[index].name
        detail = f"{name} and what follows were removed"
    return PackComparison(False, name, detail, index, surviving_bytes, surviving_tokens, old_total, partial)


# -- the cache boundary --------------------------------------------------------


def check_cache_boundary(
    pack: Pack, tokenizer: TemplateTokenizer, question: str = DEFAULT_PROBE_QUESTION
) -> BoundaryCheck:
    """Check with the server tokenizer that the prefix's tokens are a prefix of prefix + question's.

    When they are, every request about this pack (any question, any
    sibling) starts with the same tokens and the server's prefix cache can
    serve all of them; when not, ``divergent_position`` is where they part.
    """
    if not question:
        raise PackError("check_cache_boundary needs a non-empty question")
    shared = tokenizer.encode(pack.prefix)
    full = tokenizer.encode(pack.user_content(question))
    position: int | None = None
    for index, token in enumerate(shared):
        if index >= len(full) or full[index] != token:
            position = index
            break
    return BoundaryCheck(
        ok=position is None,
        prefix_tokens=len(shared),
        prompt_tokens=len(full),
        divergent_position=position,
        question=question,
    )
