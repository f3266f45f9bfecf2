"""connect(), doctor(), chat streaming and error translation, against the fake engine."""

from __future__ import annotations

import asyncio

import pytest
from fake_engine import FakeEngine, Fault

from longctx.backends.base import connect, rendezvous_order
from longctx.backends.chat import ChatRequest
from longctx.backends.http import parse_context_overflow, split_base_url
from longctx.errors import BackendError, ConfigError, ContextOverflow, ServerError, ServerUnreachable
from longctx.options.groups import ServerOptions
from longctx.retry import RetryPolicy, instant_retries
from longctx.serving.doctor import diagnose

URL = "http://fake-engine:8000/v1"


def request(text: str = "hello", **extra: object) -> ChatRequest:
    return ChatRequest(messages=({"role": "user", "content": text},), max_tokens=8, **extra)  # type: ignore[arg-type]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "generic"])
def test_connect_discovers_the_engine_model_and_window(engine: str) -> None:
    fake = FakeEngine(engine=engine)
    backend = connect(URL, transport=fake.transport(), async_transport=fake.transport())
    info = backend.info
    assert info.engine == engine
    assert info.model == "fake-model"
    assert info.context_length == 32768
    assert info.api_url == URL and info.root_url == "http://fake-engine:8000"
    if engine == "vllm":
        assert info.version == "0.32.0" and info.prefix_caching is True and info.cache_block_tokens == 16
        assert info.cache_reporting is None  # vLLM does not say until a response shows it
    if engine == "sglang":
        assert info.version == "0.5.23" and info.cache_reporting is True and info.metrics is True
    if engine == "generic":
        assert info.version is None and info.prefix_caching is None


def test_connect_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeEngine()
    monkeypatch.setenv("LONGCTX_BASE_URL", "http://from-env:9000/v1")
    monkeypatch.setenv("LONGCTX_MODEL", "fake-model")
    backend = connect(transport=fake.transport())
    assert backend.info.api_url == "http://from-env:9000/v1"


def test_an_unserved_model_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"does not serve 'other'.*fake-model"):
        connect(ServerOptions(URL, model="other"), transport=FakeEngine().transport())


def test_an_unreachable_server_is_server_unreachable() -> None:
    with instant_retries(), pytest.raises(ServerUnreachable, match="cannot reach"):
        connect("http://127.0.0.1:9/v1", retry=RetryPolicy(attempts=2))


def test_bad_urls_are_refused() -> None:
    with pytest.raises(ConfigError):
        connect("ftp://somewhere")
    with pytest.raises(BackendError):
        split_base_url("not a url")


