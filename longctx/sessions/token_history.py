"""Token-id history: a conversation's earlier turns as token ids, so that a later turn goes out as ids.

Two ways to send an earlier answer, chosen per session:

- **generated** (``RequestOptions(token_history=True)``): the answer as the
  token ids the model generated. An answer sent back as text is served from
  the cache only as far as re-tokenising it gives back the generated ids
  (:mod:`longctx.sessions.reuse`; docs/api.md, "Answer reuse"); as the
  generated ids, the whole previous answer is read from the cache
  (block-rounded; measured on both engines: docs/benchmarks.md,
  ``sessions-answer-reuse``). The turns ask the server for every prompt's
  and answer's ids.
- **text** (the default of the token-id prompts, :mod:`longctx.sessions.prompt_ids`):
  the answer's text as the template renders it, tokenized in its place
  (below), exactly as the server tokenizes the same conversation sent as
  chat messages. The prompt is the text path's, token for token; only the
  server's rendering and tokenizing of the whole are saved.

A later turn's ids: the previous turn's prompt ids, the previous answer, then
the chat template's glue (the end of the assistant message and the next user
message, with the generation prompt). The glue comes from the server's own
template, through its tokenize route: ``[system, user (previous question)]``
and ``[system, user, assistant "", user (new message)]``, each with the
generation prompt; the second less the first is the glue, provided the first
is a prefix of the second (otherwise the turn goes out as text). A generated
answer that ended with the token the glue starts with (the end-of-turn token)
does not get it twice. A text answer goes in the assistant message of the
second conversation instead of "": the difference is then the answer as the
template renders it and the glue, tokenized together in context (a small
request: the system message and two short user messages, not the pack).

The turn goes out as text when the engine has no tokenize route, when a
turn's ids are missing, when the previous answer had reasoning the template
drops from history (its ids would keep it), or when the glue check fails;
:attr:`HistoryIds.reason` says which. What is lost on ``/v1/completions``:
the server's chat-side parsing (a reasoning parser's separate field, tool
calls).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from longctx.backends.chat import ChatRequest, Completion
from longctx.backends.tokenizer import ServerTokenizer
from longctx.recordtypes import record_type
from longctx.store import TurnRecord

__all__ = ["FirstIds", "FirstMessages", "HistoryIds", "TokenHistory", "glue_ids"]

FirstMessages = Callable[[], list[dict[str, str]]]
"""The messages of the first turn's request (pack and first question): a resumed session's ids start there."""

FirstIds = Callable[[ServerTokenizer], "Sequence[int] | None"]
"""The first turn's prompt ids where known without tokenizing its messages (the pack's stored ids)."""


@record_type
class HistoryIds:
    """A turn's prompt after earlier turns: ``request`` with ``prompt_ids``, or as text with ``reason``."""

    request: ChatRequest
    reason: str | None = None


def glue_ids(
    tokenizer: ServerTokenizer, system: str | None, previous_user: str, user: str, answer: str = ""
) -> list[int] | None:
    """The template's tokens after a generation prompt through the next one: ``answer``, then ``user``.

    With ``answer`` empty, the glue between an answer and the next
    generation prompt. None when the template does not render the shorter
    conversation as a prefix of the longer one (the glue is then not well
    defined, or the answer's first token merges with the generation prompt).
    """
    head = [{"role": "system", "content": system}] if system is not None else []
    before = [*head, {"role": "user", "content": previous_user}]
    after = [*before, {"role": "assistant", "content": answer}, {"role": "user", "content": user}]
    short, long = tokenizer.tokenize_messages(before), tokenizer.tokenize_messages(after)
    if long[: len(short)] != short:
        return None
    return long[len(short) :]


