"""A local HTTP proxy that injects faults into chat requests on their way to a real server.

Each chat completion request takes the next fault from the queue (or none):
drop the connection before answering, answer 503, answer 429 with a
Retry-After, stall without a byte, or cut the streamed answer midway. Every
other request (and every chat request once the queue is empty) is passed
through byte for byte. One request per connection, which keeps the relay
simple and makes every fault hit exactly the request it was meant for.

With ``perturb`` set (``"logprob"`` or ``"token"``), every streamed chat
answer whose usage reports cached tokens is changed on its way back, as a
cache that serves wrong KV would change it: the first token's logprob drops
by ``perturb_by`` nats, or the first generated token id (and the first
character of the text) changes. Cold answers pass unchanged; ``perturbed``
counts the answers changed.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

CHAT_PATH = b"/v1/chat/completions"


@dataclass
class FaultProxy:
    upstream_host: str
    upstream_port: int
    faults: deque[str] = field(default_factory=deque)
    seen: list[str] = field(default_factory=list)
    stall_seconds: float = 30.0
    perturb: str | None = None
    perturb_by: float = 1.0
    perturbed: int = 0

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
            # A client that went away first (a CLI that stopped at an error) leaves nothing to relay to.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._relay(client, request, cut=fault == "cut")

    def _relay(self, client: socket.socket, request: bytes, cut: bool) -> None:
        """Pass the exchange through; with ``cut``, drop it right after the first streamed event."""
        head, _, body = request.partition(b"\r\n\r\n")
        lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
        forwarded = b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body
        with socket.create_connection((self.upstream_host, self.upstream_port)) as upstream:
            upstream.sendall(forwarded)
            if self.perturb and request.startswith(b"POST " + CHAT_PATH):
                client.sendall(self._perturbed(_read_all(upstream)))
                return
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

    def _perturbed(self, response: bytes) -> bytes:
        """``response`` (a whole HTTP answer) with its stream changed if it reports cached tokens."""
        head, _, body = response.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        if any(line.lower().startswith(b"transfer-encoding: chunked") for line in lines):
            body = _unchunked(body)
        events = [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]
        chunks = [json.loads(e) for e in events if e.strip() != b"[DONE]"]
        cached = max(
            ((c.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            for c in chunks
        )
        if cached and chunks:
            _change(chunks, self.perturb or "", self.perturb_by)
            self.perturbed += 1
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        encoded = text.encode()
        kept = [
            line
            for line in lines
            if not line.lower().startswith((b"transfer-encoding:", b"content-length:", b"connection:"))
        ]
        kept += [f"Content-Length: {len(encoded)}".encode(), b"Connection: close"]
        return b"\r\n".join(kept) + b"\r\n\r\n" + encoded


def _change(chunks: list[dict[str, Any]], how: str, by: float) -> None:
    """Change the first generated token's logprob, or its id and text, in a stream's chunks."""
    for chunk in chunks:
        for choice in chunk.get("choices") or ():
            content = ((choice.get("logprobs") or {}).get("content")) or []
            if how == "logprob" and content:
                content[0]["logprob"] -= by
                return
            if how == "token" and choice.get("token_ids"):  # vLLM
                choice["token_ids"][0] += 1
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    delta["content"] = "#" + delta["content"][1:]
                return
        outputs = (chunk.get("sglext") or {}).get("output_ids")
        if how == "token" and outputs:  # SGLang: every id in the last chunk
            outputs[0][0] += 1
            return


def _read_all(upstream: socket.socket) -> bytes:
    data = b""
    while chunk := upstream.recv(65536):
        data += chunk
    return data


def _unchunked(body: bytes) -> bytes:
    """The payload of an HTTP/1.1 chunked body."""
    out, rest = b"", body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            break
        out, rest = out + rest[:size], rest[size + 2 :]
    return out


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
