"""Keep-alive HTTP/1.1 connections over the standard library's ``http.client``: the sync client's network.

The requests longctx sends are plain HTTP/1.1 to a few servers: this pool
does what they need and nothing more, under longctx's own client
(:mod:`longctx.backends.client`). It replaced httpcore2, httpx2's network
layer, whose import (with h11, anyio, sniffio and truststore) was 119 M of
the 954 M instructions a new ``longctx batch`` process ran (callgrind,
2026-12-06), paid before the first request.

What it keeps from httpcore2's behaviour: a connection is used by one
request at a time and goes back to the pool only when its answer was read to
the end and the server keeps it open; an idle connection is dropped after
:data:`KEEP_IDLE` seconds or when the server has closed it (its socket reads
as ready), so a request never goes out on a connection the server has
already given up; at most :data:`MAX_IDLE` are kept. Proxies and HTTP/2 are
not here: where the environment names a proxy, the client's requests go
through httpx2 (see :func:`longctx.backends.http.network_wire`).
"""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from typing import Literal

__all__ = ["KEEP_IDLE", "MAX_IDLE", "ConnectionPool", "Origin", "Reply", "Stage", "Timeouts", "WireError"]

#: Seconds an idle connection is kept (httpx2's default keep-alive expiry; uvicorn, under vLLM and
#: SGLang, closes one after 5 s, so reusing an older one would race the server's close).
KEEP_IDLE = 5.0
#: Idle connections kept at most, over every server (httpx2's default).
MAX_IDLE = 20
#: Bytes handed on per read of an answer: whatever has arrived, up to this.
CHUNK = 65536

Stage = Literal["connect", "write", "read"]


class WireError(Exception):
    """A request that failed on the wire: at which stage, and whether by its time bound."""

    def __init__(self, stage: Stage, message: str, *, timed_out: bool = False, protocol: bool = False):
        super().__init__(message)
        self.stage = stage
        self.timed_out = timed_out
        #: The server broke HTTP (closed before a whole answer, sent no status line).
        self.protocol = protocol

    @property
    def kind(self) -> str:
        """The failure's name, as httpx names it: ConnectError, ReadTimeout, RemoteProtocolError, ..."""
        if self.timed_out:
            return f"{self.stage.capitalize()}Timeout"
        if self.protocol:
            return "RemoteProtocolError"
        return f"{self.stage.capitalize()}Error"


class Timeouts:
    """Seconds each stage may wait (None: no bound): making the connection, sending, each read."""

    __slots__ = ("connect", "read", "write")

    def __init__(self, connect: float | None, read: float | None, write: float | None) -> None:
        self.connect, self.read, self.write = connect, read, write


Origin = tuple[str, str, int]  # scheme, host, port


class _Connection:
    def __init__(self, origin: Origin, connection: http.client.HTTPConnection) -> None:
        self.origin = origin
        self.http = connection
        # Kept here too: http.client hands the socket to the response of a server that closes
        # after answering (HTTP/1.0, "Connection: close"), and the connection's is None then.
        self.socket = connection.sock
        self.idle_since = 0.0

    def usable(self, now: float) -> bool:
        """Whether an idle connection can take a request: not expired, not closed by the server."""
        sock = self.http.sock
        if sock is None or now - self.idle_since > KEEP_IDLE:
            return False
        # Readable while idle: the server closed it (or sent what no request asked for).
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def close(self) -> None:
        self.http.close()

    def abort(self) -> None:
        """End the request on it now: a thread blocked reading it wakes to the end of the stream."""
        # shutdown, not close: a close from another thread leaves a blocked read waiting.
        with contextlib.suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)


