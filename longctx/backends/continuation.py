"""Continuing a prefix the server holds without resending it: SGLang's sessions.

SGLang keeps every request made in a session it opened (``POST
/open_session``); a later request names one of them (``session_params``:
``id``, ``rid``) and sends only its own tokens. With ``offset`` the server
keeps that many ids of the named request's prompt and appends the new ones
(``drop_previous_output`` leaves the named request's answer out). So a
follow-up over a million-token pack sends its own few tokens, not the pack's
million ids: no body of megabytes to encode, send, parse and validate, and no
million ids passed from the server's HTTP process to its scheduler. The
prompt the server builds is the named prompt's first ``offset`` ids and the
new ones: the ids the id path sends, by construction (``offset`` is the
longest prefix the request's ids share with the named prompt).

How it runs here (:class:`Continuations`, one per server):

- the first request sent as ids under a cache salt opens a session and goes
  in it, whole (the *lead*); once it finished, every later request under that
  salt whose ids share at least :data:`MIN_SHARED` of their first ids with the
  lead's names the lead and sends the rest (siblings and later turns alike);
- requests sent while the lead is still running, and requests that ask for
  what ``/generate`` is not asked for here (log probabilities, an answer
  constraint, the ids echoed, extra body fields, a host-tier cap), go whole on
  ``/v1/completions`` as before;
- a lead that named :data:`MAX_CHILDREN` children is retired: the server
  keeps each child's prompt in the session until it is closed, so the next
  request opens a new session; sessions are closed when the client closes;
- a continuation the server refuses (the session is gone: the server
  restarted or closed it) is sent whole, at once, and its prompt form says
  why (``ids: session continuation refused: ...``); the salt's lead is
  forgotten, so the next request opens a new session.

Only SGLang has such a route (``session_api`` in its engine profile), only
its native ``/generate`` takes ``session_params`` (its OpenAI routes drop
them: 0.5.23 read). vLLM has none: its completions route takes the whole
prompt on every request (0.32's ``session_id`` names a conversation for
routing and metrics; its streamed inputs are an in-process engine API, not a
route).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any

from longctx.recordtypes import record_type

__all__ = ["MAX_CHILDREN", "MIN_SHARED", "Continuations", "GeneratePlan", "generate_chunk", "refusal"]

MIN_SHARED = 1024
"""A request continues the lead only when it shares at least this many first ids with it."""

MAX_CHILDREN = 64
"""Requests named after one lead before its session is retired (the server keeps each child's prompt)."""


@record_type
class GeneratePlan:
    """One request as SGLang's ``/generate`` body, in a session: a lead (whole) or a continuation."""

    salt: str
    session_id: str
    rid: str
    body: dict[str, Any]
    prompt_ids: tuple[int, ...]
    #: The lead's rid this request continues from; None: this request is a lead.
    continues: str | None = None
    offset: int = 0
    #: The session must be opened before this request (a new lead).
    opens: bool = False


@record_type(frozen=False)
class _Lead:
    session_id: str
    rid: str
    prompt_ids: tuple[int, ...]
    finished: bool = False
    children: int = 0


def _shared(one: Sequence[int], other: Sequence[int]) -> int:
    """How many first ids ``one`` and ``other`` share."""
    limit = min(len(one), len(other))
    if tuple(one[:limit]) == tuple(other[:limit]):
        return limit
    low, high = 0, limit  # the first difference lies in [low, high)
    while high - low > 1024:
        middle = (low + high) // 2
        if tuple(one[low:middle]) == tuple(other[low:middle]):
            low = middle
        else:
            high = middle
    while low < high and one[low] == other[low]:
        low += 1
    return low


def _sampling(request: Any) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if request.max_tokens is not None:
        params["max_new_tokens"] = request.max_tokens
    if request.temperature is not None:
        params["temperature"] = request.temperature
    if request.seed is not None:
        params["sampling_seed"] = request.seed
    return params


@record_type(frozen=False)
class Continuations:
    """The sessions this process opened on one SGLang server, one lead per cache salt; thread-safe."""

    min_shared: int = MIN_SHARED
    max_children: int = MAX_CHILDREN
    _leads: dict[str, _Lead] = field(default_factory=dict)
    _retired: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @staticmethod
    def unsuitable(request: Any) -> str | None:
        """Why ``request`` (a ChatRequest) goes whole; None: it may continue a lead."""
        if request.prompt_ids is None:
            return "sent as text"
        for name, why in (
            ("logprobs", "log probabilities asked"),
            ("constraint", "an answer constraint"),
            ("token_ids", "the ids asked back"),
            ("extra_body", "extra body fields"),
            ("offload_tokens", "a host-tier cap"),
        ):
            if getattr(request, name) not in (None, False, {}, ()):
                return why
        return None

    def plan(self, request: Any) -> GeneratePlan | None:
        """The ``/generate`` plan of ``request``; None: send it whole on ``/v1/completions`` as before."""
        if self.unsuitable(request) is not None:
            return None
        ids: tuple[int, ...] = tuple(request.prompt_ids)
        salt = request.cache_salt or ""
        rid = request.request_id or uuid.uuid4().hex
        base: dict[str, Any] = {"sampling_params": _sampling(request), "stream": True, "rid": rid}
        if request.cache_salt:
            base["cache_salt"] = request.cache_salt
        with self._lock:
            lead = self._leads.get(salt)
            if lead is not None and lead.children >= self.max_children and lead.finished:
                self._retired.append(lead.session_id)
                del self._leads[salt]
                lead = None
            if lead is None:
                session_id = uuid.uuid4().hex
                self._leads[salt] = _Lead(session_id, rid, ids)
                body = {**base, "input_ids": list(ids), "session_params": {"id": session_id}}
                return GeneratePlan(salt, session_id, rid, body, ids, opens=True)
            if not lead.finished:
                return None
            shared = _shared(ids, lead.prompt_ids)
            if shared < self.min_shared or shared >= len(ids):
                return None
            lead.children += 1
        session = {"id": lead.session_id, "rid": lead.rid, "offset": shared, "drop_previous_output": True}
        body = {**base, "input_ids": list(ids[shared:]), "session_params": session}
        return GeneratePlan(salt, lead.session_id, rid, body, ids, continues=lead.rid, offset=shared)

    def finished(self, plan: GeneratePlan) -> None:
        """``plan``'s request was answered: a lead may now be continued."""
        with self._lock:
            lead = self._leads.get(plan.salt)
            if lead is not None and plan.continues is None and lead.rid == plan.rid:
                lead.finished = True

    def failed(self, plan: GeneratePlan) -> None:
        """``plan``'s request failed or was refused: forget its salt's lead (the next request opens anew)."""
        with self._lock:
            lead = self._leads.get(plan.salt)
            if lead is not None and lead.session_id == plan.session_id:
                del self._leads[plan.salt]
                self._retired.append(lead.session_id)

    def to_close(self) -> list[str]:
        """The retired sessions, to close now (each is handed out once)."""
        with self._lock:
            found, self._retired = self._retired, []
            return found

    def close_all(self) -> list[str]:
        """Every session opened here (retired and open), forgetting them all."""
        with self._lock:
            found = [*self._retired, *(lead.session_id for lead in self._leads.values())]
            self._retired, self._leads = [], {}
            return found


def generate_chunk(event: Mapping[str, Any], seen: str) -> tuple[dict[str, Any], str]:
    """One ``/generate`` stream event as a completions chunk, and the answer's text so far.

    ``/generate`` streams the whole text so far; the usage is in
    ``meta_info`` (``prompt_tokens``, ``completion_tokens``,
    ``cached_tokens``), final once ``finish_reason`` is set.
    """
    text = str(event.get("text") or "")
    meta = event.get("meta_info") or {}
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else finish
    choice: dict[str, Any] = {"index": 0, "text": text[len(seen) :] if text.startswith(seen) else text}
    chunk: dict[str, Any] = {"choices": [choice]}
    if kind:
        choice["finish_reason"] = str(kind)
        chunk["usage"] = {
            "prompt_tokens": meta.get("prompt_tokens"),
            "completion_tokens": meta.get("completion_tokens"),
            "prompt_tokens_details": {"cached_tokens": meta.get("cached_tokens")},
        }
    return chunk, text


def refusal(event: Mapping[str, Any]) -> str | None:
    """The server's reason when a ``/generate`` event says the request was aborted; else None."""
    meta = event.get("meta_info") or {}
    finish = meta.get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        return str(finish.get("message") or "aborted")
    return None
