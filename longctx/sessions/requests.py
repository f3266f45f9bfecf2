"""Request building: a question's chat request over the session's pack and history.

:class:`Asked` is what a question asks for beyond its text (its citations
checked, its answer typed), :func:`grounding` the citation instruction and
what the answer will be checked against, :func:`constrained` the body fields
that hold an answer to its schema (a cited answer's too). :class:`RequestBuilder` makes a session's
requests: the messages after a history, the request options, the pack's
tokens as an offload bound, and the prompt as token ids where asked and exact
(:mod:`longctx.sessions.prompt_ids`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from longctx.backends.base import Backend
from longctx.backends.chat import ChatRequest
from longctx.backends.tokenizer import ServerTokenizer
from longctx.citations import CITE_INSTRUCTION, Grounding
from longctx.errors import ConfigError
from longctx.options.groups import RequestOptions
from longctx.packing.image_parts import content_parts
from longctx.recordtypes import record_type
from longctx.sessions.changes import Changes
from longctx.sessions.prompt_ids import PromptIds
from longctx.store import Store, StoredPack, TurnRecord

if TYPE_CHECKING:
    from longctx.schemas import AnswerSchema


__all__ = [
    "Asked",
    "RequestBuilder",
    "RequestSource",
    "constrained",
    "grounding",
    "request_messages",
]


@record_type
class Asked:
    """What one question asks for beyond its text: its citations checked, its answer typed (None: not)."""

    grounding: Grounding | None = None
    schema: AnswerSchema | None = None


def grounding(
    cite: bool | None, pack: StoredPack | None, history: Sequence[TurnRecord], changes: Changes | None
) -> Grounding | None:
    """What a question asked with ``cite`` adds to its request and checks its answer in; None without it.

    Its citations are checked in the documents the request carries: the
    ``pack``'s, then the changed files the ``history`` and this
    question's ``changes`` appended, a later copy of a path replacing an earlier one.
    """
    if not cite:
        return None
    appended = [turn.preamble for turn in history] + [changes.text if changes is not None else ""]
    return Grounding(CITE_INSTRUCTION, (pack.prefix if pack is not None else "", *appended))


def constrained(request: ChatRequest, asked: Asked, backend: Backend) -> ChatRequest:
    """``request`` with the body fields that hold its answer to ``asked``'s schema on the server it goes to.

    The prompt is left as it is (a schema costs no cached token); the
    fields are the engine profile's (:meth:`AnswerSchema.request_fields`).
    A cited question's answer is held to its grounding's schema (sources,
    each a line of its document, then the answer: :func:`longctx.citations.cite_schema`)
    where the server can constrain decoding; where it cannot, the question
    goes without it and the answer is read as the model wrote it.
    """
    server = backend.server_for(request.affinity_key)
    if asked.schema is not None:
        return dataclasses.replace(request, constraint=asked.schema.request_fields(server))
    if asked.grounding is None:
        return request
    from longctx.schemas import AnswerSchema  # a cited question's only: a plain batch never loads it

    try:
        fields = AnswerSchema("cited_answer", asked.grounding.schema).request_fields(server)
    except ConfigError:  # no schema form, or one turned off: the instruction alone asks for the sources
        return request
    return dataclasses.replace(request, constraint=fields)


def request_messages(
    pack: StoredPack | None, turns: Sequence[TurnRecord], question: str, preamble: str = ""
) -> list[dict[str, Any]]:
    """The messages that ask ``question`` after ``turns`` over ``pack`` (after ``preamble``: changed files).

    The first user message is content parts when the pack holds images
    (:meth:`~longctx.packing.Pack.user_parts`), else one string.
    """
    users: list[str | list[dict[str, Any]]] = [
        *(turn.preamble + turn.question + turn.instruction for turn in turns),
        preamble + question,
    ]
    messages: list[dict[str, Any]] = []
    if pack is not None:
        messages.append({"role": "system", "content": pack.system})
        first = str(users[0])
        # The documents open the first user message, each image in its place.
        users[0] = content_parts(pack.prefix, pack.images, first) if pack.images else pack.prefix + first
    for user, turn in zip(users, turns, strict=False):
        messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": turn.history_answer})
    messages.append({"role": "user", "content": users[-1]})
    return messages


class RequestSource(Protocol):
    """What a session's requests are made from (a :class:`~longctx.sessions.session.Session` is one)."""

    request: RequestOptions

    @property
    def pack(self) -> StoredPack | None: ...

    @property
    def affinity_key(self) -> str: ...

    @property
    def backend(self) -> Backend: ...

    @property
    def store(self) -> Store: ...


class RequestBuilder:
    """A session's requests: a question's chat request after a history, as token ids where asked and exact."""

    def __init__(self, source: RequestSource) -> None:
        self._source = source
        self._tokenizers: dict[str, ServerTokenizer] = {}  # by replica: each asks its identity once
        self.prompt_ids = PromptIds(lambda: source.store, self._history_tokenizer)

    def pack_tokens(self) -> int:
        """The pack's tokens (0 without one): the prefix siblings share, what a request may offload."""
        pack = self._source.pack
        return int(pack.summary.get("total_tokens") or 0) if pack is not None else 0

    def chat_request(
        self,
        question: str,
        history: Sequence[TurnRecord],
        max_tokens: int,
        changes: Changes | None = None,
        grounding: Grounding | None = None,
    ) -> ChatRequest:
        """The request that asks ``question`` (checked at the call) after ``history``, as text."""
        source, options = self._source, self._source.request
        preamble = changes.text if changes is not None else ""
        asked = question + (grounding.instruction if grounding is not None else "")  # after the question
        return ChatRequest(
            messages=tuple(request_messages(source.pack, history, asked, preamble)),
            max_tokens=max_tokens,
            temperature=options.temperature,
            seed=options.seed,
            cache_salt=options.cache_salt,
            affinity_key=source.affinity_key,
            extra_body=options.extra_body,
            offload_tokens=(self.pack_tokens() or None) if options.offload_prefix_only else None,
        )

    def as_ids(self, request: ChatRequest, history: Sequence[TurnRecord]) -> ChatRequest:
        """``request`` (after ``history``) as token ids where asked for and exact, else why not.

        See :meth:`PromptIds.request <longctx.sessions.prompt_ids.PromptIds.request>`.
        """
        source = self._source
        options, pack, backend = source.request, source.pack, source.backend
        if not (options.prompt_ids or options.token_history) or (pack is None and not history):
            return request
        server = backend.server_for(request.affinity_key)
        routed = bool(backend.router_policy) or backend.router(server.api_url) is not None
        turns = list(history)
        return self.prompt_ids.request(
            request,
            turns,
            server=server,
            routed=routed,
            pack=pack,
            options=options,
            first_messages=lambda: request_messages(
                pack, (), turns[0].question + turns[0].instruction, turns[0].preamble
            ),
        )

    def _history_tokenizer(self) -> ServerTokenizer | None:
        backend, key = self._source.backend, self._source.affinity_key
        server = backend.server_for(key)
        if not server.profile.tokenizes:
            return None
        if server.api_url not in self._tokenizers:
            self._tokenizers[server.api_url] = backend.tokenizer(key)
        return self._tokenizers[server.api_url]
