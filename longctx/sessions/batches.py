"""Sibling batches: questions asked side by side from a session's current point, each a branch.

:class:`SiblingBatches` is a session's part that asks them: the requests
built from the one history (:mod:`longctx.sessions.requests`), sent as the
engine's measured dispatch says (:mod:`longctx.sessions.siblings`), each
answer committed as a branch of its own with its key, the batch's counter
check and report. What it needs of its session is :class:`BatchHost`.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from functools import partial
from typing import Protocol

from longctx.backends.base import Backend, Sent
from longctx.drivers import Io, Plan
from longctx.options.groups import RequestOptions
from longctx.report import build_report
from longctx.sessions import siblings
from longctx.sessions.answers import Batch
from longctx.sessions.arguments import AskManyCall, AskManyOptions
from longctx.sessions.changes import Changes
from longctx.sessions.recording import Recording, branch_record
from longctx.sessions.records import Committed, committed_records
from longctx.sessions.requests import Asked, RequestBuilder, constrained, grounding
from longctx.sessions.warm import WarmStart
from longctx.store import CounterCheckRecord, SessionRecord, Store, StoredPack, TurnRecord
from longctx.verification import counters
from longctx.verification.canary import CanaryOptions, CanaryResult, CanarySampler
from longctx.verification.counters import CounterSnapshot, PendingCheck

__all__ = ["BatchHost", "SiblingBatches"]


class BatchHost(Protocol):
    """What a batch needs of its session (a :class:`~longctx.sessions.session.Session`)."""

    request: RequestOptions
    canaries: CanarySampler
    warming: WarmStart | None
    _turns: list[TurnRecord]
    _requests: RequestBuilder
    _recording: Recording
    _pending_checks: list[PendingCheck]

    @property
    def id(self) -> str: ...

    @property
    def pack(self) -> StoredPack | None: ...

    @property
    def backend(self) -> Backend: ...

    @property
    def store(self) -> Store: ...

    @property
    def affinity_key(self) -> str: ...

    def _opened(self) -> SessionRecord: ...

    def _pending_changes(self, history: Sequence[TurnRecord], max_tokens: int) -> Changes | None: ...

    def plan_canary(self, options: CanaryOptions | None = None) -> Plan[CanaryResult]: ...


class SiblingBatches:
    """A session's sibling batches: each question a branch from the current point, sharing the prefix."""

    def __init__(self, host: BatchHost) -> None:
        self._host = host

    def _prepared(
        self,
        questions: Sequence[str],
        max_tokens: int,
        changes: Changes | None,
        keys: Sequence[str] | None,
        asked: Asked,
    ) -> siblings.SiblingBatch:
        host = self._host
        if keys is not None:
            siblings.check_keys(host.store, questions, keys)
        if host.warming is not None:
            host.warming.wait()  # siblings take no turn lock; they share the warmed prefix
        history = list(host._turns)
        requests = [
            host._requests.as_ids(
                host._requests.chat_request(q, history, max_tokens, changes, asked.grounding), history
            )
            for q in questions
        ]
        record = host._opened()
        shaped = tuple(constrained(request, asked, host.backend) for request in requests)
        batch_id = uuid.uuid4().hex[:16]
        return siblings.SiblingBatch(shaped, tuple(questions), batch_id, record.id, asked)

    def _commit(
        self,
        sent: Sent,
        question: str,
        batch: siblings.SiblingBatch,
        changes: Changes | None,
        key: str | None,
        *,
        index: int = 0,
    ) -> Committed:
        host = self._host
        record = host._opened()
        branch = branch_record(record, "sibling", question[:80], len(host._turns))
        # Its place among the batch's questions: `sessions show` lists a batch in question order.
        branch = dataclasses.replace(branch, settings={**branch.settings, "batch_index": index})
        committed = committed_records(
            sent,
            session_id=branch.id,
            position=0,
            question=question,
            purpose="sibling",
            batch_id=batch.batch_id,
            changes=changes,
            inherited_turns=branch.parent_turns or 0,
            asked=batch.asked,
        )
        # The batch's parent is stored with its first sibling, so a batch
        # stopped before any answer leaves no parent without branches.
        with host._recording.first_write(host.pack, record) as opening:
            host.store.sessions.commit_turn(
                committed.turn, committed.request, opening=opening, new_session=branch, key=key
            )
        return committed

    def plan(self, call: AskManyCall, options: AskManyOptions) -> Plan[Batch]:
        """The plan of a checked batch; with ``reuse_answered``, of its unanswered questions only."""
        host = self._host
        if options.get("reuse_answered"):
            return (yield from siblings.reusing_answers(host.store, host.id, call, options, self._plan_all))
        return (yield from self._plan_all(call, options))

    def _plan_all(self, call: AskManyCall, options: AskManyOptions) -> Plan[Batch]:
        """The plan of a batch that asks every one of its questions (see :meth:`plan`)."""
        host = self._host
        questions, max_tokens, concurrency = call.questions, call.max_tokens, call.concurrency
        keys = options.get("keys")
        changes = yield Io(partial(host._pending_changes, host._turns, max_tokens))
        asked = Asked(grounding(call.cite, host.pack, host._turns, changes), call.schema)
        batch = yield Io(partial(self._prepared, questions, max_tokens, changes, keys, asked))
        dispatch = yield Io(partial(self._dispatch, batch, concurrency))
        opened = partial(CounterSnapshot.around, host.backend, host.affinity_key, host.request.counter_check)
        with (yield Io(opened)) as snapshot:
            outcome = yield from siblings.dispatched(
                host.backend,
                batch,
                dispatch=dispatch,
                commit=lambda sent, index: self._commit(
                    sent, batch.questions[index], batch, changes, keys[index] if keys else None, index=index
                ),
                on_answer=options.get("on_answer"),
                on_away=snapshot.follow,
            )
            finished: Batch = yield Io(partial(self._finished, batch, outcome, snapshot, dispatch))
        if host.canaries.due(len(questions)):
            yield from host.plan_canary()
        return finished

    def _dispatch(self, batch: siblings.SiblingBatch, concurrency: int | None) -> siblings.Dispatch:
        """How this batch goes out: to the server its requests are routed to, as measured fastest there."""
        host = self._host
        server = host.backend.server_for(batch.requests[0].affinity_key)
        return siblings.choose_dispatch(server, host.request, concurrency)

    def _finished(
        self,
        batch: siblings.SiblingBatch,
        outcome: siblings.Outcome,
        snapshot: CounterSnapshot,
        dispatch: siblings.Dispatch,
    ) -> Batch:
        host = self._host
        records = [outcome.results[i].request for i in sorted(outcome.results)]
        settling = snapshot.close(batch.session_id, batch.batch_id, records)
        keep = host._recording.keep  # in memory until the session is stored, if no sibling was answered

        def kept(checks: list[CounterCheckRecord]) -> None:
            keep(host.store, checks=checks, skips=settling.skips)

        check = counters.batch_check(settling, kept, host._pending_checks)
        if outcome.failures:
            raise outcome.failures[0]
        answers = tuple(outcome.results[i].answer for i in range(len(batch.questions)))
        report = build_report(
            records,
            title=f"batch of {len(batch.questions)} sibling questions",
            counter_check=check,
            dispatch=dispatch.describe(),
        )
        return Batch(answers, report)
