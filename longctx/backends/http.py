"""Plain HTTP to an inference server: JSON, text and server-sent event streams, failures as longctx errors.

Everything a server offers is plain JSON, text or a server-sent event stream
over HTTP: :class:`HttpEndpoint` for JSON and text (tokenize, metrics, server
info, version), :func:`post_events` / :func:`apost_events` for the streamed
answers (sync and async clients are the one place the two modes differ; see
:mod:`longctx.drivers`). The sync requests go through longctx's own client
(:mod:`longctx.backends.client`, over the connection pool of
:mod:`longctx.backends.connections`); the async ones through httpx2's
(:mod:`longctx.backends.httpx2_bridge`, imported at the first async call or
where a test hands in an httpx2 transport).

Failures become longctx errors: no connection is :class:`ServerUnreachable`,
an error status is :class:`ServerError`, a 429 is :class:`RateLimited`, and
a prompt that does not fit is :class:`ContextOverflow` whichever engine said
so. Every request carries an id (``X-Request-Id``: the caller's, else a new
one), and every error of a request carries it and the server's own id when
the answer said one, so the request can be found in the server's log.

The credentials a request carries (its ``Authorization`` header) never reach
an error: a server whose error answer echoes the request's headers has them
replaced by ``[redacted]`` in the message and the body the error keeps.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import ssl
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Any

from longctx.backends.client import Client, Response, Sending, Wire, encode_body
from longctx.backends.connections import ConnectionPool, Timeouts, WireError
from longctx.backends.waits import Waits, seconds_text
from longctx.errors import BackendError, ContextOverflow, RateLimited, ServerError, ServerUnreachable
from longctx.process_state import PROCESS
from longctx.recordtypes import record_type
from longctx.retry import parse_retry_after

if TYPE_CHECKING:
    from longctx.backends.httpx2_bridge import AsyncClient, AsyncResponse, AsyncTransport, Transport

__all__ = [
    "REQUEST_ID_HEADER",
    "TRANSPORT_ERRORS",
    "EventPost",
    "Exchange",
    "HttpEndpoint",
    "apost_events",
    "connection_refused",
    "credentials_in",
    "error_from_response",
    "make_async_client",
    "make_client",
    "network_wire",
    "parse_context_overflow",
    "post_events",
    "redacted",
    "split_base_url",
    "timed_out",
]

#: The header that carries the id of each request (vLLM takes it as its own request id).
REQUEST_ID_HEADER = "X-Request-Id"
BODY_LIMIT = 2000

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


def _parsed(body: str) -> Any:
    """The JSON of an error body; None when it is not JSON."""
    try:
        return json.loads(body)
    except ValueError:
        return None


def _error_message(body: str, parsed: Any) -> str:
    """The human message inside an error body (vLLM nests it, SGLang does not)."""
    if isinstance(parsed, dict):
        for holder, key in ((parsed.get("error"), "message"), (parsed, "message"), (parsed, "detail")):
            if isinstance(holder, dict) and isinstance(holder.get(key), str):
                return str(holder[key])
    return body


def _body_id(parsed: Any) -> str | None:
    """The request id an answer's JSON names (``request_id`` or ``id``, at the top or in ``error``)."""
    holders = (parsed, parsed.get("error")) if isinstance(parsed, dict) else ()
    for holder in holders:
        for key in ("request_id", "id"):
            if isinstance(holder, dict) and isinstance(holder.get(key), str) and holder[key]:
                return str(holder[key])
    return None


REDACTED = "[redacted]"
_CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "x-api-key", "api-key")


def credentials_in(headers: Mapping[str, str]) -> tuple[str, ...]:
    """The secrets of a request's ``headers``: each credential header's value and its token (``Bearer T``)."""
    found: list[str] = []
    for name, value in headers.items():
        if name.lower() in _CREDENTIAL_HEADERS and value.strip():
            found.append(value.strip())
            token = value.strip().partition(" ")[2].strip()
            if token:
                found.append(token)
    # Longest first: a header's value is replaced whole before its token is.
    return tuple(sorted(set(found), key=len, reverse=True))


