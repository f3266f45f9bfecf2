"""The server's own prefix-cache counters, read around calls, against what the responses said.

A check compares the growth of a server's hit counter (the one its
engine profile names, :class:`~longctx.backends.profiles.CacheCounters`)
over a window with the cached tokens the responses in that window
reported. The counter is the server's, not the call's: every call of this
process to the same server that overlaps the window is counted in it. So
calls that overlap in time share one window (a *period*, kept by the
process's ledger in :data:`longctx.process_state.PROCESS`): the counter is
read when the first of them starts, and again once the last has ended and
the counter has settled (engines publish metrics a moment after the
response); the growth is compared with what all of them reported. Each
call's check records its own reported tokens, those of the others in its
window (``others_reported``) and the window's id, so a report over several
calls counts a shared window once. Without this, two sessions asking the
same server at once (an MCP server's concurrent tool calls) each saw the other's hits and reported a mismatch.

Other processes' requests are not in the ledger: a process cannot see
them. Where the engine counts the prompt tokens its cache was asked about
(the profile's ``query_counter``: vLLM's prefix-cache queries, SGLang's
prompt tokens), the window compares that counter's growth with the prompt
tokens its calls' responses reported; a server asked about more than this
process sent there was reached by other clients (or by an attempt of this
process that failed after the server began it), and the window gives no
check, only a note saying why (:attr:`Settling.skips`, stored like the other
skips). Where the engine has no such counter, or a response did not say its
prompt tokens, such traffic shows as a mismatch ("counted N tokens more"),
and the note names the likely reasons.

Replicas: a call reads only the replica its pack is homed on. A request
that fails over to another replica makes the call join that replica's
window before it is sent there (:meth:`CounterSnapshot.follow`, the
delivery's ``on_away``), so its hits are counted where they land: as this
process's, not as other traffic in that window. A home replica that cannot
be read after the window (it went away) gives no check, and the note says so.

Tiers below the GPU (:mod:`longctx.backends.tiers`): the responses count
a block loaded back from host memory as cached. Where the server counts
such hits (its profile's ``tiers`` say which metrics), the window records
them by tier. Where it counts only the bytes its offloading moved, the
reported tokens the GPU counter lacks are the host tier's while bytes came
back from the host in the window (``tier_source`` ``transfers``:
inferred), and the check counts them as host hits, not as a mismatch.

A turn's check finishes off the answer's path (:meth:`Settling.then`): the
session waits for its pending checks before a report and when it closes,
never before an answer.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import field, replace
from typing import Any, Self

from longctx.backends.base import Backend
from longctx.backends.profiles import CacheCounters
from longctx.backends.tiers import TierReading
from longctx.process_state import PROCESS
from longctx.recordtypes import record_type
from longctx.report import CounterCheck
from longctx.store import CounterCheckRecord, CounterSkip, RequestRecord, Store

__all__ = [
    "CounterSnapshot",
    "PendingCheck",
    "Settling",
    "batch_check",
    "combine_checks",
    "stored_check",
    "wait_for_checks",
]

#: How long a settle waits for the counter to reach what the responses reported.
SETTLE_TIMEOUT = 5.0
#: How long a batch waits for its check before it returns without it (a
#: settle takes up to about a second; longer only while other calls of this
#: process share its window).
BATCH_CHECK_SECONDS = 8.0


class CounterSnapshot:
    """One call's place in the counter windows of the servers it reads (see the module docstring).

    Open it before the call's requests are sent (:meth:`take`, :meth:`take_all`),
    :meth:`close` it with the call's records once they have all ended. Used
    as a context manager, a call that raises (a failed request, Ctrl-C)
    leaves its windows without a check: an open window would keep its
    period, and every check sharing it, from ever settling.
    """

    def __init__(
        self,
        periods: Mapping[str, _Period] | None = None,
        notes: Sequence[str] = (),
        backend: Backend | None = None,
    ) -> None:
        # No periods: a snapshot that reads and checks nothing (``notes`` say why, when it could not).
        self._periods = dict(periods or {})
        self._notes = tuple(notes)
        self._backend = backend  # reads the replicas that requests fail over to
        self._follow_lock = threading.Lock()
        self._closed = False

    @classmethod
    def take(cls, backend: Backend, affinity_key: str | None = None) -> CounterSnapshot:
        """Open a window on the replica that serves ``affinity_key`` (only that one).

        Every request of one key goes to that replica; reading the others
        would cost a ``/metrics`` request per replica and a wait for
        counters that cannot move. A request that fails over to another
        replica opens a window there first (:meth:`follow`).
        """
        return cls._open(backend, [backend.server_for(affinity_key).api_url])

    @classmethod
    def take_all(cls, backend: Backend) -> CounterSnapshot:
        """Open a window on every replica up (a job: its packs go to all of them)."""
        # By the replicas' state: joining a window reads each counter once (reading them all to
        # list the URLs cost every replica a second /metrics request).
        return cls._open(backend, [replica.api_url for replica in backend.replicas if replica.up])

    @classmethod
    def around(cls, backend: Backend, affinity_key: str | None, enabled: bool) -> CounterSnapshot:
        """:meth:`take`, or a snapshot that reads nothing and checks nothing.

        Nothing is read with ``enabled`` false, or behind a router
        (:attr:`ServerOptions.router_policy <longctx.options.groups.ServerOptions.router_policy>`
        set): a router answers ``/metrics`` with one replica's counters, not
        necessarily the one that served, so the check could only wait and fail.
        """
        if not enabled or backend.router_policy:
            return cls()
        return cls.take(backend, affinity_key)

    @classmethod
    def _open(cls, backend: Backend, urls: Iterable[str]) -> CounterSnapshot:
        periods: dict[str, _Period] = {}
        notes: list[str] = []
        for url in urls:
            period = PROCESS.get(_Ledger).join(backend, url)
            if period is not None:
                periods[url] = period
            elif (note := backend.counter_note(url)) is not None:
                notes.append(f"no counter check: {note}")
        return cls(periods, notes, backend)

    def follow(self, url: str) -> None:
        """Count this call's requests to replica ``url`` too: join its window now, before one is sent there.

        The delivery's ``on_away`` hook (a request failing over); blocking
        (it may read the counter). A snapshot that checks nothing follows
        nowhere. Serialised, so a second request waits for the first's join
        instead of going out before the counter was read.
        """
        with self._follow_lock:
            if self._closed or not self._periods or url in self._periods:
                return
            assert self._backend is not None  # a snapshot with periods was opened on a backend
            period = PROCESS.get(_Ledger).join(self._backend, url)
            if period is not None:
                self._periods = {**self._periods, url: period}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self._closed:
            self.close("", None, [])

    def close(self, session_id: str, batch_id: str | None, records: Iterable[RequestRecord]) -> Settling:
        """End the call's windows with its requests; the checks come once its periods have settled.

        Call it once, as soon as the call's last request has ended: a
        period settles only when none of its calls is still open.
        """
        if self._closed:
            raise RuntimeError("a counter snapshot is closed once")
        self._closed = True
        records = list(records)
        shares = [
            PROCESS.get(_Ledger).leave(period, [r for r in records if r.base_url == url])
            for url, period in self._periods.items()
        ]
        notes = list(self._notes)
        elsewhere = Counter(r.base_url for r in records if self._periods and r.base_url not in self._periods)
        notes += [
            f"no counter check: {count} request(s) answered by {url}, whose counter this call could not read"
            for url, count in elsewhere.items()
        ]
        return Settling(session_id, batch_id, shares, notes)

    def close_into(self, store: Store, session_id: str, records: Iterable[RequestRecord]) -> PendingCheck:
        """:meth:`close`, and store the checks once they settle, off the caller's path (a turn's).

        The store keeps the checks made and why a server's was skipped
        (:attr:`Settling.skips`), so the session's report says it after a resume too.
        """
        settling = self.close(session_id, None, records)

        def keep(checks: list[CounterCheckRecord]) -> CounterCheck | None:
            store.sessions.record(*checks, *settling.skips)
            return combine_checks(checks, notes=settling.notes)

        return settling.then(keep)


@record_type(frozen=False)
class _Share:
    """One call's part of a period: its own requests and the cached tokens they reported."""

    period: _Period
    requests: int
    reported: int | None


