"""``longctx proxy``: a local recording proxy in front of an OpenAI-compatible server.

An application that is not longctx points its base URL at the proxy
(``http://127.0.0.1:PORT/v1``) and changes nothing else. Every request is
forwarded to the upstream server as it came (headers too, so its API key
reaches the server) and the answer comes back as the server sends it:
streamed answers chunk by chunk, as they arrive. The chat and completions
requests are recorded (:mod:`longctx.lint.recording`: the body and the
answer's usage and time to the first byte, never a header) in a log that
``longctx lint`` reads.

A streamed request that did not ask for usage gets
``stream_options.include_usage`` added (the cached tokens come only in
that last chunk); an OpenAI client reads the extra chunk (``choices: []``)
as the SDK documents. ``inject_usage=False`` forwards bodies untouched.

:meth:`RecordingProxy.counter_check` checks the recorded cached tokens
against the upstream server's own counter over the proxy's life, with
longctx's counter check (requests that did not pass through the proxy show
as other traffic, and the check says so instead of failing).

Standard library only (``http.server``, ``http.client``): a thread per
connection.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

from longctx.backends.base import Backend
from longctx.errors import ConfigError
from longctx.lint.recording import RequestRecorder, usage_of_events
from longctx.report import CounterCheck
from longctx.store import RequestRecord
from longctx.usage import Usage
from longctx.verification.counters import CounterSnapshot, combine_checks

__all__ = ["RecordingProxy"]

# How long a check waits for the server's counter to settle (a few seconds at most; longer while
# other calls of this process share the window).
_CHECK_SECONDS = 15.0

_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
_RECORDED_PATHS: Final = ("/chat/completions", "/completions")
_UPSTREAM_TIMEOUT: Final = 3600.0


class RecordingProxy:
    """A recording proxy from ``host:port`` (0: any free port) to ``upstream``."""

    def __init__(
        self,
        upstream: str,
        log: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        inject_usage: bool = True,
    ) -> None:
        parsed = urllib.parse.urlsplit(upstream.rstrip("/"))
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ConfigError(f"--upstream must be an http(s) URL, not {upstream!r}")
        root = parsed.path[: -len("/v1")] if parsed.path.endswith("/v1") else parsed.path
        self.upstream = urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, root, "", ""))
        self._parsed = parsed
        self._root = root
        self.recorder = RequestRecorder(log)
        self.inject_usage = inject_usage
        self.records: list[dict[str, Any]] = []
        self._records_lock = threading.Lock()
        self._host, self._port = host, port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._snapshot: CounterSnapshot | None = None
        self._backend: Backend | None = None

    @property
    def url(self) -> str:
        """The proxy's root (``http://host:port``); an OpenAI client takes ``url + "/v1"``."""
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        port = self._server.server_address[1]
        return f"http://{self._host}:{port}"

    def start(self, *, backend: Backend | None = None) -> RecordingProxy:
        """Listen and serve on a thread; with ``backend`` (the upstream), open a counter window now."""
        handler = _handler(self)
        self._server = ThreadingHTTPServer((self._host, self._port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="longctx-proxy", daemon=True)
        self._thread.start()
        if backend is not None:
            self._backend = backend
            self._snapshot = CounterSnapshot.take(backend)
        return self

    def serve_forever(self) -> None:
        """Block until interrupted (the CLI)."""
        assert self._thread is not None
        while self._thread.is_alive():
            self._thread.join(0.5)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self.recorder.close()

    def counter_check(self) -> CounterCheck | None:
        """The recorded cached tokens against the upstream's counter since :meth:`start` (once)."""
        if self._snapshot is None or self._backend is None:
            return None
        server = self._backend.server_for(None)
        with self._records_lock:
            lines = list(self.records)
        records = [_request_record(line, server.api_url, server.engine, server.model) for line in lines]
        settling = self._snapshot.close("proxy", None, [r for r in records if r is not None])
        self._snapshot = None
        checks = settling.wait(timeout=_CHECK_SECONDS)
        return combine_checks(checks or [], notes=settling.notes)

    # -- forwarding ----------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        parsed = self._parsed
        if parsed.scheme == "https":
            return http.client.HTTPSConnection(
                parsed.hostname or "",
                parsed.port,
                timeout=_UPSTREAM_TIMEOUT,
                context=ssl.create_default_context(),
            )
        return http.client.HTTPConnection(parsed.hostname or "", parsed.port, timeout=_UPSTREAM_TIMEOUT)

    def forward(self, handler: BaseHTTPRequestHandler) -> None:
        """Send ``handler``'s request upstream and stream the answer back; record it if it is a completion."""
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        body = _json_object(raw)
        recorded = body is not None and handler.path.split("?")[0].endswith(_RECORDED_PATHS)
        if recorded and body is not None and self.inject_usage and body.get("stream"):
            options = body.get("stream_options")
            if not isinstance(options, dict) or "include_usage" not in options:
                body["stream_options"] = {
                    **(options if isinstance(options, dict) else {}),
                    "include_usage": True,
                }
                raw = json.dumps(body).encode()
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers["Content-Length"] = str(len(raw))
        started, clock = time.time(), time.monotonic()
        connection = self._connection()
        try:
            try:
                connection.request(
                    handler.command, self._root + handler.path, body=raw or None, headers=headers
                )
                response = connection.getresponse()
            except OSError as error:
                handler.send_error(502, f"upstream unreachable: {error}")
                return
            ttft, chunks = self._relay(handler, response, clock)
        finally:
            connection.close()
        if recorded and body is not None:
            content = b"".join(chunks)
            usage = usage_of_events(content.splitlines()) if body.get("stream") else _usage_of(content)
            line = self.recorder.record(
                handler.path.split("?")[0],
                body,
                started_at=started,
                status=response.status,
                usage=usage,
                ttft_seconds=ttft,
                total_seconds=time.monotonic() - clock,
            )
            with self._records_lock:
                self.records.append(line)

    @staticmethod
    def _relay(
        handler: BaseHTTPRequestHandler, response: http.client.HTTPResponse, clock: float
    ) -> tuple[float | None, list[bytes]]:
        handler.send_response_only(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in _HOP_BY_HOP:
                handler.send_header(key, value)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.send_header("Connection", "close")
        handler.end_headers()
        ttft: float | None = None
        chunks: list[bytes] = []
        while True:
            chunk = response.read1(65536)
            if not chunk:
                break
            if ttft is None:
                ttft = time.monotonic() - clock
            chunks.append(chunk)
            try:
                handler.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                handler.wfile.flush()
            except OSError:
                break  # the client left; the answer is still recorded as far as it came
        try:
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except OSError:
            pass
        handler.close_connection = True
        return ttft, chunks


def _handler(proxy: RecordingProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            proxy.forward(self)

        def do_GET(self) -> None:
            proxy.forward(self)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the recording is the log; nothing on stderr per request

    return Handler


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _usage_of(content: bytes) -> dict[str, Any] | None:
    value = _json_object(content)
    usage = value.get("usage") if value is not None else None
    return usage if isinstance(usage, dict) else None


def _request_record(line: dict[str, Any], url: str, engine: str, model: str) -> RequestRecord | None:
    response = line.get("response") or {}
    usage = response.get("usage")
    if not isinstance(usage, dict) or response.get("status") != 200:
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return RequestRecord(
        id=str(line.get("id")),
        session_id=None,
        batch_id=None,
        purpose="proxy",
        started_at=float(line.get("started_at") or 0.0),
        base_url=url,
        engine=engine,
        model=model,
        usage=Usage(
            prompt_tokens=usage.get("prompt_tokens"),
            cached_tokens=cached,
            created_cache_tokens=None,
            completion_tokens=usage.get("completion_tokens"),
            ttft_seconds=response.get("ttft_seconds"),
            total_seconds=response.get("total_seconds"),
        ),
        attempts=1,
    )
