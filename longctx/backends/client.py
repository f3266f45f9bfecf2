"""longctx's own synchronous HTTP client: a request's answer whole, or its body as it arrives.

Every sync request longctx sends (model listings, tokenize, metrics, streamed
answers) went through httpx2's ``Client``, whose import was 127 M of the
842 M instructions a new ``longctx batch`` process ran (callgrind, Python
3.11, 2026-12-07; what it stands on, ``http.client``, ``ssl`` and ``json``,
is imported anyway). The requests are plain JSON and server-sent events over
HTTP/1.1 to a few servers, so this client does what they need and nothing
more: no redirects, cookies, auth flows or HTTP/2. The async client is still
httpx2's (:mod:`longctx.backends.httpx2_bridge`), made only where async code
asks.

A :class:`Client` sends through a :class:`Wire`: the network
(:class:`~longctx.backends.connections.ConnectionPool`, keep-alive
connections), or an httpx2 transport (a test's mock, a proxy named in the
environment: :class:`longctx.backends.httpx2_bridge.TransportWire`), so the
tests run this client over the same code the network does. Every failure on
the wire raises :class:`~longctx.backends.connections.WireError` (stage,
timed out or not), whichever wire it came from.
"""

from __future__ import annotations

import codecs
import contextlib
import importlib
import json
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, TypedDict, Unpack
from urllib.parse import urlsplit

from longctx.backends.connections import Origin, Timeouts, WireError

_orjson: Any
try:  # optional (the ``fast`` extra): encodes a million token ids about ten times faster than json
    _orjson = importlib.import_module("orjson")
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

__all__ = [
    "USER_AGENT",
    "Client",
    "Headers",
    "Response",
    "Sending",
    "Wire",
    "WireReply",
    "encode_body",
    "timeouts_of",
]

#: Sent with every request (servers log it).
USER_AGENT = "longctx"

_DEFAULT_PORTS = {"http": 80, "https": 443}


class WireReply(Protocol):
    """An answer on the wire: status and raw headers at once, the body read as it arrives."""

    status: int
    headers: list[tuple[bytes, bytes]]

    def read_some(self) -> bytes:
        """The next bytes of the body (``b""`` at its end); raises :class:`WireError`."""

    def close(self) -> None:
        """Done with the answer: its connection is kept when it was read whole, else closed."""


class Wire(Protocol):
    """Where a client's requests go: one request out, its :class:`WireReply` back."""

    def request(
        self,
        method: str,
        origin: Origin,
        target: str,
        *,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        timeouts: Timeouts,
    ) -> WireReply:
        """Send one request (``headers`` as given, Host and Content-Length set); raises :class:`WireError`."""

    def close(self) -> None:
        """Close what the wire holds open (the requests still answering end too)."""


