"""Sessions: conversations over a pack whose prefix the server keeps cached.

A :class:`Session` holds an append-only history. Each request is the pack's
system header, the pack's prefix with the first question, then the turns in
order, so every request starts with every byte of the one before it and the
server prefills only what is new. A turn is committed to the store in one
transaction once its answer arrived (a crash loses no completed turn and
leaves no half turn); :meth:`Session.ask_many` fans siblings out from the
current point (:mod:`longctx.sessions.siblings`), each a branch;
:meth:`Session.fork` branches at any turn. The lifecycle is httpx's
(:mod:`longctx.sessions.resources`, :mod:`longctx.sessions.recording`).

Assistant turns are kept as the chat template renders them in later
requests (:func:`~longctx.sessions.answers.history_form`), so the history a
session sends is byte for byte what the server renders next time. Every
request of a pack carries one affinity key derived from the pack's
fingerprint (:func:`affinity_key`), so cache-aware routers keep the pack on
one replica.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Self, Unpack, cast

from longctx.backends.base import Backend, Sent
from longctx.drivers import Io, Plan, arun, run
from longctx.errors import ConfigError, LongctxError, StoreError
from longctx.interrupts import acquire
from longctx.options.groups import RequestOptions, ServerOptions
from longctx.report import Prices, SavingsReport, build_report
from longctx.sessions import arguments, reporting
from longctx.sessions.answers import Answer, Batch
from longctx.sessions.arguments import AskCall, AskManyOptions, AskOptions
from longctx.sessions.batches import SiblingBatches
from longctx.sessions.changes import Changes, ChangeTracker, check_room
from longctx.sessions.conversation import Conversation
from longctx.sessions.recording import Recording, branch_record, placed_images, stored_pack
from longctx.sessions.records import Committed, cited_answers, committed_records
from longctx.sessions.requests import Asked, RequestBuilder, constrained, grounding, request_messages
from longctx.sessions.resources import Progress, Resources
from longctx.sessions.reuse import reuse_notes
from longctx.sessions.warm import WARM_QUESTION, WarmPlan, WarmStart
from longctx.store import SessionRecord, Store, StoredPack, TurnRecord
from longctx.tokens.tokenizers import EstimateTokenizer
from longctx.verification import counters
from longctx.verification.canary import (
    CANARY_QUESTION,
    CanaryOptions,
    CanaryResult,
    CanarySampler,
    canary_plan,
)
from longctx.verification.counters import CounterSnapshot, PendingCheck

if TYPE_CHECKING:
    from longctx.packing import Pack

__all__ = ["Session", "affinity_key", "served_settings"]

_RESTORED_AS: dict[str, type[Session]] = {}


def affinity_key(fingerprint: str | None, session_id: str) -> str:
    """The routing key of a pack's requests: the same for every session over one pack."""
    return f"longctx-{fingerprint[:32]}" if fingerprint else f"longctx-session-{session_id}"


def served_settings(request: RequestOptions, backend: Backend) -> dict[str, Any]:
    """The settings every stored session keeps: its request options, and the servers and model it used."""
    urls = [replica.api_url for replica in backend.replicas]
    info = backend.info
    settings = {**request.to_dict(), "base_urls": urls, "model": info.model}
    if info.prefix_caching is False:
        # Kept with the session, so its report (read back at any time) can say why nothing was cached.
        settings[reporting.CACHING_OFF_SETTING] = (
            info.profile.caching_fix(info.settings) or "prefix caching on"
        )
    return settings


