"""What goes on the wire for one chat request, and what is read back from its stream (longctx.backends.chat).

A server double records each request's route, body and headers and answers
with the stream given: the body is compared whole, so a field sent that was
not asked for, or one missing, fails here before a router or engine sees it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import httpx2
import pytest

from longctx.backends.chat import ChatClient, ChatRequest, Completion, TokenLogprob
from longctx.backends.engines import GENERIC, SGLANG, VLLM
from longctx.backends.profiles import EngineProfile
from longctx.drivers import stream
from longctx.usage import Usage

URL = "http://server:8000/v1"
QUESTION = ({"role": "user", "content": "q"},)
USAGE = {"prompt_tokens": 30, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 16}}
STANDARD = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}


class Server:
    """Records each request and answers with ``events`` (server-sent, then [DONE]) and ``headers``."""

    def __init__(self, events: list[dict[str, Any]] | None = None, headers: Mapping[str, str] = {}) -> None:
        self.events = events if events is not None else answer_events("a", "nswer")
        self.headers = dict(headers)
        self.seen: list[tuple[str, dict[str, Any], httpx2.Headers]] = []

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        self.seen.append((request.url.path, json.loads(request.content), request.headers))
        text = "".join(f"data: {json.dumps(event)}\n\n" for event in self.events) + "data: [DONE]\n\n"
        return httpx2.Response(200, text=text, headers={"content-type": "text/event-stream", **self.headers})

    def client(self, profile: EngineProfile = GENERIC, **options: Any) -> ChatClient:
        return ChatClient(
            URL, "m", profile=profile, transport=httpx2.MockTransport(self.handle),
            async_transport=httpx2.MockTransport(self.handle), **options,
        )  # fmt: skip

    @property
    def body(self) -> dict[str, Any]:
        return self.seen[-1][1]


def answer_events(*pieces: str, usage: Mapping[str, Any] | None = USAGE) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"choices": [{"index": 0, "delta": {"content": piece}}]} for piece in pieces
    ]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if usage is not None:
        events.append({"choices": [], "usage": dict(usage)})
    return events


# -- the body and headers sent -------------------------------------------------------------


def test_a_plain_request_sends_the_messages_the_model_and_the_usage_switch_only() -> None:
    server = Server()
    server.client().complete(ChatRequest(messages=QUESTION))
    path, body, headers = server.seen[0]
    assert path == "/v1/chat/completions"
    assert body == {**STANDARD, "messages": [{"role": "user", "content": "q"}]}
    assert "authorization" not in headers and "x-session-id" not in headers


def test_the_sampling_fields_go_when_set_zero_included_and_the_key_as_a_bearer_token() -> None:
    server = Server()
    client = server.client(api_key="sk-1")
    client.complete(ChatRequest(messages=QUESTION, max_tokens=0, temperature=0.0, seed=0))
    assert server.body == {
        **STANDARD,
        "messages": list(QUESTION),
        "max_tokens": 0,
        "temperature": 0.0,
        "seed": 0,
    }
    assert server.seen[0][2]["authorization"] == "Bearer sk-1"
    client.complete(ChatRequest(messages=QUESTION, max_tokens=64))
    assert server.body == {**STANDARD, "messages": list(QUESTION), "max_tokens": 64}


def test_the_affinity_key_goes_in_user_the_named_body_fields_and_every_affinity_header() -> None:
    server = Server()
    client = server.client(affinity_headers=("x-session-id", "X-Route"))
    request = ChatRequest(
        messages=QUESTION, affinity_key="pack-1", body_affinity=("prompt_cache_key",), cache_salt="tenant"
    )
    client.complete(request)
    _, body, headers = server.seen[0]
    sent = {"user": "pack-1", "prompt_cache_key": "pack-1", "cache_salt": "tenant"}
    assert body == {**STANDARD, "messages": list(QUESTION), **sent}
    assert headers["x-session-id"] == "pack-1" and headers["x-route"] == "pack-1"
    assert "x-smg-routing-key" not in headers
    client.complete(ChatRequest(messages=QUESTION, affinity_key="", cache_salt=""))
    assert server.body == {**STANDARD, "messages": list(QUESTION)}


def test_extra_fields_go_beside_the_standard_ones_and_never_override_them() -> None:
    server = Server()
    extra = {"model": "other", "stream": False, "top_k": 3, "response_format": {"type": "text"}}
    server.client().complete(
        ChatRequest(
            messages=QUESTION,
            extra_body=extra,
            constraint={"response_format": {"type": "json_object"}},
            seed=1,
        )
    )
    sent = {"top_k": 3, "response_format": {"type": "json_object"}, "seed": 1}
    assert server.body == {**STANDARD, "messages": list(QUESTION), **sent}


def test_a_gateways_session_token_is_sent_back_with_its_key_only() -> None:
    server = Server(headers={"x-session-token": "pod-7"})
    client = server.client()
    client.complete(ChatRequest(messages=QUESTION))  # no key: nothing to keep it under
    client.complete(ChatRequest(messages=QUESTION, affinity_key="pack-1"))
    assert "x-session-token" not in server.seen[-1][2]
    client.complete(ChatRequest(messages=QUESTION, affinity_key="pack-1"))
    assert server.seen[-1][2]["x-session-token"] == "pod-7"
    client.complete(ChatRequest(messages=QUESTION, affinity_key="pack-2"))
    assert "x-session-token" not in server.seen[-1][2]
    quiet = Server()
    other = quiet.client()
    other.complete(ChatRequest(messages=QUESTION, affinity_key="pack-1"))
    other.complete(ChatRequest(messages=QUESTION, affinity_key="pack-1"))
    assert "x-session-token" not in quiet.seen[-1][2]


def test_a_prompt_of_token_ids_goes_to_completions_with_its_logprobs_count() -> None:
    server = Server([{"choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]}])
    completion = server.client(VLLM).complete(
        ChatRequest(messages=QUESTION, prompt_ids=(1, 2, 3), logprobs=2, token_ids=True)
    )
    path, body, _ = server.seen[0]
    assert path == "/v1/completions" and completion.text == "ok"
    assert body == {**STANDARD, "prompt": [1, 2, 3], "logprobs": 2, "return_token_ids": True}


def test_chat_logprobs_ask_for_the_alternatives_and_ids_by_the_engines_switches() -> None:
    server = Server()
    server.client(SGLANG).complete(ChatRequest(messages=QUESTION, logprobs=0, token_ids=True))
    assert server.body == {
        **STANDARD, "messages": list(QUESTION), "logprobs": True, "top_logprobs": 0,
        "return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True,
    }  # fmt: skip


def test_tier_details_are_asked_for_and_the_offload_cap_merged_into_the_extra_body() -> None:
    server = Server()
    server.client(SGLANG, tier_details=True).complete(ChatRequest(messages=QUESTION, offload_tokens=100))
    assert server.body == {**STANDARD, "messages": list(QUESTION), "return_cached_tokens_details": True}
    capped = Server()
    extra = {"kv_transfer_params": {"do_remote_prefill": False}}
    capped.client(VLLM, tier_details=True).complete(
        ChatRequest(messages=QUESTION, offload_tokens=100, extra_body=extra)
    )
    assert capped.body == {
        **STANDARD, "messages": list(QUESTION),
        "kv_transfer_params": {"do_remote_prefill": False, "max_offload_tokens": 100},
    }  # fmt: skip
    assert extra == {"kv_transfer_params": {"do_remote_prefill": False}}  # the caller's dict untouched
    uncapped = Server()
    uncapped.client(VLLM, tier_details=True).complete(ChatRequest(messages=QUESTION))
    assert uncapped.body == {**STANDARD, "messages": list(QUESTION)}
    off = Server()
    off.client(VLLM).complete(ChatRequest(messages=QUESTION, offload_tokens=100))
    assert off.body == {**STANDARD, "messages": list(QUESTION)}


# -- the stream read back ------------------------------------------------------------------


def test_the_answer_reasoning_finish_and_usage_are_read_from_the_stream() -> None:
    events = [
        {"choices": [{"index": 0, "delta": {"reasoning_content": "think "}}]},
        {"choices": [{"index": 0, "delta": {"reasoning": "more"}}]},
        {"choices": [{"index": 0, "delta": {"content": "an"}}]},
        {"choices": [{"index": 0, "delta": {"content": ""}}]},
        {"choices": [{"index": 0, "delta": {"content": "swer"}, "finish_reason": "length"}]},
        {
            "choices": [],
            "usage": {**USAGE, "prompt_tokens_details": {"cached_tokens": 16, "created_cache_tokens": 14}},
        },
    ]
    firsts: list[int] = []
    completion = Server(events).client().complete(ChatRequest(messages=QUESTION), lambda: firsts.append(1))
    assert (completion.text, completion.reasoning, completion.finish_reason) == (
        "answer",
        "think more",
        "length",
    )
    usage = completion.usage
    counts = (usage.prompt_tokens, usage.cached_tokens, usage.created_cache_tokens, usage.completion_tokens)
    assert counts == (30, 16, 14, 2)
    assert (
        usage.cached_reason is None
        and usage.host_cached_tokens is None
        and usage.external_cached_tokens is None
    )
    assert firsts == [1]
    assert usage.ttft_seconds is not None and usage.total_seconds is not None
    assert 0 <= usage.ttft_seconds < usage.total_seconds  # the first token came before the end
    assert (completion.token_ids, completion.prompt_token_ids, completion.logprobs) == (None, None, None)


def test_without_usage_or_cached_tokens_the_reason_is_given() -> None:
    no_usage = Server(answer_events("a", usage=None)).client().complete(ChatRequest(messages=QUESTION))
    assert no_usage.usage.prompt_tokens is None and no_usage.usage.cached_tokens is None
    assert (
        no_usage.usage.cached_reason == "the server sent no usage (stream_options.include_usage unsupported?)"
    )
    bare = {"prompt_tokens": 30, "completion_tokens": 2}
    vllm = Server(answer_events("a", usage=bare)).client(VLLM).complete(ChatRequest(messages=QUESTION))
    assert vllm.usage.cached_reason == VLLM.missing_report and vllm.usage.prompt_tokens == 30
    assert vllm.usage.completion_tokens == 2 and vllm.usage.cached_tokens is None
    assert vllm.usage.created_cache_tokens is None and vllm.reasoning is None


def test_an_answer_with_no_token_has_its_first_token_time_at_the_end() -> None:
    completion = Server(answer_events()).client().complete(ChatRequest(messages=QUESTION))
    assert completion.text == "" and completion.usage.ttft_seconds == completion.usage.total_seconds


def test_token_ids_are_read_from_each_engines_place() -> None:
    vllm = [
        {"prompt_token_ids": [5, 6], "choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": [7]}]},
        {"choices": [{"index": 0, "delta": {"content": "b"}, "token_ids": [8, 9]}]},
        {"choices": [{"index": 0, "delta": {}, "token_ids": []}]},
        {"choices": [], "usage": USAGE},
    ]
    got = Server(vllm).client(VLLM).complete(ChatRequest(messages=QUESTION, token_ids=True))
    assert got.token_ids == (7, 8, 9) and got.prompt_token_ids == (5, 6)
    completions = [
        {"choices": [{"index": 0, "text": "a", "prompt_token_ids": [1, 2], "token_ids": [3]}]},
        {"choices": [{"index": 0, "text": "b", "prompt_token_ids": None, "token_ids": [4]}]},
    ]
    got = Server(completions).client(VLLM).complete(ChatRequest(messages=QUESTION, prompt_ids=(1, 2)))
    assert got.text == "ab" and got.token_ids == (3, 4) and got.prompt_token_ids == (1, 2)
    sglang = [
        {"choices": [{"index": 0, "delta": {"content": "ab"}}]},
        {"choices": [], "usage": USAGE, "sglext": {"output_ids": [[3, 4], [9]], "input_ids": [[1, 2]]}},
    ]
    got = Server(sglang).client(SGLANG).complete(ChatRequest(messages=QUESTION, token_ids=True))
    assert got.token_ids == (3, 4) and got.prompt_token_ids == (1, 2)
    flat = [{"choices": [], "usage": USAGE, "sglext": {"input_ids": [1, 2, 3]}}]
    got = Server(flat).client(SGLANG).complete(ChatRequest(messages=QUESTION))
    assert got.prompt_token_ids == (1, 2, 3) and got.token_ids is None
    assert got.finish_reason is None and got.text == ""  # no choice finished: no reason given
    odd = [{"choices": [], "usage": USAGE, "sglext": ["not", "a", "dict"]}]
    assert Server(odd).client(SGLANG).complete(ChatRequest(messages=QUESTION)).prompt_token_ids is None


def test_sglangs_tier_split_is_read_and_a_missing_tier_is_zero() -> None:
    def split(details: object) -> tuple[int | None, int | None]:
        events = [{"choices": [], "usage": USAGE, "sglext": {"cached_tokens_details": details}}]
        usage = Server(events).client(SGLANG).complete(ChatRequest(messages=QUESTION)).usage
        return usage.host_cached_tokens, usage.external_cached_tokens

    assert split({"device": 4, "host": 8, "storage": 4.0}) == (8, 4)
    assert split({"device": 16, "host": None, "storage": "4"}) == (0, 0)
    assert split({}) == (None, None)
    assert split("none") == (None, None)


def test_logprobs_are_read_in_both_routes_forms_alternatives_most_likely_first() -> None:
    chat = [
        {"choices": [{"index": 0, "delta": {"content": "a"}, "logprobs": {"content": [
            {"token": "a", "logprob": -0.5, "top_logprobs": [
                {"token": "a", "logprob": -0.5}, {"token": "b", "logprob": None},
                {"token": "c", "logprob": -2},
            ]},
        ]}}]},
        {"choices": [{"index": 0, "delta": {"content": "d"}, "logprobs": {"content": [
            {"token": "d", "logprob": -1.0},
        ]}}]},
        {"choices": [{"index": 0, "delta": {}, "logprobs": None}]},
    ]  # fmt: skip
    got = Server(chat).client().complete(ChatRequest(messages=QUESTION, logprobs=2))
    assert got.logprobs == (
        TokenLogprob("a", -0.5, (("a", -0.5), ("c", -2.0))),
        TokenLogprob("d", -1.0, ()),
    )
    completions = [
        {"choices": [{"index": 0, "text": "xy", "logprobs": {
            "tokens": ["x", "y"], "token_logprobs": [-0.1, -0.7],
            "top_logprobs": [{"a": -3.0, "x": -0.1}, None],
        }}]},
        {"choices": [{"index": 0, "text": "w", "logprobs": {"tokens": ["w"], "token_logprobs": [-0.2]}}]},
    ]  # fmt: skip
    got = Server(completions).client().complete(ChatRequest(messages=QUESTION, prompt_ids=(1,), logprobs=1))
    assert got.logprobs == (
        TokenLogprob("x", -0.1, (("x", -0.1), ("a", -3.0))),
        TokenLogprob("y", -0.7, ()),
        TokenLogprob("w", -0.2, ()),
    )
    empty = [{"choices": [{"index": 0, "delta": {"content": "a"}, "logprobs": {"refusal": None}}]}]
    assert Server(empty).client().complete(ChatRequest(messages=QUESTION)).logprobs == ()


def test_a_streamed_answer_comes_piece_by_piece_then_whole() -> None:
    server = Server(answer_events("one ", "two"))
    io = server.client().sending(ChatRequest(messages=QUESTION), streamed=True)
    assert io.pieces is not None
    assert [piece for piece in stream(_plan(io))][:-1] == ["one ", "two"]
    assert server.client().sending(ChatRequest(messages=QUESTION)).pieces is None
    reading = io.pieces()
    with pytest.raises(RuntimeError, match="not read to its end"):
        _ = reading.value
    assert "".join(reading.each()) == "one two" and reading.value.text == "one two"


def _plan(io: Any) -> Any:
    completion = yield io
    return completion


def test_the_async_client_sends_and_reads_the_same() -> None:
    server = Server(answer_events("as", "ync"))
    client = server.client()

    async def ask() -> tuple[Completion, str]:
        io = client.sending(ChatRequest(messages=QUESTION, affinity_key="k"), streamed=True)
        assert io.acall is not None and io.pieces is not None
        completion = await io.acall()
        pieces = io.pieces()
        text = "".join([piece async for piece in pieces.aeach()])
        await client.aclose()
        return completion, text

    completion, text = asyncio.run(ask())
    assert completion.text == text == "async" and completion.usage.cached_tokens == 16
    assert server.body == {**STANDARD, "messages": list(QUESTION), "user": "k"}
    assert not client.is_closed  # the blocking client is still open
    client.close()
    assert client.is_closed


def test_usage_of_a_completion_is_a_usage() -> None:
    completion = Server().client().complete(ChatRequest(messages=QUESTION))
    assert isinstance(completion.usage, Usage) and completion.text == "answer"


def test_the_server_admitting_the_request_and_its_first_token_are_told_in_that_order() -> None:
    told: list[str] = []
    completion = (
        Server()
        .client()
        .complete(
            ChatRequest(messages=QUESTION),
            on_first_token=lambda: told.append("first token"),
            on_admitted=lambda: told.append("admitted"),
        )
    )
    assert told == ["admitted", "first token"] and completion.text == "answer"


def test_a_prompt_of_ids_asks_for_ids_by_the_engines_completions_switches() -> None:
    server = Server([{"choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]}])
    server.client(SGLANG).complete(ChatRequest(messages=QUESTION, prompt_ids=(1, 2), token_ids=True))
    assert server.body == {**STANDARD, "prompt": [1, 2], "return_token_ids": True}


def test_log_probabilities_sent_without_their_tokens_score_nothing() -> None:
    events = [
        {"choices": [{"index": 0, "text": "x", "logprobs": {"token_logprobs": [-0.1], "tokens": None}}]}
    ]
    got = Server(events).client().complete(ChatRequest(messages=QUESTION, prompt_ids=(1,), logprobs=0))
    assert got.text == "x" and got.logprobs == ()


def test_a_body_is_encoded_as_httpx2_encodes_json_with_orjson_or_without(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from longctx.backends import client

    message = {"role": "user", "content": 'é ü \u2028 "q"'}
    body = {"model": "m", "prompt": list(range(2000)), "messages": [message],
            "temperature": 0.5, "stream": True, "n": None, "big": 2**70}  # fmt: skip
    expected = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    assert client.encode_body(body) == expected  # 2**70 is past orjson: json then
    del body["big"]
    expected = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    assert client.encode_body(body) == expected
    monkeypatch.setattr(client, "_orjson", None)
    assert client.encode_body(body) == expected
