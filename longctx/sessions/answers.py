"""What questions return: :class:`Answer` (one answered question) and :class:`Batch` (siblings).

An answer's text is kept for later turns in :func:`history_form`: the way a
reasoning model's chat template renders it there.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from longctx.citations import Citation
from longctx.recordtypes import record_type
from longctx.report import SavingsReport
from longctx.sessions.changes import Changes
from longctx.usage import Usage

__all__ = ["THINK_END", "Answer", "Batch", "history_form"]

THINK_END = "</think>"


def history_form(answer: str) -> str:
    """``answer`` as a reasoning model's chat template renders it in a later turn.

    Everything up to the last ``</think>`` is dropped, then leading newlines
    (the rule of Qwen3's template, which DeepSeek-R1 and Kimi K2-Thinking
    follow in substance).
    """
    if THINK_END in answer:
        return answer.rsplit(THINK_END, maxsplit=1)[-1].lstrip("\n")
    return answer


@record_type
class Answer:
    """One answered question. ``str(answer)`` is its text.

    An answer of a :class:`~longctx.sessions.sharded.ShardedSession` is the
    combined (reduce) answer with the answers of every shard it was made
    from in ``shard_answers``; for any other session ``shard_answers`` is
    empty. ``appended`` is set when the question's message carried files
    changed since the pack (see :mod:`longctx.sessions.changes`). ``turn``
    is the answer's index in its session's ``turns``, counting the turns a
    fork or a sibling follows; what longctx prints numbers turns from 1, so
    :meth:`to_dict` (the CLI's ``--json``), the chat, the report and
    ``sessions show`` call it turn ``turn + 1``. ``finish_reason`` is the
    server's (``"length"``: cut at ``max_tokens``).
    ``citations``: where the answer says it rests, each checked against the
    pack (see :mod:`longctx.citations`), when asked for with ``cite=True``;
    None when not asked for. ``data``: the answer's validated value when it
    was asked with a ``schema`` (:mod:`longctx.schemas`: a model instance
    for a pydantic class, a list with ``multi``, else the parsed JSON), and
    ``schema`` that schema's stored form; None without one.
    """

    question: str
    text: str
    reasoning: str | None
    finish_reason: str | None
    usage: Usage
    session_id: str
    turn: int
    request_id: str
    attempts: int
    shard_answers: tuple[Answer, ...] = ()
    appended: Changes | None = None
    citations: tuple[Citation, ...] | None = None
    data: Any = None
    schema: Mapping[str, Any] | None = None

    def __str__(self) -> str:
        return self.text

    def to_dict(self) -> dict[str, Any]:
        """The JSON form the CLI prints: question, answer, usage, where it is stored."""
        data: dict[str, Any] = {
            "question": self.question,
            "answer": self.text,
            "reasoning": self.reasoning,
            "session_id": self.session_id,
            "turn": self.turn + 1,  # numbered from 1, as the chat, the report and `sessions show` number it
            "finish_reason": self.finish_reason,
            "usage": self.usage.to_dict(),
            "attempts": self.attempts,
        }
        if self.appended is not None:
            data["appended"] = [change.describe() for change in self.appended.changes]
        if self.citations is not None:
            data["citations"] = [citation.to_dict() for citation in self.citations]
        if self.schema is not None:
            from longctx.schemas import json_value  # only a typed answer's: a new process loads it then

            data["data"] = json_value(self.data)
            data["schema"] = dict(self.schema)
        if self.shard_answers:
            data["shard_answers"] = [answer.to_dict() for answer in self.shard_answers]
        return data


@record_type
class Batch:
    """The answers of :meth:`Conversation.ask_many`, in question order, and their report.

    ``reused`` counts the answers an earlier call stored under their keys
    and this one did not ask again (``reuse_answered``); the report covers
    the requests of this call.
    """

    answers: tuple[Answer, ...]
    report: SavingsReport
    reused: int = 0

    def __iter__(self) -> Iterator[Answer]:
        return iter(self.answers)

    def __len__(self) -> int:
        return len(self.answers)

    def __getitem__(self, index: int) -> Answer:
        return self.answers[index]
