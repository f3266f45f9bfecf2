"""The GPU probes never record a failed request as a time, and size ``max`` packs with the tokenizer.

A pack sized at 3.6 characters a token overflowed a window whose tokenizer
gives about 3.5: every request came back HTTP 400, and the probe logged
them as timings. Against the fake engine over HTTP here: a 400, and a
stream without usage, each stop the probe; the pack is counted to fit.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_engine import FakeEngine, Fault
from fake_http import FakeHttpServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks" / "gpu"))

import followup_probe


@pytest.fixture
def served() -> Iterator[FakeHttpServer]:
    server = FakeHttpServer(FakeEngine(engine="generic", block=1, answer="a timed answer"))
    yield server
    server.close()


def probe_server(served: FakeHttpServer) -> followup_probe.Server:
    return followup_probe.Server(served.base_url, "fake-model", "vllm")


def request() -> dict[str, object]:
    return {"model": "fake-model", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Hi."}]}  # fmt: skip


def test_a_successful_request_is_timed(served: FakeHttpServer) -> None:
    row = probe_server(served).stream("chat/completions", request(), time.perf_counter())
    assert row["prompt_tokens"] and row["ttft"] > 0


def test_an_http_400_is_refused_not_recorded(served: FakeHttpServer) -> None:
    served.fake.faults.append(Fault(status=400, body={"error": "the prompt is longer than the window"}))
    with pytest.raises(followup_probe.ProbeFailure, match=r"HTTP 400.*longer than the window"):
        probe_server(served).stream("chat/completions", request(), time.perf_counter())


def test_a_stream_without_usage_is_refused(served: FakeHttpServer) -> None:
    served.fake.faults.append(Fault(status=200, body={"choices": []}))  # a 200 that is no stream at all
    with pytest.raises(followup_probe.ProbeFailure, match="without its usage"):
        probe_server(served).stream("chat/completions", request(), time.perf_counter())


def test_a_failed_tokenize_call_is_refused(served: FakeHttpServer) -> None:
    with pytest.raises(followup_probe.ProbeFailure, match="HTTP 404"):
        probe_server(served).tokenize_timed([{"role": "user", "content": "Hi."}])


class DenseTokenizer:
    """3.5 characters a token: denser than the probe's 3.6 guess."""

    def count(self, text: str) -> int:
        return int(len(text) / 3.5) + 1


def test_a_max_pack_is_counted_to_fit_the_window() -> None:
    target = 20_000
    guessed = followup_probe.pack_text(target, 3.6)
    assert DenseTokenizer().count(guessed) > target  # the guess alone overflows
    fitted = followup_probe.fitted_pack(target, DenseTokenizer(), 3.6)
    assert target * 0.9 < DenseTokenizer().count(fitted) <= target


def test_bench_gpus_plain_client_refuses_a_failed_request_too(served: FakeHttpServer) -> None:
    import bench_gpu

    client = bench_gpu.PlainClient(served.base_url, "fake-model")
    messages = [{"role": "user", "content": "Hi."}]
    assert client.send(messages, "salt", 4, None)["prompt"]
    served.fake.faults.append(Fault(status=400, body={"error": "too long"}))
    with pytest.raises(RuntimeError, match="HTTP 400"):
        client.send(messages, "salt", 4, None)
    served.fake.faults.append(Fault(status=200, body={"choices": []}))
    with pytest.raises(RuntimeError, match="without its usage"):
        client.send(messages, "salt", 4, None)