class Settling:
    """A call's counter checks, once every period it took part in has settled.

    :meth:`wait` blocks for them (one :class:`CounterCheckRecord` per
    server whose counter could be read after); :meth:`then` hands them to a
    function on a worker thread, off the caller's path.
    """

    def __init__(
        self, session_id: str, batch_id: str | None, shares: Sequence[_Share], notes: Sequence[str] = ()
    ) -> None:
        self._session_id = session_id
        self._batch_id = batch_id
        self._shares = list(shares)
        self._notes = tuple(notes)

    @property
    def notes(self) -> tuple[str, ...]:
        """Why a check was skipped: no counter to read, or readings of two processes (once settled)."""
        skipped = (share.period.skipped for share in self._shares if share.period.settled.is_set())
        return self._notes + tuple(dict.fromkeys(note for note in skipped if note))

    @property
    def skips(self) -> list[CounterSkip]:
        """:attr:`notes` as the store keeps them, under the call's session."""
        return [CounterSkip(self._session_id, note, self._batch_id) for note in self.notes]

    @property
    def counter(self) -> str:
        """The name of the counter read (the first server's), or "" when none was."""
        return self._shares[0].period.counter if self._shares else ""

    def wait(self, timeout: float | None = None) -> list[CounterCheckRecord] | None:
        """The checks, or None when a period has not settled within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        checks = []
        for share in self._shares:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not share.period.settled.wait(left):
                return None
            check = share.period.check_for(share, self._session_id, self._batch_id)
            if check is not None:
                checks.append(check)
        return checks

    def then(self, keep: Callable[[list[CounterCheckRecord]], CounterCheck | None]) -> PendingCheck:
        """``keep(checks)`` on a worker thread once they are in; its result is the pending check's."""

        def finish() -> CounterCheck | None:
            checks = self.wait()
            assert checks is not None  # waited without a timeout
            return keep(checks)

        return PendingCheck(finish, idle=not self._shares)


