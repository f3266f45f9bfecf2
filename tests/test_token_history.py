"""Token-id history against a stand-in tokenizer: the glue, the end-of-turn token, when it falls back to text.

The same against the real engines: test_session_engines.py (the next turn
reads the whole previous answer from the cache).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from longctx.backends.chat import ChatRequest, Completion
from longctx.backends.tokenizer import ServerTokenizer
from longctx.sessions.token_history import TokenHistory, glue_ids
from longctx.store import TurnRecord
from longctx.usage import Usage

END = 2  # the end-of-turn token


class ChatMLIds:
    """A chat template over a tokenizer with one id per character (special tokens: 1 and END)."""

    def __init__(self, *, prefix_breaks: bool = False) -> None:
        self.prefix_breaks = prefix_breaks
        self.calls = 0

    def tokenize_messages(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        self.calls += 1
        ids: list[int] = [99] if self.prefix_breaks and len(messages) > 2 else []
        for message in messages:
            ids += [1, *map(ord, message["role"]), 10, *map(ord, message["content"]), END, 10]
        return [*ids, 1, *map(ord, "assistant"), 10]


def _turn(position: int, answer_ids: tuple[int, ...] | None, answer: str = "a") -> TurnRecord:
    return TurnRecord(
        "s", position, f"q{position}?", answer, "a", None, f"r{position}", 0.0, answer_ids=answer_ids
    )


def _completion(prompt: tuple[int, ...] | None, generated: tuple[int, ...] | None) -> Completion:
    return Completion("a", None, "length", Usage(None, None, None, None, None, None), generated, prompt)


def _history(tokenizer: ChatMLIds | None) -> TokenHistory:
    return TokenHistory(lambda: cast(ServerTokenizer, tokenizer) if tokenizer is not None else None)


REQUEST = ChatRequest(messages=({"role": "user", "content": "q1?"},))


def _kwargs(user: str = "q1?") -> dict[str, Any]:
    first = [{"role": "system", "content": "S"}, {"role": "user", "content": "PACK q0?"}]
    return {"system": "S", "user": user, "first_messages": lambda: first}


def test_the_glue_is_the_template_between_an_answer_and_the_next_generation_prompt() -> None:
    glue = glue_ids(cast(ServerTokenizer, ChatMLIds()), "S", "q0?", "q1?")
    assert glue == [
        END,
        10,
        1,
        *map(ord, "user"),
        10,
        *map(ord, "q1?"),
        END,
        10,
        1,
        *map(ord, "assistant"),
        10,
    ]
    assert glue_ids(cast(ServerTokenizer, ChatMLIds(prefix_breaks=True)), "S", "q0?", "q1?") is None


def test_the_next_prompt_is_the_previous_prompt_the_generated_ids_and_the_glue() -> None:
    tokenizer = ChatMLIds()
    history = _history(tokenizer)
    first = history.request(REQUEST, [], **_kwargs("q0?"))
    assert first.token_ids and first.prompt_ids is None  # a chat request, asking for the ids
    history.answered(first, _completion((7, 8), (50, 51, END)), 1)
    second = history.request(REQUEST, [_turn(0, (50, 51, END))], **_kwargs())
    glue = glue_ids(cast(ServerTokenizer, tokenizer), "S", "q0?", "q1?")
    assert glue is not None and glue[0] == END
    # The answer ended with the end-of-turn token: it is not sent twice.
    assert second.prompt_ids == (7, 8, 50, 51, END, *glue[1:])
    history.answered(second, _completion(None, (60,)), 2)
    third = history.request(REQUEST, [_turn(0, (50, 51, END)), _turn(1, (60,))], **_kwargs("q2?"))
    assert third.prompt_ids is not None and third.prompt_ids[: len(second.prompt_ids) + 1] == (
        *second.prompt_ids,
        60,
    )


def test_a_resumed_history_is_rebuilt_from_the_stored_ids() -> None:
    tokenizer = ChatMLIds()
    live = _history(tokenizer)
    first_prompt = tuple(tokenizer.tokenize_messages(_kwargs()["first_messages"]()))
    live.answered(live.request(REQUEST, [], **_kwargs("q0?")), _completion(first_prompt, (50, 51)), 1)
    turns = [_turn(0, (50, 51))]
    expected = live.request(REQUEST, turns, **_kwargs())
    rebuilt = _history(tokenizer).request(REQUEST, turns, **_kwargs())
    assert rebuilt.prompt_ids == expected.prompt_ids is not None


def test_it_falls_back_to_text_where_ids_cannot_be_trusted() -> None:
    turns = [_turn(0, (50, 51))]
    # No tokenize route (a generic server): the request is left alone.
    assert _history(None).request(REQUEST, turns, **_kwargs()) == REQUEST
    # A turn without ids, or whose history form dropped reasoning: text, asking for ids.
    for turn in (_turn(0, None), _turn(0, (50,), answer="<think>x</think>a")):
        fallback = _history(ChatMLIds()).request(REQUEST, [turn], **_kwargs())
        assert fallback.token_ids and fallback.prompt_ids is None
    # A template whose shorter conversation is no prefix of the longer.
    broken = _history(ChatMLIds(prefix_breaks=True)).request(REQUEST, turns, **_kwargs())
    assert broken.prompt_ids is None
