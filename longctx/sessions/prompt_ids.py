"""Prompts sent as token ids: the server skips rendering and re-tokenizing the pack on every request.

A cached follow-up's time to first token grows with the pack when it goes
as chat messages: the server renders the template and tokenizes the whole
text each time (one H200, vLLM 0.24.0, 2026-12-04: 0.60 s at 122,805 tokens,
2.04 s at 462,644; as token ids 0.275 s and 0.66 s; docs/benchmarks.md,
"Cached follow-ups"). Where the engine takes a token-id prompt (its
profile's ``takes_prompt_ids``: ``/v1/completions`` with ``prompt`` a list of
ids on vLLM and SGLang), a session sends exactly the ids the server would
have made of the same messages:

- **the pack's ids** (the system message and the first user message up to
  where the question starts), tokenized once per pack fingerprint and server
  tokenizer identity by the server's own chat template, and kept in the
  store (``store.caches.pack_ids``);
- **the template's ids after a user message** (its end and the generation
  prompt), found with two probe questions over a stand-in pack: the ids of
  ``[system, user(stand-in + question)]`` less their common start and end
  must be each question's own tokens, else the template is not covered;
- **the tail**: the question (after any changed files, before any
  instruction) as its own tokens, exact because the pack ends at a fixed
  delimiter and a blank line and the question starts with a non-blank
  character, so no token spans the boundary (a tail with whitespace at
  either end goes as text).

A pack's ids are made off the request's path: the first request over a pack
whose ids neither the session nor the store holds goes as text (as it would
have: the server tokenizes it once either way) while a thread asks the
server for the pack's ids, so a batch of siblings or a job's first visit to
a pack waits for no extra tokenization; the requests after it go as ids.
Each pack's ids are checked when made: the server's tokens of the pack with
a probe question must end with the probe's tokens and the template's, else
the pack goes as text. Later turns go through
:class:`~longctx.sessions.token_history.TokenHistory`, starting from these
ids. Wherever ids cannot be used the request goes as chat messages and its
usage says why (``prompt_form``, kept with the request; the report sums the
reasons): an engine without the route, a router in front, a server without a
tokenize route, chat-only request fields, a template the rule does not cover.
``RequestOptions(prompt_ids=False)`` sends text always.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from longctx.backends.base import ServerInfo
from longctx.backends.chat import ChatRequest
from longctx.backends.tokenizer import ServerTokenizer
from longctx.errors import LongctxError, TokenizerError
from longctx.options.groups import RequestOptions
from longctx.sessions.token_history import FirstMessages, HistoryIds, TokenHistory
from longctx.store import Store, StoredPack, StoredPackIds, TurnRecord

__all__ = [
    "CHAT_ONLY_FIELDS",
    "PACK_IDS_PENDING",
    "PACK_PROBE",
    "PromptIds",
    "chat_only_reason",
    "pack_ids",
    "tail_reason",
]

PACK_IDS_PENDING: Final = "the pack's token ids are being made beside this request, which goes as text"
"""Why a pack's first request goes as text: its ids are made off the request's path."""

PACK_PROBE: Final = "Which file comes first?"
"""The question a pack's ids are checked with when they are made."""

# Two questions that start and end differently, over a stand-in pack that ends as packs do.
_TEMPLATE_PROBES: Final = ("Alpha beta gamma?", "(x) 42 delta")
_STAND_IN: Final = "<documents>\nx\n</documents>\n\n"

CHAT_ONLY_FIELDS: Final = frozenset(
    {"tools", "tool_choice", "chat_template", "chat_template_kwargs", "reasoning_effort"}
)
"""Fields a chat request renders or parses that a token-id prompt would lose: such a request goes as text.

``response_format`` is not among them: both engines' ``/v1/completions`` take
it (vLLM 0.32, SGLang 0.5.23).
"""


def tail_reason(tail: str) -> str | None:
    """Why ``tail`` (after the pack in the first user message) cannot go as its own tokens; None: it can."""
    if not tail or tail != tail.strip():
        return "the question starts or ends with whitespace (its tokens could merge with the template's)"
    return None