@record_type(frozen=False)
class _Period:
    """A window on one server's counter, shared by the calls of this process that overlap in it."""

    url: str
    counter: str
    before: int
    before_tiers: TierReading | None = None
    #: The query counter at the start and end of the window (None: the engine has none).
    before_queries: int | None = None
    after_queries: int | None = None
    #: The connections of the calls that joined, latest last: the counter is
    #: read through the latest (the first may have been closed by its owner).
    backends: list[Backend] = field(default_factory=list)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    open: int = 0
    reported: int = 0
    unknown: bool = False  # a call's responses reported no cached tokens: nothing to expect
    #: The prompt tokens the calls' responses reported (``prompt_unknown``: one did not say).
    prompt: int = 0
    prompt_unknown: bool = False
    settling: bool = False
    left: int = 0  # calls that have left: a settle restarts its clock when one more has
    after: int | None = None
    after_tiers: TierReading | None = None
    settled: threading.Event = field(default_factory=threading.Event)
    #: The server processes the first reading came from (see CacheCounters.started).
    started: tuple[float, ...] = ()
    #: Why the period gives no check (its readings came from different processes).
    skipped: str | None = None

    def check_for(self, share: _Share, session_id: str, batch_id: str | None) -> CounterCheckRecord | None:
        """The check of one call of this (settled) period, or None when the counter was not read after."""
        if self.after is None or self.skipped is not None:
            return None
        others = None if self.unknown or share.reported is None else self.reported - share.reported
        tiers = _tier_deltas(
            self.before_tiers,
            self.after_tiers,
            counted=self.after - self.before,
            reported=None if self.unknown else self.reported,
        )
        return CounterCheckRecord(
            session_id=session_id,
            batch_id=batch_id,
            base_url=self.url,
            counter=self.counter,
            before=self.before,
            after=self.after,
            reported=share.reported,
            requests=share.requests,
            others_reported=others,
            window_id=self.id,
            host_tokens=tiers.host,
            external_tokens=tiers.external,
            loaded_bytes=tiers.loaded_bytes,
            tier_source=tiers.source,
        )


