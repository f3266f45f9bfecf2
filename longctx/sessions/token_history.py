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
  the answer's text re-tokenised, exactly as the server tokenizes the same
  conversation sent as chat messages. The prompt is the text path's, token
  for token; only the server's rendering and tokenizing are saved. An answer
  with whitespace at either end (which a template may trim, or which could
  merge with the template's tokens) sends the turn as text; so does a
  template that fails the check below.

A later turn's ids: the previous turn's prompt ids, the previous answer, then
the chat template's glue (the end of the assistant message and the next user
message, with the generation prompt). The glue comes from the server's own
template, through its tokenize route: ``[system, user (previous question)]``
and ``[system, user, assistant "", user (new message)]``, each with the
generation prompt; the second less the first is the glue, provided the first
is a prefix of the second (otherwise the turn goes out as text). A generated
answer that ended with the token the glue starts with (the end-of-turn token)
does not get it twice. For text answers the rule (prompt, the answer's own
tokens, glue) is checked once per session against the server's tokenization
of a probe conversation.

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
from dataclasses import dataclass

from longctx.backends.chat import ChatRequest, Completion
from longctx.backends.tokenizer import ServerTokenizer
from longctx.store import TurnRecord

__all__ = ["HistoryIds", "TokenHistory", "glue_ids"]

FirstMessages = Callable[[], list[dict[str, str]]]
"""The messages of the first turn's request (pack and first question): a resumed session's ids start there."""

FirstIds = Callable[[ServerTokenizer], "Sequence[int] | None"]
"""The first turn's prompt ids where known without tokenizing its messages (the pack's stored ids)."""

# A probe conversation for the text answers' rule: an answer that starts and ends with a letter.
_PROBE_QUESTIONS = ("Which module parses the flags?", "And the tests?")
_PROBE_ANSWER = "It is cli/flags.py, beside the app"


@dataclass(frozen=True)
class HistoryIds:
    """A turn's prompt after earlier turns: ``request`` with ``prompt_ids``, or as text with ``reason``."""

    request: ChatRequest
    reason: str | None = None


def glue_ids(
    tokenizer: ServerTokenizer, system: str | None, previous_user: str, user: str
) -> list[int] | None:
    """The template's tokens between an assistant answer and the next generation prompt, with ``user``.

    None when the template does not render the shorter conversation as a
    prefix of the longer one (the glue is then not well defined).
    """
    head = [{"role": "system", "content": system}] if system is not None else []
    before = [*head, {"role": "user", "content": previous_user}]
    after = [*before, {"role": "assistant", "content": ""}, {"role": "user", "content": user}]
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
        self._text_rule: str | bool | None = False  # False: not checked yet; None: holds; str: why not

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
        (else as their text, re-tokenised).
        """
        tokenizer = self._tokenizer()
        if tokenizer is None:
            return HistoryIds(request, "the server has no tokenize route")
        asking = dataclasses.replace(request, token_ids=True) if generated else request
        if not turns:
            return HistoryIds(asking, "the first turn")
        piece = _generated_piece if generated else _text_piece(tokenizer)
        if any(piece(turn) is None for turn in turns):
            return HistoryIds(asking, _missing(generated))
        if not generated and (broken := self._text_rule_fails(tokenizer, system)):
            return HistoryIds(asking, broken)
        if self._prompt is None or self._prompt_turns != len(turns) - 1:
            self._prompt = _rebuilt(
                tokenizer, system, turns, first_messages, piece=piece, first_ids=self._first_ids
            )
            self._prompt_turns = len(turns) - 1
        glue = glue_ids(tokenizer, system, turns[-1].question, user)
        if self._prompt is None or not glue:
            return HistoryIds(asking, "the chat template's glue between turns is not a prefix rule")
        answer = piece(turns[-1])
        assert answer is not None
        ids = _glued([*self._prompt, *answer], glue, drop_repeat=generated)
        return HistoryIds(dataclasses.replace(asking, prompt_ids=tuple(ids)))

    def answered(self, request: ChatRequest, completion: Completion, turns: int) -> None:
        """Take in the answer that made the conversation ``turns`` turns long (its prompt's ids)."""
        prompt = request.prompt_ids or completion.prompt_token_ids
        if prompt is None:
            self._prompt = None
            return
        self._prompt, self._prompt_turns = list(prompt), turns - 1

    def _text_rule_fails(self, tokenizer: ServerTokenizer, system: str | None) -> str | None:
        """Why text answers cannot be spliced in as their own tokens on this template (None: they can)."""
        if self._text_rule is False:
            self._text_rule = _check_text_rule(tokenizer, system)
        return self._text_rule if isinstance(self._text_rule, str) else None


def _missing(generated: bool) -> str:
    if generated:
        return "an earlier answer's generated ids are missing (or its reasoning is dropped by the template)"
    return "an earlier answer starts or ends with whitespace (the template may trim it)"


def _generated_piece(turn: TurnRecord) -> Sequence[int] | None:
    # Reasoning the template drops from history would stay in the ids.
    return turn.answer_ids if turn.history_answer == turn.answer else None


def _text_piece(tokenizer: ServerTokenizer) -> Callable[[TurnRecord], Sequence[int] | None]:
    """An answer's text as its own tokens; None where edge whitespace could be trimmed or merge."""
    found: dict[str, list[int]] = {}

    def piece(turn: TurnRecord) -> Sequence[int] | None:
        text = turn.history_answer
        if not text or text != text.strip():
            return None
        if text not in found:
            found[text] = tokenizer.encode(text)
        return found[text]

    return piece


def _check_text_rule(tokenizer: ServerTokenizer, system: str | None) -> str | None:
    """Whether prompt + the answer's tokens + glue gives the server's own tokens of a probe conversation."""
    head = [{"role": "system", "content": system}] if system is not None else []
    first, second = _PROBE_QUESTIONS
    before = [*head, {"role": "user", "content": first}]
    whole = [*before, {"role": "assistant", "content": _PROBE_ANSWER}, {"role": "user", "content": second}]
    glue = glue_ids(tokenizer, system, first, second)
    if glue is None:
        return "the chat template's glue between turns is not a prefix rule"
    spliced = [*tokenizer.tokenize_messages(before), *tokenizer.encode(_PROBE_ANSWER), *glue]
    if spliced != tokenizer.tokenize_messages(whole):
        return "the chat template renders an answer otherwise than its own tokens between the turns"
    return None


def _glued(ids: Sequence[int], glue: Sequence[int], *, drop_repeat: bool = True) -> list[int]:
    """``ids`` then ``glue``, less its first token where a generated answer already ended with it."""
    return [*ids, *(glue[1:] if drop_repeat and ids and ids[-1] == glue[0] else glue)]


def _rebuilt(
    tokenizer: ServerTokenizer,
    system: str | None,
    turns: Sequence[TurnRecord],
    first_messages: FirstMessages,
    *,
    piece: Callable[[TurnRecord], Sequence[int] | None],
    first_ids: FirstIds | None,
) -> list[int] | None:
    """The ids of the last prompt of ``turns`` (a resumed session): first prompt, then answers and glue."""
    known = first_ids(tokenizer) if first_ids is not None else None
    ids = list(known) if known is not None else tokenizer.tokenize_messages(first_messages())
    generated = piece is _generated_piece
    for index, turn in enumerate(turns[1:], start=1):
        answer = piece(turns[index - 1])
        assert answer is not None
        glue = glue_ids(
            tokenizer, system, turns[index - 1].question, turn.preamble + turn.question + turn.instruction
        )
        if not glue:
            return None
        ids = _glued([*ids, *answer], glue, drop_repeat=generated)
    return ids
