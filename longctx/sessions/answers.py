"""What questions return: :class:`Answer` (one answered question) and :class:`Batch` (siblings).

An answer's text is kept for later turns in :func:`history_form`: the way a
reasoning model's chat template renders it there.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from longctx.backends.base import Backend, Sent
from longctx.backends.chat import ChatRequest
from longctx.citations import CITE_INSTRUCTION, Citation, CitedAnswer, Grounding, file_link
from longctx.errors import ConfigError
from longctx.options.groups import RequestOptions
from longctx.report import SavingsReport
from longctx.schemas import AnswerSchema, SchemaSpec, answer_schema, json_value
from longctx.sessions.changes import Changes
from longctx.store import RequestRecord, Store, StoredPack, TurnRecord
from longctx.usage import Usage

__all__ = [
    "THINK_END",
    "Answer",
    "AskManyOptions",
    "AskOptions",
    "Asked",
    "Batch",
    "Committed",
    "answer_bound",
    "asked_how",
    "check_ask_many",
    "checked_concurrency",
    "checked_question",
    "cited_answers",
    "committed_records",
    "constrained",
    "grounding",
    "history_form",
    "refuse_unknown",
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


class AskOptions(TypedDict, total=False):
    """The keywords of ``ask``, which ``aask``, ``stream``, ``astream`` and ``plan_ask`` take too.

    ``max_tokens``: the answer's bound (default: the request options').
    ``cite``: the answer cites where it rests, each citation checked against
    the pack (:mod:`longctx.citations`). ``schema``: the answer is decoded to
    a JSON Schema and validated, its value in :attr:`Answer.data`
    (:mod:`longctx.schemas`: a pydantic model class, a JSON Schema dict, a
    concise spec or an :class:`~longctx.schemas.AnswerSchema`). Not both.
    ``ask_many`` takes them too (:class:`AskManyOptions`).
    """

    max_tokens: int | None
    cite: bool
    schema: SchemaSpec | None


@dataclass(frozen=True)
class Asked:
    """What one question asks for beyond its text: its citations checked, its answer typed (None: not)."""

    grounding: Grounding | None = None
    schema: AnswerSchema | None = None


def asked_how(options: Mapping[str, Any], where: str) -> tuple[bool, AnswerSchema | None]:
    """``cite`` and the :class:`AnswerSchema` of ``options`` (:class:`AskOptions`), checked before sending.

    An unknown keyword is a :class:`TypeError` naming ``where``; a schema
    that is none, or ``cite`` with a schema (a cited answer ends in prose
    sources, which no JSON answer can), a :class:`~longctx.errors.ConfigError`.
    """
    if where == "ask":
        refuse_unknown(options, AskOptions, where)
    cite, spec = bool(options.get("cite", False)), options.get("schema")
    if spec is None:
        return cite, None
    if cite:
        raise ConfigError("cite and schema cannot be asked together: a cited answer ends in prose sources")
    return cite, answer_schema(spec)


class AskManyOptions(AskOptions, total=False):
    """The keywords of ``ask_many`` on every session kind.

    ``max_tokens``: the answer's bound (default: the request options').
    ``concurrency``: how many in flight (default: the request options', else
    what was measured fastest for the engine). ``on_answer``: hears of each
    answer as it is stored. ``keys``: the caller's name for each question,
    stored with its answer; a key that already has an answer is refused
    before anything is sent, unless ``reuse_answered``: then its question
    is not asked and its stored answer comes back in the batch (without
    ``keys``, each question's key is :func:`~longctx.sessions.siblings.batch_keys`'
    for this session, so a batch stopped by Ctrl-C or a dead server is
    finished by asking the same questions again with ``reuse_answered``).
    ``cite`` and ``schema`` (:class:`AskOptions`) hold for every question.
    """

    concurrency: int | None
    on_answer: Callable[[Answer], None] | None
    keys: Sequence[str] | None
    reuse_answered: bool


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


def refuse_unknown(keywords: Mapping[str, object], accepted: type, where: str) -> None:
    """Raise :class:`TypeError` naming each keyword of ``keywords`` that the TypedDict ``accepted`` lacks.

    ``**options: Unpack[...]`` is checked only by a type checker; this is the check at run time.
    """
    known = set(getattr(accepted, "__required_keys__", ())) | set(getattr(accepted, "__optional_keys__", ()))
    unknown = sorted(set(keywords) - known)
    if unknown:
        raise TypeError(f"{where}() got unexpected keyword argument(s): {', '.join(unknown)}")


def check_ask_many(request: RequestOptions, questions: Sequence[str], options: AskManyOptions) -> None:
    """Refuse a bad ``ask_many`` call before anything is sent, on every session kind.

    An unknown keyword, one string given as the questions (each character
    would be a question) or a question that is no string is a
    :class:`TypeError` (naming its index); a ``max_tokens`` or ``concurrency``
    its option field's rule refuses, a blank question, or no question, a
    :class:`~longctx.errors.ConfigError`.
    """
    refuse_unknown(options, AskManyOptions, "ask_many")
    if isinstance(questions, str) or not isinstance(questions, Sequence):
        one = " (ask(question) asks one)" if isinstance(questions, str) else ""
        raise TypeError(f"ask_many takes a list of questions, not {type(questions).__name__}{one}")
    for index, question in enumerate(questions):
        checked_question(question, f"questions[{index}]")
    answer_bound(request, options.get("max_tokens"))
    checked_concurrency(options.get("concurrency"))
    if not questions:
        raise ConfigError("ask_many needs at least one question")


def checked_question(question: object, name: str = "question") -> str:
    """``question`` if it is a non-blank ``str``; else a TypeError (a ConfigError when blank) naming ``name``.

    A question of another type (None, a number) is refused before anything
    is sent; ``ask_many`` names the index (``questions[2]``).
    """
    if not isinstance(question, str):
        raise TypeError(f"{name} must be a str, not {type(question).__name__} ({question!r:.60})")
    if not question.strip():
        raise ConfigError("the question is empty" if name == "question" else f"{name} is empty")
    return question


def answer_bound(request: RequestOptions, max_tokens: int | None) -> int:
    """A per-call ``max_tokens``, checked by the option field's own rule; None: ``request``'s.

    0 is refused as the option object refuses it (it is not "not given"), and
    a negative bound never reaches the server.
    """
    if max_tokens is None:
        return request.max_tokens
    checked: int = RequestOptions.checked("max_tokens", max_tokens)
    return checked


def checked_concurrency(concurrency: int | None) -> int | None:
    """A per-call ``concurrency``, checked by :attr:`RequestOptions.concurrency`'s rule (None: not given)."""
    checked: int | None = RequestOptions.checked("concurrency", concurrency)
    return checked


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