def test_streamed_chat_reports_usage_ttft_and_sends_affinity_and_salt() -> None:
    fake = FakeEngine()
    backend = connect(URL, transport=fake.transport())
    sent = backend.complete(request(cache_salt="tenant-a", affinity_key="longctx-abc"))
    assert sent.completion.text == "a fake answer"
    usage = sent.completion.usage
    assert usage.prompt_tokens and usage.cached_tokens == 0 and usage.completion_tokens == 3
    assert usage.ttft_seconds is not None and usage.total_seconds is not None
    assert usage.ttft_seconds <= usage.total_seconds
    body, headers = fake.chat_bodies[0], fake.chat_headers[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["cache_salt"] == "tenant-a"
    assert body["user"] == "longctx-abc"
    assert headers["x-session-id"] == "longctx-abc" and headers["x-smg-routing-key"] == "longctx-abc"
    assert headers["x-request-id"] == sent.request_id
    assert sent.attempts == 1


def test_async_chat_is_the_same() -> None:
    fake = FakeEngine(engine="sglang")
    backend = connect(URL, transport=fake.transport(), async_transport=fake.transport())
    sent = asyncio.run(backend.acomplete(request()))
    assert sent.completion.text == "a fake answer"
    assert sent.completion.usage.cached_tokens == 0


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_missing_cached_tokens_name_the_flag(engine: str) -> None:
    fake = FakeEngine(engine=engine, report_cached=False)
    backend = connect(URL, transport=fake.transport())
    usage = backend.complete(request()).completion.usage
    assert usage.cached_tokens is None
    flag = "--enable-prompt-tokens-details" if engine == "vllm" else "--enable-cache-report"
    assert usage.cached_reason is not None and flag in usage.cached_reason


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_context_overflow_is_one_error_type_on_both_engines(engine: str) -> None:
    fake = FakeEngine(engine=engine, context_length=100)
    backend = connect(URL, transport=fake.transport())
    with pytest.raises(ContextOverflow) as raised:
        backend.complete(request("x" * 2000))
    assert raised.value.context_length == 100
    assert raised.value.prompt_tokens is not None and raised.value.prompt_tokens > 100
    assert raised.value.status == 400


def test_overflow_messages_of_both_engines_parse() -> None:
    vllm = (
        "This model's maximum context length is 32768 tokens. However, your prompt contains "
        "40000 input tokens. Please reduce the length of the input messages."
    )
    sglang = "The input (40001 tokens) is longer than the model's context length (32768 tokens)."
    assert parse_context_overflow(vllm) == (40000, 32768)
    at_least = (
        "This model's maximum context length is 32768 tokens. However, your prompt contains at least "
        "32769 input tokens, which exceeds this limit even without any output tokens."
    )
    assert parse_context_overflow(at_least) == (32769, 32768)
    assert parse_context_overflow(sglang) == (40001, 32768)
    assert parse_context_overflow("model not found") is None


def test_retries_recover_from_drops_503_and_429() -> None:
    fake = FakeEngine()
    fake.faults.extend([Fault(drop=True), Fault(status=503), Fault(status=429, headers={"Retry-After": "0"})])
    backend = connect(URL, transport=fake.transport())
    with instant_retries():
        sent = backend.complete(request())
    assert sent.attempts == 4
    assert sent.completion.text == "a fake answer"


def test_4xx_is_not_retried() -> None:
    fake = FakeEngine()
    fake.faults.append(Fault(status=404, body={"error": {"message": "no such route"}}))
    backend = connect(URL, transport=fake.transport())
    with instant_retries(), pytest.raises(ServerError) as raised:
        backend.complete(request())
    assert raised.value.status == 404
    assert len(fake.chat_bodies) == 1


def test_retries_are_bounded() -> None:
    fake = FakeEngine()
    fake.faults.extend([Fault(status=503)] * 10)
    backend = connect(URL, transport=fake.transport(), retry=RetryPolicy(attempts=3))
    with instant_retries(), pytest.raises(ServerError):
        backend.complete(request())
    assert len(fake.chat_bodies) == 3


def test_doctor_names_the_flags_to_add() -> None:
    fake = FakeEngine(engine="vllm", report_cached=False, prefix_caching=False)
    backend = connect(URL, transport=fake.transport())
    diagnosis = diagnose(backend)
    flags = {finding.flag for finding in diagnosis.findings}
    assert "--enable-prefix-caching" in flags
    assert "--enable-prompt-tokens-details" in flags
    assert not diagnosis.ok
    assert "--enable-prefix-caching" in diagnosis.to_text()


def test_doctor_on_sglang_without_reporting() -> None:
    fake = FakeEngine(engine="sglang", report_cached=False)
    diagnosis = diagnose(connect(URL, transport=fake.transport()), probe=False)
    assert "--enable-cache-report" in {finding.flag for finding in diagnosis.findings}


def test_doctor_on_a_generic_server_says_what_it_cannot_check() -> None:
    diagnosis = diagnose(connect(URL, transport=FakeEngine(engine="generic").transport()))
    assert any("cannot check prefix caching" in finding.reason for finding in diagnosis.findings)


def test_counters_read_the_servers_hit_counter() -> None:
    fake = FakeEngine()
    backend = connect(URL, transport=fake.transport())
    fake.hits_total = 1234
    reading = backend.counters()[URL]
    assert reading is not None and reading.hits == 1234 and reading.counter == "vllm:prefix_cache_hits_total"


def test_rendezvous_routing_is_stable_and_spreads_keys() -> None:
    urls = [f"http://replica-{i}:8000/v1" for i in range(3)]
    firsts = {rendezvous_order(f"pack-{i}", urls)[0] for i in range(60)}
    assert firsts == set(urls)
    # Removing a replica moves only the keys that lived on it.
    for i in range(60):
        key = f"pack-{i}"
        before = rendezvous_order(key, urls)[0]
        after = rendezvous_order(key, urls[:2])[0]
        assert before == after or before == urls[2]


def test_several_replicas_keep_one_pack_on_one_replica() -> None:
    fakes = {f"http://replica-{i}:8000/v1": FakeEngine() for i in range(3)}

    def route(request):  # type: ignore[no-untyped-def]
        return fakes[f"http://{request.url.host}:8000/v1"].handle(request)

    import httpx2

    backend = connect(list(fakes), transport=httpx2.MockTransport(route))
    for _ in range(5):
        backend.complete(request(affinity_key="longctx-pack-one"))
    used = [url for url, fake in fakes.items() if fake.chat_bodies]
    assert len(used) == 1
    assert used[0] == backend.server_for("longctx-pack-one").api_url
