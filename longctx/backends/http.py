"""Plain HTTP to an inference server: the one module that imports httpx2.

Everything a server offers is plain JSON, text or a server-sent event stream
over HTTP: :class:`HttpEndpoint` for JSON and text (tokenize, metrics, server
info, version), :func:`post_events` / :func:`apost_events` for the streamed
answers (sync and async clients are the one place the two modes differ; see
:mod:`longctx.drivers`).

Failures become longctx errors: no connection is :class:`ServerUnreachable`,
an error status is :class:`ServerError`, and a prompt that does not fit is
:class:`ContextOverflow` whichever engine said so.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import ssl
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx2

from longctx.errors import BackendError, ContextOverflow, ServerError, ServerUnreachable
from longctx.retry import parse_retry_after

__all__ = [
    "AsyncTransport",
    "EventPost",
    "HttpEndpoint",
    "Transport",
    "apost_events",
    "error_from_response",
    "make_async_client",
    "make_client",
    "parse_context_overflow",
    "post_events",
    "split_base_url",
]

BODY_LIMIT = 2000
Transport = httpx2.BaseTransport
AsyncTransport = httpx2.AsyncBaseTransport

# vLLM: "This model's maximum context length is 32768 tokens. However, your
# prompt contains 40000 input tokens..." (and variants that count the
# requested output too). SGLang: "The input (40000 tokens) is longer than the
# model's context length (32768 tokens)."
_VLLM_OVERFLOW = re.compile(
    r"maximum context length is (\d+) tokens.*?(?:contains|requested)(?: at least)? (\d+)", re.S
)
_VLLM_OVERFLOW_ALT = re.compile(r"maximum context length is (\d+) tokens.*?\((\d+) in the messages", re.S)
_SGLANG_OVERFLOW = re.compile(
    r"input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)"
)
_SGLANG_OVERFLOW_ALT = re.compile(
    r"(?:requested|total) tokens? \((\d+)\).*?exceeds? .*?context length (?:of )?\(?(\d+)", re.S | re.I
)


def split_base_url(base_url: str) -> tuple[str, str]:
    """``(root, api)`` of a server from either form of its URL.

    ``http://host:8000/v1`` and ``http://host:8000`` both give
    ``("http://host:8000", "http://host:8000/v1")``: engines serve the OpenAI
    routes under ``/v1`` and their own (``/tokenize``, ``/metrics``) at the root.
    """
    trimmed = base_url.strip().rstrip("/")
    if not re.match(r"^https?://[^/\s]+", trimmed):
        raise BackendError(f"not an http(s) server URL: {base_url!r}", url=base_url)
    root = trimmed[: -len("/v1")] if trimmed.endswith("/v1") else trimmed
    return root, f"{root}/v1"


def parse_context_overflow(message: str) -> tuple[int | None, int | None] | None:
    """``(prompt_tokens, context_length)`` if ``message`` says the prompt is too long, else None."""
    match = _VLLM_OVERFLOW.search(message) or _VLLM_OVERFLOW_ALT.search(message)
    if match:
        return int(match.group(2)), int(match.group(1))
    match = _SGLANG_OVERFLOW.search(message) or _SGLANG_OVERFLOW_ALT.search(message)
    if match:
        return int(match.group(1)), int(match.group(2))
    lowered = message.lower()
    if "context length" in lowered and ("longer" in lowered or "exceed" in lowered or "maximum" in lowered):
        return None, None
    return None


def _error_message(body: str) -> str:
    """The human message inside an error body (vLLM nests it, SGLang does not)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body
    if isinstance(parsed, dict):
        for holder, key in ((parsed.get("error"), "message"), (parsed, "message"), (parsed, "detail")):
            if isinstance(holder, dict) and isinstance(holder.get(key), str):
                return str(holder[key])
    return body


def error_from_response(status: int, body: str, url: str) -> BackendError:
    """The longctx error for an HTTP error answer from a server."""
    message = _error_message(body)
    clipped = body[:BODY_LIMIT]
    if status in (400, 413, 422):
        overflow = parse_context_overflow(message)
        if overflow is not None:
            prompt_tokens, context_length = overflow
            detail = (
                f"the prompt ({prompt_tokens} tokens) does not fit "
                f"the server's context length ({context_length})"
                if prompt_tokens is not None and context_length is not None
                else "the prompt does not fit the server's context length"
            )
            return ContextOverflow(
                f"{detail}: {message[:300]}",
                prompt_tokens=prompt_tokens,
                context_length=context_length,
                url=url,
                status=status,
                body=clipped,
            )
    return ServerError(f"{url} answered HTTP {status}: {message[:300]}", url=url, status=status, body=clipped)


def unreachable(url: str, error: BaseException) -> ServerUnreachable:
    return ServerUnreachable(f"cannot reach {url}: {type(error).__name__}: {error}", url=url)


