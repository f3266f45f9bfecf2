"""Streaming chat completions through the openai client (imported here only).

Every request is streamed with ``stream_options.include_usage``, so the time
to first token is measured and the usage arrives in the final chunk. The
client's own retries are off (``max_retries=0``): retrying lives in
:mod:`longctx.retry`. Failures become longctx errors; a stream that drops or
stalls midway is :class:`ServerUnreachable`, so the whole request is
retried and no partial answer is ever kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import openai

from longctx.backends.http import (
    TRANSPORT_ERRORS,
    AsyncTransport,
    Transport,
    error_from_response,
    make_async_client,
    make_client,
    unreachable,
)
from longctx.config import DEFAULT_AFFINITY_HEADERS
from longctx.errors import BackendError, ServerError
from longctx.retry import parse_retry_after
from longctx.usage import Usage

__all__ = ["ChatClient", "ChatRequest", "Completion"]

# What a request can fail with before it is translated into a longctx error.
_FAILURES: tuple[type[BaseException], ...] = (openai.OpenAIError, *TRANSPORT_ERRORS)


@dataclass(frozen=True)
class ChatRequest:
    """One chat completion to send.

    ``affinity_key`` goes out in each of the client's affinity headers
    (:data:`longctx.config.DEFAULT_AFFINITY_HEADERS` unless set otherwise)
    and as the ``user`` field, which routers (vllm-router, SGLang's gateway,
    llm-d, Dynamo) use to keep a prefix on one replica.
    ``cache_salt`` namespaces the server's prefix cache (tenants never share).
    """

    messages: tuple[Mapping[str, str], ...]
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    cache_salt: str | None = None
    affinity_key: str | None = None
    request_id: str | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Completion:
    """A finished answer: its text, separate reasoning if the server split it, and usage."""

    text: str
    reasoning: str | None
    finish_reason: str | None
    usage: Usage


def _extra(model: Any, *names: str) -> Any:
    extra = getattr(model, "model_extra", None) or {}
    for name in names:
        value = getattr(model, name, None) if name in type(model).model_fields else extra.get(name)
        if value is not None:
            return value
    return None


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

    def add(self, chunk: Any) -> None:
        if chunk.usage is not None:
            self.usage = chunk.usage
        for choice in chunk.choices or ():
            delta = choice.delta
            content = getattr(delta, "content", None)
            thought = _extra(delta, "reasoning_content", "reasoning")
            if (content or thought) and self.first_token_at is None:
                self.first_token_at = time.perf_counter()
                if self.on_first_token is not None:
                    self.on_first_token()
            if content:
                self.text.append(content)
            if thought:
                self.reasoning.append(str(thought))
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason

    def finish(self) -> Completion:
        ended = time.perf_counter()
        usage = self.usage
        prompt = completion = cached = created = None
        reason: str | None = None
        if usage is None:
            reason = "the server sent no usage (stream_options.include_usage unsupported?)"
        else:
            prompt, completion = usage.prompt_tokens, usage.completion_tokens
            details = usage.prompt_tokens_details
            cached = getattr(details, "cached_tokens", None) if details is not None else None
            created = _extra(details, "created_cache_tokens") if details is not None else None
            if cached is None:
                reason = self.missing_reason
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
            ),
        )


def _translate(error: BaseException, url: str) -> BackendError:
    if isinstance(error, openai.APIStatusError):
        translated = error_from_response(error.status_code, error.response.text, url)
        translated.retry_after = parse_retry_after(error.response.headers.get("retry-after"))
        return translated
    if isinstance(error, (openai.APIConnectionError, *TRANSPORT_ERRORS)):
        return unreachable(url, error)
    if isinstance(error, openai.APIError):
        # An error event inside the stream (the server gave up midway).
        return ServerError(f"{url} failed during the answer: {error}", url=url, status=None)
    raise error


class ChatClient:
    """Streaming chat against one server, sync and async; one attempt per call."""

    def __init__(
        self,
        api_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 3600.0,
        stall_timeout: float = 600.0,
        missing_cache_reason: str,
        affinity_headers: Sequence[str] = DEFAULT_AFFINITY_HEADERS,
        transport: Transport | None = None,
        async_transport: AsyncTransport | None = None,
    ) -> None:
        self.api_url = api_url
        self.model = model
        self.url = f"{api_url}/chat/completions"
        self._missing = missing_cache_reason
        self._affinity_headers = tuple(affinity_headers)
        key = api_key or "EMPTY"
        self._sync = openai.OpenAI(
            base_url=api_url,
            api_key=key,
            max_retries=0,
            http_client=make_client(timeout=timeout, stall_timeout=stall_timeout, transport=transport),
        )
        self._async = openai.AsyncOpenAI(
            base_url=api_url,
            api_key=key,
            max_retries=0,
            http_client=make_async_client(
                timeout=timeout, stall_timeout=stall_timeout, transport=async_transport
            ),
        )

    def _arguments(self, request: ChatRequest) -> dict[str, Any]:
        headers: dict[str, str] = {}
        body: dict[str, Any] = dict(request.extra_body)
        arguments: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(message) for message in request.messages],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.max_tokens is not None:
            arguments["max_tokens"] = request.max_tokens
        if request.temperature is not None:
            arguments["temperature"] = request.temperature
        if request.seed is not None:
            arguments["seed"] = request.seed
        if request.affinity_key:
            arguments["user"] = request.affinity_key
            for name in self._affinity_headers:
                headers[name] = request.affinity_key
        if request.request_id:
            headers["X-Request-Id"] = request.request_id
        if request.cache_salt:
            body["cache_salt"] = request.cache_salt
        arguments["extra_headers"] = headers
        if body:
            arguments["extra_body"] = body
        return arguments

    def complete(
        self,
        request: ChatRequest,
        on_first_token: Callable[[], None] | None = None,
        on_admitted: Callable[[], None] | None = None,
    ) -> Completion:
        """Send ``request`` once and read the whole stream.

        ``on_admitted`` is called when the response's headers arrive: the
        server has accepted the request (vLLM sends them once it rendered and
        tokenized the prompt, just before the request enters its scheduler).
        ``on_first_token`` is called when the first token arrives: the
        server has then prefilled (and cached) the whole prompt.
        """
        accumulator = _Accumulator(time.perf_counter(), self._missing, on_first_token)
        try:
            stream: Iterable[Any] = self._sync.chat.completions.create(**self._arguments(request))
            if on_admitted is not None:
                on_admitted()
            for chunk in stream:
                accumulator.add(chunk)
        except _FAILURES as error:
            raise _translate(error, self.url) from error
        return accumulator.finish()

    async def acomplete(
        self,
        request: ChatRequest,
        on_first_token: Callable[[], None] | None = None,
        on_admitted: Callable[[], None] | None = None,
    ) -> Completion:
        """The async twin of :meth:`complete`."""
        accumulator = _Accumulator(time.perf_counter(), self._missing, on_first_token)
        try:
            stream = await self._async.chat.completions.create(**self._arguments(request))
            if on_admitted is not None:
                on_admitted()
            async for chunk in stream:
                accumulator.add(chunk)
        except _FAILURES as error:
            raise _translate(error, self.url) from error
        return accumulator.finish()

    def close(self) -> None:
        self._sync.close()

    async def aclose(self) -> None:
        await self._async.close()
