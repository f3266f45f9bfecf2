"""A local HTTP proxy that injects faults into chat requests on their way to a real server.

Each chat completion request takes the next fault from the queue (or none):
drop the connection before answering, answer 503, answer 429 with a
Retry-After, stall without a byte, or cut the streamed answer midway. Every
other request (and every chat request once the queue is empty) is passed
through byte for byte. One request per connection, which keeps the relay
simple and makes every fault hit exactly the request it was meant for.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field

CHAT_PATH = b"/v1/chat/completions"


@dataclass
class FaultProxy:
    upstream_host: str
    upstream_port: int
    faults: deque[str] = field(default_factory=deque)
    seen: list[str] = field(default_factory=list)
    stall_seconds: float = 30.0

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self._stopping.set()
        self._listener.close()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        with client:
            request = _read_request(client)
            if request is None:
                return
            fault = (
                self.faults.popleft() if request.startswith(b"POST " + CHAT_PATH) and self.faults else None
            )
            self.seen.append(fault or "pass")
            if fault == "drop":
                client.shutdown(socket.SHUT_RDWR)
                return
            if fault == "503":
                _respond(client, 503, b'{"error": {"message": "overloaded", "code": 503}}')
                return
            if fault and fault.startswith("429"):
                wait = fault.partition(":")[2] or "1"
                _respond(client, 429, b'{"error": {"message": "slow down"}}', {"Retry-After": wait})
                return
            if fault == "stall":
                deadline = time.monotonic() + self.stall_seconds
                while time.monotonic() < deadline and not self._stopping.is_set():
                    time.sleep(0.1)
                return
            self._relay(client, request, cut=fault == "cut")

    def _relay(self, client: socket.socket, request: bytes, cut: bool) -> None:
        """Pass the exchange through; with ``cut``, drop it right after the first streamed event."""
        head, _, body = request.partition(b"\r\n\r\n")
        lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
        forwarded = b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body
        with socket.create_connection((self.upstream_host, self.upstream_port)) as upstream:
            upstream.sendall(forwarded)
            relayed = b""
            while True:
                chunk = upstream.recv(65536)
                if not chunk:
                    return
                if cut:
                    relayed += chunk
                    event = relayed.find(b"data: ")
                    end = relayed.find(b"\n\n", event) if event >= 0 else -1
                    if end >= 0:
                        client.sendall(relayed[: end + 2])
                        client.shutdown(socket.SHUT_RDWR)
                        return
                    continue
                client.sendall(chunk)


def _read_request(client: socket.socket) -> bytes | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = client.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = client.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head + b"\r\n\r\n" + body


def _respond(client: socket.socket, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
    reason = {503: "Service Unavailable", 429: "Too Many Requests"}.get(status, "Error")
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    client.sendall(
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"{extra}Connection: close\r\n\r\n".encode()
        + body
    )
