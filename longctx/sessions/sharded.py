"""Questions over a corpus larger than the window: map over shards, then reduce.

Opt-in: :class:`ShardedSession` splits the corpus into shards that each fit
the window (:func:`longctx.packing.build_shards`), each a stable prefix of its
own. A question goes to every shard at once as a turn of that shard's own
session (map), so a follow-up question to the same shard reuses the
shard's cached prefix and history; then one request combines the shard
answers (reduce). It is a :class:`~longctx.sessions.conversation.Conversation`
like any session; its answer is the reduce one, with the shards' answers in
:attr:`Answer.shard_answers <longctx.sessions.answers.Answer.shard_answers>`.

In the store, a sharded session is a record of kind ``sharded``; its shard
sessions (kind ``shard``) and its reducer (kind ``reduce``) are its
branches, and each reduce request is a fork of the reducer with no history.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Self, TypeVar, Unpack

from longctx.drivers import Fanout, Io, Plan, Result
from longctx.errors import ConfigError
from longctx.options.groups import DEFAULT_CONCURRENCY, CorpusOptions, RequestOptions
from longctx.packing import Pack, ShardedPack
from longctx.report import Prices, SavingsReport, build_report
from longctx.sessions.answers import Answer, Batch
from longctx.sessions.arguments import AskManyCall, AskManyOptions, AskOptions, checked_ask, checked_ask_many
from longctx.sessions.conversation import Conversation
from longctx.sessions.corpus_sessions import (
    CorpusSessionOptions,
    Paths,
    as_paths,
    checked_session_options,
    server_corpus_options,
    shards_for_server,
)
from longctx.sessions.resources import Resources
from longctx.sessions.session import Session, served_settings
from longctx.sources.corpus import check_sources, load_corpus
from longctx.store import SessionRecord
from longctx.verification.counters import stored_check

if TYPE_CHECKING:
    from longctx.schemas import AnswerSchema


__all__ = ["KIND", "REDUCE_SYSTEM", "ShardedSession"]

REDUCE_SYSTEM = (
    "You combine partial answers. Each partial answer below was written from one part of a "
    "larger set of documents. Answer the question from all of them: keep what they agree on, "
    "say where they differ, and do not invent what none of them says."
)

KIND = "sharded"
T = TypeVar("T")


def _values(results: Sequence[Result[T]]) -> tuple[T, ...]:
    """Every plan's value, in order; else the first error, once all have ended (the rest are stored)."""
    for result in results:
        if result.error is not None:
            raise result.error
    return tuple(result.value for result in results)  # type: ignore[misc]


def _reduce_prompt(question: str, partial: Sequence[Answer]) -> str:
    parts = "\n\n".join(
        f'<partial-answer part="{index}">\n{answer.text}\n</partial-answer>'
        for index, answer in enumerate(partial, start=1)
    )
    return f"{REDUCE_SYSTEM}\n\nQuestion: {question}\n\n{parts}"


