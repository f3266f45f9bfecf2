"""longctx.lint without a server: the log readers, both cache simulations, the causes, the reports."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from longctx.errors import ConfigError, InputError
from longctx.lint import (
    LintReport,
    LoggedRequest,
    SglangCache,
    VllmCache,
    fail_selection,
    kv_tokens_of_plan,
    lint_requests,
    read_log,
    requests_from_lines,
)
from longctx.lint.logs import message_text


class CharRenderer:
    """A stand-in tokenizer: one token per character of a ChatML-like rendering."""

    identity = "chars"

    def tokens(self, request: LoggedRequest) -> list[int]:
        if request.kind == "completions":
            prompt = request.prompt
            return list(prompt) if isinstance(prompt, tuple) else [ord(c) for c in prompt or ""]
        tools = json.dumps(list(request.tools)) if request.tools else ""
        text = tools + "".join(f"<{m['role']}>{message_text(m)}</>" for m in request.messages) + "<assistant>"
        return [ord(character) for character in text]


def chat(*messages: tuple[str, str], **fields: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": role, "content": content} for role, content in messages],
        **fields,
    }


def lines(*bodies: Mapping[str, Any]) -> list[str]:
    return [json.dumps(body) for body in bodies]


def lint(*bodies: Mapping[str, Any], block: int = 4, **options: Any) -> LintReport:
    return lint_requests(requests_from_lines(lines(*bodies)), CharRenderer(), block_tokens=block, **options)


DOC = "A long shared document. " * 20


# -- the log formats -------------------------------------------------------------------------------


def test_reads_chat_completions_batch_and_recorded_lines(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    recorded = {
        "kind": "longctx.request",
        "id": "r1",
        "started_at": 5.0,
        "path": "/v1/chat/completions",
        "request": chat(("user", "hi")),
        "response": {
            "status": 200,
            "ttft_seconds": 0.5,
            "usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}},
        },
    }
    log.write_text(
        "\n".join(
            [
                json.dumps(chat(("system", "s"), ("user", "q"), user="ann")),
                "",
                "# a comment",
                json.dumps({"model": "m", "prompt": "text"}),
                json.dumps({"prompt": [1, 2, 3]}),
                json.dumps({"custom_id": "b1", "url": "/v1/chat/completions", "body": chat(("user", "x"))}),
                json.dumps(recorded),
                json.dumps({"kind": "note", "text": "not a request"}),
            ]
        )
    )
    requests = read_log(log)
    assert [r.kind for r in requests] == ["chat", "completions", "completions", "chat", "chat"]
    assert requests[0].user == "ann" and requests[0].line == 1
    assert requests[2].prompt == (1, 2, 3)
    assert requests[3].label == "b1"
    assert requests[4].label == "r1" and requests[4].timestamp == 5.0
    assert requests[4].reported.cached_tokens == 4 and requests[4].reported.status == 200
    assert [r.index for r in requests] == [0, 1, 2, 3, 4]


def test_bad_logs_say_where(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="2: not JSON"):
        requests_from_lines(['{"prompt": "a"}', "{oops"])
    with pytest.raises(InputError, match="no request"):
        requests_from_lines(['{"kind": "note"}'])
    with pytest.raises(InputError, match="cannot read"):
        read_log(tmp_path / "missing.jsonl")
    with pytest.raises(InputError, match="messages is not a list"):
        requests_from_lines(['{"messages": "hi"}'])


def test_content_parts_become_text() -> None:
    message = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert message_text(message) == "ab"
    assert message_text({"role": "assistant", "content": None}) == ""


# -- the simulations -------------------------------------------------------------------------------


def test_vllm_caches_full_blocks_only_and_never_the_last_token() -> None:
    cache = VllmCache(block_size=4)
    assert cache.send(list(range(10))) == 0
    assert cache.cached_blocks == 2  # the partial third block is not cached
    assert cache.send(list(range(10))) == 8
    assert cache.send(list(range(8))) == 4  # a whole-prompt hit recomputes the last block
    assert cache.send([*range(5), 99, 100, 101, 102]) == 4  # the chain stops at the first miss


def test_vllm_salt_namespaces_the_chain() -> None:
    cache = VllmCache(block_size=2)
    cache.send([1, 2, 3, 4, 5], cache_salt="a")
    assert cache.cached_tokens([1, 2, 3, 4, 5], cache_salt="b") == 0
    assert cache.cached_tokens([1, 2, 3, 4, 5], cache_salt="a") == 4


def test_vllm_evicts_least_recent_and_tails_first() -> None:
    cache = VllmCache(block_size=2, capacity_blocks=5)
    cache.send([1, 2, 3, 4, 5, 6, 7])  # 3 full blocks cached
    cache.send([10, 11, 12, 13, 14])  # needs 4 blocks: evicts the first prompt's tail blocks first
    assert cache.cached_tokens([1, 2, 3, 4, 5, 6, 7]) == 2  # its first block survived
    assert cache.send(list(range(100, 112))) == 0  # more than the cache: runs without caching anything


def test_sglang_radix_reuses_any_token_prefix() -> None:
    cache = SglangCache(page_size=1)
    assert cache.send([1, 2, 3, 4, 5]) == 0
    assert cache.send([1, 2, 3, 9, 9]) == 3
    assert cache.send([1, 2, 3, 4, 5, 6]) == 5
    assert cache.send([1, 2, 3, 4, 5, 6]) == 5  # capped at length - 1
    paged = SglangCache(page_size=4)
    paged.send(list(range(10)))
    assert paged.cached_tokens([*range(7), 50, 51]) == 4


def test_sglang_evicts_least_recently_used_leaves() -> None:
    cache = SglangCache(page_size=1, capacity_tokens=12)
    cache.send([1, 2, 3, 4, 5, 6])
    cache.send([7, 8, 9, 10, 11, 12])
    cache.send([1, 2, 3, 4, 5, 6, 0])  # touches the first
    cache.send([20, 21, 22, 23, 24])  # evicts the least recent: the second
    assert cache.cached_tokens([7, 8, 9, 10, 11, 12]) == 0
    assert cache.cached_tokens([1, 2, 3, 4, 5, 6]) == 5
    assert cache.held_tokens <= 12


# -- the causes ------------------------------------------------------------------------------------


def cause_of(first: Mapping[str, Any], second: Mapping[str, Any]) -> str:
    return lint(first, second).requests[1].cause


def test_each_cause_is_named() -> None:
    sys = "You are a helpful assistant for the shop."
    assert (
        cause_of(
            chat(("system", f"{sys} Today is 2026-12-05 10:31."), ("user", "q")),
            chat(("system", f"{sys} Today is 2026-12-06 09:02."), ("user", "q")),
        )
        == "timestamp"
    )
    assert (
        cause_of(
            chat(("system", f"{sys} Request 3f2a9c1d-1111-4222-8333-444455556666."), ("user", "q")),
            chat(("system", f"{sys} Request 9b7e0a2c-1111-4222-8333-444455556666."), ("user", "q")),
        )
        == "request_id"
    )
    assert (
        cause_of(
            chat(("system", f"{sys} The user's name is Ann."), ("user", "q"), user="ann"),
            chat(("system", f"{sys} The user's name is Bob."), ("user", "q")),
        )
        == "user_in_system"
    )
    assert (
        cause_of(
            chat(("system", sys + " Be brief."), ("user", "q")),
            chat(("system", sys + "  Be brief."), ("user", "q")),
        )
        == "whitespace"
    )
    tools_a = [{"type": "function", "function": {"name": "f", "parameters": {"a": 1, "b": 2}}}]
    tools_b = [{"type": "function", "function": {"parameters": {"b": 2, "a": 1}, "name": "f"}}]
    assert cause_of(chat(("user", "q"), tools=tools_a), chat(("user", "q"), tools=tools_b)) == "key_order"
    tools_c = [{"type": "function", "function": {"name": "g"}}]
    assert cause_of(chat(("user", "q"), tools=tools_a), chat(("user", "q"), tools=tools_c)) == "tools_changed"
    shots = [("user", "2+2?"), ("assistant", "4"), ("user", "3+3?"), ("assistant", "6")]
    swapped = [shots[2], shots[3], shots[0], shots[1]]
    assert (
        cause_of(
            chat(("system", sys), *shots, ("user", "1+1?")), chat(("system", sys), *swapped, ("user", "1+1?"))
        )
        == "volatile_few_shot"
    )
    assert (
        cause_of(
            chat(("system", sys), ("user", "a"), ("assistant", "b"), ("user", "c")),
            chat(("system", sys), ("user", "c")),
        )
        == "history_rewritten"
    )
    assert (
        cause_of(
            chat(("system", sys + " Be nice."), ("user", "q")),
            chat(("system", sys + " Be kind."), ("user", "q")),
        )
        == "system_changed"
    )
    assert cause_of(chat(("user", DOC + "Q1?")), chat(("user", DOC + "Q2?"))) == "question"
    first = chat(("user", DOC + "Q1?"))
    turn = chat(("user", DOC + "Q1?"), ("assistant", "A1"), ("user", "Q2?"))
    assert cause_of(first, turn) == "new_turn"
    assert cause_of(chat(("user", "q"), cache_salt="a"), chat(("user", "q"), cache_salt="b")) == "cache_salt"


def test_a_break_names_offset_text_ancestor_and_fix() -> None:
    report = lint(
        chat(("system", "Hello. Today is 2026-12-05."), ("user", DOC), id="a"),
        chat(("system", "Hello. Today is 2026-12-06."), ("user", DOC), id="b"),
    )
    (finding,) = report.requests[1].findings
    assert finding.cause == "timestamp" and finding.severity == "break"
    assert finding.request == "b" and finding.ancestor == "a"
    prefix = "<system>Hello. Today is 2026-12-0"
    assert finding.token_offset == len(prefix)
    assert finding.after.startswith("6.") and finding.ancestor_after.startswith("5.")
    assert finding.part == "message 0 (system)"
    assert finding.fix is not None and "date" in finding.fix
    assert finding.lost_tokens > len(DOC)


def test_siblings_lose_the_straddled_block_and_short_prefixes_nothing_else() -> None:
    doc = "x" * 37
    report = lint(chat(("user", doc + "Q1")), chat(("user", doc + "Q2")), block=8)
    row = report.requests[1]
    assert row.cause == "question"
    shared = len("<user>" + doc + "Q")
    assert row.shared_tokens == shared
    assert row.cached == {"vllm": shared - shared % 8, "sglang": shared}
    (straddle,) = row.findings
    assert straddle.cause == "block_straddle" and straddle.lost_tokens == shared % 8
    short = lint(chat(("user", "ab")), chat(("user", "ac")), block=16).requests[1]
    assert [f.cause for f in short.findings] == ["short_prefix"]


def test_eviction_under_a_kv_budget_is_a_break() -> None:
    docs = [chat(("user", f"{n}" + "y" * 60 + "?")) for n in range(3)]
    report = lint(*docs, docs[0], block=4, kv_tokens=160)
    last = report.requests[3]
    assert last.shared_tokens == len(CharRenderer().tokens(requests_from_lines(lines(docs[0]))[0]))
    causes = {(f.cause, f.engine) for f in last.findings}
    assert ("evicted", "vllm") in causes and ("evicted", "sglang") in causes
    unbounded = lint(*docs, docs[0], block=4)
    assert unbounded.requests[3].findings == ()


def test_hit_rate_and_reusable_totals() -> None:
    report = lint(*[chat(("user", DOC + f"Q{n}?")) for n in range(6)], block=16)
    shared = report.requests[1].shared_tokens
    assert report.reusable_tokens == 5 * shared
    assert report.cached_tokens("sglang") == 5 * shared
    assert report.cached_tokens("vllm") == 5 * (shared - shared % 16)
    assert 0.8 < report.hit_rate("sglang") < 5 / 6


# -- the reports and --fail-on ---------------------------------------------------------------------


def test_renderings_carry_the_same_facts() -> None:
    report = lint(
        chat(("system", "Now: 2026-12-05 10:00"), ("user", DOC), user="u"),
        chat(("system", "Now: 2026-12-05 10:01"), ("user", DOC)),
    )
    data = json.loads(report.to_json())
    assert data["summary"]["requests"] == 2
    assert data["summary"]["causes"] == {"timestamp": 1}
    assert data["requests"][1]["findings"][0]["cause"] == "timestamp"
    text = report.to_text()
    assert "timestamp" in text and "fix:" in text and "vllm" in text
    page = report.to_html()
    assert page.startswith("<!doctype html>") and "<script" not in page and "timestamp" in page


def test_fail_on_selects_causes() -> None:
    assert "timestamp" in fail_selection("break") and "block_straddle" not in fail_selection("break")
    assert fail_selection("loss") == {"block_straddle", "short_prefix"}
    assert fail_selection("timestamp, key_order") == {"timestamp", "key_order"}
    assert "question" not in fail_selection("any")
    with pytest.raises(ConfigError, match="unknown cause"):
        fail_selection("nonsense")
    with pytest.raises(ConfigError, match="unknown cause"):
        fail_selection("question")
    report = lint(
        chat(("system", "t=2026-12-05"), ("user", DOC)), chat(("system", "t=2026-12-06"), ("user", DOC))
    )
    assert [f.cause for f in report.failing(fail_selection("break"))] == ["timestamp"]
    assert report.failing(fail_selection("loss")) == ()


def test_arguments_are_checked() -> None:
    with pytest.raises(ConfigError):
        lint(chat(("user", "a")), block=0)
    with pytest.raises(ConfigError):
        lint(chat(("user", "a")), kv_tokens=0)


def test_kv_tokens_of_a_plan() -> None:
    assert kv_tokens_of_plan({"kv_memory_per_gpu_bytes": 1 << 30, "token_bytes_per_gpu": 1 << 17}) == 8192
    assert kv_tokens_of_plan({"kv_memory_per_gpu_bytes": None, "token_bytes_per_gpu": 4}) is None


class ToolBlindRenderer(CharRenderer):
    """A chat template that does not render ``tools`` (as the tiny model's does not)."""

    def tokens(self, request: LoggedRequest) -> list[int]:
        return super().tokens(dataclasses.replace(request, tools=()))


def test_each_break_of_one_prompt_is_named_with_what_it_cost() -> None:
    def system(minute: int, request: str, user: str) -> str:
        return (
            f"Current time: 2026-09-11T08:{minute:02d}:00Z\nRequest id: req_{request}\n"
            f"user: {user}@example.com\n" + ("You are the support assistant. " * 4)
        )

    report = lint(
        chat(("system", system(0, "51706749f3", "customer0")), ("user", "Where is my order?")),
        chat(("system", system(1, "56448162f3", "customer1")), ("user", "Where is my order?")),
    )
    row = report.requests[1]
    breaks = [f for f in row.findings if f.severity == "break"]
    assert [f.cause for f in breaks] == ["timestamp", "request_id", "user_in_system"]
    offsets = [f.token_offset for f in breaks]
    assert offsets == sorted(offsets) and offsets[0] == row.shared_tokens
    assert all(f.lost_tokens > 0 for f in breaks)
    assert row.cause == "timestamp"


def test_a_change_the_template_does_not_render_is_no_break() -> None:
    tools_a = [{"type": "function", "function": {"name": "f", "parameters": {"a": 1, "b": 2}}}]
    tools_b = [{"type": "function", "function": {"parameters": {"b": 2, "a": 1}, "name": "f"}}]
    requests = requests_from_lines(lines(chat(("user", DOC + "Q1")), chat(("user", DOC + "Q2"))))
    requests = [
        dataclasses.replace(requests[0], tools=tuple(tools_a)),
        dataclasses.replace(requests[1], tools=tuple(tools_b)),
    ]
    report = lint_requests(requests, ToolBlindRenderer(), block_tokens=4)
    assert report.requests[1].cause == "question"
    assert all(f.severity != "break" for f in report.findings)
