"""Special-token spellings in document text, broken so that a server reads them as ordinary text.

vLLM and SGLang tokenize message content with the model's special tokens
enabled: a document that spells ``<|im_end|>`` and ``<|im_start|>system``
would end the user's turn and open a system turn of its own, whatever
fence surrounds it. :func:`neutralise` inserts :data:`BREAK` (U+200B, zero
width space) after the first character of every occurrence of a spelling,
so ``<|im_end|>`` becomes ``<\\u200b|im_end|>``: the same text to a reader,
no longer the special token to a tokenizer (added tokens match their exact
spelling). The result depends only on the text and the spellings.

Which spellings: :data:`DEFAULT_SPELLINGS`, the control spellings of the
common chat formats that ordinary text never writes (``<|...|>``,
DeepSeek's fullwidth-bar spellings, ``[INST]``...), always; plus those a caller adds
through ``CorpusOptions.special_tokens``: the special tokens of the served
model, learned from the server (:meth:`ServerTokenizer.special_spellings
<longctx.backends.tokenizer.ServerTokenizer.special_spellings>`, which
tries :data:`CANDIDATE_SPELLINGS`) or read from an offline tokenizer. Plain
spellings such as ``<think>`` or ``<s>`` are broken only when the served
model treats them as special, since documents use them as text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Final, TypeAlias

__all__ = ["BREAK", "CANDIDATE_SPELLINGS", "DEFAULT_SPELLINGS", "neutralise"]

BREAK: Final = "\u200b"
"""Inserted after the first character of a special-token spelling."""

_CHATML: Final = ("<|im_start|>", "<|im_end|>", "<|im_sep|>", "<|endoftext|>", "<|endofprompt|>")
_LLAMA3: Final = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|finetune_right_pad_id|>",
    "<|image|>",
    *(f"<|reserved_special_token_{number}|>" for number in range(256)),
)
_PHI_AND_OTHERS: Final = (
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
    "<|endofturn|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|im_middle|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_end|>",
    "<|tool_call_argument_begin|>",
    "<|start|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
    "<|startoftext|>",
    "<|padding|>",
)
_DEEPSEEK: Final = (
    "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
    "<\uff5cUser\uff5c>",
    "<\uff5cAssistant\uff5c>",
    "<\uff5ctool\u2581calls\u2581begin\uff5c>",
    "<\uff5ctool\u2581calls\u2581end\uff5c>",
    "<\uff5ctool\u2581call\u2581begin\uff5c>",
    "<\uff5ctool\u2581call\u2581end\uff5c>",
    "<\uff5ctool\u2581sep\uff5c>",
)
_BRACKETED: Final = (
    "[INST]",
    "[/INST]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_CALLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "<<SYS>>",
    "<</SYS>>",
    "<start_of_turn>",
    "<end_of_turn>",
)

DEFAULT_SPELLINGS: Final[tuple[str, ...]] = (*_CHATML, *_LLAMA3, *_PHI_AND_OTHERS, *_DEEPSEEK, *_BRACKETED)
"""Broken in every pack: control spellings of common chat formats, not written by ordinary text."""

_PLAIN: Final = (
    "<s>",
    "</s>",
    "<unk>",
    "<pad>",
    "<bos>",
    "<eos>",
    "<mask>",
    "<sep>",
    "<cls>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<answer>",
    "</answer>",
    "<|think|>",
)

CANDIDATE_SPELLINGS: Final[tuple[str, ...]] = (*DEFAULT_SPELLINGS, *_PLAIN)
"""Spellings tried on a server to learn which it treats as special tokens (the defaults and plain tags)."""


# A trie node: each next character to its node; _END marks a spelling ending here.
_Trie: TypeAlias = dict[str, "_Trie"]
_END: Final = ""


def _trie_expression(node: _Trie) -> str:
    """The expression matching the longest spelling of ``node``'s trie that starts at a position.

    Children come before the end of a spelling (the empty alternative, last),
    so a spelling that contains another is matched as itself: the match is
    the one the alternation of every spelling, longest first, would give.
    """
    chain = ""
    # A run of nodes with one child and no spelling ending there is plain text.
    while len(node) == 1 and _END not in node:
        ((character, node),) = node.items()
        chain += re.escape(character)
    branches = [
        re.escape(character) + _trie_expression(child)
        for character, child in sorted(node.items())
        if character
    ]
    if not branches:
        return chain
    if _END in node:
        branches.append("")
    return chain + "(?:" + "|".join(branches) + ")"


def _trie_pattern(spellings: Iterable[str]) -> re.Pattern[str] | None:
    """One expression shaped as a trie of ``spellings`` (None for none).

    Not an alternation of them: CPython's engine tries an alternation's
    branches one by one at every "<" and "[" (frequent in code), and a trie's
    branches are one character each, rejected at once. Three times faster on
    an npm tree.
    """
    root: _Trie = {}
    for spelling in spellings:
        node = root
        for character in spelling:
            node = node.setdefault(character, {})
        node[_END] = {}
    return re.compile(_trie_expression(root)) if root else None


def _spellings(extra: tuple[str, ...]) -> set[str]:
    return {spelling for spelling in {*DEFAULT_SPELLINGS, *extra} if len(spelling) > 1}


@functools.lru_cache(maxsize=16)
def _pattern(extra: tuple[str, ...]) -> re.Pattern[str] | None:
    return _trie_pattern(_spellings(extra))


@functools.lru_cache(maxsize=16)
def _openings(extra: tuple[str, ...]) -> re.Pattern[str] | None:
    # The first three characters of every spelling (46 openings for the 349 candidates), as a small
    # trie of its own: a text that holds none of them holds no spelling, and is passed over without
    # the whole expression, which `re` takes ten times longer to compile (10 ms of a new process here).
    return _trie_pattern({spelling[:3] for spelling in _spellings(extra)})


def neutralise(text: str, extra: Iterable[str] = ()) -> tuple[str, int]:
    """``text`` with each :data:`DEFAULT_SPELLINGS` or ``extra`` spelling broken by :data:`BREAK`; how many.

    Deterministic: the same text and spellings give the same result. A
    text with none of them is returned as it is (the same object). Where
    spellings overlap, the leftmost is broken, and of those starting there
    the longest.
    """
    # Cached by the extra spellings as given: a reader passes the same tuple
    # for every file, so the expression is neither rebuilt nor looked up by
    # a set of hundreds of spellings each time.
    spellings = extra if isinstance(extra, tuple) else tuple(extra)
    openings = _openings(spellings)
    if openings is None or openings.search(text) is None:
        return text, 0
    pattern = _pattern(spellings)
    if pattern is None:
        return text, 0
    count = 0

    def broken(match: re.Match[str]) -> str:
        nonlocal count
        count += 1
        spelling = match.group()
        return spelling[0] + BREAK + spelling[1:]

    result = pattern.sub(broken, text)
    return (result, count) if count else (text, 0)