class ShardedSession(Conversation):
    """Sessions over every shard of an oversized corpus, and a reducer.

    Takes :class:`~longctx.sessions.corpus_sessions.RepoSession`'s arguments
    (:class:`~longctx.sessions.corpus_sessions.CorpusSessionOptions`), plus
    ``sharded`` (shards already built, instead of loading ``paths``).
    Shards leave out the earlier copies of a layered pack, so
    ``CorpusOptions.max_stale_share`` only chooses the order of the
    documents. Like every session, constructing one does no I/O: the first
    question loads, connects and builds the shards.
    """

    _default_title = "sharded session"

    def __init__(
        self,
        paths: Paths,
        *,
        sharded: ShardedPack | Pack | None = None,
        **given: Unpack[CorpusSessionOptions],
    ) -> None:
        options = checked_session_options(type(self).__name__, given)
        self.paths = as_paths(paths)
        self.corpus_options = options.get("corpus") or CorpusOptions()
        self.request = options.get("request") or RequestOptions()
        self._resources = Resources(
            server=options.get("server"),
            backend=options.get("backend"),
            store=options.get("store"),
            on_progress=options.get("on_progress"),
        )
        self._title = options.get("title")
        self._given = sharded
        self._new_id = uuid.uuid4().hex[:16]
        self._record: SessionRecord | None = None
        self._shards: tuple[Session, ...] | None = None
        self._reducer: Session | None = None
        self._reductions: list[Session] = []  # the reducer's forks asked here: their checks may be in flight

    # -- lifecycle ------------------------------------------------------------

    @classmethod
    def restore(cls, record: SessionRecord, resources: Resources) -> Self:
        """The sharded session a stored ``record`` describes, each shard with every committed turn.

        Raises :class:`~longctx.errors.ConfigError` when it is not a sharded session.
        """
        if record.kind != KIND:
            raise ConfigError(f"session {record.id} is not a sharded session (it is a {record.kind})")
        session = cls((), request=RequestOptions.from_dict(record.settings))
        session._resources = resources
        session._record = record
        session._shards = tuple(
            Session.restore(resources.store.sessions.session(part), resources.borrowed())
            for part in record.settings["shards"]
        )
        session._reducer = Session.restore(
            resources.store.sessions.session(record.settings["reducer"]), resources.borrowed()
        )
        return session

    def settle(self) -> None:
        # Its parts share its backend and store: their work must be written before those close.
        for part in self._parts():
            part.settle()
            if part in self._reductions:  # a reduce's fork is asked once: done with, once settled
                self._reductions.remove(part)

    def _parts(self) -> tuple[Session, ...]:
        """The sessions this one has asked through: shards, reducer and the reducer's forks."""
        if self._shards is None or self._reducer is None:
            return ()
        return (*self._shards, self._reducer, *self._reductions)

    @property
    def shards(self) -> tuple[Session, ...]:
        """One session per shard, in corpus order (built on first use)."""
        self._prepare()
        assert self._shards is not None
        return self._shards

    @property
    def reducer(self) -> Session:
        """The session whose forks combine the shards' answers."""
        self._prepare()
        assert self._reducer is not None
        return self._reducer

    def _prepare(self) -> None:
        with self._resources.lock:
            if self._shards is not None:
                return
            if self._given is None:
                check_sources(self.paths)  # a missing path fails before any server is contacted
            backend, store = self.backend, self.store
            given = self._given
            if given is None:
                self._resources.progress("reading files")
                options = server_corpus_options(self.corpus_options, backend, store)
                corpus = load_corpus(self.paths, options, store=store)
                packs = shards_for_server(corpus, backend, store=store, request=self.request)
                label = corpus.root or "documents"
            else:
                packs = given.shards if isinstance(given, ShardedPack) else (given,)
                label = "documents"
            count = len(packs)
            shards = [
                Session(backend, shard, store=store, request=self.request, title=f"shard {index}/{count}")
                for index, shard in enumerate(packs, start=1)
            ]
            reducer = Session(backend, None, store=store, request=self.request, title="reduce")
            for part in (*shards, reducer):
                part._resources = self._resources.borrowed()  # closed with this session, as resumed ones are
            record = SessionRecord(
                id=self._new_id,
                created_at=time.time(),
                kind=KIND,
                title=self._title or f"{label}: {count} shards",
                pack_fingerprint=None,
                parent_id=None,
                parent_turns=None,
                settings={
                    **served_settings(self.request, backend),
                    "shards": [shard.id for shard in shards],
                    "reducer": reducer.id,
                },
            )
            store.sessions.create_session(record)
            for shard in shards:
                shard.attach(record.id, "shard")
            reducer.attach(record.id, "reduce")
            # Recorded now, with the sharded session: resume finds every part even if one never asked.
            for part in (*shards, reducer):
                part.persist()
            self._record, self._shards, self._reducer = record, tuple(shards), reducer

    # -- questions ----------------------------------------------------------

    def plan_ask(
        self, question: str, *, purpose: str = "turn", streamed: bool = False, **options: Unpack[AskOptions]
    ) -> Plan[Answer]:
        """Every shard at once as its own turn (map), then one request that combines their answers (reduce).

        ``purpose`` is recorded only by the session kinds that send one request;
        here each map request is ``map I/N`` and the combining one ``reduce``.
        ``cite`` is refused: the combined answer is written from the shards'
        answers, not from a pack its citations could be checked in; so is ``schema``.
        ``streamed``: the combining request hands its text out as it comes
        (one shard's answer, which needs no combining, streams itself).
        """
        self._resources.check_open()
        # Refused at the call, before any shard is asked.
        call = checked_ask(self.request, question, options, "stream" if streamed else "ask")
        _refuse_asking(call.cite, call.schema)
        return self._plan_map_reduce(call.question, call.max_tokens, streamed)

    def _plan_map_reduce(self, question: str, max_tokens: int, streamed: bool) -> Plan[Answer]:
        """The plan of :meth:`plan_ask` once its arguments are checked."""
        self._resources.check_open()  # again: the session may have been closed since the call
        shards = yield Io(lambda: self.shards)
        count = len(shards)
        if count == 1 and streamed:
            only: Answer = yield from shards[0].plan_ask(
                question, max_tokens=max_tokens, purpose="map 1/1", streamed=True
            )
            return dataclasses.replace(only, shard_answers=(only,))
        plans = [
            partial(shard.plan_ask, question, max_tokens=max_tokens, purpose=f"map {index}/{count}")
            for index, shard in enumerate(shards, start=1)
        ]
        partial_answers = _values(
            (yield Fanout(plans, min(count, self.request.concurrency or DEFAULT_CONCURRENCY)))
        )
        return (yield from self._reduced(question, partial_answers, max_tokens, streamed=streamed))

    def _reduced(
        self,
        question: str,
        partial_answers: tuple[Answer, ...],
        max_tokens: int | None,
        *,
        streamed: bool = False,
    ) -> Plan[Answer]:
        if len(partial_answers) == 1:
            return dataclasses.replace(partial_answers[0], shard_answers=partial_answers)
        reducer: Session = yield Io(partial(self.reducer.fork, at=0))
        self._reductions.append(reducer)
        combined = yield from reducer.plan_ask(
            _reduce_prompt(question, partial_answers),
            max_tokens=max_tokens,
            purpose="reduce",
            streamed=streamed,
        )
        return dataclasses.replace(combined, question=question, shard_answers=partial_answers)

    def plan_ask_many(self, questions: Sequence[str], **options: Unpack[AskManyOptions]) -> Plan[Batch]:
        """Sibling ``questions``: each shard answers them all as one batch, then each is reduced.

        The shards' batches run at once, each sharing its shard's prefix;
        ``on_answer`` hears of each combined answer. ``keys`` are not taken here.
        """
        self._resources.check_open()
        call = checked_ask_many(self.request, questions, options)  # at the call, as plan_ask
        _refuse_asking(call.cite, call.schema)
        if options.get("keys") or options.get("reuse_answered"):
            raise ConfigError("a sharded session's ask_many takes no answer keys (and reuses no answers)")
        return self._plan_batches(call, options.get("on_answer"))

    def _plan_batches(self, call: AskManyCall, on_answer: Callable[[Answer], None] | None) -> Plan[Batch]:
        """The plan of :meth:`plan_ask_many` once its arguments are checked."""
        questions, max_tokens = call.questions, call.max_tokens
        limit = self.request.concurrency if call.concurrency is None else call.concurrency
        shards = yield Io(lambda: self.shards)
        maps = [
            partial(shard.plan_ask_many, questions, max_tokens=max_tokens, concurrency=limit)
            for shard in shards
        ]
        batches = _values((yield Fanout(maps, len(shards))))

        def reduce_one(index: int) -> Plan[Answer]:
            answer = yield from self._reduced(
                questions[index], tuple(batch[index] for batch in batches), max_tokens
            )
            if on_answer is not None:
                on_answer(answer)
            return answer

        reduces = [partial(reduce_one, index) for index in range(len(questions))]
        answers = _values((yield Fanout(reduces, limit or DEFAULT_CONCURRENCY)))
        batch: Batch = yield Io(partial(self._batch, answers))
        return batch

    def _batch(self, answers: tuple[Answer, ...]) -> Batch:
        self.settle()  # the shards' batch checks and the reduces' turn checks are written
        ids = {a.session_id for answer in answers for a in (answer, *answer.shard_answers)}
        records = self.store.sessions.requests(session_ids=sorted(ids))
        # The shards' batches are checked under each shard (with the batch's id); the reduces,
        # each a fork of the reducer, under their own ids.
        batches = {record.batch_id for record in records if record.batch_id is not None}
        check = stored_check(
            self.store,
            [*sorted(ids), *(shard.id for shard in self.shards)],
            where=lambda kept: kept.session_id in ids or kept.batch_id in batches,
        )
        title = f"batch of {len(answers)} questions over {len(self.shards)} shards"
        return Batch(answers, build_report(records, title=title, counter_check=check))

    # -- branches and reports -------------------------------------------------

    def fork(self, at: int | None = None, *, title: str | None = None) -> ShardedSession:
        """A sharded session whose shards are forks of these at ``at`` turns (all by default).

        The fork shares this session's backend, store and reducer, and closes none of them.
        """
        self._resources.check_open()
        shards = self.shards
        forked = ShardedSession((), request=self.request)
        forked._resources = self._resources.borrowed()
        forked._shards = tuple(shard.fork(at, title=f"{shard.title} (fork)") for shard in shards)
        forked._reducer = self.reducer
        assert self._record is not None
        record = dataclasses.replace(
            self._record,
            id=forked._new_id,
            created_at=time.time(),
            title=title or f"fork of {self.title}",
            settings={**self._record.settings, "shards": [shard.id for shard in forked._shards]},
        )
        self.store.sessions.create_session(record)
        forked._record = record
        return forked

    def report(self, *, include_branches: bool = True, prices: Prices | None = None) -> SavingsReport:
        """Every map and reduce request, shard by shard, and the server counters' check over them."""
        self._resources.check_open()
        self.settle()
        ids: list[str] = []
        for session in (*self.shards, self.reducer):
            ids.append(session.id)
            if include_branches:
                ids.extend(session.branch_ids())
        return build_report(
            self.store.sessions.requests(session_ids=ids),
            title=f"map-reduce over {len(self.shards)} shards",
            counter_check=stored_check(self.store, ids),
            prices=prices,
        )

    def __repr__(self) -> str:
        shards: Any = len(self._shards) if self._shards is not None else "unbuilt"
        return f"<ShardedSession {self.id} {self.title!r}: {shards} shards>"


def _refuse_asking(cite: bool, schema: AnswerSchema | None) -> None:
    if cite:
        raise ConfigError(
            "cite is not available over shards: the combined answer rests on the shards' answers, "
            "not on one pack its citations could be checked in; ask without --shard, or without cite"
        )
    if schema is not None:
        raise ConfigError("schema is not available over shards: ask without --shard, or without a schema")
