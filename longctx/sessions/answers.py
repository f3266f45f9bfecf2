"""What questions return: :class:`Answer` (one answered question) and :class:`Batch` (siblings).

An answer's text is kept for later turns in :func:`history_form`: the way a
reasoning model's chat template renders it there.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from longctx.backends.base import Backend, Sent
from longctx.backends.chat import ChatRequest
from longctx.citations import CITE_INSTRUCTION, Citation, CitedAnswer, Grounding, file_link
from longctx.report import SavingsReport
from longctx.schemas import AnswerSchema, json_value
from longctx.sessions.changes import Changes
from longctx.store import RequestRecord, Store, StoredPack, TurnRecord
from longctx.usage import Usage

__all__ = [
    "THINK_END",
    "Answer",
    "Asked",
    "Batch",
    "Committed",
    "cited_answers",
    "committed_records",
    "constrained",
    "grounding",
    "history_form",
    "request_record",
    "stored_answers",
    "stored_citations",
    "stored_data",
]

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


@dataclass(frozen=True)
class Answer:
    """One answered question. ``str(answer)`` is its text.

    An answer of a :class:`~longctx.sessions.sharded.ShardedSession` is the
    combined (reduce) answer with the answers of every shard it was made
    from in ``shard_answers``; for any other session ``shard_answers`` is
    empty. ``appended`` is set when the question's message carried files
    changed since the pack (see :mod:`longctx.sessions.changes`). ``turn``
    is the answer's index in its session's ``turns``, counting the turns a
    fork or a sibling follows (``sessions show`` lists it under that number).
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
            "turn": self.turn,
            "usage": self.usage.to_dict(),
            "attempts": self.attempts,
        }
        if self.appended is not None:
            data["appended"] = [change.describe() for change in self.appended.changes]
        if self.citations is not None:
            data["citations"] = [citation.to_dict() for citation in self.citations]
        if self.schema is not None:
            data["data"] = json_value(self.data)
            data["schema"] = dict(self.schema)
        if self.shard_answers:
            data["shard_answers"] = [answer.to_dict() for answer in self.shard_answers]
        return data


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Committed:
    """What one answered request left: its turn, its request record, and the answer."""

    turn: TurnRecord
    request: RequestRecord
    answer: Answer


@dataclass(frozen=True)
class Asked:
    """What one question asks for beyond its text: its citations checked, its answer typed (None: not)."""

    grounding: Grounding | None = None
    schema: AnswerSchema | None = None


def stored_answers(
    store: Store, questions: Sequence[str], keys: Sequence[str], schema: AnswerSchema | None = None
) -> dict[int, Answer]:
    """The answers ``store`` holds under ``keys`` (one per question), by question index, with their usage.

    An answer stored with a schema has its ``data`` again, made with
    ``schema``'s model class where it is the same schema.
    """
    found = store.sessions.answered(keys)
    if not found:
        return {}
    owners = sorted({turn.session_id for turn in found.values()})
    records = {record.id: record for record in store.sessions.requests(session_ids=owners)}
    # A stored position counts its own session's turns; an answer's turn counts those it follows too.
    inherited = {owner: store.sessions.session(owner).parent_turns or 0 for owner in owners}
    answers: dict[int, Answer] = {}
    for index, key in enumerate(keys):
        turn = found.get(key)
        if turn is None:
            continue
        record = records.get(turn.request_id or "")
        answers[index] = Answer(
            question=questions[index],
            text=turn.answer,
            reasoning=turn.reasoning,
            finish_reason=None,
            usage=record.usage if record is not None else Usage(None, None, None, None, None, None),
            session_id=turn.session_id,
            turn=inherited[turn.session_id] + turn.position,
            request_id=turn.request_id or "",
            attempts=record.attempts if record is not None else 1,
            citations=stored_citations(turn),
            data=stored_data(turn, schema),
            schema=turn.schema,
        )
    return answers


def grounding(
    cite: bool | None, pack: StoredPack | None, history: Sequence[TurnRecord], changes: Changes | None
) -> Grounding | None:
    """What a question asked with ``cite`` adds to its request and checks its answer in; None without it.

    Its citations are checked in the documents the request carries: the
    ``pack``'s, then the changed files the ``history`` and this
    question's ``changes`` appended, a later copy of a path replacing an earlier one.
    """
    if not cite:
        return None
    appended = [turn.preamble for turn in history] + [changes.text if changes is not None else ""]
    return Grounding(CITE_INSTRUCTION, (pack.prefix if pack is not None else "", *appended))


