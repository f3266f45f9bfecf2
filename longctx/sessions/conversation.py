"""The interface every session kind implements: :class:`Conversation`.

Questions (one turn, siblings, a stream of one answer), forks, reports and
a lifecycle (close, async close, context managers). :class:`~longctx.sessions.session.Session`
(and the corpus sessions built on it) and
:class:`~longctx.sessions.sharded.ShardedSession` implement it, so code that
takes a session works with either. The sync and async calls are thin
drivers over each kind's plans (:mod:`longctx.drivers`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Self, Unpack

from longctx.backends.base import Backend
from longctx.drivers import Plan, arun, run
from longctx.report import Prices, SavingsReport
from longctx.sessions.answers import Answer, Batch
from longctx.sessions.arguments import AskManyOptions, AskOptions
from longctx.sessions.resources import Resources
from longctx.sessions.streams import AnswerStream, AsyncAnswerStream
from longctx.store import SessionRecord, Store

__all__ = ["Conversation"]


class Conversation(ABC):
    """What every session offers: questions, siblings, forks, reports, a lifecycle.

    :class:`Session` (and :class:`~longctx.sessions.corpus_sessions.RepoSession` /
    :class:`~longctx.sessions.corpus_sessions.DocSession` built on it) and
    :class:`~longctx.sessions.sharded.ShardedSession` implement it, so code
    that takes a session works with either.
    """

    # Set by each kind's constructor: what it uses and owns, its stored record
    # once recorded, the id it will be recorded under, and the title asked for.
    _resources: Resources
    _record: SessionRecord | None
    _new_id: str
    _title: str | None
    _default_title = "session"

    @property
    def id(self) -> str:
        """The session's id in the store (``longctx report ID``), known before it is recorded."""
        return self._record.id if self._record is not None else self._new_id

    @property
    def title(self) -> str:
        if self._record is not None:
            return self._record.title
        return self._title or self._default_title

    @property
    def store(self) -> Store:
        """The store the session lives in (the default one, opened on first use, unless given)."""
        return self._resources.store

    @property
    def backend(self) -> Backend:
        """The connection to the server, made on first use unless one was given."""
        return self._resources.backend

    @classmethod
    def resume(cls, session_id: str, backend: Backend | None = None, *, store: Store | None = None) -> Self:
        """The stored session ``session_id`` with every committed turn.

        Without ``backend``, the session connects to the server(s) it used
        when it first needs one (reading its turns or report needs none).
        Without ``store`` it opens the default one, and closes it in
        :meth:`close`. Raises :class:`~longctx.errors.SessionNotFound` for an
        unknown id, and what :meth:`restore` raises.
        """
        with Resources.for_resume(backend, store) as resources:
            return cls.restore(resources.store.sessions.session(session_id), resources)

    @classmethod
    @abstractmethod
    def restore(cls, record: SessionRecord, resources: Resources) -> Self:
        """A session object of this kind for a stored ``record`` over ``resources``; writes nothing."""

    def close(self) -> None:
        """Close the connection and the store if this session opened them; idempotent.

        From then on every call that would reach the server or the store
        raises :class:`~longctx.errors.SessionClosed` (so do the forks and
        branches that share what was closed); ``id``, ``title`` and
        ``turns`` can still be read.
        """
        self.settle()
        self._resources.close()

    async def aclose(self) -> None:
        """:meth:`close` for async code (``async with``): also closes the connections ``aask`` opened.

        An async client's connections belong to the event loop that opened
        them, so only a coroutine on it can close them. What the session
        waits for first (a warm start, counter checks) is waited for in a
        thread, not on the loop.
        """
        import asyncio  # only async paths load asyncio (about 30 modules); a sync batch never does

        await asyncio.to_thread(self.settle)
        await self._resources.aclose()

    def settle(self) -> None:  # noqa: B027 - most kinds run nothing in the background
        """Wait for this conversation's work still running off the answers' path; :meth:`close` does first.

        That work needs the connection or writes to the store: a warm start,
        the pack's token ids being made (until they are, a new request goes
        as text), the counter checks. Call it to find all of it in the store,
        or before a request that must go as token ids.
        """

    @abstractmethod
    def plan_ask(
        self, question: str, *, purpose: str = "turn", streamed: bool = False, **options: Unpack[AskOptions]
    ) -> Plan[Answer]:
        """The plan of one turn that asks ``question`` (``purpose``: what its request is recorded as).

        Its arguments are checked when it is called, not when the plan runs
        (:mod:`longctx.sessions.arguments`): every public call fails at its own line.

        :meth:`ask` and :meth:`aask` carry it out; so can a caller that
        composes turns (a sharded session's map step runs its shards' plans
        side by side). See :mod:`longctx.drivers`. ``streamed``: its answer's text comes as it arrives.
        ``options``: :class:`AskOptions` (``max_tokens``, ``cite``, ``schema``).
        """

    @abstractmethod
    def plan_ask_many(self, questions: Sequence[str], **options: Unpack[AskManyOptions]) -> Plan[Batch]:
        """The plan of a batch of sibling ``questions`` from the current point (see :meth:`ask_many`)."""

    def ask(self, question: str, **options: Unpack[AskOptions]) -> Answer:
        """Ask ``question`` as the next turn, stored once answered (``options``: :class:`AskOptions`)."""
        return run(self.plan_ask(question, **options))

    async def aask(self, question: str, **options: Unpack[AskOptions]) -> Answer:
        """:meth:`ask` on the running event loop; as safe: one turn at a time, also against :meth:`ask`."""
        return await arun(self.plan_ask(question, **options))

    def stream(self, question: str, **options: Unpack[AskOptions]) -> AnswerStream:
        """:meth:`ask` (its keywords too), the text handed out as it arrives: see :class:`AnswerStream`.

        Its arguments are refused here, as :meth:`ask` refuses them, before anything is iterated.
        """
        return AnswerStream(self.plan_ask(question, streamed=True, **options))

    def astream(self, question: str, **options: Unpack[AskOptions]) -> AsyncAnswerStream:
        """:meth:`stream` on the running event loop: ``async for text in stream``; refused as eagerly."""
        return AsyncAnswerStream(self.plan_ask(question, streamed=True, **options))

    def ask_many(self, questions: Sequence[str], **options: Unpack[AskManyOptions]) -> Batch:
        """Ask sibling ``questions`` from the current point; each becomes a branch.

        They go out as the request options' ``dispatch`` says (``auto``: what
        was measured fastest for the server's engine; see
        :mod:`longctx.sessions.siblings`); the batch report's ``dispatch``
        says which was used. Answers come back in question order. A question
        that fails after its retries raises once the others are done; the
        answered ones are stored. ``options``: :class:`AskManyOptions`.
        """
        return run(self.plan_ask_many(questions, **options))

    async def aask_many(self, questions: Sequence[str], **options: Unpack[AskManyOptions]) -> Batch:
        """:meth:`ask_many` on the running event loop."""
        return await arun(self.plan_ask_many(questions, **options))

    def source_roots(self) -> tuple[str, ...]:
        """The absolute paths the pack was made from, where known: a citation's file is looked for there."""
        return ()

    @abstractmethod
    def fork(self, at: int | None = None, *, title: str | None = None) -> Conversation:
        """A new session sharing this one's first ``at`` turns (all by default)."""

    @abstractmethod
    def report(self, *, include_branches: bool = True, prices: Prices | None = None) -> SavingsReport:
        """Savings over every request of this session (and of its branches)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self.__enter__()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
