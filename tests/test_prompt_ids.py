"""Prompts as token ids against stand-in tokenizers: exact where the rule holds, text with a reason where not.

The same against the real engines (the ids equal the server's own
tokenization, the cached tokens equal the text path's): test_prompt_ids_engines.py.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from longctx.backends.chat import ChatRequest
from longctx.backends.engines import GENERIC, VLLM
from longctx.backends.tokenizer import ServerTokenizer
from longctx.errors import TokenizerError
from longctx.options.groups import RequestOptions
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


def test_a_prompt_with_images_goes_as_chat_with_the_reason(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        ids = _ids(store, ChatMLChars())
        parts = [
            {"type": "text", "text": PACK.prefix},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
            {"type": "text", "text": "What does the page say?"},
        ]
        messages = ({"role": "system", "content": PACK.system}, {"role": "user", "content": parts})
        request = ids.request(
            ChatRequest(messages=messages), (), server=_server(), routed=False, pack=PACK,
            options=RequestOptions(), first_messages=list,
        )  # fmt: skip
        assert request.prompt_ids is None
        assert request.text_reason == "the prompt holds images (token ids cannot carry them)"


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


# -- later turns start from the pack's ids; what is made, kept and asked for ------------------------


class Recording(ChatMLChars):
    """Keeps every message content it tokenizes."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.seen: list[str] = []

    def tokenize_messages(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        self.seen += [message["content"] for message in messages]
        return super().tokenize_messages(messages)


class Numbered(ChatMLChars):
    """A template that numbers its messages: what comes after a turn depends on the messages before it."""

    def tokenize_messages(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        self.calls.append("messages")
        ids: list[int] = []
        for index, message in enumerate(messages):
            ids += [1, *self.encode(f"{index}{message['role']}\n{message['content']}"), END, 10]
        return [*ids, 1, *self.encode(f"{len(messages)}assistant\n")]


def _conversation(*pairs: tuple[str, str], last: str) -> ChatRequest:
    messages: list[Mapping[str, str]] = [{"role": "system", "content": "SYS"}]
    for question, answer in pairs:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return ChatRequest(messages=(*messages, {"role": "user", "content": last}))


def _later(ids: PromptIds, request: ChatRequest, turns: Sequence[TurnRecord], **options: Any) -> ChatRequest:
    return ids.request(
        request, turns, server=_server(), routed=False, pack=options.pop("pack", PACK),
        options=RequestOptions(**options), first_messages=lambda: FIRST,
    )  # fmt: skip


def test_a_later_turn_starts_from_the_packs_ids_without_tokenizing_the_pack_again(tmp_path: Path) -> None:
    for tokenizer in (Recording(), Numbered()):
        with Store.open(tmp_path / type(tokenizer).__name__) as store:
            ids = _ids(store, tokenizer)
            _ask(ids, PACK.prefix + "q0?")
            ids.wait()
            request = _conversation((PACK.prefix + "q0?", "It is a."), last="q1?")
            tokenizer.calls.clear()
            if isinstance(tokenizer, Recording):
                tokenizer.seen.clear()
            later = _later(ids, request, [_turn(0, "q0?", "It is a.")])
            assert later.prompt_ids == tuple(tokenizer.tokenize_messages(request.messages))
            if isinstance(tokenizer, Recording):
                tokenizer.seen = tokenizer.seen[: -len(request.messages)]  # less the check just above
                assert tokenizer.seen and not any(PACK.prefix in text for text in tokenizer.seen)


def test_a_later_turn_without_a_pack_or_with_text_asked_makes_no_pack_ids(tmp_path: Path) -> None:
    tokenizer = ChatMLChars()
    request = _conversation((PACK.prefix + "q0?", "It is a."), last="q1?")
    turns = [_turn(0, "q0?", "It is a.")]
    with Store.open(tmp_path) as store:
        ids = _ids(store, tokenizer)
        packless = _later(ids, request, turns, pack=None)
        assert packless.prompt_ids == tuple(tokenizer.tokenize_messages(request.messages))
        text = _later(ids, request, turns, prompt_ids=False, token_history=True)
        assert text.prompt_ids is None and text.text_reason is None  # no generated ids stored: text
        ids.wait()
        assert store.caches.pack_ids(tokenizer.identity, PACK.fingerprint) is None


def test_earlier_answers_go_as_their_generated_ids_with_token_history(tmp_path: Path) -> None:
    tokenizer = ChatMLChars()
    generated = dataclasses.replace(_turn(0, "q0?", "It is a."), answer_ids=(900, 901, END))
    request = _conversation((PACK.prefix + "q0?", "It is a."), last="q1?")
    with Store.open(tmp_path) as store:
        later = _later(_ids(store, tokenizer), request, [generated], token_history=True)
    assert later.prompt_ids is not None and later.token_ids is True
    prompt = list(later.prompt_ids)
    start = prompt.index(900)
    assert prompt[start : start + 3] == [900, 901, END]


def test_text_asked_for_is_never_explained_even_where_ids_could_not_go(tmp_path: Path) -> None:
    with Store.open(tmp_path) as store:
        ids = _ids(store, ChatMLChars())
        assert _ask(ids, PACK.prefix + "Where?", routed=True, prompt_ids=False).text_reason is None
        assert _ask(ids, PACK.prefix + "Where?", profile=GENERIC, prompt_ids=False).text_reason is None


def test_a_packs_ids_are_read_from_the_store_once_per_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = ChatMLChars()
    with Store.open(tmp_path) as store:
        first = _ids(store, tokenizer)
        _ask(first, PACK.prefix + "Where?")
        first.wait()
        reads: list[str] = []
        real = store.caches.pack_ids
        monkeypatch.setattr(store.caches, "pack_ids", lambda *key: reads.append(key[1]) or real(*key))
        ids = _ids(store, tokenizer)
        for question in ("Where?", "What?", "Why?"):
            assert _ask(ids, PACK.prefix + question).prompt_ids is not None
        assert reads == ["fp1"]


def test_a_packs_ids_are_made_in_a_named_daemon_thread(tmp_path: Path) -> None:
    release = threading.Event()

    class Slow(ChatMLChars):
        def tokenize_messages(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
            release.wait(10)
            return super().tokenize_messages(messages)

    with Store.open(tmp_path) as store:
        ids = _ids(store, Slow())
        assert _ask(ids, PACK.prefix + "Where?").text_reason == PACK_IDS_PENDING
        making = [thread for thread in threading.enumerate() if thread.name == "longctx-pack-ids"]
        assert len(making) == 1 and making[0].daemon
        assert _ask(ids, PACK.prefix + "Where?").text_reason == PACK_IDS_PENDING  # one thread per pack
        release.set()
        ids.wait()
        assert not making[0].is_alive()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_pack_whose_ids_fail_unexpectedly_goes_as_text_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Broken(ChatMLChars):
        def tokenize_messages(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
            raise RuntimeError("a bug")

    # The bug is not swallowed: it reaches the thread's excepthook (printed, in a program).
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    with Store.open(tmp_path) as store:
        ids = _ids(store, Broken())
        _ask(ids, PACK.prefix + "Where?")
        ids.wait()
        assert _ask(ids, PACK.prefix + "Where?").text_reason == "the pack's token ids could not be made"
    assert [str(error) for error in raised] == ["a bug"]


def test_a_template_that_knows_only_its_own_roles_covers_the_pack() -> None:
    class Strict(ChatMLChars):
        """Refuses a role it does not know, as some chat templates raise."""

        def tokenize_messages(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
            unknown = [m["role"] for m in messages if m["role"] not in ("system", "user", "assistant")]
            if unknown:
                raise TokenizerError(f"the template does not know the roles {unknown}")
            return super().tokenize_messages(messages)

    made = pack_ids(cast(ServerTokenizer, Strict()), "SYS", PACK.prefix)
    assert made == pack_ids(cast(ServerTokenizer, ChatMLChars()), "SYS", PACK.prefix)


def test_a_template_that_drops_the_documents_leaves_no_pack_to_send_as_ids() -> None:
    class LastParagraph(ChatMLChars):
        """Renders only the last paragraph of the last message."""

        def tokenize_messages(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
            return [*self.encode(messages[-1]["content"].rsplit("\n\n", 1)[-1]), END]

    made = pack_ids(cast(ServerTokenizer, LastParagraph()), "SYS", PACK.prefix)
    assert made == "the pack's last tokens merge with the question's (no clean boundary)"
