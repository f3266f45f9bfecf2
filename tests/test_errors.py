"""Server errors name their request, a 429 is RateLimited with its Retry-After, and the retries honour it.

Against the fake engine (tests/fake_engine.py) and httpx2's MockTransport.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import httpx2
import pytest
from click.testing import CliRunner
from fake_engine import FakeEngine, Fault

from longctx.backends.base import Backend, connect
from longctx.backends.chat import ChatRequest
from longctx.backends.http import EventPost, HttpEndpoint, post_events
from longctx.cli import EXIT_SERVER, Runtime, exit_code, main
from longctx.errors import BackendError, RateLimited, ServerError, ServerUnreachable
from longctx.retry import RetryEvent, RetryPolicy, call_with_retry, is_retryable, parse_retry_after

URL = "http://fake-engine:8000/v1"
ONCE = RetryPolicy(attempts=1)


def request() -> ChatRequest:
    return ChatRequest(messages=({"role": "user", "content": "hello"},), max_tokens=8)


def sent_id(fake: FakeEngine) -> str:
    """The X-Request-Id the fake saw on its last chat request."""
    return fake.chat_headers[-1]["x-request-id"]


def test_a_429_is_rate_limited_with_its_retry_after_and_request_id() -> None:
    fake = FakeEngine()
    fake.faults.append(
        Fault(status=429, body={"error": {"message": "slow down"}}, headers={"Retry-After": "7"})
    )
    backend = connect(URL, transport=fake.transport(), retry=ONCE)
    with pytest.raises(RateLimited) as raised:
        backend.complete(request())
    error = raised.value
    assert not isinstance(error, ServerError)  # not a fault: a caller catching ServerError lets it pass
    assert isinstance(error, BackendError) and error.status == 429 and error.retry_after == 7.0
    assert error.request_id == sent_id(fake)
    assert "rate limiting" in str(error) and "wait 7 s" in str(error) and "slow down" in str(error)
    assert f"request id {error.request_id}" in str(error)
    assert is_retryable(error)
    assert exit_code(error) == EXIT_SERVER


def test_retry_after_as_an_http_date_and_absent() -> None:
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=90), usegmt=True)
    fake = FakeEngine()
    fake.faults.extend([Fault(status=429, headers={"Retry-After": later}), Fault(status=429)])
    backend = connect(URL, transport=fake.transport(), retry=ONCE)
    with pytest.raises(RateLimited) as dated:
        backend.complete(request())
    assert dated.value.retry_after is not None and 80 < dated.value.retry_after <= 90
    with pytest.raises(RateLimited) as bare:
        backend.complete(request())
    assert bare.value.retry_after is None and "wait" not in str(bare.value)
    # A date without a zone ("-0000") is UTC, not an error.
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 -0000") == 0.0
    assert parse_retry_after("soon") is None


def test_a_500_names_the_request_id_sent_and_the_servers() -> None:
    fake = FakeEngine()
    fake.faults.append(
        Fault(status=500, body={"error": {"message": "boom"}}, headers={"x-request-id": "srv-123"})
    )
    backend = connect(URL, transport=fake.transport(), retry=ONCE)
    with pytest.raises(ServerError) as raised:
        backend.complete(request())
    error = raised.value
    assert error.status == 500 and error.request_id == sent_id(fake) and error.server_request_id == "srv-123"
    assert str(error).endswith(f"(request id {error.request_id}; server request id srv-123)")
    assert error.message == f"{URL}/chat/completions answered HTTP 500: boom"  # the ids are added by str()


def test_the_servers_id_from_the_body_and_an_echo_named_once() -> None:
    fake = FakeEngine()
    fake.faults.append(Fault(status=503, body={"id": "body-9", "error": {"message": "busy"}}))
    backend = connect(URL, transport=fake.transport(), retry=ONCE)
    with pytest.raises(ServerError) as raised:
        backend.complete(request())
    assert raised.value.server_request_id == "body-9"

    echoing = FakeEngine()
    echoing.faults.append(Fault(status=500, headers={"x-request-id": "mine"}))
    with pytest.raises(ServerError) as echoed:
        connect(URL, transport=echoing.transport(), retry=ONCE).complete(
            ChatRequest(messages=({"role": "user", "content": "hi"},), request_id="mine")
        )
    assert echoed.value.request_id == "mine" == echoed.value.server_request_id
    assert str(echoed.value).endswith("(request id mine)")  # the echo is not named twice


def test_retries_of_one_request_keep_its_id_and_the_last_error_names_it() -> None:
    fake = FakeEngine()
    fake.faults.extend([Fault(status=503)] * 3)
    backend = connect(URL, transport=fake.transport(), retry=RetryPolicy(attempts=3, initial_wait=0))
    with pytest.raises(ServerError) as raised:
        backend.complete(request())
    ids = {headers["x-request-id"] for headers in fake.chat_headers}
    assert ids == {raised.value.request_id}


def test_json_requests_carry_an_id_and_their_errors_name_it() -> None:
    seen: list[str] = []

    def handler(incoming: httpx2.Request) -> httpx2.Response:
        seen.append(incoming.headers["x-request-id"])
        if incoming.url.path == "/tokenize":
            return httpx2.Response(200, text="not json", headers={"x-request-id": "srv-7"})
        return httpx2.Response(502, json={"detail": "bad gateway"})

    endpoint = HttpEndpoint(URL, timeout=5.0, transport=httpx2.MockTransport(handler))
    with pytest.raises(ServerError) as failed:
        endpoint.get_json("/metrics")
    assert failed.value.request_id == seen[-1] and seen[-1] in str(failed.value)
    with pytest.raises(ServerError) as not_json:
        endpoint.post_json("/tokenize", {"prompt": "x"})
    assert not_json.value.request_id == seen[-1] and not_json.value.server_request_id == "srv-7"
    assert len(set(seen)) == 2  # one id per request


def test_a_stream_that_fails_midway_names_the_servers_id_from_its_chunks() -> None:
    chunk = {"id": "chatcmpl-abc", "choices": [{"index": 0, "delta": {"content": "x"}}]}
    stream = f"data: {json.dumps(chunk)}\n\ndata: {json.dumps({'error': 'engine died'})}\n\n"

    def handler(incoming: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, text=stream, headers={"content-type": "text/event-stream"})

    client = httpx2.Client(transport=httpx2.MockTransport(handler))
    post = EventPost(f"{URL}/chat/completions", {}, {}, request_id="abc")
    with pytest.raises(ServerError) as raised:
        list(post_events(client, post))
    assert raised.value.request_id == "abc" and raised.value.server_request_id == "chatcmpl-abc"
    assert "engine died" in str(raised.value) and "server request id chatcmpl-abc" in str(raised.value)


def test_a_dropped_connection_names_the_request_it_was_sending() -> None:
    fake = FakeEngine()
    fake.faults.append(Fault(drop=True))
    backend = connect(URL, transport=fake.transport(), retry=ONCE)
    with pytest.raises(ServerUnreachable) as raised:
        backend.complete(request())
    assert raised.value.request_id == sent_id(fake) and raised.value.request_id in str(raised.value)


def _waits(error: BaseException, policy: RetryPolicy) -> list[float]:
    """The waits the policy chose before retrying after ``error`` (then it gives up and re-raises)."""
    events: list[RetryEvent] = []

    def fail() -> None:
        raise error

    with pytest.raises(type(error)):
        call_with_retry(fail, policy, on_retry=events.append)
    return [event.wait_seconds for event in events]


def test_the_retry_waits_what_a_429_asks_bounded_by_max_wait() -> None:
    # initial_wait is far from both: the waits seen are the server's, not the backoff.
    policy = RetryPolicy(attempts=2, initial_wait=20.0, max_wait=0.05, total_seconds=600)
    assert _waits(RateLimited("slow down", status=429, retry_after=0.01), policy) == [0.01]
    assert _waits(RateLimited("slow down", status=429, retry_after=120.0), policy) == [0.05]
    assert _waits(ServerError("busy", status=503, retry_after=120.0), policy) == [0.05]


def test_the_cli_exits_with_the_server_code_and_names_the_request(
    fake: FakeEngine, backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LONGCTX_INSTANT_RETRIES", "1")
    project = tmp_path / "project"
    project.mkdir()
    (project / "a.py").write_text("x = 1\n")
    fake.faults.extend([Fault(status=429, headers={"Retry-After": "1"})] * 10)
    result = CliRunner().invoke(main, ["ask", str(project), "now?"], obj=Runtime(backend=backend))
    assert result.exit_code == EXIT_SERVER, result.output
    assert "rate limiting" in result.stderr and f"request id {sent_id(fake)}" in result.stderr
