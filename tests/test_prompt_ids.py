"""Prompts as token ids against stand-in tokenizers: exact where the rule holds, text with a reason where not.

The same against the real engines (the ids equal the server's own
tokenization, the cached tokens equal the text path's): test_prompt_ids_engines.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from longctx.backends.chat import ChatRequest
from longctx.backends.engines import GENERIC, VLLM
from longctx.backends.tokenizer import ServerTokenizer
from longctx.config import RequestOptions
from longctx.errors import TokenizerError
from longctx.sessions.prompt_ids import (
    PACK_IDS_PENDING,
    PromptIds,
    chat_only_reason,
    pack_ids,
    tail_reason,
)
from longctx.store import Store, StoredPack, TurnRecord

END = 2


class ChatMLChars:
    """ChatML over one id per character, like a server's tokenize route (messages or text).

    ``merge_blank`` makes a blank line followed by text one token (a tokenizer whose
    pieces span the pack's boundary); ``trim`` strips message contents (a template
    that trims answers).
    """

    def __init__(self, *, merge_blank: bool = False, trim: bool = False) -> None:
        self.merge_blank = merge_blank
        self.trim = trim
        self.identity = "server:stand-in:m:1"
        self.calls: list[str] = []

    def encode(self, text: str) -> list[int]:
        self.calls.append("encode")
        ids: list[int] = []
        for index, char in enumerate(text):
            if self.merge_blank and char.isalpha() and text[max(0, index - 2) : index] == "\n\n":
                ids[-2:] = [1000 + ord(char)]  # "\n\nX" as one token
            else:
                ids.append(ord(char))
        return ids

    def tokenize_messages(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        self.calls.append("messages")
        ids: list[int] = []
        for message in messages:
            content = message["content"].strip() if self.trim else message["content"]
            ids += [1, *self.encode(message["role"] + "\n" + content), END, 10]
        return [*ids, 1, *self.encode("assistant\n")]


PACK = StoredPack("fp1", "1", "SYS", "<documents>\nfile\n</documents>\n\n", {"total_tokens": 9})


def _request(content: str) -> ChatRequest:
    return ChatRequest(messages=({"role": "system", "content": "SYS"}, {"role": "user", "content": content}))


def _ids(store: Store, tokenizer: ChatMLChars) -> PromptIds:
    return PromptIds(lambda: store, lambda: cast(ServerTokenizer, tokenizer))


def _server(profile: Any = VLLM) -> Any:
    class Info:
        pass

    info = Info()
    info.profile = profile  # type: ignore[attr-defined]
    return info


FIRST = [{"role": "system", "content": "SYS"}, {"role": "user", "content": PACK.prefix + "q0?"}]


def _ask(ids: PromptIds, content: str, turns: Sequence[TurnRecord] = (), **options: Any) -> ChatRequest:
    return ids.request(
        _request(content), turns, server=_server(options.pop("profile", VLLM)),
        routed=options.pop("routed", False), pack=PACK, options=RequestOptions(**options),
        first_messages=lambda: FIRST,
    )  # fmt: skip


def test_the_first_prompt_is_the_servers_own_tokens_of_the_messages(tmp_path: Path) -> None:
    tokenizer = ChatMLChars()
    with Store.open(tmp_path) as store:
        ids = _ids(store, tokenizer)
        # The pack's first request goes as text, its ids made beside it; the next one as ids.
        first = _ask(ids, PACK.prefix + "Where is main?")
        assert first.prompt_ids is None and first.text_reason == PACK_IDS_PENDING
        ids.wait()
        request = _ask(ids, PACK.prefix + "Where is main?")
        assert request.prompt_ids == tuple(tokenizer.tokenize_messages(request.messages))
        assert request.text_reason is None
        # Kept in the store by pack and tokenizer identity: a new session does not tokenize the pack.
        assert store.caches.pack_ids(tokenizer.identity, "fp1") is not None
        tokenizer.calls.clear()
        again = _ask(_ids(store, tokenizer), PACK.prefix + "And tests?")
        assert again.prompt_ids == tuple(tokenizer.tokenize_messages(again.messages))
        assert tokenizer.calls.count("messages") == 1  # only the check above: none for the pack


def test_it_goes_as_text_with_the_reason_where_ids_would_not_be_exact(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        ids = _ids(store, ChatMLChars())
        spaced = _ask(ids, PACK.prefix + " leading space?")
        assert spaced.prompt_ids is None and "whitespace" in (spaced.text_reason or "")
        merged = _ask(_ids(store, ChatMLChars(merge_blank=True)), PACK.prefix + "Where?")
        assert merged.prompt_ids is None and merged.text_reason is not None
        generic = _ask(ids, PACK.prefix + "Where?", profile=GENERIC)
        assert generic.prompt_ids is None and "takes no token-id prompts" in (generic.text_reason or "")
        routed = _ask(ids, PACK.prefix + "Where?", routed=True)
        assert routed.prompt_ids is None and "router" in (routed.text_reason or "")
        tools = ids.request(
            ChatRequest(messages=_request(PACK.prefix + "Where?").messages, extra_body={"tools": []}),
            (), server=_server(), routed=False, pack=PACK, options=RequestOptions(), first_messages=list,
        )  # fmt: skip
        assert tools.prompt_ids is None and "tools" in (tools.text_reason or "")
        # Text asked for: no ids, and nothing to explain.
        text = _ask(ids, PACK.prefix + "Where?", prompt_ids=False)
        assert text.prompt_ids is None and text.text_reason is None


def test_a_constrained_request_goes_as_ids_and_keeps_its_constraint(tmp_path: Path) -> None:
    """A typed answer's field (longctx.schemas) is no reason for text: completions take it, so it stays."""
    constraint = {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}}
    with Store.open(tmp_path) as store:
        ids = _ids(store, ChatMLChars())
        _ask(ids, PACK.prefix + "Who?")  # the pack's first request goes as text; its ids are made beside it
        ids.wait()
        typed = ids.request(
            dataclasses.replace(_request(PACK.prefix + "Who?"), constraint=constraint), (), server=_server(),
            routed=False, pack=PACK, options=RequestOptions(), first_messages=lambda: FIRST,
        )  # fmt: skip
        assert typed.prompt_ids is not None and typed.text_reason is None
        assert typed.constraint == constraint