@record_type
class _TierDeltas:
    """A window's cached tokens by tier and bytes loaded from the host (see :func:`_tier_deltas`)."""

    source: str | None = None
    host: int | None = None
    external: int | None = None
    loaded_bytes: int | None = None


def _tier_deltas(
    before: TierReading | None, after: TierReading | None, *, counted: int, reported: int | None
) -> _TierDeltas:
    """The growth of the tier counters over a window; the host's share inferred where only bytes are counted.

    ``counted`` is the hit counter's growth, ``reported`` what every
    response of the window reported (None: unknown).
    """
    if after is None:
        return _TierDeltas()

    def grown(name: str) -> int | None:
        late: int | None = getattr(after, name)
        early: int | None = getattr(before, name) if before is not None else None
        if late is None:
            return None
        return late - (early or 0)

    loaded = grown("load_bytes")
    if after.source == "transfers":
        # No tokens by tier: what the responses reported beyond the GPU counter came from
        # the host, if anything came back from it meanwhile.
        host = None
        if reported is not None:
            host = max(0, reported - counted) if loaded else 0
        return _TierDeltas("transfers", host, None, loaded)
    return _TierDeltas(after.source, grown("host"), grown("external"), loaded)


class _Ledger:
    """The process's open periods, one per server (by its URL), and their settling.

    By URL, whatever connection a call uses: the counter is the server's,
    so two sessions with connections of their own (an MCP server's
    sources) still count in each other's windows.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._periods: dict[str, _Period] = {}
        self._idle = threading.Condition(self._lock)

    def join(self, backend: Backend, url: str) -> _Period | None:
        """The period a call starting now on ``url`` belongs to (a new one if none is open)."""
        with self._lock:
            period = self._periods.get(url)
            if period is not None:
                period.open += 1
                period.backends.append(backend)
                return period
        # Read outside the lock: it is a request to the server.
        reading = backend.counters([url]).get(url)
        if reading is None:
            return None
        with self._lock:
            # A call that started meanwhile opened one: its reading is older than this call's requests.
            period = self._periods.setdefault(
                url,
                _Period(
                    url,
                    reading.counter,
                    reading.hits,
                    reading.tiers,
                    before_queries=reading.queries,
                    started=reading.started,
                ),
            )
            period.open += 1
            period.backends.append(backend)
            return period

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no period is open or settling; False if one still is after ``timeout`` seconds."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._periods, timeout)

    def leave(self, period: _Period, records: Sequence[RequestRecord]) -> _Share:
        """A call of ``period`` has ended with ``records``; the last one out starts its settling."""
        values = [r.usage.cached_tokens for r in records if r.usage.cached_tokens is not None]
        share = _Share(period, len(records), sum(values) if values else None)
        with self._lock:
            period.open -= 1
            period.left += 1
            if share.reported is None and records:
                period.unknown = True
            period.reported += share.reported or 0
            prompts = [r.usage.prompt_tokens for r in records]
            period.prompt += sum(tokens for tokens in prompts if tokens is not None)
            period.prompt_unknown = period.prompt_unknown or None in prompts
            start = period.open == 0 and not period.settling
            if start:
                period.settling = True
        if start:
            _checkers().submit(self._settle, period)
        return share

    def _settle(self, period: _Period) -> None:
        """Read the counter until it settles; end the period unless a call joined it meanwhile.

        Engines publish metrics a moment after the response, so one read
        right after the last answer can miss the last request: the read
        waits for the hits the responses reported and, where the server
        counts queries, for the prompt tokens they reported (other clients'
        hits alone can reach the first). When the responses reported
        nothing there is nothing to wait for: a short quiet spell is enough,
        so a server without cached-token reporting does not slow every
        check by a second.
        """
        last: int | None = None
        last_tiers: TierReading | None = None
        last_queries: int | None = None
        seen, deadline, last_change = -1, 0.0, 0.0
        while True:
            with self._lock:
                if period.open:  # a call joined: its leaving settles the period
                    period.settling = False
                    return
                expected = None if period.unknown else period.before + period.reported
                asked = _asked(period)
                if period.left != seen:  # a call joined and left since: wait for its hits too
                    seen, last_change = period.left, time.monotonic()
                    deadline = last_change + SETTLE_TIMEOUT
            reading = _read(period)
            done = reading is None
            if reading is not None and (skipped := _mixed(period, reading)) is not None:
                period.skipped, done = skipped, True
            elif reading is not None:
                if reading.hits != last:
                    last, last_change = reading.hits, time.monotonic()
                last_tiers, last_queries = reading.tiers, reading.queries
                now = time.monotonic()
                # Past the expected value, other traffic is counted too: waiting cannot make it match.
                # Other clients' hits can reach it before this process's own are published, so
                # where the server counts queries, they must have counted this process's prompts too.
                reached = expected is not None and reading.hits >= expected
                reached = reached and (asked is None or reading.queries is None or reading.queries >= asked)
                quiet = 1.0 if expected is not None else 0.2
                done = reached or now - last_change >= quiet or now >= deadline
            if done:
                with self._lock:
                    if period.open:
                        period.settling = False
                        return
                    if period.left != seen:  # one more call came and went: read again
                        continue
                    if last is None and period.skipped is None:
                        period.skipped = (
                            f"no counter check: {period.url} could not be read after the window"
                            " (it went away, or stopped answering /metrics)"
                        )
                    period.after = last
                    period.after_tiers = last_tiers
                    period.after_queries = last_queries
                    if last is not None and period.skipped is None:
                        period.skipped = _unseen_traffic(period)
                    if self._periods.get(period.url) is period:
                        del self._periods[period.url]
                    self._idle.notify_all()
                period.settled.set()
                return
            time.sleep(0.1)


def _mixed(period: _Period, reading: CacheCounters) -> str | None:
    """Why ``reading`` cannot be compared with the period's first one, or None when it can."""
    if period.started and reading.started and period.started != reading.started:
        return (
            f"no counter check: {period.url} answered /metrics from another server process at the end of the"
            " window than at its start (a load balancer in front of the replicas, or a restart); give the"
            " replicas' own URLs, or declare the router"
        )
    if reading.hits < period.before:
        return (
            f"no counter check: {period.url}'s counter went down during the window ({period.before:,} then"
            f" {reading.hits:,}): it was read from two servers (a load balancer), or the server restarted"
        )
    return None