def stored_citations(turn: TurnRecord) -> tuple[Citation, ...] | None:
    """The citations ``turn`` was stored with (None: not asked for)."""
    return None if turn.citations is None else tuple(Citation.from_dict(data) for data in turn.citations)


def cited_answers(turns: Sequence[TurnRecord], roots: Sequence[str]) -> tuple[CitedAnswer, ...]:
    """The report's entries of the ``turns`` asked with ``cite``, each citation linked under ``roots``."""
    entries = []
    for turn in turns:
        citations = stored_citations(turn)
        if citations is not None:
            links = tuple(file_link(citation.path, roots) for citation in citations)
            entries.append(CitedAnswer(turn.question, turn.position, citations, links))
    return tuple(entries)


def stored_data(turn: TurnRecord, schema: AnswerSchema | None = None) -> Any:
    """The value of ``turn``'s answer, asked with a schema (None without), validated when stored.

    Made with ``schema``'s model class when ``schema`` is the one it was
    asked with, else the parsed JSON.
    """
    if turn.schema is None:
        return None
    asked = AnswerSchema.from_dict(turn.schema)
    same = schema is not None and schema.digest == asked.digest
    return (schema if same and schema is not None else asked).validated(turn.answer, None)


def constrained(request: ChatRequest, schema: AnswerSchema | None, backend: Backend) -> ChatRequest:
    """``request`` with the body fields that hold its answer to ``schema`` on the server it goes to.

    The prompt is left as it is (the schema costs no cached token); the
    fields are the engine profile's (:meth:`AnswerSchema.request_fields`).
    """
    if schema is None:
        return request
    fields = schema.request_fields(backend.server_for(request.affinity_key))
    return dataclasses.replace(request, constraint=fields)


def request_record(
    sent: Sent, *, session_id: str, batch_id: str | None, purpose: str, ended_at: float
) -> RequestRecord:
    """The request row of ``sent``, which ended at ``ended_at`` (its start is that less its total time)."""
    usage = sent.completion.usage
    return RequestRecord(
        id=sent.request_id,
        session_id=session_id,
        batch_id=batch_id,
        purpose=purpose,
        started_at=ended_at - (usage.total_seconds or 0.0),
        base_url=sent.server.api_url,
        engine=sent.server.engine,
        model=sent.server.model,
        usage=usage,
        attempts=sent.attempts,
    )


def committed_records(
    sent: Sent,
    *,
    session_id: str,
    position: int,
    question: str,
    purpose: str,
    batch_id: str | None,
    changes: Changes | None = None,
    inherited_turns: int = 0,
    asked: Asked | None = None,
) -> Committed:
    """The records of one answered request (its turn and its request row), and the answer they make.

    ``position`` counts the turns of the session itself (how the turn is
    stored); the answer's ``turn`` adds the ``inherited_turns`` a fork or a
    sibling follows, so that it is the answer's index in ``session.turns``.
    ``asked``: with a grounding (a cited question) the answer's citations
    are read and checked, and kept with the turn; with a schema the answer
    is validated first: one that is cut, not JSON or refused raises
    :class:`~longctx.errors.InvalidAnswer` and makes no records.
    """
    completion = sent.completion
    grounding, schema = (asked.grounding, asked.schema) if asked is not None else (None, None)
    data = schema.validated(completion.text, completion.finish_reason) if schema is not None else None
    citations = grounding.citations(completion.text) if grounding is not None else None
    now = time.time()
    request = request_record(sent, session_id=session_id, batch_id=batch_id, purpose=purpose, ended_at=now)
    turn = TurnRecord(
        session_id=session_id,
        position=position,
        question=question,
        answer=completion.text,
        history_answer=history_form(completion.text),
        reasoning=completion.reasoning,
        request_id=sent.request_id,
        created_at=now,
        preamble=changes.text if changes is not None else "",
        file_changes=dict(changes.files) if changes is not None else {},
        answer_ids=completion.token_ids,
        instruction=grounding.instruction if grounding is not None else "",
        citations=None if citations is None else tuple(citation.to_dict() for citation in citations),
        schema=schema.to_dict() if schema is not None else None,
    )
    answer = Answer(
        question=question,
        text=completion.text,
        reasoning=completion.reasoning,
        finish_reason=completion.finish_reason,
        usage=completion.usage,
        session_id=session_id,
        turn=inherited_turns + position,
        request_id=sent.request_id,
        attempts=sent.attempts,
        appended=changes,
        citations=citations,
        data=data,
        schema=turn.schema,
    )
    return Committed(turn, request, answer)