def test_pack_ids_are_refused_on_a_template_that_does_not_render_a_question_as_its_own_tokens() -> None:
    class Lowering(ChatMLChars):
        def tokenize_messages(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
            lowered = [{**message, "content": message["content"].lower()} for message in messages]
            return super().tokenize_messages(lowered)  # the template changes what it renders

    assert isinstance(pack_ids(cast(ServerTokenizer, Lowering()), "SYS", PACK.prefix), str)
    made = pack_ids(cast(ServerTokenizer, ChatMLChars()), "SYS", PACK.prefix)
    assert not isinstance(made, str) and made.after_user == (END, 10, 1, *map(ord, "assistant\n"))


def _turn(position: int, question: str, answer: str) -> TurnRecord:
    return TurnRecord("s", position, question, answer, answer, None, f"r{position}", 0.0)


def test_a_later_turn_is_the_servers_tokens_of_the_conversation_with_answers_as_text(tmp_path: Path) -> None:
    tokenizer = ChatMLChars()
    turns = [_turn(0, "q0?", "It is a."), _turn(1, "q1?", "Then b.")]
    messages = [
        {"role": "system", "content": "SYS"}, {"role": "user", "content": PACK.prefix + "q0?"},
        {"role": "assistant", "content": "It is a."}, {"role": "user", "content": "q1?"},
        {"role": "assistant", "content": "Then b."}, {"role": "user", "content": "q2?"},
    ]  # fmt: skip
    with Store.open(tmp_path) as store:
        request = _ask(_ids(store, tokenizer), "q2?", turns)
        assert request.prompt_ids == tuple(tokenizer.tokenize_messages(messages))
        # An answer with whitespace at its ends, on a template that trims answers: in its place, as rendered.
        trimming = ChatMLChars(trim=True)
        spaced = [turns[0], _turn(1, "q1?", "  Then b.\n")]
        request = _ask(_ids(store, trimming), "q2?", spaced)
        assert request.prompt_ids == tuple(trimming.tokenize_messages(messages))


# -- every reason, word for word; the tokenizer failing; what is asked for ------------------------


def test_each_reason_for_text_is_told_whole(tmp_path: Path) -> None:
    assert tail_reason("Where?") is None
    for tail in ("", " Where?", "Where?\n"):
        assert tail_reason(tail) == (
            "the question starts or ends with whitespace (its tokens could merge with the template's)"
        )
    assert chat_only_reason({"top_k": 3}) is None
    assert chat_only_reason({"tools": [], "tool_choice": "auto", "top_k": 3}) == (
        "the request sets tool_choice, tools, which a chat request carries"
    )
    with Store.open(tmp_path) as store:
        ids = _ids(store, ChatMLChars())
        assert _ask(ids, PACK.prefix + "Where?", profile=GENERIC).text_reason == (
            f"the {GENERIC.label} server takes no token-id prompts"
        )
        assert _ask(ids, PACK.prefix + "Where?", routed=True).text_reason == (
            "a router is in front (its routes and tokenizer are not checked)"
        )
        assert _ask(ids, "no pack here?").text_reason == "the first user message does not start with the pack"
        untokenized = PromptIds(lambda: store, lambda: None)
        assert _ask(untokenized, PACK.prefix + "Where?").text_reason == "the server has no tokenize route"
        merged = _ids(store, MergingW())
        _ask(merged, PACK.prefix + "Where?")
        merged.wait()
        assert _ask(merged, PACK.prefix + "Where?").text_reason == (
            "the pack's last tokens merge with the question's (no clean boundary)"
        )
        assert store.caches.pack_ids("server:stand-in:m:1", "fp1") is None  # a reason is not kept


class MergingW(ChatMLChars):
    """Merges a blank line and a "W" into one token: the template's probes pass, the pack's probe does not."""

    def encode(self, text: str) -> list[int]:
        ids = super().encode(text.replace("\n\nW", "\x00"))
        return [1087 if token == 0 else token for token in ids]


def test_a_pack_whose_last_tokens_merge_with_the_probe_has_no_clean_boundary() -> None:
    made = pack_ids(cast(ServerTokenizer, MergingW()), "SYS", PACK.prefix)
    assert made == "the pack's last tokens merge with the question's (no clean boundary)"
    assert not isinstance(pack_ids(cast(ServerTokenizer, ChatMLChars()), "SYS", PACK.prefix), str)


def test_the_template_check_names_a_template_that_changes_the_question(tmp_path: Path) -> None:
    class Lowering(ChatMLChars):
        def tokenize_messages(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
            return super().tokenize_messages([{**m, "content": m["content"].lower()} for m in messages])

    assert pack_ids(cast(ServerTokenizer, Lowering()), "SYS", PACK.prefix) == (
        "the chat template does not render a question as its own tokens"
    )


def test_a_tokenizer_that_fails_sends_text_from_then_on_saying_why(tmp_path: Path) -> None:
    class Failing(ChatMLChars):
        def tokenize_messages(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
            raise TokenizerError("the tokenize route answered 500")

    tokenizer = Failing()
    turns = [_turn(0, "q0?", "It is a.")]
    with Store.open(tmp_path) as store:
        ids = _ids(store, tokenizer)
        later = _ask(ids, "q1?", turns)
        reason = "the server could not tokenize: the tokenize route answered 500"
        assert later.prompt_ids is None and later.text_reason == reason
        tokenizer.calls.clear()
        assert _ask(ids, PACK.prefix + "Where?").text_reason == reason
        assert tokenizer.calls == []  # not asked again
        # Making the pack's ids fails the same way: said, and the pack goes as text.
        fresh = _ids(store, tokenizer)
        assert _ask(fresh, PACK.prefix + "Where?").text_reason == PACK_IDS_PENDING
        fresh.wait()
        assert _ask(fresh, PACK.prefix + "Where?").text_reason == (
            "the pack's token ids could not be made: the tokenize route answered 500"
        )


def test_answer_ids_are_asked_for_with_token_history_and_no_pack_means_plain_text(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        ids = _ids(store, ChatMLChars())
        asked = _ask(ids, PACK.prefix + "Where?", token_history=True)
        assert asked.token_ids is True and asked.text_reason == PACK_IDS_PENDING
        ids.wait()
        plain = _ask(ids, PACK.prefix + "Where?")
        assert plain.token_ids is False and plain.prompt_ids is not None
        text = _ask(ids, PACK.prefix + "Where?", prompt_ids=False, token_history=True)
        assert text.prompt_ids is None and text.text_reason is None and text.token_ids is True
        packless = ids.request(
            _request("Where?"), (), server=_server(), routed=False, pack=None, options=RequestOptions(),
            first_messages=lambda: FIRST,
        )  # fmt: skip
        assert packless == _request("Where?")