def _asked(period: _Period) -> int | None:
    """The query counter once it counts the period's requests: its first reading plus their prompt tokens.

    None where it cannot be told (no query counter, a response without its prompt tokens).
    """
    if period.before_queries is None or period.prompt_unknown:
        return None
    return period.before_queries + period.prompt


def _unseen_traffic(period: _Period) -> str | None:
    """Why a settled period gives no check: its server was asked about prompts this process did not send.

    None when it cannot tell (no query counter, a response without its
    prompt tokens) or the counter grew by no more than the period's calls
    reported: a counter read a moment early grows by less, never more, so
    only a larger growth is taken as other traffic. Checked on vLLM 0.32
    (CPU): its query counter grows by each request's prompt tokens once, at
    admission (a preempted request's second admission is not counted, a
    lookup that found no room is not either); SGLang 0.5.23 counts each
    finished request's prompt tokens once.
    """
    asked = _asked(period)
    if asked is None or period.after_queries is None:
        return None
    unseen = period.after_queries - asked
    if unseen <= 0:
        return None
    return (
        f"no counter check on {period.url}: other clients' requests reached it in the window"
        f" ({unseen:,} prompt tokens this process did not send, or sent in an attempt that failed"
        " after the server began it)"
    )


def _read(period: _Period) -> CacheCounters | None:
    """The period's counter now, through the latest of its connections that can still read it."""
    for backend in reversed(period.backends):
        try:
            return backend.counters([period.url]).get(period.url)
        except Exception:  # noqa: BLE001 - closed by its owner, or the server gone: try the next
            continue
    return None


