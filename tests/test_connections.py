"""longctx's own client and its connection pool against a real HTTP/1.1 server on 127.0.0.1.

Each path of the server below does one thing a server does to a client: answers
whole and keeps the connection, streams chunks one at a time, goes silent,
closes without answering, closes mid-body, closes its idle connections. The
client is longctx's own (over ``network_wire``), the errors are checked as the
longctx errors a user sees.
"""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from fake_engine import FakeEngine
from fake_http import FakeHttpServer, batch_over_one_file

from longctx.backends import connections
from longctx.backends.connections import ConnectionPool, Timeouts, WireError
from longctx.backends.http import (
    EventPost,
    HttpEndpoint,
    connection_refused,
    make_client,
    network_wire,
    post_events,
    timed_out,
    tls_context,
)
from longctx.backends.httpx2_bridge import TransportWire
from longctx.cli import EXIT_INTERRUPTED
from longctx.errors import ServerUnreachable


class Server:
    """A scripted HTTP/1.1 server: ``connections`` counts the TCP connections it accepted."""

    def __init__(self) -> None:
        self.connections = 0
        self.go_on = threading.Event()  # what a streaming path waits for between its two chunks
        self.waited_in_vain = False  # it sent its second chunk without being told to go on
        self.client_sockets: list[socket.socket] = []
        self.targets: list[str] = []  # each request's target as sent (a proxied one is a whole URL)
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                owner.connections += 1
                owner.client_sockets.append(self.connection)

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                owner.route(self)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                owner.route(self)

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"

    def route(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        self.targets.append(handler.path)
        path = urllib.parse.urlsplit(handler.path).path
        if path == "/json":
            body = b'{"ok": true}'
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
        elif path == "/events":
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            for number in (1, 2):
                if number == 2 and not self.go_on.wait(10):
                    self.waited_in_vain = True
                data = f'data: {{"n": {number}}}\n\n'.encode()
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                handler.wfile.flush()
            handler.wfile.write(b"0\r\n\r\n")
        elif path == "/silent":
            handler.send_response(200)
            handler.send_header("Content-Length", "10")
            handler.end_headers()
            handler.wfile.flush()
            self.go_on.wait(10)
        elif path == "/hang-up":
            handler.close_connection = True
        elif path == "/cut":
            handler.send_response(200)
            handler.send_header("Content-Length", "100")
            handler.end_headers()
            handler.wfile.write(b"only part")
            handler.close_connection = True
        else:  # an error answer that keeps the connection (send_error would close it)
            handler.send_response(404)
            handler.send_header("Content-Length", "0")
            handler.end_headers()

    def close_idle_connections(self) -> None:
        """What a server does to a connection idle past its keep-alive timeout."""
        for sock in self.client_sockets:
            sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.go_on.set()
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    made = Server()
    yield made
    made.close()


def test_a_client_keeps_one_connection_for_its_requests(server: Server) -> None:
    endpoint = HttpEndpoint(server.url, timeout=10.0)
    try:
        assert [endpoint.get_json("/json") for _ in range(5)] == [{"ok": True}] * 5
        assert endpoint.status("/nothing") == 404  # an error answer read whole keeps it too
        assert endpoint.get_json("/json") == {"ok": True}
    finally:
        endpoint.close()
    assert server.connections == 1


def test_a_connection_the_server_closed_while_idle_is_not_used_again(server: Server) -> None:
    endpoint = HttpEndpoint(server.url, timeout=10.0)
    try:
        endpoint.get_json("/json")
        server.close_idle_connections()
        assert endpoint.get_json("/json") == {"ok": True}
    finally:
        endpoint.close()
    assert server.connections == 2


def test_an_idle_connection_past_its_keep_alive_is_not_used_again(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = HttpEndpoint(server.url, timeout=10.0)
    try:
        endpoint.get_json("/json")
        monkeypatch.setattr(connections, "KEEP_IDLE", -1.0)  # every idle connection has expired
        endpoint.get_json("/json")
    finally:
        endpoint.close()
    assert server.connections == 2


def test_a_stream_hands_on_each_event_as_it_arrives(server: Server) -> None:
    # The second chunk is sent only once the first event reached the caller:
    # a transport that waited for the whole body would wait ten seconds and fail.
    client = make_client(timeout=30.0, stall_timeout=30.0)
    seen = []
    try:
        for event in post_events(client, EventPost(f"{server.url}/events", {"q": 1}, {})):
            seen.append(event["n"])
            if event["n"] == 1:
                assert not server.go_on.is_set()
                server.go_on.set()
        post_events_again = list(post_events(client, EventPost(f"{server.url}/events", {"q": 2}, {})))
    finally:
        client.close()
    assert seen == [1, 2] and [event["n"] for event in post_events_again] == [1, 2]
    assert not server.waited_in_vain
    assert server.connections == 1  # a chunked stream read to its end keeps its connection


def test_a_stream_left_early_closes_its_connection(server: Server) -> None:
    client = make_client(timeout=30.0, stall_timeout=30.0)
    try:
        events = cast(
            Generator[dict[str, Any]], post_events(client, EventPost(f"{server.url}/events", {}, {}))
        )
        assert next(events)["n"] == 1
        events.close()  # the caller stops reading: the rest is never read off this connection
        server.go_on.set()
        assert [event["n"] for event in post_events(client, EventPost(f"{server.url}/events", {}, {}))] == [
            1,
            2,
        ]
    finally:
        client.close()
    assert server.connections == 2


def test_a_silent_server_is_a_read_timeout(server: Server) -> None:
    client = make_client(timeout=30.0, stall_timeout=0.3)
    try:
        with pytest.raises(ServerUnreachable, match="ReadTimeout") as raised:
            list(post_events(client, EventPost(f"{server.url}/silent", {}, {})))
    finally:
        client.close()
    assert timed_out(raised.value) and not connection_refused(raised.value)


def test_a_server_that_hangs_up_or_cuts_the_body_is_a_protocol_error(server: Server) -> None:
    endpoint = HttpEndpoint(server.url, timeout=10.0)
    try:
        with pytest.raises(
            ServerUnreachable, match="RemoteProtocolError: the server closed without answering"
        ):
            endpoint.get_json("/hang-up")
        with pytest.raises(ServerUnreachable, match="RemoteProtocolError: the server closed 91 bytes before"):
            endpoint.get_json("/cut")
        assert endpoint.get_json("/json") == {"ok": True}  # a new connection, not the broken one
    finally:
        endpoint.close()


def test_nothing_listening_is_a_refused_connection() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]  # bound, not listening: refused
        endpoint = HttpEndpoint(f"http://127.0.0.1:{port}", timeout=5.0)
        with pytest.raises(
            ServerUnreachable, match=r"ConnectError: cannot connect to 127\.0\.0\.1"
        ) as raised:
            endpoint.get_json("/json")
        assert endpoint.status("/json") is None
        endpoint.close()
    assert connection_refused(raised.value) and not timed_out(raised.value)


def test_a_proxy_in_the_environment_leaves_the_requests_to_httpx2(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.lower().endswith("_proxy")]:
        monkeypatch.delenv(name)
    assert isinstance(network_wire(), ConnectionPool)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert isinstance(network_wire(), TransportWire)
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.setenv("all_proxy", "http://proxy.example:3128")  # any case
    assert isinstance(network_wire(), TransportWire)
    monkeypatch.delenv("all_proxy")
    monkeypatch.setenv("NO_PROXY", "*")  # no proxy named: the pool again
    assert isinstance(network_wire(), ConnectionPool)
    monkeypatch.setenv("HTTP_PROXY", "")  # set but empty names none
    assert isinstance(network_wire(), ConnectionPool)


def test_a_proxied_client_goes_through_the_proxy_the_environment_names(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test server is the proxy: a request for another host reaches it with that host's URL.
    monkeypatch.setenv("HTTP_PROXY", server.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    client = make_client(timeout=5.0, stall_timeout=5.0)
    try:
        answer = client.request("GET", "http://elsewhere.example/json")
        assert answer.status_code == 200 and answer.json() == {"ok": True}
        assert server.targets[-1] == "http://elsewhere.example/json"
    finally:
        client.close()


def test_the_pool_keeps_at_most_max_idle_connections_and_closes_them(server: Server) -> None:
    pool = ConnectionPool(tls_context)
    origin = ("http", "127.0.0.1", int(server.url.rsplit(":", 1)[1]))
    host = [(b"Host", b"127.0.0.1")]
    timeouts = Timeouts(5.0, 5.0, 5.0)
    replies = [
        pool.request("GET", origin, "/json", headers=host, body=b"", timeouts=timeouts)
        for _ in range(connections.MAX_IDLE + 3)
    ]
    for reply in replies:
        while reply.read_some():
            pass
        reply.close()
    assert server.connections == connections.MAX_IDLE + 3
    idle = list(pool._idle)
    assert len(idle) == connections.MAX_IDLE
    pool.close()
    assert all(connection.http.sock is None for connection in idle) and not pool._idle
    with pytest.raises(WireError, match="cannot connect") as raised:
        pool.request("GET", ("http", "127.0.0.1", 1), "/", headers=host, body=b"", timeouts=timeouts)
    assert raised.value.stage == "connect" and not raised.value.timed_out


def test_closing_a_client_ends_a_stream_another_thread_is_reading(server: Server) -> None:
    # What a Ctrl-C does to a batch: the main thread closes the backend while a
    # worker reads an answer the server is still holding back.
    client = make_client(timeout=30.0, stall_timeout=30.0)
    first, outcome = threading.Event(), []

    def read() -> None:
        try:
            for _ in post_events(client, EventPost(f"{server.url}/events", {}, {})):
                first.set()
        except ServerUnreachable as error:
            outcome.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert first.wait(10)
    client.close()
    reader.join(10)
    assert not reader.is_alive() and not server.go_on.is_set()  # ended while the server still held it
    assert len(outcome) == 1 and "the server closed before the whole answer" in str(outcome[0])


def test_ctrl_c_ends_a_batch_whose_answer_is_still_streaming(tmp_path: Path) -> None:
    # The interrupt is seen at once; then the process must not wait at exit for
    # the worker thread still reading the held answer (it did, with httpcore2 too).
    served = FakeHttpServer(FakeEngine(engine="generic", block=1, answer="one two three four"))
    served.hold_after_first_piece()
    args, env = batch_over_one_file(tmp_path, served.base_url, ["What does first return?"])
    command = [sys.executable, "-c", "import sys; from longctx.cli import main; sys.exit(main())", *args]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert served.first_piece_sent.wait(60), "no answer began"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
        assert not served.hold.is_set()  # the answer was still held back when the process ended
    finally:
        served.hold.set()
        if process.poll() is None:
            process.kill()
        served.close()
    assert process.returncode == EXIT_INTERRUPTED and "longctx: interrupted" in stderr