def _after_user(tokenizer: ServerTokenizer, system: str) -> tuple[int, ...] | str:
    """The template's ids after a user message's content, or why the template is not covered."""
    rendered = [
        tokenizer.tokenize_messages(
            [{"role": "system", "content": system}, {"role": "user", "content": _STAND_IN + probe}]
        )
        for probe in _TEMPLATE_PROBES
    ]
    first, second = rendered
    start = _common_length(first, second)
    end = _common_length(first[::-1], second[::-1])
    for ids, probe in zip(rendered, _TEMPLATE_PROBES, strict=True):
        if ids[start : len(ids) - end] != tokenizer.encode(probe):
            return "the chat template does not render a question as its own tokens"
    return tuple(first[len(first) - end :])


def pack_ids(tokenizer: ServerTokenizer, system: str, prefix: str) -> StoredPackIds | str:
    """The pack's prompt ids under ``tokenizer``, checked; or why they cannot be made.

    One tokenization of the whole pack (with :data:`PACK_PROBE`) by the
    server's chat template, and a few small ones for the template.
    """
    after = _after_user(tokenizer, system)
    if isinstance(after, str):
        return after
    whole = tokenizer.tokenize_messages(
        [{"role": "system", "content": system}, {"role": "user", "content": prefix + PACK_PROBE}]
    )
    tail = [*tokenizer.encode(PACK_PROBE), *after]
    if len(whole) <= len(tail) or whole[len(whole) - len(tail) :] != tail:
        return "the pack's last tokens merge with the question's (no clean boundary)"
    return StoredPackIds(tuple(whole[: len(whole) - len(tail)]), after)


def _common_length(one: list[int], other: list[int]) -> int:
    count = 0
    for left, right in zip(one, other, strict=False):
        if left != right:
            break
        count += 1
    return count


