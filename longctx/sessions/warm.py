"""Warm start: prefill a session's prefix while the user types the first question.

What it does, and why it is skipped only on two facts, is in docs/api.md
("Warm start"). Here: :class:`WarmStart` sends one request in a background
thread, the messages the session's next question would send with a fixed
stand-in question (:data:`WARM_QUESTION`) and ``max_tokens=1``, recorded as
a request of the session (purpose ``warm``; a session not stored yet keeps
it for its first turn, :mod:`longctx.sessions.recording`). It holds the
session's turn lock, so the first question never races its own warm-up.
:func:`recent_request` is the store's fact (a request over the same prefix
that ended less than :data:`RECENT_SECONDS` ago);
:meth:`Backend.started_at <longctx.backends.base.Backend.started_at>` is the
server's (it has run since). Only both skip the request: when in doubt it
is sent, since a needless one costs one prefill in the background, a wrong
skip the first question's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Final

from longctx.backends.base import Backend
from longctx.backends.chat import ChatRequest
from longctx.errors import LongctxError
from longctx.interrupts import wait_set
from longctx.recordtypes import record_type
from longctx.sessions.records import request_record
from longctx.store import CounterCheckRecord, CounterSkip, RequestRecord, SessionRecord, Store
from longctx.usage import Usage
from longctx.verification.counters import CounterSnapshot

__all__ = [
    "CLOCK_SLACK_SECONDS",
    "RECENT_SECONDS",
    "WARM_QUESTION",
    "WarmPlan",
    "WarmResult",
    "WarmStart",
    "recent_request",
]

WARM_QUESTION: Final = "Reply with one word."
"""The stand-in question of a warm request: it follows the prefix, so it is never cached."""

RECENT_SECONDS: Final = 300.0
"""A prefix used on the server less than this long ago is taken as still held (if it has not restarted)."""

CLOCK_SLACK_SECONDS: Final = 5.0
"""The start time is the server's clock, the store's times are ours: a start this close counts as after."""


@record_type
class WarmPlan:
    """What a warm start needs from its session: where to send, where to record, and the request."""

    backend: Backend
    store: Store
    record: SessionRecord
    request: ChatRequest
    has_history: bool
    keep: Callable[[RequestRecord, Sequence[CounterCheckRecord], Sequence[CounterSkip]], None]
    """Where the warm request's record, its counter checks and why one was skipped go (the session
    stores them with itself)."""


@record_type
class WarmResult:
    """What a warm start did: sent a request (``usage``), or skipped it or failed (the reason)."""

    request_id: str | None
    usage: Usage | None
    skipped: str | None = None
    failed: str | None = None
    why: str | None = None
    """Why a warm request was sent although the store knew a recent request over the prefix."""

    def summary_line(self) -> str:
        """One line for the terminal."""
        if self.skipped is not None:
            return f"warm start skipped: {self.skipped}"
        if self.failed is not None:
            return f"warm start failed ({self.failed}); the first question prefills the pack"
        assert self.usage is not None
        why = f"; {self.why}" if self.why else ""
        # "unknown" alone reads as a longctx fault: the reason names the server's missing switch.
        unknown = self.usage.cached_tokens is None and self.usage.cached_reason
        missing = f": {self.usage.cached_reason}" if unknown else ""
        return f"warm start: pack prefilled ({self.usage.summary_line()}{missing}){why}"


class WarmStart:
    """One warm-up request of a session, in a background thread holding the session's turn lock.

    Constructing it does nothing; :meth:`start` takes ``lock`` at once (so
    a question asked right after waits for the warm-up), then prepares the
    plan and sends the request in a daemon thread, which releases the lock.
    A :class:`~longctx.errors.LongctxError` on the way is kept in the
    result, never raised: the first question then does the work itself.
    """

    def __init__(self, prepare: Callable[[], WarmPlan], *, lock: threading.Lock) -> None:
        self._prepare = prepare
        self._lock = lock
        self._done = threading.Event()
        self._result: WarmResult | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> WarmStart:
        """Take the turn lock and send the warm request in the background; returns ``self``."""
        if self._thread is not None:
            raise RuntimeError("a warm start runs once")
        self._lock.acquire()
        self._thread = threading.Thread(target=self._run, name="longctx-warm-start", daemon=True)
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> WarmResult | None:
        """The result once the warm-up is done (None if ``timeout`` passed first)."""
        wait_set(self._done, timeout)  # in ticks: a Ctrl-C during a long prefill is seen at once
        return self._result

    @property
    def result(self) -> WarmResult | None:
        """The result, or None while the warm-up runs."""
        return self._result

    def _run(self) -> None:
        try:
            self._result = self._warm()
        except LongctxError as error:
            self._result = WarmResult(None, None, failed=str(error).splitlines()[0])
        finally:
            self._lock.release()
            self._done.set()

    def _warm(self) -> WarmResult:
        plan = self._prepare()
        held = recent_request(plan)
        why = None
        if held is not None:
            ago = time.time() - _ended(held)
            started = plan.backend.started_at(plan.request.affinity_key)
            if started is None:
                why = f"the server cannot say whether it still holds the prefix computed {ago:.0f} s ago"
            elif started > held.started_at - CLOCK_SLACK_SECONDS:
                why = f"the server restarted {time.time() - started:.0f} s ago, after it computed this prefix"
            else:
                return WarmResult(
                    None,
                    None,
                    skipped=f"the server computed this prefix {ago:.0f} s ago (request {held.id}) "
                    "and has run since",
                )
        # On the replica the warm request goes to (its pack's), as a turn's window is.
        with CounterSnapshot.take(plan.backend, plan.request.affinity_key) as snapshot:
            sent = plan.backend.complete(plan.request, on_away=snapshot.follow)
            # Recorded with its counter check, once that settled.
            record = request_record(
                sent, session_id=plan.record.id, batch_id=None, purpose="warm", ended_at=time.time()
            )
            settling = snapshot.close(plan.record.id, None, [record])
            checks = settling.wait()
            plan.keep(record, checks or [], settling.skips)
        return WarmResult(sent.request_id, sent.completion.usage, why=why)


def recent_request(plan: WarmPlan, *, now: float | None = None) -> RequestRecord | None:
    """The latest request over ``plan``'s prefix on its server that ended within :data:`RECENT_SECONDS`.

    Over the same prefix: a request of a session over the same pack and
    cache salt (for a session with turns, of this session: its history is
    part of the prefix), to one of the backend's servers, for its model.
    """
    now = time.time() if now is None else now
    record = plan.record
    urls = {info.api_url for info in plan.backend.servers}
    salt = record.settings.get("cache_salt")
    sessions = {s.id: s for s in plan.store.sessions.sessions(include_branches=True)}
    for request in reversed(plan.store.sessions.requests(model=plan.backend.info.model)):
        if request.base_url not in urls or now - _ended(request) > RECENT_SECONDS:
            continue
        owner = sessions.get(request.session_id or "")
        if owner is None or owner.pack_fingerprint is None:
            continue
        if plan.has_history and owner.id != record.id:
            continue
        if owner.pack_fingerprint == record.pack_fingerprint and owner.settings.get("cache_salt") == salt:
            return request
    return None


def _ended(request: RequestRecord) -> float:
    return request.started_at + (request.usage.total_seconds or 0.0)
