"""The fake engine over real HTTP, for the CLI run as a process (in a pipe or a terminal).

:class:`FakeHttpServer` serves a :class:`~fake_engine.FakeEngine` on
127.0.0.1. A streamed chat answer goes out word by word, one server-sent
event each; with ``hold`` cleared, the server stops after the first word
until the test sets it, so a test can see the first piece on the screen
while the last is not sent yet. ``stop()`` closes the port (the server
went away) and ``start()`` opens the same port again.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx2
from fake_engine import FakeEngine


class FakeHttpServer:
    """``fake`` on ``base_url`` until :meth:`close`."""

    def __init__(self, fake: FakeEngine, port: int = 0) -> None:
        self.fake = fake
        self.hold = threading.Event()
        self.hold.set()  # set: the whole answer goes at once; cleared: the rest waits for it
        self.first_piece_sent = threading.Event()
        self._server: http.server.ThreadingHTTPServer | None = None
        self.port = port
        self.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Close the port: connections are refused until :meth:`start`."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    close = stop

    def hold_after_first_piece(self) -> None:
        """The next streamed answer stops after its first word until ``hold`` is set."""
        self.first_piece_sent.clear()
        self.hold.clear()

    def chat_requests(self, *, answers_only: bool = True) -> list[dict[str, Any]]:
        """The chat requests served (``answers_only``: without the one-token warm starts)."""
        bodies = list(self.fake.chat_bodies)
        return [body for body in bodies if not answers_only or body.get("max_tokens") != 1]

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner._serve(self, b"")

            def do_POST(self) -> None:
                owner._serve(self, self.rfile.read(int(self.headers.get("Content-Length") or 0)))

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def _serve(self, handler: http.server.BaseHTTPRequestHandler, body: bytes) -> None:
        request = httpx2.Request(
            handler.command,
            f"http://127.0.0.1:{self.port}{handler.path}",
            headers=dict(handler.headers.items()),
            content=body,
        )
        response = self.fake.handle(request)
        streamed = response.headers.get("content-type", "").startswith("text/event-stream")
        handler.send_response(response.status_code)
        for name, value in response.headers.items():
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                handler.send_header(name, value)
        if not streamed:
            handler.send_header("Content-Length", str(len(response.content)))
            handler.end_headers()
            handler.wfile.write(response.content)
            return
        handler.send_header("Connection", "close")  # HTTP/1.0: the body ends when the connection does
        handler.end_headers()
        for event in _word_events(response.text):
            first = not self.first_piece_sent.is_set() and _has_content(event)
            if first:  # set before the write: the client can show the piece before this thread runs again
                self.first_piece_sent.set()
            handler.wfile.write(event.encode())
            handler.wfile.flush()
            if first:
                self.hold.wait(60)


def batch_over_one_file(
    root: Path, base_url: str, questions: Sequence[str]
) -> tuple[list[str], dict[str, str]]:
    """``longctx batch`` arguments for ``questions`` over a one-file corpus made under ``root``, and the
    environment to run it in as a new process: this one's without its ``LONGCTX_`` settings, a store
    of its own under ``root``."""
    corpus = root / "corpus"
    corpus.mkdir()
    (corpus / "notes.py").write_text("def first():\n    return 1\n")
    listed = root / "questions.txt"
    listed.write_text("".join(f"{question}\n" for question in questions))
    env = {key: value for key, value in os.environ.items() if not key.startswith("LONGCTX_")}
    env["LONGCTX_HOME"] = str(root / "home")
    return ["batch", str(corpus), "--questions", str(listed), "--base-url", base_url], env


def _has_content(event: str) -> bool:
    data = event.removeprefix("data: ").strip()
    if data == "[DONE]":
        return False
    choices = json.loads(data).get("choices") or [{}]
    return bool(choices[0].get("delta", {}).get("content"))


def _word_events(text: str) -> list[str]:
    """The fake's events, its one content event split into one event a word."""
    events: list[str] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        data = block.removeprefix("data: ")
        if data == "[DONE]" or not _has_content(block):
            events.append(block + "\n\n")
            continue
        chunk = json.loads(data)
        words = chunk["choices"][0]["delta"]["content"].split(" ")
        for index, word in enumerate(words):
            piece = json.loads(data)
            piece["choices"][0]["delta"]["content"] = word if index == 0 else " " + word
            events.append(f"data: {json.dumps(piece)}\n\n")
    return events
