"""The million-token probe (benchmarks/gpu/million_probe.py) refuses, rather than records, a failed request.

Against a small HTTP server of the standard library that answers as told:
an error status, an abort inside the stream, a stream without usage, a
prompt of another length than was sent; and a good stream, which is timed.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

PROBE = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "million_probe.py"


@pytest.fixture(scope="module")
def probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("million_probe", PROBE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Handler(http.server.BaseHTTPRequestHandler):
    answer: tuple[int, list[dict[str, Any]]] = (200, [])

    def do_GET(self) -> None:  # /metrics
        body = b"# HELP x\nvllm:time_to_first_token_seconds_sum 1.5\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        status, events = self.answer
        body = "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.ThreadingHTTPServer]:
    listening = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=listening.serve_forever, daemon=True)
    thread.start()
    yield listening
    listening.shutdown()
    listening.server_close()


USAGE = {"prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 4}}


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ((400, [{"error": "too long"}]), "HTTP 400"),
        ((200, [{"error": {"message": "engine died"}}]), "failed in its stream"),
        ((200, [{"choices": [{"text": "a"}]}]), "sent no usage"),
        ((200, [{"choices": [{"text": "a"}], "usage": {**USAGE, "prompt_tokens": 4}}]), "4 prompt tokens, 5"),
        (
            (200, [{"text": "", "meta_info": {"finish_reason": {"type": "abort", "message": "no session"}}}]),
            "aborted",
        ),
    ],
)
def test_a_failed_request_is_refused(
    probe: ModuleType, server: http.server.ThreadingHTTPServer, answer: Any, why: str
) -> None:
    _Handler.answer = answer
    client = probe.Server(f"http://127.0.0.1:{server.server_port}/v1", "m", "vllm")
    with pytest.raises(probe.Refused, match=why):
        client.stream("/v1/completions", b"{}", time.perf_counter(), 5)


def test_a_good_stream_is_timed_with_the_servers_histograms(
    probe: ModuleType, server: http.server.ThreadingHTTPServer
) -> None:
    _Handler.answer = (200, [{"choices": [{"text": ""}]}, {"choices": [], "usage": USAGE}])
    client = probe.Server(f"http://127.0.0.1:{server.server_port}/v1", "m", "vllm")
    row = client.stream("/v1/completions", b"{}", time.perf_counter(), 5)
    assert (row["prompt_tokens"], row["cached"], row["bytes"]) == (5, 4, 2)
    assert row["encode"] >= 0 and row["transfer"] >= 0 and row["rest"] > 0 and row["ttft"] <= row["total"]
    assert row["server"] == {}  # the histogram did not move