def wait_for_checks(timeout: float = 30.0) -> bool:
    """Wait until every counter window of this process has settled; False on ``timeout``.

    For a program (or a test) about to end or to reuse a server's URL for
    another server: the checks settle on worker threads after the calls
    that made them have returned.
    """
    return PROCESS.get(_Ledger).wait_idle(timeout)


def batch_check(
    settling: Settling, keep: Callable[[list[CounterCheckRecord]], None], pending: list[PendingCheck]
) -> CounterCheck | None:
    """A batch's check for its report if its window settles soon; ``keep`` stores it either way.

    The batch's window is shared with the calls of this process that
    overlapped it. While one of them still runs (another session's long
    batch), the batch returns without its check, which ``keep`` gets later
    from a :class:`PendingCheck` appended to ``pending`` (the session
    waits for those before its report).
    """

    def finish(checks: list[CounterCheckRecord]) -> CounterCheck | None:
        keep(checks)
        return combine_checks(checks, notes=settling.notes)

    checks = settling.wait(timeout=BATCH_CHECK_SECONDS)
    if checks is not None:
        return finish(checks)
    pending.append(settling.then(finish))
    return CounterCheck(
        counter=settling.counter,
        server_delta=None,
        reported=None,
        matches=None,
        note="other calls of this process on the same server were still running; the session's report has it",
    )


class PendingCheck:
    """A counter check finishing on a worker thread; :meth:`wait` for its result.

    The workers are shared by the process and started once (starting a
    thread per turn cost milliseconds on a loaded machine, on the answer's
    path). A failure to read or store the check (the server gone, the store
    closed by its owner) is kept in ``error``, never raised: the check is
    evidence about the answer, not part of it.
    """

    def __init__(self, finish: Callable[[], CounterCheck | None], *, idle: bool = False) -> None:
        self.result: CounterCheck | None = None
        self.error: BaseException | None = None
        self._finish = finish
        # Nothing was read before the call: nothing to check, no work queued.
        self._future: Future[None] | None = None if idle else _waiters().submit(self._run)

    def _run(self) -> None:
        try:
            self.result = self._finish()
        except Exception as error:  # noqa: BLE001 - kept for the caller, see the class docstring
            self.error = error

    def wait(self, timeout: float | None = None) -> CounterCheck | None:
        if self._future is not None:
            wait([self._future], timeout)
        return self.result


class _CounterThreads:
    """The process's threads that read counters and store checks (in :data:`~longctx.process_state.PROCESS`).

    ``settlers`` read counters until they settle: a few, since a counter that
    never reaches the expected value holds one for seconds and must not hold
    up the other servers' periods. ``waiters`` wait for a settled period and
    store its checks, apart from the readers: a waiter blocks until its
    period ends, and waiters filling every reader thread would leave none to
    end it.
    """

    def __init__(self) -> None:
        self.settlers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="longctx-counter-settle")
        self.waiters = ThreadPoolExecutor(max_workers=8, thread_name_prefix="longctx-counter-check")

    def close(self) -> None:
        """Let the threads end once their work is done (:meth:`ProcessState.reset` calls it)."""
        self.settlers.shutdown(wait=False)
        self.waiters.shutdown(wait=False)


def _checkers() -> ThreadPoolExecutor:
    return PROCESS.get(_CounterThreads).settlers


def _waiters() -> ThreadPoolExecutor:
    return PROCESS.get(_CounterThreads).waiters


def stored_check(
    store: Store,
    session_ids: Sequence[str],
    *,
    pending: tuple[Sequence[CounterCheckRecord], Sequence[CounterSkip]] = ((), ()),
    where: Callable[[CounterCheckRecord | CounterSkip], bool] | None = None,
) -> CounterCheck | None:
    """The check over what the store keeps for these sessions: the checks made, why others were skipped.

    ``pending`` adds the checks and skips of a session not stored yet;
    ``where`` keeps only the records of one call (a batch's).
    """
    checks = [*store.sessions.counter_checks(session_ids), *pending[0]]
    skips = [*store.sessions.counter_skips(session_ids), *pending[1]]
    if where is not None:
        checks, skips = [c for c in checks if where(c)], [s for s in skips if where(s)]
    return combine_checks(checks, notes=tuple(dict.fromkeys(skip.note for skip in skips)))