class Reply:
    """A server's answer: status and headers at once, the body read as it arrives.

    Read it to the end (:meth:`read_some` gives ``b""``) and :meth:`close` it:
    the connection then serves the next request; closed earlier, the
    connection is closed with it.
    """

    def __init__(
        self, pool: ConnectionPool, connection: _Connection, response: http.client.HTTPResponse
    ) -> None:
        self.status = response.status
        self.headers: list[tuple[bytes, bytes]] = [
            (name.encode("latin-1"), value.encode("latin-1")) for name, value in response.getheaders()
        ]
        self._pool = pool
        self._connection: _Connection | None = connection
        self._response = response
        self._ended = False

    def read_some(self) -> bytes:
        """The next bytes of the body that have arrived (up to :data:`CHUNK`); ``b""`` at its end."""
        if self._ended:
            return b""
        try:
            data = self._response.read1(CHUNK)
        except TimeoutError as error:
            silent = "timed out waiting for the answer's next bytes"
            raise WireError("read", silent, timed_out=True) from error
        except http.client.IncompleteRead as error:
            closed = "the server closed before the whole answer"
            raise WireError("read", closed, protocol=True) from error
        except (OSError, http.client.HTTPException) as error:
            raise WireError("read", f"the answer broke off: {error}") from error
        if not data:
            if self._response.length:  # http.client reads a body cut short as its end
                closed = f"the server closed {self._response.length} bytes before the whole answer"
                raise WireError("read", closed, protocol=True)
            self._ended = True
        return data

    def close(self) -> None:
        """Give the connection back (answer read whole, kept open by the server) or close it."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        whole = self._ended or self._response.isclosed()
        self._response.close()
        if whole and not self._response.will_close and connection.http.sock is not None:
            self._pool.give_back(connection)
        else:
            self._pool.drop(connection)


class ConnectionPool:
    """HTTP/1.1 connections to any number of servers, kept alive between requests; thread-safe.

    ``tls`` gives the context for an ``https`` server (called at its first
    connection). Making a pool opens nothing. Closing it ends the requests
    still answering too (their readers get the end of the stream at once):
    a caller that closes its client on Ctrl-C is not kept waiting by a long
    prefill's stream in another thread.
    """

    def __init__(self, tls: Callable[[], ssl.SSLContext]) -> None:
        self._tls = tls
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()  # carrying a request now
        self._lock = threading.Lock()
        self._closed = False

    def request(
        self,
        method: str,
        origin: Origin,
        target: str,
        *,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        timeouts: Timeouts,
    ) -> Reply:
        """Send one request and return its answer once its status line and headers arrived.

        ``headers`` go as given (Host and Content-Length included: the caller
        sets them). Raises :class:`WireError`.
        """
        connection = self._idle_connection(origin) or self._connect(origin, timeouts.connect)
        with self._lock:
            if self._closed:
                connection.close()
                raise WireError("connect", "the client was closed")
            self._busy.add(connection)
        sock = connection.http.sock
        try:
            sock.settimeout(timeouts.write)
            connection.http.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                connection.http.putheader(name.decode("latin-1"), value.decode("latin-1"))
            connection.http.endheaders(body or None)
        except TimeoutError as error:
            self.drop(connection)
            raise WireError("write", "timed out sending the request", timed_out=True) from error
        except (OSError, http.client.HTTPException) as error:
            self.drop(connection)
            raise WireError("write", f"the request could not be sent: {error}") from error
        try:
            sock.settimeout(timeouts.read)
            response = connection.http.getresponse()
        except TimeoutError as error:
            self.drop(connection)
            raise WireError("read", "timed out waiting for the answer", timed_out=True) from error
        except http.client.RemoteDisconnected as error:
            self.drop(connection)
            raise WireError("read", "the server closed without answering", protocol=True) from error
        except http.client.HTTPException as error:
            self.drop(connection)
            raise WireError("read", f"the answer is not HTTP: {error}", protocol=True) from error
        except OSError as error:
            self.drop(connection)
            raise WireError("read", f"the answer broke off: {error}") from error
        return Reply(self, connection, response)

    def give_back(self, connection: _Connection) -> None:
        """Keep ``connection`` for the next request to its server (the oldest idle one goes past MAX_IDLE)."""
        connection.idle_since = time.monotonic()
        with self._lock:
            self._busy.discard(connection)
            if self._closed:
                dropped = [connection]
            else:
                self._idle.append(connection)
                dropped = self._idle[:-MAX_IDLE] if len(self._idle) > MAX_IDLE else []
                del self._idle[: len(dropped)]
        for old in dropped:
            old.close()

    def drop(self, connection: _Connection) -> None:
        """Close ``connection``: its request ended without leaving it reusable."""
        with self._lock:
            self._busy.discard(connection)
        connection.close()

    def close(self) -> None:
        """Close every idle connection, and end the requests still answering (their replies close them)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            busy = list(self._busy)
        for connection in idle:
            connection.close()
        for connection in busy:
            connection.abort()

    def _idle_connection(self, origin: Origin) -> _Connection | None:
        now = time.monotonic()
        stale: list[_Connection] = []
        found = None
        with self._lock:
            # The most recently used first: the likeliest still open.
            for index in range(len(self._idle) - 1, -1, -1):
                connection = self._idle[index]
                if connection.origin != origin:
                    continue
                del self._idle[index]
                if connection.usable(now):
                    found = connection
                    break
                stale.append(connection)
        for connection in stale:
            connection.close()
        return found

    def _connect(self, origin: Origin, timeout: float | None) -> _Connection:
        scheme, host, port = origin
        made: http.client.HTTPConnection
        if scheme == "https":
            made = http.client.HTTPSConnection(host, port, timeout=timeout, context=self._tls())
        else:
            made = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            made.connect()
        except TimeoutError as error:
            made.close()
            silent = f"timed out connecting to {host}:{port}"
            raise WireError("connect", silent, timed_out=True) from error
        except OSError as error:  # refused, no such host, a TLS handshake or certificate refused
            made.close()
            raise WireError("connect", f"cannot connect to {host}:{port}: {error}") from error
        return _Connection(origin, made)