class HttpEndpoint:
    """JSON and text requests to one server, errors translated.

    ``transport`` replaces the network (``httpx2.MockTransport`` in unit tests).
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float,
        transport: Transport | None = None,
    ) -> None:
        self.root_url, self.api_url = split_base_url(base_url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx2.Client(
            timeout=timeout, transport=transport, headers=headers, verify=tls_context()
        )

    def close(self) -> None:
        self.client.close()

    def url(self, path: str) -> str:
        """Absolute URL of ``path``: ``/v1/...`` paths and root paths alike."""
        return f"{self.root_url}{path if path.startswith('/') else '/' + path}"

    def _send(
        self, method: str, path: str, body: Any | None = None, timeout: float | None = None
    ) -> httpx2.Response:
        url = self.url(path)
        try:
            response = self.client.request(method, url, json=body, timeout=timeout or self.client.timeout)
        except httpx2.TransportError as error:
            raise unreachable(url, error) from error
        if response.status_code >= 400:
            raise error_from_response(response.status_code, response.text, url)
        return response

    def get_json(self, path: str, *, timeout: float | None = None) -> Any:
        return _json(self._send("GET", path, timeout=timeout), self.url(path))

    def post_json(self, path: str, body: Any, *, timeout: float | None = None) -> Any:
        return _json(self._send("POST", path, body, timeout=timeout), self.url(path))

    def get_text(self, path: str, *, timeout: float | None = None) -> str:
        return self._send("GET", path, timeout=timeout).text

    def status(self, path: str, *, timeout: float = 10.0) -> int | None:
        """The HTTP status of GET ``path``, or None when the server cannot be reached."""
        try:
            return self.client.get(self.url(path), timeout=timeout).status_code
        except httpx2.TransportError:
            return None


def _json(response: httpx2.Response, url: str) -> Any:
    try:
        return response.json()
    except ValueError as error:
        raise ServerError(
            f"{url} answered something that is not JSON: {response.text[:200]!r}",
            url=url,
            status=response.status_code,
            body=response.text[:BODY_LIMIT],
        ) from error


# The exceptions httpx2 raises when a connection fails, drops or stalls.
TRANSPORT_ERRORS: tuple[type[Exception], ...] = (httpx2.TransportError, httpx2.StreamError)


def _event(line: str, url: str) -> dict[str, Any] | None:
    """The JSON of one server-sent ``data:`` line; None for anything else (comments, ``[DONE]``)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    try:
        event = json.loads(data)
    except ValueError as error:
        raise ServerError(f"{url} streamed something that is not JSON: {data[:200]!r}", url=url) from error
    if not isinstance(event, dict):
        raise ServerError(f"{url} streamed {data[:200]!r}, not an object", url=url)
    if "error" in event and "choices" not in event:
        # The server gave up midway (an error event inside the stream).
        raise ServerError(f"{url} failed during the answer: {str(event['error'])[:BODY_LIMIT]}", url=url)
    return event


@contextlib.contextmanager
def _stream_errors(url: str) -> Iterator[None]:
    """A connection that fails, drops or stalls while streaming becomes :class:`ServerUnreachable`."""
    try:
        yield
    except TRANSPORT_ERRORS as error:
        raise unreachable(url, error) from error


def _opened(response: httpx2.Response, url: str, post: EventPost) -> None:
    """Say the server accepted the stream; its error answer (body already read) raises instead."""
    if response.status_code >= 400:
        error = error_from_response(response.status_code, response.content.decode("utf-8", "replace"), url)
        error.retry_after = parse_retry_after(response.headers.get("retry-after"))
        raise error
    if post.on_headers is not None:
        post.on_headers(response.headers)
    if post.on_open is not None:
        post.on_open()


@dataclass(frozen=True)
class EventPost:
    """A POST answered by a server-sent event stream: where, what, and who hears it was accepted."""

    url: str
    body: Any
    headers: dict[str, str]
    on_open: Callable[[], None] | None = None
    #: Hears the response's headers once they arrived (a gateway's session token).
    on_headers: Callable[[Mapping[str, str]], None] | None = None


def post_events(client: httpx2.Client, post: EventPost) -> Iterator[dict[str, Any]]:
    """Send ``post`` and yield each JSON event of the server-sent stream that answers it.

    ``post.on_open`` is called once the response's headers arrived. An HTTP
    error answer raises its longctx error (with ``retry_after``); a
    connection that fails, drops or stalls midway raises
    :class:`ServerUnreachable`; an error event inside the stream raises
    :class:`ServerError`. :func:`apost_events` is the same over an async client.
    """
    url = post.url
    with _stream_errors(url), client.stream("POST", url, json=post.body, headers=post.headers) as response:
        if response.status_code >= 400:
            response.read()
        _opened(response, url, post)
        yield from filter(None, (_event(line, url) for line in response.iter_lines()))


async def apost_events(client: httpx2.AsyncClient, post: EventPost) -> AsyncIterator[dict[str, Any]]:
    """:func:`post_events` over an async client (the transport is all that differs)."""
    url = post.url
    with _stream_errors(url):
        async with client.stream("POST", url, json=post.body, headers=post.headers) as response:
            if response.status_code >= 400:
                await response.aread()
            _opened(response, url, post)
            async for line in response.aiter_lines():
                if (event := _event(line, url)) is not None:
                    yield event


def make_client(*, timeout: float, stall_timeout: float, transport: Transport | None = None) -> httpx2.Client:
    """An httpx2 client for streamed answers: ``stall_timeout`` bounds the wait for each read."""
    return httpx2.Client(
        timeout=httpx2.Timeout(timeout, read=stall_timeout, connect=30.0),
        transport=transport,
        verify=tls_context(),
    )


def make_async_client(
    *, timeout: float, stall_timeout: float, transport: AsyncTransport | None = None
) -> httpx2.AsyncClient:
    """The async twin of :func:`make_client`."""
    return httpx2.AsyncClient(
        timeout=httpx2.Timeout(timeout, read=stall_timeout, connect=30.0),
        transport=transport,
        verify=tls_context(),
    )


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The one verifying TLS context of every client in the process.

    httpx2 builds one per client otherwise, reading the CA bundle each time
    (about 50 ms): six times for a backend over two replicas, on the way to
    the first request. Built as httpx2 builds its default (``SSL_CERT_FILE``
    and ``SSL_CERT_DIR`` honoured); shared contexts are safe across threads.
    """
    return httpx2.create_ssl_context()