class Session(Conversation):
    """A conversation over an optional pack, persisted in the store.

    ``backend`` is a connection (:func:`~longctx.backends.base.connect`) the
    caller owns; without one the session connects to ``server`` (default
    :class:`~longctx.options.groups.ServerOptions`) on its first request and owns
    that connection. ``pack`` is a :class:`~longctx.packing.Pack` or a
    :class:`~longctx.store.StoredPack`. ``store`` likewise: without one the
    default store is opened on first use and closed by :meth:`close`.
    ``request`` sets how every request is made. Nothing is contacted,
    opened or stored until the first call that needs it; resume a stored
    session by id with :meth:`resume`.
    """

    def __init__(
        self,
        backend: Backend | None = None,
        pack: Pack | StoredPack | None = None,
        *,
        server: ServerOptions | None = None,
        store: Store | None = None,
        request: RequestOptions | None = None,
        title: str | None = None,
        on_progress: Progress | None = None,
    ) -> None:
        self.request = request or RequestOptions()
        self._resources = Resources(server=server, backend=backend, store=store, on_progress=on_progress)
        self._pack: StoredPack | None = stored_pack(pack) if pack is not None else None
        self._title = title
        self._record: SessionRecord | None = None
        self._recording = Recording()
        self._parent: tuple[str, str] | None = None
        self._new_id = uuid.uuid4().hex[:16]
        self._turns: list[TurnRecord] = []
        # Set for a session over a repository that follows its files.
        self._tracker: ChangeTracker | None = None
        # One turn at a time: a turn's request is built from the history the
        # previous turn left.
        self._turn_lock = threading.Lock()
        self._requests = RequestBuilder(self)  # the requests of its questions, as text or token ids
        self._batches = SiblingBatches(self)  # its sibling questions, each a branch
        # The warm start begun on entering (RequestOptions.warm_start) or by warm_start().
        self.warming: WarmStart | None = None
        # Turns' counter checks still settling on their threads (see verification/counters.py).
        self._pending_checks: list[PendingCheck] = []
        self.canaries = CanarySampler(self.request.canary_every)  # the canaries run on its prefix

    # -- lifecycle ------------------------------------------------------------

    @classmethod
    def restore(cls, record: SessionRecord, resources: Resources) -> Self:
        """A session object for a stored ``record`` over ``resources`` (resume, fork, branch); writes nothing.

        Without a backend in ``resources``, it connects where the session
        was served. Raises :class:`~longctx.errors.StoreError` when its pack
        is missing from the store.
        """
        store = resources.store
        pack = store.sessions.pack(record.pack_fingerprint) if record.pack_fingerprint else None
        if record.pack_fingerprint and pack is None:
            raise StoreError(
                f"session {record.id} refers to pack {record.pack_fingerprint} missing from the store"
            )
        pack = placed_images(pack) if pack is not None else None  # the images it sent, sent again
        settings = record.settings
        if resources.given_backend is None:
            # Where the session was served, unless the caller connects it elsewhere.
            urls = tuple(settings.get("base_urls") or ())
            resources.server = ServerOptions(base_url=urls or None, model=settings.get("model"))
        # A plain Session comes back as the kind it was stored as (Self is then Session).
        stored_kind = _RESTORED_AS.get(str(settings.get("session_kind", "")), Session)
        kind = cast("type[Self]", stored_kind) if cls is Session else cls
        session = kind._blank(pack, RequestOptions.from_dict(settings), record.title, settings)
        session._resources = resources
        session._record = record
        session._recording = Recording(stored=True)
        session._turns = session._load_history(record)
        if session.request.follow_changes:
            session._tracker = ChangeTracker.from_settings(settings)
        return session

    # The name a kind of session is stored under, so that resuming one gives back
    # that kind (a RepoSession resumes as a RepoSession); "" for a plain Session.
    session_kind = ""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.session_kind:
            _RESTORED_AS[cls.session_kind] = cls

    @classmethod
    def _blank(
        cls, pack: StoredPack | None, request: RequestOptions, title: str, settings: Mapping[str, Any]
    ) -> Self:
        """A session of this kind for a stored record's pack and ``settings`` (restore fills in the rest)."""
        return cls(pack=pack, request=request, title=title)

    def _kind_settings(self) -> dict[str, Any]:
        """What this kind of session stores in its settings to be restored as itself."""
        return {}

    @property
    def pack(self) -> StoredPack | None:
        """The pack every request starts with (prepared on first use by a corpus session)."""
        return self._pack

    def _set_pack(self, pack: Pack | StoredPack) -> None:
        self._pack = stored_pack(pack)

    def _opened(self) -> SessionRecord:
        """The session's record, made with its settings on first use; stored with its first turn."""
        with self._resources.lock:
            if self._record is not None:
                return self._record
            pack = self.pack  # first: preparing a corpus session's pack sets its tracker
            settings = {
                **served_settings(self.request, self.backend),
                **(self._tracker.to_settings() if self._tracker is not None else {}),
                **self._kind_settings(),
            }
            parent_id, kind = self._parent or (None, "session")
            self._record = SessionRecord(
                id=self._new_id,
                created_at=time.time(),
                kind=kind,
                title=self._title or (pack.summary.get("title", "") if pack else "") or "session",
                pack_fingerprint=pack.fingerprint if pack else None,
                parent_id=parent_id,
                parent_turns=None,
                settings=settings,
            )
            return self._record

    def persist(self) -> SessionRecord:
        """The session's record, stored now if it is not yet, turns or not (a fork's parent, a shard)."""
        record = self._opened()
        self._recording.store_now(self.store, self.pack, record)
        return record

    def attach(self, parent_id: str, kind: str) -> None:
        """Record this session, when it is stored, as a branch of kind ``kind`` of ``parent_id``."""
        self._parent = (parent_id, kind)

    # -- identity and history -----------------------------------------------

    @property
    def turns(self) -> tuple[TurnRecord, ...]:
        """Every turn of the conversation, inherited ones first."""
        return tuple(self._turns)

    @property
    def affinity_key(self) -> str:
        if self.request.prompt_cache_key:  # the caller's own key, by OpenAI's name
            return self.request.prompt_cache_key
        pack = self.pack
        if pack is not None:
            return affinity_key(pack.fingerprint, self.id)
        return affinity_key(None, self._root_id())

    def _root_id(self) -> str:
        record = self._record
        if record is None:
            return self.id
        while record.parent_id is not None:
            try:
                record = self.store.sessions.session(record.parent_id)
            except LongctxError:
                break
        return record.id

    def _load_history(self, record: SessionRecord) -> list[TurnRecord]:
        """The turns a session sees: its ancestors' up to each branch point, then its own."""
        own = self.store.sessions.turns(record.id)
        if record.parent_id is None:
            return own
        parent = self.store.sessions.session(record.parent_id)
        inherited = self._load_history(parent)[: record.parent_turns]
        return inherited + own

    def messages(
        self, question: str, *, history: Sequence[TurnRecord] | None = None, preamble: str = ""
    ) -> list[dict[str, Any]]:
        """The messages of the request that would ask ``question`` now (after ``preamble``: changed files).

        The first user message is content parts when the pack holds images
        (:meth:`~longctx.packing.Pack.user_parts`), else one string.
        """
        return request_messages(self.pack, self._turns if history is None else history, question, preamble)

    def settle(self) -> None:
        # A warm start in flight records its request; the pack's ids and counter checks write to the store.
        if self.warming is not None:
            self.warming.wait()
        self._requests.prompt_ids.wait()
        self.settle_checks()

    def settle_checks(self) -> None:
        """Wait for the counter checks of this session's calls still in flight (they write to the store)."""
        while self._pending_checks:
            self._pending_checks.pop().wait()

    def __enter__(self) -> Self:
        if self.request.warm_start and self.warming is None:
            self.warm_start()
        return self

    def warm_start(self) -> WarmStart:
        """Prefill the prefix in the background; the next turn waits for it (see sessions/warm.py)."""
        self._resources.check_open()  # here, not in the background where no caller would hear it
        self.warming = WarmStart(self._warm_plan, lock=self._turn_lock).start()
        return self.warming

    def _warm_plan(self) -> WarmPlan:
        record = self._opened()
        request = self._requests.chat_request(WARM_QUESTION, self._turns, 1)
        return WarmPlan(
            self.backend,
            self.store,
            record,
            request,
            has_history=bool(self._turns),
            keep=lambda warm, checks, skips: self._recording.keep(self.store, [warm], checks, skips),
        )

    def stop_following(self) -> None:
        """Append no changed files from now on (``RequestOptions.follow_changes=False`` at resume)."""
        self._tracker = None

    def _pending_changes(self, history: Sequence[TurnRecord], max_tokens: int) -> Changes | None:
        """The files changed since the model last saw them, checked against the window; None if none."""
        tracker = self._tracker
        if tracker is None or not self.request.follow_changes:
            return None
        estimate = EstimateTokenizer()
        changes = tracker.pending(self.store, history, count=estimate.count)
        if changes is None:
            return None
        history_text = "".join(turn.preamble + turn.question + turn.history_answer for turn in history)
        check_room(
            changes,
            prompt_tokens=self._requests.pack_tokens() + estimate.count(history_text),
            max_tokens=max_tokens,
            context_length=self.backend.info.context_length,
            paths=tracker.paths,
        )
        self._resources.progress(changes.summary_line())
        return changes

    # -- requests -----------------------------------------------------------

    def plan_ask(
        self, question: str, *, purpose: str = "turn", streamed: bool = False, **options: Unpack[AskOptions]
    ) -> Plan[Answer]:
        """The plan of one turn: built, sent, committed in one transaction once the answer arrived.

        One turn at a time (a turn's request is built from the history the
        previous turn left), whichever driver carries it out. The arguments
        are checked here, at the call (:func:`~longctx.sessions.arguments.checked_ask`),
        not when the plan is carried out: ``stream("")`` fails where ``ask("")`` does.
        """
        self._resources.check_open()
        call = arguments.checked_ask(self.request, question, options, "stream" if streamed else "ask")
        return self._plan_turn(call, purpose, streamed)

    def _plan_turn(self, call: AskCall, purpose: str, streamed: bool) -> Plan[Answer]:
        """The plan of one turn whose arguments were checked (see :meth:`plan_ask`)."""
        question, max_tokens, cite, schema = call.question, call.max_tokens, call.cite, call.schema
        self._resources.check_open()  # again: the session may have been closed since the call
        yield Io(partial(acquire, self._turn_lock))  # in ticks: a warm start may hold it a long prefill
        try:
            record = yield Io(self._opened)  # connects, and prepares a corpus session's pack
            changes = yield Io(partial(self._pending_changes, self._turns, max_tokens))
            asked = Asked(grounding(cite, self.pack, self._turns, changes), schema)
            request = self._requests.chat_request(question, self._turns, max_tokens, changes, asked.grounding)
            request = yield Io(partial(constrained, request, asked, self.backend))
            request = yield Io(partial(self._requests.as_ids, request, self._turns))
            # No wait for the last turn's check: a turn sent while it settles shares its window.
            opened = partial(
                CounterSnapshot.around, self.backend, request.affinity_key, self.request.counter_check
            )
            with (yield Io(opened)) as snapshot:
                sent = yield from self.backend.delivery(request, on_away=snapshot.follow, streamed=streamed)
                commit = partial(self._commit_turn, sent, question, purpose, changes, asked)
                committed: Committed = yield Io(commit)
                self._requests.prompt_ids.history.answered(request, sent.completion, len(self._turns))
                self._pending_checks.append(snapshot.close_into(self.store, record.id, [committed.request]))
            if self.canaries.due():
                yield from self.plan_canary()
            return committed.answer
        finally:
            self._turn_lock.release()

    def plan_canary(self, options: CanaryOptions | None = None) -> Plan[CanaryResult]:
        """The cache canary on this session's own prefix; the result is kept in :attr:`canaries`.

        The probe is the request the next turn would send (the system
        header, the pack, the history) with the canary's question, so the
        canary checks the real prefix, not a toy prompt; the cached run is
        read under the session's own ``cache_salt``, so the cache entries its
        answers are served from are the ones checked.
        """
        self._resources.check_open()
        yield Io(self._opened)  # connects, and prepares a corpus session's pack
        yield Io(self.settle_checks)  # its requests would count in the counter windows still open
        result = yield from canary_plan(
            self.backend,
            self.messages(CANARY_QUESTION),
            options,
            affinity_key=self.affinity_key,
            cached_salt=self.request.cache_salt,
        )
        self.canaries.keep(result)
        return result

    def canary(self, options: CanaryOptions | None = None) -> CanaryResult:
        """:meth:`plan_canary` carried out here (``raise_for_divergence()`` fails on a finding)."""
        return run(self.plan_canary(options))

    async def acanary(self, options: CanaryOptions | None = None) -> CanaryResult:
        """:meth:`plan_canary` on the running event loop."""
        return await arun(self.plan_canary(options))

    def _commit_turn(
        self, sent: Sent, question: str, purpose: str, changes: Changes | None, asked: Asked
    ) -> Committed:
        """Store the answered turn (one transaction) and add it to the history."""
        record = self._opened()
        inherited = record.parent_turns or 0  # a turn's stored position counts only the session's own turns
        committed = committed_records(
            sent,
            session_id=self.id,
            position=len(self._turns) - inherited,
            question=question,
            purpose=purpose,
            batch_id=None,
            changes=changes,
            inherited_turns=inherited,
            asked=asked,
        )
        with self._recording.first_write(self.pack, record) as opening:
            self.store.sessions.commit_turn(committed.turn, committed.request, opening=opening)
        self._turns.append(committed.turn)
        return committed

    # -- siblings -----------------------------------------------------------

    def plan_ask_many(self, questions: Sequence[str], **options: Unpack[AskManyOptions]) -> Plan[Batch]:
        """The plan of a batch of siblings: each question a branch sharing the whole prefix.

        See :meth:`Conversation.ask_many`. ``keys`` are stored with each
        answer in its transaction (:meth:`store.sessions.answered
        <longctx.store.SessionLog.answered>` finds them), so a job run again asks
        only what is unanswered; with ``reuse_answered`` this batch does so
        itself (see :class:`~longctx.sessions.arguments.AskManyOptions`).
        """
        self._resources.check_open()
        call = arguments.checked_ask_many(self.request, questions, options)  # at the call, as plan_ask
        return self._batches.plan(call, options)

    # -- branches -----------------------------------------------------------

    def fork(self, at: int | None = None, *, title: str | None = None) -> Session:
        """A new session sharing this one's first ``at`` turns (all by default).

        The fork shares this session's backend and store and closes neither.
        Both are stored at once, turns or not: the fork is resumed by id.
        """
        record = self.persist()
        keep = len(self._turns) if at is None else at
        if not 0 <= keep <= len(self._turns):
            raise ConfigError(f"cannot fork at turn {at}: the session has {len(self._turns)} turns")
        child = branch_record(record, "fork", title or f"fork of {self.title}", keep)
        self.store.sessions.create_session(child)
        return Session.restore(child, self._resources.borrowed())

    def branch(self, answer: Answer) -> Session:
        """The branch session an ``ask_many`` answer lives in, to continue it (shares backend and store)."""
        return Session.restore(self.store.sessions.session(answer.session_id), self._resources.borrowed())

    # -- reports ------------------------------------------------------------

    def report(self, *, include_branches: bool = True, prices: Prices | None = None) -> SavingsReport:
        """Savings over every request of this session (and of its sibling branches)."""
        self.settle_checks()
        ids = [self.id, *(self.branch_ids() if include_branches else [])]
        # A session not stored yet still reports what it did (its warm start).
        records = [*self.store.sessions.requests(session_ids=ids), *self._recording.pending_requests]
        pending = (self._recording.pending_checks, self._recording.pending_skips)
        notes = [
            f"turn {turn.position}: appended {len(turn.file_changes)} changed file(s): "
            + ", ".join(sorted(turn.file_changes)[:5])
            for turn in self._turns
            if turn.file_changes
        ]
        notes += reuse_notes([r for r in records if r.session_id == self.id and r.purpose == "turn"])
        turns = [*self._turns, *(turn for branch in ids[1:] for turn in self.store.sessions.turns(branch))]
        fallback_rate = reporting.earlier_cold_rate(self.store, records)
        if fallback_rate is not None:
            notes.append("cold prefill rate measured on earlier requests to the same server and model")
        settings = self._record.settings if self._record is not None else {}
        notes += reporting.caching_off_notes(settings, records)
        return build_report(
            records,
            title=f"session {self.id}: {self.title}",
            counter_check=counters.stored_check(self.store, ids, pending=pending),
            prices=prices,
            notes=notes,
            cold_rate=fallback_rate,
            citations=cited_answers(turns, self.source_roots()),
            questions=reporting.sibling_questions(records, ids[1:], self.store),
        )

    def branch_ids(self) -> list[str]:
        """Ids of the sessions branched from this one (siblings and forks)."""
        if not self._recording.stored:
            return []
        return [child.id for child in self.store.sessions.children(self.id)]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} {self.title!r}: {len(self._turns)} turns>"