def combine_checks(checks: Sequence[CounterCheckRecord], *, notes: Sequence[str] = ()) -> CounterCheck | None:
    """One check over several servers or calls; None when there is none and nothing was skipped.

    Calls that shared a window (the same ``window_id``) count its growth
    once, against what all its calls reported: theirs and the others'.
    ``notes`` say why a server's check was skipped (a router whose workers
    cannot be read, readings of two processes); with no check left they are
    the result's note. A growth below what was reported is never shown as
    a negative "more".
    """
    if not checks:
        if not notes:
            return None
        return CounterCheck(counter="", server_delta=None, reported=None, matches=None, note="; ".join(notes))
    combined = _combined(checks)
    if notes:
        combined = replace(combined, note="; ".join(filter(None, (combined.note, *notes))))
    return combined


def _combined(checks: Sequence[CounterCheckRecord]) -> CounterCheck:
    windows: dict[str, list[CounterCheckRecord]] = {}
    for number, check in enumerate(checks):
        windows.setdefault(check.window_id or f"own {number}", []).append(check)
    firsts = [group[0] for group in windows.values()]
    counted = sum(first.after - first.before for first in firsts)
    tiers = _combined_tiers(firsts)
    # Host hits a server counts only in bytes: the inferred tokens count as the server's.
    delta = counted + (tiers["host_tokens"] or 0 if tiers["tier_source"] == "transfers" else 0)
    if any(check.reported is None or check.others_reported is None for check in checks):
        return CounterCheck(
            counter=checks[0].counter,
            server_delta=delta,
            reported=None,
            matches=None,
            note="responses did not report cached tokens; the server counter is the only figure",
            **tiers,
        )
    reported = sum(check.reported or 0 for check in checks)
    # The window's other calls are those not in this report (their own rows are elsewhere).
    expected = sum((first.reported or 0) + (first.others_reported or 0) for first in firsts)
    others = expected - reported
    matches = delta == expected
    inferred = (
        f"{tiers['host_tokens']:,} of the tokens came from host memory "
        f"({(tiers['loaded_bytes'] or 0) / (1 << 30):,.2f} GiB loaded back; the server counts bytes "
        "only, so the tokens are the responses' cached tokens less its GPU counter)"
        if tiers["tier_source"] == "transfers" and tiers["host_tokens"]
        else ""
    )
    if not matches and delta > expected:
        note = (
            f"the server counted {delta - expected:,} tokens more than the responses reported "
            "(other clients' traffic, a request that failed after the server began it,"
            " or requests longctx did not make, in the same window)"
        )
    elif not matches:
        note = (
            f"the server counted {expected - delta:,} tokens fewer than the responses reported "
            "(its counter was not the one that served them: a load balancer in front of the replicas"
            " answered /metrics; give the replicas' URLs or declare the router)"
        )
    elif others:
        note = f"{others:,} of the tokens were cached by other calls of this process in the same window"
    else:
        note = ""
    note = "; ".join(filter(None, (note, inferred)))
    return CounterCheck(
        counter=checks[0].counter,
        server_delta=delta,
        reported=reported,
        matches=matches,
        note=note,
        others_reported=others,
        **tiers,
    )


def _combined_tiers(firsts: Sequence[CounterCheckRecord]) -> dict[str, Any]:
    """The windows' tier figures summed: a count is None when a window that counted tiers lacks it."""
    with_tiers = [check for check in firsts if check.tier_source is not None]
    if not with_tiers:
        return {"host_tokens": None, "external_tokens": None, "loaded_bytes": None, "tier_source": None}

    def summed(name: str) -> int | None:
        values = [getattr(check, name) for check in with_tiers]
        return None if any(value is None for value in values) else sum(values)

    sources = sorted({check.tier_source for check in with_tiers if check.tier_source})
    return {
        "host_tokens": summed("host_tokens"),
        "external_tokens": summed("external_tokens"),
        "loaded_bytes": summed("loaded_bytes"),
        "tier_source": "+".join(sources),
    }
