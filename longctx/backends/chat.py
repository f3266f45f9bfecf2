"""Streaming chat completions, the OpenAI-compatible ``/v1/chat/completions`` of vLLM and SGLang.

Every request is streamed with ``stream_options.include_usage``, so the time
to first token is measured and the usage arrives in the final chunk. One
call is one attempt: retrying lives in :mod:`longctx.retry`. Failures become
longctx errors; a stream that drops or stalls midway is
:class:`ServerUnreachable`, so the whole request is retried and no partial
answer is ever kept.

The stream is read straight from HTTP (:func:`longctx.backends.http.post_events`),
not through the openai SDK, whose import alone took 0.62 s (docs/architecture.md,
"Choices that differ from the first sketch").

A request with ``prompt_ids`` is a prompt already rendered through the chat
template, as token ids: it goes to ``/v1/completions`` instead (both engines
take a list of ids as ``prompt``), so a session can send its history with
each answer's generated ids (:mod:`longctx.sessions.token_history`). With
``token_ids`` the server is asked for the prompt's and the answer's ids, by
the body fields of its engine profile (``chat_id_switches``,
``completions_id_switches``: each engine's fields and where it sends the
ids are noted there).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncGenerator, Callable, Generator, Mapping, Sequence
from dataclasses import field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from longctx.backends.continuation import Continuations, GeneratePlan, generate_chunk, refusal
from longctx.backends.http import (
    TRANSPORT_ERRORS,
    EventPost,
    apost_events,
    make_async_client,
    make_client,
    post_events,
    split_base_url,
)
from longctx.backends.prefill_wait import MIN_PREFILL_TOKENS, PrefillWatch
from longctx.backends.profiles import EngineProfile
from longctx.drivers import Io
from longctx.errors import BackendError
from longctx.options.groups import (
    DEFAULT_AFFINITY_HEADERS,
    DEFAULT_STALL_TIMEOUT_SECONDS,
    DEFAULT_TIMEOUT_SECONDS,
    ECHOED_HEADERS,
)
from longctx.recordtypes import record_type
from longctx.usage import Usage

if TYPE_CHECKING:
    from longctx.backends.httpx2_bridge import AsyncClient, AsyncTransport, Transport

__all__ = ["ChatClient", "ChatRequest", "Completion", "TokenLogprob"]


@record_type
class ChatRequest:
    """One chat completion to send.

    ``affinity_key`` goes out in each of the client's affinity headers
    (:data:`longctx.options.groups.DEFAULT_AFFINITY_HEADERS` unless set otherwise)
    and as the ``user`` field, which routers (vllm-router, SGLang's gateway,
    llm-d, Dynamo) use to keep a prefix on one replica.
    ``cache_salt`` namespaces the server's prefix cache (tenants never share).
    ``logprobs`` asks for each generated token's log probability and that
    many alternatives (``top_logprobs``; 0 for the chosen token's only).
    ``body_affinity`` names body fields that carry ``affinity_key`` too
    (OpenAI's ``prompt_cache_key``, for a gateway that routes on it).
    """

    messages: tuple[Mapping[str, str], ...]
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    cache_salt: str | None = None
    affinity_key: str | None = None
    request_id: str | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    prompt_ids: tuple[int, ...] | None = None
    token_ids: bool = False
    logprobs: int | None = None
    body_affinity: tuple[str, ...] = ()
    #: Offload at most this many prompt tokens to the server's host tier (the shared pack), where
    #: the engine takes a per-request cap; None: no cap.
    offload_tokens: int | None = None
    #: Body fields that constrain decoding (an answer schema's, in the form the engine profile
    #: says: :meth:`longctx.schemas.AnswerSchema.request_fields`); they never touch the prompt.
    constraint: Mapping[str, Any] = field(default_factory=dict)
    #: Why this request goes as chat messages where token ids were wanted (kept with its usage as
    #: ``prompt_form``; longctx.sessions.prompt_ids); None: ids, or text as asked.
    text_reason: str | None = None


@record_type
class TokenLogprob:
    """One generated token as the server scored it: its text, log probability, and the alternatives.

    ``top`` holds ``(token, logprob)`` of the most likely tokens at that
    position, most likely first (the chosen one among them under greedy
    decoding), as many as the request's ``logprobs`` asked for.
    """

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@record_type
class Completion:
    """A finished answer: its text, separate reasoning if the server split it, and usage.

    ``token_ids`` (the answer as generated) and ``prompt_token_ids`` are
    set when the request asked for them and the server sent them, as are
    ``logprobs`` (one :class:`TokenLogprob` per generated token).
    """

    text: str
    reasoning: str | None
    finish_reason: str | None
    usage: Usage
    token_ids: tuple[int, ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None


def _first(mapping: Any, *names: str) -> Any:
    """The first of ``names`` that ``mapping`` holds with a value (None when it is no mapping)."""
    if not isinstance(mapping, dict):
        return None
    return next((mapping[name] for name in names if mapping.get(name) is not None), None)


class _Accumulator:
    """Collects a stream's pieces and timings."""

    def __init__(
        self, started: float, missing_reason: str, on_first_token: Callable[[], None] | None = None
    ) -> None:
        self.started = started
        self.on_first_token = on_first_token
        self.first_token_at: float | None = None
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.missing_reason = missing_reason
        self.token_ids: list[int] | None = None
        self.prompt_token_ids: list[int] | None = None
        # SGLang's split of the cached tokens by tier (``sglext.cached_tokens_details``).
        self.tier_details: dict[str, Any] | None = None
        self.logprobs: list[TokenLogprob] | None = None

    def add(self, chunk: dict[str, Any]) -> str:
        """Take in one chunk; the answer's text it adds ("" for none)."""
        added = ""
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        self._add_ids(chunk)
        self._add_logprobs(chunk)
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            # A chat chunk carries a delta; a completions chunk its text.
            content = delta.get("content") if "delta" in choice else choice.get("text")
            thought = _first(delta, "reasoning_content", "reasoning")
            if (content or thought) and self.first_token_at is None:
                self.first_token_at = time.perf_counter()
                if self.on_first_token is not None:
                    self.on_first_token()
            if content:
                self.text.append(content)
                added += content
            if thought:
                self.reasoning.append(str(thought))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return added

    def _add_ids(self, chunk: dict[str, Any]) -> None:
        prompt = chunk.get("prompt_token_ids")
        for choice in chunk.get("choices") or ():
            prompt = prompt or choice.get("prompt_token_ids")
            if choice.get("token_ids"):
                self.token_ids = [*(self.token_ids or []), *choice["token_ids"]]
        extension = chunk.get("sglext") or {}
        if isinstance(extension, dict):
            # SGLang's chat route: every id so far, per choice, in the last chunk.
            outputs, inputs = extension.get("output_ids"), extension.get("input_ids")
            if outputs:
                self.token_ids = list(outputs[0])
            if inputs:
                prompt = inputs[0] if isinstance(inputs[0], list) else inputs
            details = extension.get("cached_tokens_details")
            if isinstance(details, dict):
                self.tier_details = details
        if prompt:
            self.prompt_token_ids = [int(token) for token in prompt]

    def _add_logprobs(self, chunk: dict[str, Any]) -> None:
        """The chunk's token log probabilities: chat's ``logprobs.content[]``, or completions' lists."""
        for choice in chunk.get("choices") or ():
            scored = choice.get("logprobs")
            if not isinstance(scored, dict):
                continue
            found = self.logprobs if self.logprobs is not None else []
            if isinstance(scored.get("content"), list):
                for entry in scored["content"]:
                    top = tuple(
                        (str(alt.get("token")), float(alt["logprob"]))
                        for alt in entry.get("top_logprobs") or ()
                        if alt.get("logprob") is not None
                    )
                    found.append(TokenLogprob(str(entry.get("token")), float(entry["logprob"]), top))
            elif isinstance(scored.get("token_logprobs"), list):
                tops = scored.get("top_logprobs") or [None] * len(scored["token_logprobs"])
                tokens = scored.get("tokens") or ()
                for token, logprob, top in zip(tokens, scored["token_logprobs"], tops, strict=False):
                    alternatives = sorted((top or {}).items(), key=lambda item: -item[1])
                    found.append(TokenLogprob(str(token), float(logprob), tuple(alternatives)))
            self.logprobs = found

    def finish(self) -> Completion:
        ended = time.perf_counter()
        usage = self.usage
        prompt = completion = cached = created = None
        reason: str | None = None
        if not isinstance(usage, dict):
            reason = "the server sent no usage (stream_options.include_usage unsupported?)"
        else:
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details")
            cached = _first(details, "cached_tokens")
            created = _first(details, "created_cache_tokens")
            if cached is None:
                reason = self.missing_reason
        host, external = _tier_split(self.tier_details)
        first = self.first_token_at if self.first_token_at is not None else ended
        return Completion(
            text="".join(self.text),
            reasoning="".join(self.reasoning) or None,
            finish_reason=self.finish_reason,
            usage=Usage(
                prompt_tokens=prompt,
                cached_tokens=cached,
                created_cache_tokens=None if created is None else int(created),
                completion_tokens=completion,
                ttft_seconds=first - self.started,
                total_seconds=ended - self.started,
                cached_reason=reason,
                host_cached_tokens=host,
                external_cached_tokens=external,
            ),
            token_ids=None if self.token_ids is None else tuple(int(t) for t in self.token_ids),
            prompt_token_ids=None if self.prompt_token_ids is None else tuple(self.prompt_token_ids),
            logprobs=None if self.logprobs is None else tuple(self.logprobs),
        )


def _tier_split(details: Mapping[str, Any] | None) -> tuple[int | None, int | None]:
    """(host, storage) cached tokens of SGLang's ``cached_tokens_details``; (None, None) when not sent."""
    if not details:
        return None, None
    host = details.get("host")
    storage = details.get("storage")
    return (
        int(host) if isinstance(host, (int, float)) else 0,
        int(storage) if isinstance(storage, (int, float)) else 0,
    )


class _Read:
    """One attempt's stream read as it comes: the answer's text piece by piece, then the completion.

    The one body of both modes' reading (:class:`longctx.drivers.Pieces`):
    a plain step reads it to the end, a streamed one hands its pieces on.
    """

    def __init__(
        self,
        chat: ChatClient,
        post: EventPost,
        on_first_token: Callable[[], None] | None,
        on_finished: Callable[[Completion], None] | None = None,
    ) -> None:
        self._chat = chat
        self._post = post
        self._on_first_token = on_first_token
        self._on_finished = on_finished
        self._completion: Completion | None = None

    def _finish(self, accumulator: _Accumulator) -> None:
        self._completion = accumulator.finish()
        if self._on_finished is not None:
            self._on_finished(self._completion)

    def _accumulator(self) -> _Accumulator:
        return _Accumulator(time.perf_counter(), self._chat.profile.missing_report, self._on_first_token)

    def each(self) -> Generator[str, None, None]:
        accumulator = self._accumulator()
        for chunk in post_events(self._chat._sync, self._post):
            if added := accumulator.add(chunk):
                yield added
        self._finish(accumulator)

    async def aeach(self) -> AsyncGenerator[str, None]:
        accumulator = self._accumulator()
        async for chunk in apost_events(self._chat._async, self._post):
            if added := accumulator.add(chunk):
                yield added
        self._finish(accumulator)

    @property
    def value(self) -> Completion:
        if self._completion is None:
            raise RuntimeError("the stream was not read to its end")
        return self._completion

    def read(self) -> Completion:
        for _ in self.each():
            pass
        return self.value

    async def aread(self) -> Completion:
        async for _ in self.aeach():
            pass
        return self.value


class _Refused(Exception):
    """The server refused a session continuation before its first token (the session is gone)."""


class _SessionRead(_Read):
    """A request sent in an SGLang session (:mod:`longctx.backends.continuation`); sent whole if refused.

    A lead opens its session first. A refusal before the first token (the
    session is gone, the open failed) sends the request whole on
    ``/v1/completions`` at once, its prompt form saying why.
    """

    def __init__(
        self,
        chat: ChatClient,
        plan: GeneratePlan,
        post: EventPost,
        whole: EventPost,
        *,
        on_first_token: Callable[[], None] | None,
        on_finished: Callable[[Completion], None] | None,
    ) -> None:
        super().__init__(chat, post, on_first_token, on_finished)
        self._plan = plan
        self._whole = whole
        self._opening = {"capacity_of_str_len": 1 << 30, "session_id": plan.session_id}

    def _opened(self, status: int, answer: str) -> str | None:
        """Why the session did not open; None: it did."""
        if status != 200 or plan_id_of(answer) != self._plan.session_id:
            return f"open_session answered HTTP {status}: {answer[:200]}"
        return None

    def _fallback(self, why: str) -> _Read:
        assert self._chat.continuations is not None
        self._chat.continuations.failed(self._plan)
        self._form = f"ids: session continuation refused: {why}"
        return _Read(self._chat, self._whole, self._on_first_token, self._on_finished)

    def _with_form(self, completion: Completion, form: str) -> Completion:
        usage = completion.usage
        return Completion(
            **{**completion.__dict__, "usage": Usage(**{**usage.__dict__, "prompt_form": form})}
        )

    def each(self) -> Generator[str, None, None]:
        root = split_base_url(self._chat.api_url)[0]
        why = None
        if self._plan.opens:
            self._chat.close_sessions(retired_only=True)
            try:
                answer = self._chat._sync.request(
                    "POST", f"{root}/open_session", json=self._opening, headers=self._post.headers
                )
                why = self._opened(answer.status_code, answer.text)
            except TRANSPORT_ERRORS as error:
                why = f"open_session failed: {error}"
        if why is None:
            accumulator, seen = self._accumulator(), ""
            try:
                for event in post_events(self._chat._sync, self._post):
                    chunk, seen = self._take(event, seen, accumulator)
                    if added := accumulator.add(chunk):
                        yield added
                self._finish_session(accumulator)
                return
            except (_Refused, BackendError) as error:
                if accumulator.first_token_at is not None:
                    raise
                why = str(error)
        fallback = self._fallback(why)
        yield from fallback.each()
        self._completion = self._with_form(fallback.value, self._form)

    async def aeach(self) -> AsyncGenerator[str, None]:
        root = split_base_url(self._chat.api_url)[0]
        why = None
        if self._plan.opens:
            for retired in self._chat.continuations.to_close() if self._chat.continuations else ():
                with contextlib.suppress(*TRANSPORT_ERRORS):
                    closing = {"session_id": retired}
                    await self._chat._async.post(f"{root}/close_session", json=closing, timeout=5.0)
            try:
                answer = await self._chat._async.post(
                    f"{root}/open_session", json=self._opening, headers=self._post.headers
                )
                why = self._opened(answer.status_code, answer.text)
            except TRANSPORT_ERRORS as error:
                why = f"open_session failed: {error}"
        if why is None:
            accumulator, seen = self._accumulator(), ""
            try:
                async for event in apost_events(self._chat._async, self._post):
                    chunk, seen = self._take(event, seen, accumulator)
                    if added := accumulator.add(chunk):
                        yield added
                self._finish_session(accumulator)
                return
            except (_Refused, BackendError) as error:
                if accumulator.first_token_at is not None:
                    raise
                why = str(error)
        fallback = self._fallback(why)
        async for piece in fallback.aeach():
            yield piece
        self._completion = self._with_form(fallback.value, self._form)

    def _take(
        self, event: dict[str, Any], seen: str, accumulator: _Accumulator
    ) -> tuple[dict[str, Any], str]:
        if (why := refusal(event)) is not None:
            if accumulator.first_token_at is None:
                raise _Refused(why)
            raise BackendError(f"the server aborted the answer midway: {why}", url=self._post.url)
        return generate_chunk(event, seen)

    def _finish_session(self, accumulator: _Accumulator) -> None:
        assert self._chat.continuations is not None
        self._finish(accumulator)
        self._chat.continuations.finished(self._plan)
        form = (
            "ids: session" if self._plan.continues is None else f"ids: session, {self._plan.offset} ids kept"
        )
        assert self._completion is not None
        self._completion = self._with_form(self._completion, form)


def plan_id_of(answer: str) -> str | None:
    """The session id an ``/open_session`` answer names (a JSON string)."""
    text = answer.strip()
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == '"' else text or None


class ChatClient:
    """Streaming chat against one server, sync and async; one attempt per call."""

    def __init__(
        self,
        api_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        stall_timeout: float = DEFAULT_STALL_TIMEOUT_SECONDS,
        profile: EngineProfile,
        affinity_headers: Sequence[str] = DEFAULT_AFFINITY_HEADERS,
        transport: Transport | None = None,
        async_transport: AsyncTransport | None = None,
        tier_details: bool = False,
    ) -> None:
        self.api_url = api_url
        # Ask the server where each request's cached tokens came from (SGLang with HiCache).
        self.tier_details = tier_details
        self.model = model
        self.profile = profile
        self._affinity_headers = tuple(affinity_headers)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # What a gateway set on a response (llm-d's x-session-token), per affinity key, to echo.
        self._echoes: dict[str, dict[str, str]] = {}
        self._sync = make_client(timeout=timeout, stall_timeout=stall_timeout, transport=transport)
        # The async client is made at its first use: a sync caller (the CLI's batch) then never
        # imports httpx2 (see backends/client.py).
        self._async_client: AsyncClient | None = None
        self._async_settings = (timeout, stall_timeout, async_transport)
        self._async_lock = threading.Lock()
        #: This server's prefill rates and the prompts sent to it: how long a first token may take.
        self.prefill = PrefillWatch(stall_timeout)
        #: The sessions a request continues in without resending its prefix (SGLang); None: off.
        self.continuations: Continuations | None = None

    @property
    def _async(self) -> AsyncClient:
        with self._async_lock:
            if self._async_client is None:
                timeout, stall_timeout, transport = self._async_settings
                self._async_client = make_async_client(
                    timeout=timeout, stall_timeout=stall_timeout, transport=transport
                )
            return self._async_client

    def _arguments(self, request: ChatRequest) -> tuple[dict[str, Any], dict[str, str]]:
        """The request's body and headers."""
        headers: dict[str, str] = dict(self._headers)
        body: dict[str, Any] = {**request.extra_body, **request.constraint}
        arguments: dict[str, Any] = {
            "model": self.model,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.prompt_ids is not None:
            arguments["prompt"] = list(request.prompt_ids)
        else:
            arguments["messages"] = [dict(message) for message in request.messages]
        if request.token_ids:
            arguments.update(self.profile.id_switches(completions=request.prompt_ids is not None))
        if self.tier_details:
            arguments.update(dict.fromkeys(self.profile.tier_detail_switches, True))
            cap = self.profile.offload_cap
            if cap is not None and request.offload_tokens is not None:
                # The cap sits in a dict the caller's extra body may also fill: merged, not replaced.
                outer, inner = cap
                body[outer] = {**dict(body.get(outer) or {}), inner: request.offload_tokens}
        if request.logprobs is not None:
            if request.prompt_ids is not None:
                arguments["logprobs"] = request.logprobs  # completions: the number of alternatives
            else:
                arguments["logprobs"] = True
                arguments["top_logprobs"] = request.logprobs
        for name in ("max_tokens", "temperature", "seed"):  # sent only when set, by the request's names
            if (value := getattr(request, name)) is not None:
                arguments[name] = value
        if request.affinity_key:
            arguments.update(dict.fromkeys(("user", *request.body_affinity), request.affinity_key))
            headers.update(dict.fromkeys(self._affinity_headers, request.affinity_key))
            headers.update(self._echoes.get(request.affinity_key, {}))
        if request.cache_salt:
            body["cache_salt"] = request.cache_salt
        # Extra fields go in beside the standard ones; a standard one is never overridden by them.
        return {**body, **arguments}, headers

    def _heard(self, affinity_key: str | None, headers: Mapping[str, str]) -> None:
        """Keep what the gateway set for ``affinity_key`` to send it back next time (see ECHOED_HEADERS)."""
        if not affinity_key:
            return
        echoed = {name: value for name in ECHOED_HEADERS if (value := headers.get(name))}
        if echoed:
            self._echoes[affinity_key] = echoed

    def sending(
        self,
        request: ChatRequest,
        on_first_token: Callable[[], None] | None = None,
        on_admitted: Callable[[], None] | None = None,
        *,
        streamed: bool = False,
    ) -> Io[Completion]:
        """The step that sends ``request`` once and reads the whole stream (one attempt).

        ``on_admitted`` is called when the response's headers arrive: the
        server has accepted the request (vLLM sends them once it rendered and
        tokenized the prompt, just before the request enters its scheduler).
        ``on_first_token`` is called when the first token arrives: the
        server has then prefilled (and cached) the whole prompt.
        ``streamed``: the step also hands out the answer's text as it comes
        (its ``pieces``, for :func:`longctx.drivers.stream`).
        """
        body, headers = self._arguments(request)
        route = "completions" if request.prompt_ids is not None else "chat/completions"
        wait, prompt = self.prefill.wait(request.prompt_ids, request.messages, request.cache_salt)
        longer = wait.gives_up_after > self.prefill.stall_seconds
        post = EventPost(
            f"{self.api_url}/{route}",
            body,
            headers,
            on_admitted,
            partial(self._heard, request.affinity_key),
            request_id=request.request_id,  # sent as X-Request-Id, named by the request's errors
            read_timeout=wait.gives_up_after if longer else None,
            waiting_for=wait.describe() if wait.uncached_tokens >= MIN_PREFILL_TOKENS else None,
        )

        def observe(done: Completion) -> None:
            self.prefill.observe(prompt, done.usage)

        plan = self.continuations.plan(request) if self.continuations is not None else None
        if plan is not None:
            root = split_base_url(self.api_url)[0]
            in_session = replace(post, url=f"{root}/generate", body=plan.body)

            def read_in_session() -> _Read:
                return _SessionRead(
                    self, plan, in_session, post, on_first_token=on_first_token, on_finished=observe
                )

            session_read = read_in_session
            return Io(
                lambda: session_read().read(),
                lambda: session_read().aread(),
                session_read if streamed else None,
            )

        def read() -> _Read:
            return _Read(self, post, on_first_token, observe)

        return Io(lambda: read().read(), lambda: read().aread(), read if streamed else None)

    def complete(
        self,
        request: ChatRequest,
        on_first_token: Callable[[], None] | None = None,
        on_admitted: Callable[[], None] | None = None,
    ) -> Completion:
        """Send ``request`` once, blocking (:meth:`sending` carried out here)."""
        return self.sending(request, on_first_token, on_admitted).call()

    def close(self) -> None:
        self.close_sessions()
        self._sync.close()

    async def aclose(self) -> None:
        self.close_sessions()
        if self._async_client is not None:
            await self._async_client.aclose()

    def close_sessions(self, *, retired_only: bool = False) -> None:
        """Close the sessions opened here, or only the retired ones; best effort (a dead server has none)."""
        if self.continuations is None or self._sync.is_closed:
            return
        root = split_base_url(self.api_url)[0]
        closing = self.continuations.to_close() if retired_only else self.continuations.close_all()
        for session_id in closing:
            try:
                ending = {"session_id": session_id}
                self._sync.request("POST", f"{root}/close_session", json=ending, timeout=5.0)
            except TRANSPORT_ERRORS:
                continue

    @property
    def is_closed(self) -> bool:
        """True once both clients are closed (an async client never made is closed)."""
        return self._sync.is_closed and (self._async_client is None or self._async_client.is_closed)