def redacted(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every one of ``secrets`` replaced by ``[redacted]``."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


@record_type(frozen=False)
class Exchange:
    """One request to a server, as its errors name it: where, the id sent, the id the server gave it.

    ``server_request_id`` is filled in from what the answer says (its
    ``x-request-id`` header, a body's or a streamed chunk's ``id``): an id
    other than the one sent is kept over an echo of it. ``secrets`` (the
    request's credentials) are redacted from every error made for it.
    """

    url: str
    request_id: str
    server_request_id: str | None = None
    secrets: tuple[str, ...] = field(default=(), repr=False)

    @classmethod
    def new(cls, url: str, request_id: str | None = None, *, secrets: tuple[str, ...] = ()) -> Exchange:
        """An exchange with ``url`` under ``request_id``, or a new id, sent with ``secrets``."""
        return cls(url, request_id or uuid.uuid4().hex, secrets=secrets)

    def heard(self, *ids: str | None) -> None:
        """Keep the first of ``ids`` the server gave that is not the id sent (else an echo of it)."""
        for candidate in ids:
            if not candidate:
                continue
            if self.server_request_id in (None, self.request_id):
                self.server_request_id = candidate

    def error(self, error_type: type[BackendError], message: str, **fields: Any) -> BackendError:
        """An error of ``error_type`` for this exchange: its URL and both ids set, its secrets redacted."""
        if self.secrets:
            message = redacted(message, self.secrets)
            fields = {
                name: redacted(value, self.secrets) if isinstance(value, str) else value
                for name, value in fields.items()
            }
        return error_type(
            message,
            url=self.url,
            request_id=self.request_id,
            server_request_id=self.server_request_id,
            **fields,
        )


def error_from_response(
    status: int, body: str, exchange: Exchange, headers: Mapping[str, str] | None = None
) -> BackendError:
    """The longctx error for an HTTP error answer from a server to ``exchange``.

    ``headers`` are the answer's: its ``x-request-id`` and ``Retry-After``
    are read from them.
    """
    headers = headers or {}
    parsed = _parsed(body)
    exchange.heard(headers.get("x-request-id"), _body_id(parsed))
    message = _error_message(body, parsed)
    url = exchange.url
    answer = {"status": status, "body": body[:BODY_LIMIT]}
    retry_after = parse_retry_after(headers.get("retry-after"))
    if status == 429:
        wait = f", asking to wait {retry_after:g} s" if retry_after is not None else ""
        text = f"{url} is rate limiting (HTTP 429{wait}): {message[:300]}"
        return exchange.error(RateLimited, text, retry_after=retry_after, **answer)
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
            return exchange.error(
                ContextOverflow,
                f"{detail}: {message[:300]}",
                prompt_tokens=prompt_tokens,
                context_length=context_length,
                **answer,
            )
    text = f"{url} answered HTTP {status}: {message[:300]}"
    return exchange.error(ServerError, text, retry_after=retry_after, **answer)


def unreachable(exchange: Exchange, error: BaseException) -> BackendError:
    """The :class:`ServerUnreachable` for a connection that failed, dropped or stalled during ``exchange``."""
    kind = error.kind if isinstance(error, WireError) else type(error).__name__
    return exchange.error(ServerUnreachable, f"cannot reach {exchange.url}: {kind}: {error}")


class HttpEndpoint:
    """JSON and text requests to one server, errors translated.

    ``transport`` replaces the network (an ``httpx2.MockTransport`` in unit tests).
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
        self.timeout = timeout
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = Client(
            timeout=Timeouts(timeout, timeout, timeout), wire=network_wire(transport), headers=headers
        )

    def close(self) -> None:
        self.client.close()

    def url(self, path: str) -> str:
        """Absolute URL of ``path``: ``/v1/...`` paths and root paths alike."""
        return f"{self.root_url}{path if path.startswith('/') else '/' + path}"

    def _send(
        self, method: str, path: str, body: Any | None = None, timeout: float | None = None
    ) -> tuple[Response, Exchange]:
        exchange = Exchange.new(self.url(path), secrets=credentials_in(self.client.headers))
        bound = timeout or self.timeout
        try:
            with PROCESS.get(Waits).waiting(exchange.url, bound):
                sending: Sending = {"timeout": bound, "headers": {REQUEST_ID_HEADER: exchange.request_id}}
                if body is not None:
                    sending["json"] = body
                response = self.client.request(method, exchange.url, **sending)
        except WireError as error:
            if not error.timed_out:
                raise unreachable(exchange, error) from error
            raise exchange.error(
                ServerUnreachable,
                f"no answer from {exchange.url} within {seconds_text(bound)} s: the server"
                f"{' accepted the connection but' if error.stage != 'connect' else ''}"
                " sent nothing (raise --timeout / --stall-timeout to wait longer)",
            ) from error
        if response.status_code >= 400:
            raise error_from_response(response.status_code, response.text, exchange, response.headers)
        return response, exchange

    def get_json(self, path: str, *, timeout: float | None = None) -> Any:
        return _json(*self._send("GET", path, timeout=timeout))

    def post_json(self, path: str, body: Any, *, timeout: float | None = None) -> Any:
        return _json(*self._send("POST", path, body, timeout=timeout))

    def get_text(self, path: str, *, timeout: float | None = None) -> str:
        return self._send("GET", path, timeout=timeout)[0].text

    def status(self, path: str, *, timeout: float = 10.0) -> int | None:
        """The HTTP status of GET ``path``, or None when the server cannot be reached."""
        try:
            return self.client.request("GET", self.url(path), timeout=timeout).status_code
        except WireError:
            return None


def connection_refused(error: BaseException) -> bool:
    """Whether ``error`` is a connection that could not be made at all (refused, no such host).

    Nothing listens there: another attempt a second later would fail the same way,
    so first contact says so at once instead of retrying.
    """
    cause = error.__cause__
    return isinstance(cause, WireError) and cause.stage == "connect" and not cause.timed_out


def timed_out(error: BaseException) -> bool:
    """Whether ``error`` is a request that got no answer within its bound (the server stayed silent)."""
    cause = error.__cause__
    return isinstance(cause, WireError) and cause.timed_out


def _json(response: Response, exchange: Exchange) -> Any:
    try:
        return response.json()
    except ValueError as error:
        exchange.heard(response.headers.get("x-request-id"))
        raise exchange.error(
            ServerError,
            f"{exchange.url} answered something that is not JSON: {response.text[:200]!r}",
            status=response.status_code,
            body=response.text[:BODY_LIMIT],
        ) from error


# What every client raises when a connection fails, drops or stalls (the async one's too).
TRANSPORT_ERRORS: tuple[type[Exception], ...] = (WireError,)


def _event(line: str, exchange: Exchange) -> dict[str, Any] | None:
    """The JSON of one server-sent ``data:`` line; None for anything else (comments, ``[DONE]``).

    A chunk's ``id`` is the server's id of the request (vLLM logs it), kept
    for the errors that may follow.
    """
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    url = exchange.url
    try:
        event = json.loads(data)
    except ValueError as error:
        text = f"{url} streamed something that is not JSON: {data[:200]!r}"
        raise exchange.error(ServerError, text) from error
    if not isinstance(event, dict):
        raise exchange.error(ServerError, f"{url} streamed {data[:200]!r}, not an object")
    exchange.heard(_body_id(event))
    if "error" in event and "choices" not in event:
        # The server gave up midway (an error event inside the stream).
        text = f"{url} failed during the answer: {str(event['error'])[:BODY_LIMIT]}"
        raise exchange.error(ServerError, text)
    return event


@contextlib.contextmanager
def _stream_errors(exchange: Exchange) -> Iterator[None]:
    """A connection that fails, drops or stalls while streaming becomes :class:`ServerUnreachable`."""
    try:
        yield
    except TRANSPORT_ERRORS as error:
        raise unreachable(exchange, error) from error


def _opened(response: Response | AsyncResponse, exchange: Exchange, post: EventPost) -> None:
    """Say the server accepted the stream; its error answer (body already read) raises instead."""
    if response.status_code >= 400:
        body = response.content.decode("utf-8", "replace")
        raise error_from_response(response.status_code, body, exchange, response.headers)
    exchange.heard(response.headers.get("x-request-id"))
    if post.on_headers is not None:
        post.on_headers(response.headers)
    if post.on_open is not None:
        post.on_open()


@record_type
class EventPost:
    """A POST answered by a server-sent event stream: where, what, and who hears it was accepted."""

    url: str
    body: Any
    headers: dict[str, str]
    on_open: Callable[[], None] | None = None
    #: Hears the response's headers once they arrived (a gateway's session token).
    on_headers: Callable[[Mapping[str, str]], None] | None = None
    #: Sent as ``X-Request-Id`` and named by the errors; None: a new id.
    request_id: str | None = None
    #: How long the stream may stay silent, where its first token needs longer than the client's
    #: stall timeout (a cold prefill: :mod:`longctx.backends.prefill_wait`); None: the client's.
    read_timeout: float | None = None
    #: What the server does meanwhile, for the progress line (:class:`~longctx.backends.waits.Wait`).
    waiting_for: str | None = None

    def stall_bound(self, client_timeout: Timeouts) -> float:
        """How long the stream may stay silent: this post's own bound, else the client's."""
        return self.read_timeout if self.read_timeout is not None else _stall_bound(client_timeout)

    def timeout(self, client_timeout: Timeouts) -> Timeouts | None:
        """The request's own timeouts where its reads may wait longer; None: the client's."""
        if self.read_timeout is None:
            return None
        return Timeouts(client_timeout.connect, self.read_timeout, client_timeout.write)

    def exchange(self) -> tuple[Exchange, dict[str, str]]:
        """The exchange this post is, and its headers with the request id."""
        exchange = Exchange.new(self.url, self.request_id, secrets=credentials_in(self.headers))
        return exchange, {**self.headers, REQUEST_ID_HEADER: exchange.request_id}


def post_events(client: Client, post: EventPost) -> Iterator[dict[str, Any]]:
    """Send ``post`` and yield each JSON event of the server-sent stream that answers it.

    ``post.on_open`` is called once the response's headers arrived. An HTTP
    error answer raises its longctx error (with ``retry_after``); a
    connection that fails, drops or stalls midway raises
    :class:`ServerUnreachable`; an error event inside the stream raises
    :class:`ServerError`; each names the request's ids (see :class:`Exchange`).
    :func:`apost_events` is the same over an async client.
    """
    exchange, headers = post.exchange()
    url = exchange.url
    with (
        _stream_errors(exchange),
        PROCESS.get(Waits).waiting(url, post.stall_bound(client.timeout), post.waiting_for) as wait,
        client.stream(
            "POST", url, json=post.body, headers=headers, timeout=post.timeout(client.timeout)
        ) as response,
    ):
        if response.status_code >= 400:
            response.read()
        _opened(response, exchange, post)
        for line in response.iter_lines():
            if (event := _event(line, exchange)) is not None:
                wait.end()  # the first event: the server is answering
                yield event


async def apost_events(client: AsyncClient, post: EventPost) -> AsyncIterator[dict[str, Any]]:
    """:func:`post_events` over an async client (the transport is all that differs)."""
    exchange, headers = post.exchange()
    with (
        _stream_errors(exchange),
        PROCESS.get(Waits).waiting(exchange.url, post.stall_bound(client.timeout), post.waiting_for) as wait,
    ):
        own = post.timeout(client.timeout)
        content, headers = encode_body(post.body), {**_JSON_HEADERS, **headers}
        async with client.stream(
            "POST", exchange.url, content=content, headers=headers, timeout=own
        ) as response:
            if response.status_code >= 400:
                await response.aread()
            _opened(response, exchange, post)
            async for line in response.aiter_lines():
                if (event := _event(line, exchange)) is not None:
                    wait.end()
                    yield event


_JSON_HEADERS = {"Content-Type": "application/json"}


def _stall_bound(timeout: Timeouts) -> float:
    """How long a streamed answer may stay silent: the read timeout (else the connect one)."""
    return float(timeout.read or timeout.connect or 0.0)


def make_client(*, timeout: float, stall_timeout: float, transport: Transport | None = None) -> Client:
    """A client for streamed answers: ``stall_timeout`` bounds the wait for each read.

    ``transport`` (an httpx2 transport: a test's mock) replaces the network.
    """
    return Client(timeout=_timeouts(timeout, stall_timeout), wire=network_wire(transport))


def network_wire(transport: Transport | None = None) -> Wire:
    """Where a sync client's requests go: the connection pool over ``http.client``, unless told otherwise.

    Through ``transport`` where one is given (an httpx2 transport: a test's
    mock). Through httpx2's own network where the environment names a proxy
    (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, any ``*_proxy``; httpx2
    applies them and ``NO_PROXY``): the environment only, as httpx2 reads it,
    not a system's proxy settings.
    """
    if transport is None and not _environment_names_a_proxy():
        return ConnectionPool(tls_context)
    from longctx.backends.httpx2_bridge import TransportWire

    return TransportWire(transport, verify=tls_context())


def _environment_names_a_proxy() -> bool:
    """Whether a ``<scheme>_proxy`` variable (any case, not ``no_proxy``) is set, as urllib reads them."""
    return any(
        value and name.lower().endswith("_proxy") and name.lower() != "no_proxy"
        for name, value in os.environ.items()
    )


def _timeouts(timeout: float, stall_timeout: float) -> Timeouts:
    # A connection that is not made within half a minute (or the user's bounds) will not be.
    return Timeouts(min(30.0, stall_timeout, timeout), stall_timeout, timeout)


def make_async_client(
    *, timeout: float, stall_timeout: float, transport: AsyncTransport | None = None
) -> AsyncClient:
    """The async twin of :func:`make_client` (httpx2's client, made here: the first async call imports it)."""
    from longctx.backends.httpx2_bridge import AsyncClient

    return AsyncClient(timeout=_timeouts(timeout, stall_timeout), transport=transport, verify=tls_context())


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The one verifying TLS context of every client in the process.

    httpx2 built one per client, reading the CA bundle each time
    (about 50 ms): six times for a backend over two replicas, on the way to
    the first request. Built as httpx2 builds its default (``SSL_CERT_FILE``
    and ``SSL_CERT_DIR`` honoured), at the first TLS handshake
    (:class:`_VerifiedOnFirstUse`); shared contexts are safe across threads.
    """
    return _VerifiedOnFirstUse(ssl.PROTOCOL_TLS_CLIENT)


class _VerifiedOnFirstUse(ssl.SSLContext):
    """A TLS context that reads the CA certificates at its first handshake, not when a client is made.

    Reading the bundle took 50-140 ms on the test machine, paid by every new process
    (``longctx batch`` among them) before its first request even where the server
    is plain HTTP, as every local engine is. The handshakes are made by the context
    httpx2 builds by default
    (:func:`~longctx.backends.httpx2_bridge.verifying_context`, built once under
    a lock), which this one hands them to; the protocols httpx2's async
    network sets for ALPN go along.
    """

    _built: ssl.SSLContext | None = None
    _alpn: list[str] | None = None
    _lock = threading.Lock()

    def _verifying(self) -> ssl.SSLContext:
        with self._lock:
            if self._built is None:
                from longctx.backends.httpx2_bridge import verifying_context

                self._built = verifying_context()
            if self._alpn is not None:
                self._built.set_alpn_protocols(self._alpn)
            return self._built

    def set_alpn_protocols(self, alpn_protocols: Iterable[str]) -> None:
        self._alpn = list(alpn_protocols)
        super().set_alpn_protocols(self._alpn)

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        return self._verifying().wrap_socket(*args, **kwargs)

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        return self._verifying().wrap_bio(*args, **kwargs)
