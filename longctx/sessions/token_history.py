"""Token-id history: the previous answers sent back as the token ids the model generated.

An answer sent back as text is served from the cache only as far as
re-tokenising it gives back the generated ids (:mod:`longctx.sessions.reuse`;
docs/api.md, "Answer reuse").

With ``RequestOptions(token_history=True)`` on vLLM or SGLang a session
asks for the ids of every turn (the prompt's and the answer's) and sends
each later turn to ``/v1/completions`` as token ids: the previous turn's
prompt ids, its answer's generated ids, then the chat template's glue (the
end of the assistant message and the next user message, with the
generation prompt). Each prompt then starts with every token the server
computed for the turn before, and the whole previous answer is read from the
cache (block-rounded; measured on both engines: docs/benchmarks.md,
``sessions-answer-reuse``).

The glue comes from the server's own template, through its tokenize route:
``[system, user (previous question)]`` and ``[system, user, assistant "",
user (new message)]``, each with the generation prompt; the second less the
first is the glue, provided the first is a prefix of the second (otherwise
the turn goes out as text). An answer that ended with the token the glue
starts with (the end-of-turn token) does not get it twice.

The turn goes out as text (a chat request, asking for ids so that the next
one can use them) when the engine is neither vLLM nor SGLang, for the first
turn, when a turn's ids are missing, when the previous answer had reasoning
the template drops from history (its ids would keep it), or when the glue
check fails. Siblings and warm starts always send text. What is lost on
``/v1/completions``: the server's chat-side parsing (a reasoning parser's
separate field, tool calls), hence opt-in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from longctx.backends.chat import ChatRequest, Completion
from longctx.backends.tokenizer import ServerTokenizer
from longctx.store import TurnRecord

__all__ = ["TokenHistory", "glue_ids"]

FirstMessages = Callable[[], list[dict[str, str]]]
"""The messages of the first turn's request (pack and first question): a resumed session's ids start there."""


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
    """The token ids of one session's conversation through its last answer, and the next prompt.

    ``tokenizer`` gives the server's tokenizer, or None where the server has
    no tokenize route (then every request is left as it is).
    """

    def __init__(self, tokenizer: Callable[[], ServerTokenizer | None]) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] | None = None
        self._turns = 0  # how many turns the ids cover

    def request(
        self,
        request: ChatRequest,
        turns: Sequence[TurnRecord],
        *,
        system: str | None,
        user: str,
        first_messages: FirstMessages,
    ) -> ChatRequest:
        """``request`` (the user message ``user`` after ``turns``) as token ids, or asking for them.

        ``system`` is the system message every request starts with (None: none).
        """
        tokenizer = self._tokenizer()
        if tokenizer is None:
            return request
        asking = dataclasses.replace(request, token_ids=True)
        if not turns or not all(_reusable(turn) for turn in turns):
            return asking
        if self._ids is None or self._turns != len(turns):
            self._ids, self._turns = _rebuilt(tokenizer, system, turns, first_messages), len(turns)
        glue = glue_ids(tokenizer, system, turns[-1].question, user)
        if self._ids is None or not glue:
            return asking
        return dataclasses.replace(asking, prompt_ids=tuple(_glued(self._ids, glue)))

    def answered(self, request: ChatRequest, completion: Completion, turns: int) -> None:
        """Take in the answer that made the conversation ``turns`` turns long."""
        prompt = request.prompt_ids or completion.prompt_token_ids
        if not request.token_ids or prompt is None or completion.token_ids is None:
            self._ids = None
            return
        self._ids, self._turns = [*prompt, *completion.token_ids], turns


def _glued(ids: Sequence[int], glue: Sequence[int]) -> list[int]:
    """``ids`` then ``glue``, less its first token where the answer already ended with it (end of turn)."""
    return [*ids, *(glue[1:] if ids and ids[-1] == glue[0] else glue)]


def _reusable(turn: TurnRecord) -> bool:
    # Reasoning the template drops from history would stay in the ids.
    return turn.answer_ids is not None and turn.history_answer == turn.answer


def _rebuilt(
    tokenizer: ServerTokenizer, system: str | None, turns: Sequence[TurnRecord], first_messages: FirstMessages
) -> list[int] | None:
    """The ids of ``turns`` from their stored answers (a resumed session): the first prompt, then glue."""
    ids = tokenizer.tokenize_messages(first_messages())
    for index, turn in enumerate(turns):
        assert turn.answer_ids is not None
        if index:
            glue = glue_ids(
                tokenizer, system, turns[index - 1].question, turn.preamble + turn.question + turn.instruction
            )
            if not glue:
                return None
            ids = _glued(ids, glue)
        ids += turn.answer_ids
    return ids