class TokenHistory:
    """The token ids of one session's conversation up to its last prompt, and the next prompt.

    ``tokenizer`` gives the server's tokenizer, or None where the server has
    no tokenize route (then every request is left as it is). ``first_ids``
    gives the first turn's prompt ids where they are known without
    tokenizing its messages (the pack's stored ids).
    """

    def __init__(
        self, tokenizer: Callable[[], ServerTokenizer | None], first_ids: FirstIds | None = None
    ) -> None:
        self._tokenizer = tokenizer
        self._first_ids = first_ids
        self._prompt: list[int] | None = None
        self._prompt_turns = -1  # how many turns the cached prompt follows

    def request(
        self,
        request: ChatRequest,
        turns: Sequence[TurnRecord],
        *,
        system: str | None,
        user: str,
        first_messages: FirstMessages,
        generated: bool = True,
    ) -> ChatRequest:
        """``request`` (the user message ``user`` after ``turns``) as token ids, or asking for them.

        ``system`` is the system message every request starts with (None: none).
        """
        return self.prompt(
            request, turns, system=system, user=user, first_messages=first_messages, generated=generated
        ).request

    def prompt(
        self,
        request: ChatRequest,
        turns: Sequence[TurnRecord],
        *,
        system: str | None,
        user: str,
        first_messages: FirstMessages,
        generated: bool = True,
    ) -> HistoryIds:
        """:meth:`request`, with the reason where the turn stays text.

        ``generated``: earlier answers as the ids the model generated
        (else as their text, tokenized where the template renders it).
        """
        tokenizer = self._tokenizer()
        if tokenizer is None:
            return HistoryIds(request, "the server has no tokenize route")
        asking = dataclasses.replace(request, token_ids=True) if generated else request
        if not turns:
            return HistoryIds(asking, "the first turn")
        if generated and not all(_reusable(turn) for turn in turns):
            return HistoryIds(asking, _MISSING)
        turn = _Splice(tokenizer, system, generated)
        if self._prompt is None or self._prompt_turns != len(turns) - 1:
            known = self._first_ids(tokenizer) if self._first_ids is not None else None
            self._prompt = _rebuilt(turn, turns, first_messages, known)
            self._prompt_turns = len(turns) - 1
        following = turn.after(self._prompt, turns[-1], user) if self._prompt is not None else None
        if following is None:
            return HistoryIds(asking, _NO_PREFIX_RULE)
        return HistoryIds(dataclasses.replace(asking, prompt_ids=tuple(following)))

    def answered(self, request: ChatRequest, completion: Completion, turns: int) -> None:
        """Take in the answer that made the conversation ``turns`` turns long (its prompt's ids)."""
        prompt = request.prompt_ids or completion.prompt_token_ids
        if prompt is None:
            self._prompt = None
            return
        self._prompt, self._prompt_turns = list(prompt), turns - 1


_MISSING = "an earlier answer's generated ids are missing (or its reasoning is dropped by the template)"
_NO_PREFIX_RULE = "the chat template does not render a conversation as a prefix of its continuation"


def _reusable(turn: TurnRecord) -> bool:
    # Reasoning the template drops from history would stay in the ids.
    return turn.answer_ids is not None and turn.history_answer == turn.answer


class _Splice:
    """One way of continuing a prompt's ids with its answer and the next user message."""

    def __init__(self, tokenizer: ServerTokenizer, system: str | None, generated: bool) -> None:
        self.tokenizer, self.system, self.generated = tokenizer, system, generated

    def after(self, prompt: Sequence[int], turn: TurnRecord, user: str) -> list[int] | None:
        """``prompt`` (what ``turn`` answered), its answer, then ``user`` and the generation prompt."""
        if self.generated:
            assert turn.answer_ids is not None
            glue = glue_ids(self.tokenizer, self.system, turn.question, user)
            return _glued([*prompt, *turn.answer_ids], glue) if glue else None
        # The answer's text as the template renders it (trimmed or not), tokenized in its place.
        rendered = glue_ids(self.tokenizer, self.system, turn.question, user, answer=turn.history_answer)
        return [*prompt, *rendered] if rendered else None


def _glued(ids: Sequence[int], glue: Sequence[int]) -> list[int]:
    """``ids`` then ``glue``, less its first token where the answer already ended with it (end of turn)."""
    return [*ids, *(glue[1:] if ids and ids[-1] == glue[0] else glue)]


def _rebuilt(
    splice: _Splice, turns: Sequence[TurnRecord], first_messages: FirstMessages, first: Sequence[int] | None
) -> list[int] | None:
    """The ids of the last prompt of ``turns`` (a resumed session): first prompt, then answers and glue."""
    ids: list[int] | None = list(first) if first is not None else None
    if ids is None:
        ids = splice.tokenizer.tokenize_messages(first_messages())
    for index, turn in enumerate(turns[1:], start=1):
        ids = splice.after(ids, turns[index - 1], turn.preamble + turn.question + turn.instruction)
        if ids is None:
            return None
    return ids