class PromptIds:
    """One session's prompts as token ids: the pack's ids (stored), the tail's, the template's, the turns'.

    ``store`` gives the store that keeps each pack's ids, ``tokenizer`` the
    server's tokenizer (None: no tokenize route). The turns' ids are
    :attr:`history`'s, starting from the first turn's prompt as the pack's
    ids make it. One object per session: siblings and turns share it.
    """

    def __init__(self, store: Callable[[], Store], tokenizer: Callable[[], ServerTokenizer | None]) -> None:
        self._store = store
        self._tokenizer = tokenizer
        self._packs: dict[tuple[str, str], StoredPackIds | str] = {}
        self._making: dict[tuple[str, str], threading.Thread] = {}
        self._lock = threading.Lock()
        self._failed: str | None = None  # why the server could not tokenize: text from then on
        self.history = TokenHistory(tokenizer, self._first_turn_ids)
        # The pack and first turn of the request being made (what _first_turn_ids rebuilds from).
        self._asked: tuple[StoredPack, TurnRecord] | None = None

    def request(
        self,
        request: ChatRequest,
        turns: Sequence[TurnRecord],
        *,
        server: ServerInfo,
        routed: bool,
        pack: StoredPack | None,
        options: RequestOptions,
        first_messages: FirstMessages,
    ) -> ChatRequest:
        """``request`` (the next user message after ``turns``) as token ids where asked for and exact.

        ``options.prompt_ids`` sends the pack as ids; ``options.token_history``
        earlier answers as their generated ids (else their text's tokens).
        Where ``prompt_ids`` is on and ids cannot be used, the request says why
        (``text_reason``, kept with its usage). ``routed``: a router is in front.
        """
        blocked = self._blocked(request, server, routed)
        if blocked is not None:
            outcome = HistoryIds(request, blocked)
        else:
            try:
                outcome = self._made(
                    request, turns, pack=pack, options=options, first_messages=first_messages
                )
            except TokenizerError as error:
                self._failed = f"the server could not tokenize: {error}"
                outcome = HistoryIds(request, self._failed)
        if outcome.reason is None or not options.prompt_ids:
            return outcome.request
        return dataclasses.replace(outcome.request, text_reason=outcome.reason)

    def _blocked(self, request: ChatRequest, server: ServerInfo, routed: bool) -> str | None:
        """Why no request of this kind can go as ids here, whatever its pack; None: it may."""
        if (reason := chat_only_reason(request.extra_body)) is not None:
            return reason
        if any(not isinstance(message.get("content"), str) for message in request.messages):
            # A pack with images: its first user message is content parts, and ids carry no image.
            return "the prompt holds images (token ids cannot carry them)"
        if not server.profile.takes_prompt_ids:
            return f"the {server.profile.label} server takes no token-id prompts"
        if routed:
            return "a router is in front (its routes and tokenizer are not checked)"
        return self._failed

    def _made(
        self,
        request: ChatRequest,
        turns: Sequence[TurnRecord],
        *,
        pack: StoredPack | None,
        options: RequestOptions,
        first_messages: FirstMessages,
    ) -> HistoryIds:
        tokenizer = self._tokenizer()
        if tokenizer is None:
            return HistoryIds(request, "the server has no tokenize route")
        if turns:
            system = pack.system if pack is not None else None
            self._asked = (pack, turns[0]) if pack is not None and options.prompt_ids else None
            try:
                return self.history.prompt(
                    request,
                    turns,
                    system=system,
                    user=request.messages[-1]["content"],
                    first_messages=first_messages,
                    generated=options.token_history,
                )
            finally:
                self._asked = None
        asking = dataclasses.replace(request, token_ids=options.token_history)
        if pack is None or not options.prompt_ids:
            return HistoryIds(asking)
        return self.first(asking, tokenizer, pack)

    def ids(self, tokenizer: ServerTokenizer, pack: StoredPack) -> StoredPackIds | str:
        """The pack's ids under ``tokenizer``: from this object, else the store; else why not yet.

        Ids neither holds are made in a thread (:meth:`wait` waits for it),
        and this request is told to go as text.
        """
        key = (tokenizer.identity, pack.fingerprint)
        with self._lock:
            known = self._packs.get(key)
            if known is not None:
                return known
            if key not in self._making:
                stored = self._store().caches.pack_ids(*key)
                if stored is not None:
                    self._packs[key] = stored
                    return stored
                self._making[key] = thread = threading.Thread(
                    target=self._make, args=(tokenizer, pack, key), name="longctx-pack-ids", daemon=True
                )
                thread.start()
        return PACK_IDS_PENDING

    def _make(self, tokenizer: ServerTokenizer, pack: StoredPack, key: tuple[str, str]) -> None:
        made: StoredPackIds | str = "the pack's token ids could not be made"
        try:
            made = pack_ids(tokenizer, pack.system, pack.prefix)
            if not isinstance(made, str):
                self._store().caches.save_pack_ids(*key, made)
        except LongctxError as error:  # the session may close meanwhile: text from then on, said why
            made = f"the pack's token ids could not be made: {error}"
        finally:
            with self._lock:
                self._packs[key] = made
                del self._making[key]

    def wait(self) -> None:
        """Wait for the pack ids being made (they write to the store) before the store closes."""
        with self._lock:
            making = list(self._making.values())
        for thread in making:
            thread.join()

    def _first_turn_ids(self, tokenizer: ServerTokenizer) -> list[int] | None:
        """The first turn's prompt ids from the pack's ids (None: the history tokenizes its messages)."""
        if self._asked is None:
            return None
        pack, first = self._asked
        found = self.first_prompt(tokenizer, pack, first.preamble + first.question + first.instruction)
        return None if isinstance(found, str) else found

    def first_prompt(self, tokenizer: ServerTokenizer, pack: StoredPack, tail: str) -> list[int] | str:
        """The ids of ``[system, user(pack + tail)]`` with the generation prompt, or why not."""
        if (reason := tail_reason(tail)) is not None:
            return reason
        found = self.ids(tokenizer, pack)
        if isinstance(found, str):
            return found
        return [*found.head, *tokenizer.encode(tail), *found.after_user]

    def first(self, request: ChatRequest, tokenizer: ServerTokenizer, pack: StoredPack) -> HistoryIds:
        """``request`` (a first user message: the pack, then its tail) as token ids, or why not."""
        content = request.messages[-1]["content"]
        if not content.startswith(pack.prefix):
            return HistoryIds(request, "the first user message does not start with the pack")
        found = self.first_prompt(tokenizer, pack, content[len(pack.prefix) :])
        if isinstance(found, str):
            return HistoryIds(request, found)
        return HistoryIds(dataclasses.replace(request, prompt_ids=tuple(found)))


def chat_only_reason(extra_body: Mapping[str, object]) -> str | None:
    """Why a request with these extra fields must go as chat messages (None: it need not)."""
    fields = sorted(CHAT_ONLY_FIELDS.intersection(extra_body))
    return f"the request sets {', '.join(fields)}, which a chat request carries" if fields else None
