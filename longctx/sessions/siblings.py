"""How sibling questions go out: one shared prefix, many questions after it.

Siblings are requests that share everything up to their question. Three
dispatch strategies send them:

- ``together``: every sibling at once, at most ``concurrency`` in flight,
  the next sent the moment one finishes. An engine that shares an in-flight
  prefix (vLLM v1) prefills it once, and the server's own preparation of
  each long prompt (chat template, tokenization) overlaps the first
  prefill instead of waiting for it.
- ``lead``: the first alone until its first token (the server then holds
  the whole prefix in its cache), then the rest. For a scheduler that would
  otherwise prefill a shared prefix once per request admitted together.
- ``admitted``: the first alone until the server accepted it (its response
  headers arrived: vLLM sends them after rendering and tokenizing the
  prompt, just before scheduling), then the rest, so the lead is first in
  the queue while the others' preparation still overlaps its prefill.

``auto`` picks per engine and version from the measured rows of the
server's engine profile (``EngineProfile.dispatch``, in
:mod:`longctx.backends.engines`), which the sibling benchmark filled in.
A batch larger than the concurrency is sent as a continuous refill, never
in waves: some sibling is always in flight, so the engine keeps the
prefix's blocks referenced (not evictable) until the last question has
read them.

This module only sends and collects: what an answered request becomes (a
branch session, its records) is the caller's ``commit``.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field, replace
from functools import partial
from typing import TYPE_CHECKING

from longctx.backends.base import Backend, DeliveryHooks, Sent, ServerInfo
from longctx.backends.chat import ChatRequest
from longctx.backends.engines import measured_dispatch
from longctx.drivers import Fanout, Gate, Io, Plan
from longctx.errors import ConfigError
from longctx.options.groups import RequestOptions
from longctx.recordtypes import record_type
from longctx.report import build_report
from longctx.sessions.answers import Answer, Batch
from longctx.sessions.arguments import AskManyCall, AskManyOptions
from longctx.sessions.records import Committed, stored_answers
from longctx.sessions.requests import Asked

if TYPE_CHECKING:
    from longctx.store import Store

__all__ = [
    "Dispatch",
    "Outcome",
    "SiblingBatch",
    "batch_keys",
    "check_keys",
    "choose_dispatch",
    "dispatched",
    "reusing_answers",
]


@record_type
class Dispatch:
    """How one batch of siblings goes out: the strategy, how many in flight, and why."""

    strategy: str
    concurrency: int
    reason: str

    def describe(self) -> str:
        """One line for the batch report, e.g. ``together, up to 8 in flight (auto: ...)``."""
        return f"{self.strategy}, up to {self.concurrency} in flight ({self.reason})"


def batch_keys(session_id: str, questions: Sequence[str]) -> list[str]:
    """The answer key of each of ``questions`` in a batch of session ``session_id``.

    Made of the question's text (and its occurrence, for a question given
    twice), not its place: the same questions in another order, or with
    some added, find the answers stored before.
    """
    seen: Counter[str] = Counter()
    keys = []
    for question in questions:
        seen[question] += 1
        digest = hashlib.sha256(question.encode()).hexdigest()[:16]
        keys.append(f"batch:{session_id}:{digest}:{seen[question]}")
    return keys


def reusing_answers(
    store: Store,
    session_id: str,
    call: AskManyCall,
    options: AskManyOptions,
    ask: Callable[[AskManyCall, AskManyOptions], Plan[Batch]],
) -> Plan[Batch]:
    """The plan of a batch that asks only the questions of ``call`` without an answer stored under their keys.

    The keys are ``options``' or :func:`batch_keys` for ``session_id``;
    ``ask`` is the plan of a batch that asks all it is given. The stored
    answers come back in their places, counted in :attr:`Batch.reused`.
    """
    questions = call.questions
    keys = list(options.get("keys") or batch_keys(session_id, questions))
    yield Io(partial(check_keys, store, questions, keys, answered_ok=True))
    # The stored values made with the schema's model class.
    stored: dict[int, Answer] = yield Io(partial(stored_answers, store, questions, keys, call.schema))
    todo = [index for index in range(len(questions)) if index not in stored]
    note = f"{len(stored)} of {len(questions)} answers stored by an earlier call, not asked again"
    if not todo:
        report = build_report([], title=f"batch of {len(questions)} sibling questions", notes=[note])
        return Batch(tuple(stored[index] for index in range(len(questions))), report, reused=len(stored))
    rest: AskManyOptions = {**options, "keys": [keys[index] for index in todo]}
    asked = yield from ask(replace(call, questions=[questions[index] for index in todo]), rest)
    answers = {**stored, **dict(zip(todo, asked.answers, strict=True))}
    report = replace(asked.report, notes=(*asked.report.notes, note)) if stored else asked.report
    return Batch(tuple(answers[index] for index in range(len(questions))), report, reused=len(stored))


def check_keys(
    store: Store, questions: Sequence[str], keys: Sequence[str], *, answered_ok: bool = False
) -> None:
    """Refuse answer keys that do not name each question once, or (unless ``answered_ok``) have an answer.

    Raises :class:`~longctx.errors.ConfigError` before anything is sent.
    """
    if len(keys) != len(questions):
        raise ConfigError(f"ask_many got {len(keys)} keys for {len(questions)} questions")
    if any(not isinstance(key, str) or not key for key in keys):
        raise ConfigError("every answer key must be a non-empty string")
    repeated = sorted(key for key, count in Counter(keys).items() if count > 1)
    if repeated:
        raise ConfigError(f"answer keys given twice: {', '.join(repeated[:5])}")
    if answered_ok:
        return
    stored = store.sessions.answered(keys)
    if stored:
        raise ConfigError(
            f"{len(stored)} answer keys already have a stored answer: {', '.join(sorted(stored)[:5])}"
        )


def choose_dispatch(info: ServerInfo, options: RequestOptions, concurrency: int | None = None) -> Dispatch:
    """The dispatch for siblings sent to ``info``'s server.

    An explicit strategy or concurrency (``concurrency``, else the
    options') wins; what is left to ``auto`` / None comes from the first
    measured row of the server's engine profile for its version
    (:func:`longctx.backends.engines.measured_dispatch`).
    """
    row = measured_dispatch(info.profile, info.version)
    limit = next(value for value in (concurrency, options.concurrency, row.concurrency) if value is not None)
    if options.dispatch != "auto":
        return Dispatch(options.dispatch, limit, "asked for")
    engine = f"{info.engine} {info.version}" if info.version else info.engine
    return Dispatch(row.strategy, limit, f"auto for {engine}: {row.source}")


@record_type
class SiblingBatch:
    """The requests of one batch of siblings, their questions, and where they are recorded.

    ``asked``: what the batch asked for beyond text (``cite``'s grounding, a schema).
    """

    requests: tuple[ChatRequest, ...]
    questions: tuple[str, ...]
    batch_id: str
    session_id: str
    asked: Asked = field(default_factory=Asked)


@record_type
class Outcome:
    """What came back: committed results by question index, and the errors of the others."""

    results: Mapping[int, Committed]
    failures: Sequence[BaseException]


def dispatched(
    backend: Backend,
    batch: SiblingBatch,
    *,
    dispatch: Dispatch,
    commit: Callable[[Sent, int], Committed],
    on_answer: Callable[[Answer], None] | None = None,
    on_away: Callable[[str], None] | None = None,
) -> Plan[Outcome]:
    """The plan that sends ``batch``'s requests as ``dispatch`` says and commits each answer.

    Every request is sent even when one fails; the failures are returned,
    not raised, so the caller can store what was answered first. ``commit``
    (blocking: it writes the store) runs as each answer arrives, then
    ``on_answer`` hears of it. ``on_away`` is each delivery's
    (:class:`~longctx.backends.base.DeliveryHooks`): a request leaving its home replica.
    """
    gate = None if dispatch.strategy == "together" else Gate()

    def sibling(index: int) -> Callable[[], Plan[Committed]]:
        def plan() -> Plan[Committed]:
            hooks: DeliveryHooks = {} if on_away is None else {"on_away": on_away}
            if index == 0 and gate is not None:
                hooks["on_first_token" if dispatch.strategy == "lead" else "on_admitted"] = gate.open
            sent = yield from backend.delivery(batch.requests[index], **hooks)
            committed: Committed = yield Io(partial(commit, sent, index))
            if on_answer is not None:
                on_answer(committed.answer)
            return committed

        return plan

    results = yield Fanout(
        [sibling(index) for index in range(len(batch.requests))], dispatch.concurrency, gate
    )
    return Outcome(
        {index: result.value for index, result in enumerate(results) if result.error is None},
        [result.error for result in results if result.error is not None],
    )
