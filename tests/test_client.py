"""longctx's own sync client: what it sends, how it reads an answer, and failures from any wire as one kind.

The client against a real server is tests/test_connections.py; here a recording
wire shows the bytes it hands the network, stand-in replies the reading
(lines split only where server-sent events split them, compressed bodies,
charsets), and httpx2 transports (the tests' mock, a stream that breaks) that
their failures arrive as the pool's do.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Sequence

import httpx2
import pytest

from longctx.backends.client import Client, Headers, Response
from longctx.backends.connections import Origin, Timeouts, WireError
from longctx.backends.http import (
    EventPost,
    HttpEndpoint,
    connection_refused,
    post_events,
    timed_out,
    tls_context,
)
from longctx.backends.httpx2_bridge import TransportWire
from longctx.errors import ServerUnreachable

BOUNDS = Timeouts(5.0, 7.0, 9.0)


class Chunks:
    """A reply whose body arrives in the given chunks."""

    def __init__(
        self, chunks: Sequence[bytes], headers: Sequence[tuple[bytes, bytes]] = (), status: int = 200
    ):
        self.status = status
        self.headers = list(headers)
        self._chunks: Iterator[bytes] = iter(chunks)
        self.closed = False

    def read_some(self) -> bytes:
        return next(self._chunks, b"")

    def close(self) -> None:
        self.closed = True


class Recording:
    """A wire that records each request and answers with the next reply."""

    def __init__(self, *replies: Chunks) -> None:
        self.replies = list(replies)
        self.sent: list[tuple[str, Origin, str, dict[str, str], bytes, Timeouts]] = []
        self.closed = False

    def request(
        self,
        method: str,
        origin: Origin,
        target: str,
        *,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        timeouts: Timeouts,
    ) -> Chunks:
        names = [name.decode() for name, _ in headers]
        assert len({name.lower() for name in names}) == len(names), f"a header sent twice: {names}"
        sent = {name.decode(): value.decode() for name, value in headers}
        self.sent.append((method, origin, target, sent, body, timeouts))
        return self.replies.pop(0)

    def close(self) -> None:
        self.closed = True


def test_a_json_post_carries_its_body_host_and_length_and_a_calls_headers_win_by_name() -> None:
    wire = Recording(Chunks([b'{"ok": true}']))
    client = Client(timeout=BOUNDS, wire=wire, headers={"Authorization": "Bearer k", "X-Team": "a"})
    answer = client.request(
        "POST", "http://host.example:8000/v1/tokenize?x=1", json={"text": "é"}, headers={"x-team": "b"}
    )
    assert answer.json() == {"ok": True}
    method, origin, target, headers, body, bounds = wire.sent[0]
    assert (method, origin, target) == ("POST", ("http", "host.example", 8000), "/v1/tokenize?x=1")
    assert body == '{"text":"é"}'.encode() and headers["Content-Length"] == str(len(body))
    assert headers["Host"] == "host.example:8000" and headers["Content-Type"] == "application/json"
    assert headers["Authorization"] == "Bearer k" and headers["x-team"] == "b" and "X-Team" not in headers
    assert headers["Accept-Encoding"] == "identity"  # nothing to decompress on a local server
    assert bounds is BOUNDS


def test_a_get_has_no_body_its_default_port_is_not_named_and_a_number_bounds_every_stage() -> None:
    wire = Recording(Chunks([b"text"]))
    client = Client(timeout=BOUNDS, wire=wire)
    assert client.request("GET", "https://[::1]/metrics", timeout=3.0).text == "text"
    method, origin, target, headers, body, bounds = wire.sent[0]
    assert (method, origin, target, body) == ("GET", ("https", "::1", 443), "/metrics", b"")
    assert headers["Host"] == "[::1]" and "Content-Length" not in headers
    assert (bounds.connect, bounds.read, bounds.write) == (3.0, 3.0, 3.0)


def test_a_url_that_is_not_http_fails_as_a_connection_would_and_a_closed_client_refuses() -> None:
    client = Client(timeout=BOUNDS, wire=Recording())
    with pytest.raises(WireError, match="not an http"):
        client.request("GET", "ftp://host/file")
    client.close()
    with pytest.raises(RuntimeError, match="the client was closed: no request to http://host/"):
        client.request("GET", "http://host/")


def _response(*chunks: bytes, headers: Sequence[tuple[bytes, bytes]] = ()) -> Response:
    return Response(Chunks(chunks, headers), "http://host/")


def test_lines_end_only_at_cr_lf_and_crlf_even_split_across_reads() -> None:
    lines = list(
        _response(b"data: a\r", b"\ndata: b\rdata: c\n\n", b"data: \xe2\x80", b"\xa8x\x0cy").iter_lines()
    )
    # U+2028 (split over two reads) and a form feed are inside a line: only CR, LF and CR LF end one.
    assert lines == ["data: a", "data: b", "data: c", "", "data: \u2028x\x0cy"]
    assert list(_response(b"one\r").iter_lines()) == ["one"]  # a CR at the very end ends its line


def test_a_compressed_body_is_read_decompressed_and_an_unasked_encoding_is_refused() -> None:
    packed = gzip.compress(b'{"n": 1}')
    answer = _response(packed[:5], packed[5:], headers=[(b"Content-Encoding", b"gzip")])
    assert answer.read() == b'{"n": 1}' and answer.json() == {"n": 1}
    with pytest.raises(WireError, match="compressed body is broken") as raised:
        _response(b"not gzip", headers=[(b"Content-Encoding", b"gzip")]).read()
    assert raised.value.protocol and raised.value.kind == "RemoteProtocolError"
    with pytest.raises(WireError, match="encoding not asked for: br") as raised:
        _response(b"x", headers=[(b"content-encoding", b"br")])
    assert raised.value.protocol


def test_text_reads_the_charset_named_and_headers_read_in_any_case() -> None:
    answer = _response(
        "café".encode("latin-1"), headers=[(b"Content-Type", b"text/plain; charset=ISO-8859-1")]
    )
    answer.read()
    assert answer.text == "café"
    headers = Headers([(b"X-Id", b"a"), (b"x-id", b"b"), (b"Retry-After", b"3")])
    assert headers["x-ID"] == "a, b" and headers.get("retry-after") == "3" and len(headers) == 2
    with pytest.raises(RuntimeError, match="not read"):
        _ = _response(b"x").content


def test_a_mock_transport_sees_what_the_network_would_and_its_failures_arrive_as_the_pools() -> None:
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        if request.url.path == "/refused":
            raise httpx2.ConnectError("connection refused", request=request)
        return httpx2.Response(200, json={"path": request.url.path})

    endpoint = HttpEndpoint("http://fake:8000/v1", timeout=5.0, transport=httpx2.MockTransport(handler))
    assert endpoint.post_json("/tokenize", {"prompt": "x"}) == {"path": "/tokenize"}
    assert json.loads(seen[0].content) == {"prompt": "x"} and seen[0].headers["user-agent"] == "longctx"
    assert seen[0].headers["content-type"] == "application/json" and "x-request-id" in seen[0].headers
    with pytest.raises(ServerUnreachable, match="ConnectError: connection refused") as raised:
        endpoint.get_json("/refused")
    assert connection_refused(raised.value) and not timed_out(raised.value)
    assert endpoint.status("/refused") is None


def test_a_stream_that_times_out_midway_through_a_transport_is_a_read_timeout() -> None:
    class Stalls(httpx2.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            yield b'data: {"choices": []}\n\n'
            raise httpx2.ReadTimeout("no bytes for 7 s")

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, stream=Stalls(), headers={"content-type": "text/event-stream"})

    wire = TransportWire(httpx2.MockTransport(handler), verify=tls_context())
    client = Client(timeout=BOUNDS, wire=wire)
    events = []
    with pytest.raises(ServerUnreachable, match="ReadTimeout: no bytes for 7 s") as raised:
        events.extend(post_events(client, EventPost("http://fake/v1/chat/completions", {}, {})))
    assert events == [{"choices": []}] and timed_out(raised.value)
    client.close()
    assert wire._client.is_closed
