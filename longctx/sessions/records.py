"""Record mapping: an answered request as the store's records, and stored records back as answers.

:func:`committed_records` (a turn and its request record, :class:`Committed`),
:func:`request_record`; :func:`stored_answers`, :func:`stored_data`,
:func:`stored_citations` and :func:`cited_answers` read them back.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from longctx.backends.base import Sent
from longctx.citations import Citation, CitedAnswer, file_link
from longctx.recordtypes import record_type
from longctx.sessions.answers import Answer, history_form
from longctx.sessions.changes import Changes
from longctx.sessions.requests import Asked
from longctx.store import RequestRecord, Store, TurnRecord
from longctx.usage import Usage

if TYPE_CHECKING:
    from longctx.schemas import AnswerSchema


__all__ = [
    "Committed",
    "cited_answers",
    "committed_records",
    "request_record",
    "stored_answers",
    "stored_citations",
    "stored_data",
]


@record_type
class Committed:
    """What one answered request left: its turn, its request record, and the answer."""

    turn: TurnRecord
    request: RequestRecord
    answer: Answer


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
            # Numbered from 1, as every turn longctx prints.
            entries.append(CitedAnswer(turn.question, turn.position + 1, citations, links))
    return tuple(entries)


def stored_data(turn: TurnRecord, schema: AnswerSchema | None = None) -> Any:
    """The value of ``turn``'s answer, asked with a schema (None without), validated when stored.

    Made with ``schema``'s model class when ``schema`` is the one it was
    asked with, else the parsed JSON.
    """
    if turn.schema is None:
        return None
    from longctx.schemas import AnswerSchema  # only a typed answer's: a new process loads it then

    asked = AnswerSchema.from_dict(turn.schema)
    same = schema is not None and schema.digest == asked.digest
    return (schema if same and schema is not None else asked).validated(turn.answer, None)


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
    # A cited answer in its schema's JSON is kept as its answer and a Sources block; the history keeps
    # what the model wrote, so the next turn's prompt holds the tokens the engine cached.
    cited = grounding.read(completion.text) if grounding is not None else None
    text = cited.text if cited is not None else completion.text
    citations = cited.citations if cited is not None else None
    now = time.time()
    request = request_record(sent, session_id=session_id, batch_id=batch_id, purpose=purpose, ended_at=now)
    turn = TurnRecord(
        session_id=session_id,
        position=position,
        question=question,
        answer=text,
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
        text=text,
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
