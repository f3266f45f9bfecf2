"""httpx2 behind one module: the async client, and httpx2 transports under longctx's sync client.

Imported only where it is needed, so a sync command (``longctx batch``)
never loads httpx2:

- :class:`AsyncClient`: httpx2's async client for async callers (``aask``,
  ``astream``), its failures raised as
  :class:`~longctx.backends.connections.WireError` as the sync client's are;
- :class:`TransportWire`: an httpx2 transport as the
  :class:`~longctx.backends.client.Wire` of longctx's sync client: a test's
  ``httpx2.MockTransport``, or httpx2's own network where the environment
  names a proxy (httpx2 applies ``HTTP_PROXY``, ``HTTPS_PROXY``,
  ``ALL_PROXY`` and ``NO_PROXY``);
- :func:`verifying_context`: the TLS context httpx2 builds by default (its
  CA bundle), for the first handshake of an https server.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import httpx2

from longctx.backends.client import Headers, timeouts_of
from longctx.backends.connections import Origin, Timeouts, WireError

__all__ = [
    "AsyncClient",
    "AsyncResponse",
    "AsyncTransport",
    "Transport",
    "TransportWire",
    "verifying_context",
]

#: What tests hand ``connect`` and the clients in place of the network.
Transport = httpx2.BaseTransport
AsyncTransport = httpx2.AsyncBaseTransport

_TIMEOUTS: tuple[tuple[type[Exception], str], ...] = (
    (httpx2.ConnectTimeout, "connect"),
    (httpx2.PoolTimeout, "connect"),
    (httpx2.WriteTimeout, "write"),
    (httpx2.ReadTimeout, "read"),
)
_FAILURES: tuple[tuple[type[Exception], str], ...] = (
    (httpx2.ConnectError, "connect"),
    (httpx2.ProxyError, "connect"),
    (httpx2.UnsupportedProtocol, "connect"),
    (httpx2.WriteError, "write"),
    (httpx2.ReadError, "read"),
)


def _wire_error(error: Exception) -> WireError:
    """The :class:`WireError` of an httpx2 failure: its stage, and whether its bound ran out."""
    for kind, stage in _TIMEOUTS:
        if isinstance(error, kind):
            return WireError(stage, str(error), timed_out=True)  # type: ignore[arg-type]
    for kind, stage in _FAILURES:
        if isinstance(error, kind):
            return WireError(stage, str(error))  # type: ignore[arg-type]
    return WireError("read", str(error), protocol=True)  # a protocol error, a broken stream


@contextlib.contextmanager
def _as_wire_errors() -> Iterator[None]:
    try:
        yield
    except (httpx2.TransportError, httpx2.StreamError) as error:
        raise _wire_error(error) from error


def _httpx2_timeout(timeouts: Timeouts) -> httpx2.Timeout:
    # httpx2 also bounds the wait for a free connection: as long as sending may take.
    return httpx2.Timeout(
        connect=timeouts.connect, read=timeouts.read, write=timeouts.write, pool=timeouts.write
    )


def _url(origin: Origin, target: str) -> str:
    scheme, host, port = origin
    named = f"[{host}]" if ":" in host else host
    return f"{scheme}://{named}:{port}{target}"


class _TransportReply:
    """An httpx2 response as a :class:`~longctx.backends.client.WireReply`: its body as it arrives.

    Handed on as httpx2 decodes it (a mock's body is read already, so only its
    decoded bytes are left): without its Content-Encoding, which is undone.
    """

    def __init__(self, response: httpx2.Response) -> None:
        self.status = response.status_code
        self.headers = [
            (name, value) for name, value in response.headers.raw if name.lower() != b"content-encoding"
        ]
        self._response = response
        self._chunks = response.iter_bytes()

    def read_some(self) -> bytes:
        with _as_wire_errors():
            return next(self._chunks, b"")

    def close(self) -> None:
        with _as_wire_errors():
            self._response.close()


class TransportWire:
    """Requests through ``transport`` (None: httpx2's own network, with the environment's proxies).

    ``verify`` is the TLS context of an https request made by httpx2's network.
    """

    def __init__(self, transport: Transport | None, *, verify: ssl.SSLContext) -> None:
        self._client = httpx2.Client(transport=transport, verify=verify, trust_env=True)

    def request(
        self,
        method: str,
        origin: Origin,
        target: str,
        *,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        timeouts: Timeouts,
    ) -> _TransportReply:
        """Send one request through the transport; its failures raise :class:`WireError`."""
        request = self._client.build_request(
            method,
            _url(origin, target),
            headers=list(headers),
            content=body,
            timeout=_httpx2_timeout(timeouts),
        )
        with _as_wire_errors():
            return _TransportReply(self._client.send(request, stream=True))

    def close(self) -> None:
        self._client.close()


class AsyncResponse:
    """An async answer: ``status_code`` and ``headers`` at once, the body read whole or line by line."""

    def __init__(self, response: httpx2.Response) -> None:
        self.status_code = response.status_code
        self.headers = Headers(response.headers.raw)
        self._response = response

    async def aread(self) -> bytes:
        with _as_wire_errors():
            return await self._response.aread()

    async def aiter_lines(self) -> AsyncIterator[str]:
        with _as_wire_errors():
            async for line in self._response.aiter_lines():
                yield line

    @property
    def content(self) -> bytes:
        return self._response.content

    @property
    def text(self) -> str:
        return self._response.text


class AsyncClient:
    """httpx2's async client, its failures raised as :class:`WireError`; ``timeout`` as the sync client's.

    ``transport`` replaces the network (tests); ``verify`` is the TLS
    context. Making it opens nothing.
    """

    def __init__(
        self, *, timeout: Timeouts, transport: AsyncTransport | None, verify: ssl.SSLContext
    ) -> None:
        self.timeout = timeout
        self._client = httpx2.AsyncClient(
            timeout=_httpx2_timeout(timeout), transport=transport, verify=verify
        )

    @property
    def is_closed(self) -> bool:
        return self._client.is_closed

    async def post(
        self,
        url: str,
        *,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | Timeouts | None = None,
    ) -> AsyncResponse:
        """POST ``json`` and read the answer whole (any status)."""
        with _as_wire_errors():
            response = await self._client.post(url, json=json, headers=headers, timeout=self._bound(timeout))
        return AsyncResponse(response)

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        url: str,
        *,
        content: bytes,
        headers: Mapping[str, str],
        timeout: float | Timeouts | None = None,
    ) -> AsyncIterator[AsyncResponse]:
        """Send a request and hand on its answer once its headers arrived; closed when the block ends."""
        with _as_wire_errors():
            async with self._client.stream(
                method, url, content=content, headers=headers, timeout=self._bound(timeout)
            ) as response:
                yield AsyncResponse(response)

    async def aclose(self) -> None:
        await self._client.aclose()

    @staticmethod
    def _bound(timeout: float | Timeouts | None) -> Any:
        bound = timeouts_of(timeout)
        return httpx2.USE_CLIENT_DEFAULT if bound is None else _httpx2_timeout(bound)


def verifying_context() -> ssl.SSLContext:
    """A new verifying TLS context, as httpx2 builds its default (``SSL_CERT_FILE``, ``SSL_CERT_DIR``)."""
    return httpx2.create_ssl_context()