class Headers(Mapping[str, str]):
    """A message's headers, read by name in any case; a name sent twice reads as both values joined."""

    def __init__(self, raw: Sequence[tuple[bytes, bytes]] = ()) -> None:
        self.raw = list(raw)
        self._by_name: dict[str, str] = {}
        for name, value in self.raw:
            key, text = name.decode("latin-1").lower(), value.decode("latin-1")
            self._by_name[key] = f"{self._by_name[key]}, {text}" if key in self._by_name else text

    def __getitem__(self, name: str) -> str:
        return self._by_name[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def __repr__(self) -> str:
        return f"Headers({sorted(self._by_name)})"


class Response:
    """An HTTP answer: ``status_code`` and ``headers`` at once; the body read whole or as it arrives.

    :meth:`read` reads the body whole (then :attr:`content`, :attr:`text`
    and :meth:`json`); :meth:`iter_bytes` and :meth:`iter_lines` hand it on
    as it arrives. A body the server compressed (gzip, deflate) is handed on
    decompressed. :meth:`close` gives the connection back (a body read whole)
    or closes it.
    """

    def __init__(self, reply: WireReply, url: str) -> None:
        self.url = url
        self.status_code = reply.status
        self.headers = Headers(reply.headers)
        self._reply = reply
        self._content: bytes | None = None
        self._decoder = _body_decoder(self.headers.get("content-encoding", ""))

    def iter_bytes(self) -> Iterator[bytes]:
        """The body's bytes as they arrive (decompressed); raises :class:`WireError`."""
        try:
            while data := self._reply.read_some():
                if self._decoder is not None:
                    data = self._decoder.decompress(data)
                if data:
                    yield data
            if self._decoder is not None and (rest := self._decoder.flush()):
                yield rest
        except zlib.error as error:
            raise WireError(
                "read", f"the answer's compressed body is broken: {error}", protocol=True
            ) from error

    def iter_lines(self) -> Iterator[str]:
        """The body as text lines, each as soon as its end arrived (ended by CR LF, LF or CR, not kept).

        Only those three end a line (as server-sent events define it): a line
        of JSON holding U+2028 or a form feed stays one line.
        """
        decoder = codecs.getincrementaldecoder(self._charset())(errors="replace")
        pending = ""
        for data in self.iter_bytes():
            pending += decoder.decode(data)
            lines, pending = _split_lines(pending)
            yield from lines
        pending += decoder.decode(b"", final=True)
        lines, pending = _split_lines(pending, final=True)
        yield from lines

    def read(self) -> bytes:
        """The whole body (read once, then kept); the connection is given back."""
        if self._content is None:
            try:
                self._content = b"".join(self.iter_bytes())
            finally:
                self.close()
        return self._content

    @property
    def content(self) -> bytes:
        """The body, once :meth:`read` read it."""
        if self._content is None:
            raise RuntimeError(f"the body of the answer from {self.url} was not read")
        return self._content

    @property
    def text(self) -> str:
        """The body as text, by the charset the answer names (else UTF-8); undecodable bytes replaced."""
        return self.content.decode(self._charset(), errors="replace")

    def json(self) -> Any:
        """The body as JSON; raises ``ValueError`` where it is not."""
        return json.loads(self.content)

    def close(self) -> None:
        self._reply.close()

    def _charset(self) -> str:
        for part in self.headers.get("content-type", "").split(";")[1:]:
            name, _, value = part.strip().partition("=")
            if name.lower() == "charset" and value.strip('"'):
                with contextlib.suppress(LookupError):
                    return codecs.lookup(value.strip('"')).name
        return "utf-8"


def _split_lines(text: str, *, final: bool = False) -> tuple[list[str], str]:
    """The whole lines of ``text`` and what is left of it (a CR at its end may begin a CR LF)."""
    lines: list[str] = []
    start = 0
    while True:
        newline, carriage = text.find("\n", start), text.find("\r", start)
        if carriage == -1 or (newline != -1 and newline < carriage):
            if newline == -1:
                break
            lines.append(text[start:newline])
            start = newline + 1
            continue
        if carriage == len(text) - 1 and not final:
            break  # its LF may come with the next bytes
        lines.append(text[start:carriage])
        start = carriage + (2 if text.startswith("\n", carriage + 1) else 1)
    rest = text[start:]
    if final and rest:
        return [*lines, rest], ""
    return lines, rest


def _body_decoder(encoding: str) -> Any:
    """A decompressor for ``encoding`` (None: the body is as sent); raises :class:`WireError` for others."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(zlib.MAX_WBITS | 16)
    if encoding == "deflate":
        return zlib.decompressobj()
    raise WireError("read", f"the answer is in an encoding not asked for: {encoding}", protocol=True)


def timeouts_of(timeout: float | Timeouts | None) -> Timeouts | None:
    """``timeout`` as :class:`Timeouts`: a number bounds every stage; None stays None (the client's own)."""
    if timeout is None or isinstance(timeout, Timeouts):
        return timeout
    return Timeouts(timeout, timeout, timeout)


class Sending(TypedDict, total=False):
    """What a request carries besides its method and URL (each optional)."""

    #: Sent as the JSON body (:func:`encode_body`, with its Content-Type); else ``content``.
    json: Any
    #: The body as it is.
    content: bytes
    #: Headers of this request, over the client's by name (any case).
    headers: Mapping[str, str]
    #: A number bounds every stage; :class:`Timeouts` each; absent or None: the client's own.
    timeout: float | Timeouts | None


class Client:
    """Requests to any server through ``wire``, each stage bounded by ``timeout`` unless a call says so.

    ``headers`` go with every request (a call's own override them by name).
    Making a client opens nothing; :meth:`close` closes its wire, ending the
    requests still answering on it.
    """

    def __init__(self, *, timeout: Timeouts, wire: Wire, headers: Mapping[str, str] | None = None) -> None:
        self.timeout = timeout
        self.headers = dict(headers or {})
        self.is_closed = False
        self._wire = wire

    def request(self, method: str, url: str, **sending: Unpack[Sending]) -> Response:
        """Send a request and read its answer whole (any status: the caller reads ``status_code``).

        Raises :class:`WireError` when the wire fails, ``RuntimeError`` once
        the client is closed.
        """
        with self.stream(method, url, **sending) as answer:
            answer.read()
        return answer

    @contextlib.contextmanager
    def stream(self, method: str, url: str, **sending: Unpack[Sending]) -> Iterator[Response]:
        """Send a request and hand on its answer once its headers arrived; closed when the block ends.

        Raises as :meth:`request` does.
        """
        if self.is_closed:  # a caller's mistake, not the network's: no failure to retry
            raise RuntimeError(f"the client was closed: no request to {url}")
        origin, target, host = _split(url)
        sent = {
            "Host": host,
            "User-Agent": USER_AGENT,
            "Accept": "*/*",
            "Accept-Encoding": "identity",
            **self.headers,
        }
        body = sending.get("content")
        if "json" in sending:
            body = encode_body(sending["json"])
            sent["Content-Type"] = "application/json"
        for name, value in sending.get("headers", {}).items():
            for same in [key for key in sent if key.lower() == name.lower()]:
                del sent[same]
            sent[name] = value
        if body is not None or method in ("POST", "PUT", "PATCH"):
            sent["Content-Length"] = str(len(body or b""))
        raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in sent.items()]
        bounds = timeouts_of(sending.get("timeout")) or self.timeout
        reply = self._wire.request(method, origin, target, headers=raw, body=body or b"", timeouts=bounds)
        try:
            answer = Response(reply, url)
        except WireError:
            reply.close()  # an encoding it cannot read: the connection is not reused
            raise
        try:
            yield answer
        finally:
            answer.close()

    def close(self) -> None:
        self.is_closed = True
        self._wire.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def encode_body(body: Any) -> bytes:
    """A request body as JSON bytes, as httpx2 encodes ``json=`` (compact, UTF-8 unescaped).

    By orjson when it is installed (the ``fast`` extra): a body of a million
    token ids took 0.25-0.33 s through ``json.dumps`` and 0.03 s through
    orjson on a 2-core CPU, on the way to every request's first token.
    Anything orjson does not take (an integer past 64 bits, a key that is not
    a string) goes through ``json``.
    """
    if _orjson is not None:
        try:
            return bytes(_orjson.dumps(body))
        except (TypeError, _orjson.JSONEncodeError):
            pass
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _split(url: str) -> tuple[Origin, str, str]:
    """``url``'s origin (scheme, host, port), its request target, and its Host header."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise WireError("connect", f"not an http(s) URL: {url!r}")
    try:
        port = parts.port or _DEFAULT_PORTS[scheme]
    except ValueError as error:
        raise WireError("connect", f"not an http(s) URL: {url!r} ({error})") from error
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    named = host if port == _DEFAULT_PORTS[scheme] else f"{host}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return (scheme, parts.hostname, port), target, named
