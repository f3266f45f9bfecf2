"""The server's own prefix-cache counters, read around a call, against what the responses said.

A :class:`CounterSnapshot` reads each server's hit counter
(``vllm:prefix_cache_hits_total``, ``sglang:cached_tokens_total``) before a
call; after it, the counter is read again until it settles (engines publish
metrics a moment after the response) and its growth is compared with the
cached tokens the responses reported. Each check is stored with the
session, so a report can show it later.

A single turn's check runs off the request's path (:meth:`CounterSnapshot.finish_later`):
the engines publish their counters a moment after the response, and the
wait for them to settle (up to a second, more behind a router whose
``/metrics`` is another replica's) must not delay the answer. The session
waits for its pending checks before a report and when it closes.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from longctx.backends.base import Backend
from longctx.report import CounterCheck
from longctx.store import CounterCheckRecord, RequestRecord, Store

__all__ = ["CounterSnapshot", "PendingCheck", "combine_checks"]


class CounterSnapshot:
    """The server counters before a call, to compare with the responses after it."""

    def __init__(self, backend: Backend, before: Mapping[str, Any]) -> None:
        self.backend = backend
        self.before = before

    @classmethod
    def take(cls, backend: Backend, affinity_key: str | None = None) -> CounterSnapshot:
        """Read the counter of the replica that serves ``affinity_key`` (only that one).

        Every request of one key goes to that replica; reading the others
        would cost a ``/metrics`` request per replica and a wait for
        counters that cannot move. A request that fails over to another
        replica is simply not checked.
        """
        return cls(backend, backend.counters([backend.server_for(affinity_key).api_url]))

    @classmethod
    def around(cls, backend: Backend, affinity_key: str | None, enabled: bool) -> CounterSnapshot:
        """:meth:`take`, or a snapshot that reads nothing and checks nothing.

        Nothing is read with ``enabled`` false, or behind a router
        (:attr:`ServerOptions.router_policy <longctx.config.ServerOptions.router_policy>`
        set): a router answers ``/metrics`` with one replica's counters, not
        necessarily the one that served, so the check could only wait and fail.
        """
        if not enabled or backend.router_policy:
            return cls(backend, {})
        return cls.take(backend, affinity_key)

    def finish(
        self, store: Store, session_id: str, batch_id: str | None, records: Iterable[RequestRecord]
    ) -> CounterCheck | None:
        """Read the counters again (until they settle), store and return the check."""
        checks = self.settle(session_id, batch_id, records)
        for check in checks:
            store.record_counter_check(check)
        return combine_checks(checks)

    def finish_later(
        self, store: Store, session_id: str, batch_id: str | None, records: Iterable[RequestRecord]
    ) -> PendingCheck:
        """:meth:`finish` on a background thread; the caller waits for it before it reports."""
        return PendingCheck(
            lambda: self.finish(store, session_id, batch_id, list(records)), idle=not self.before
        )

    def compare(self, records: Iterable[RequestRecord]) -> CounterCheck | None:
        """:meth:`finish` without storing: for a check over many sessions (a job)."""
        return combine_checks(self.settle("", None, records))

    def settle(
        self, session_id: str, batch_id: str | None, records: Iterable[RequestRecord]
    ) -> list[CounterCheckRecord]:
        """Read the counters again (until they settle): one check per server, not stored."""
        records = list(records)
        checks: list[CounterCheckRecord] = []
        for url, before in self.before.items():
            if before is None:
                continue
            mine = [r for r in records if r.base_url == url]
            reported_values = [r.usage.cached_tokens for r in mine if r.usage.cached_tokens is not None]
            reported = sum(reported_values) if reported_values else None
            expected = None if reported is None else before.hits + reported
            after = _settled_counter(self.backend, url, expected)
            if after is None:
                continue
            check = CounterCheckRecord(
                session_id=session_id,
                batch_id=batch_id,
                base_url=url,
                counter=before.counter,
                before=before.hits,
                after=after,
                reported=reported,
                requests=len(mine),
            )
            checks.append(check)
        return checks


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
        self._future: Future[None] | None = None if idle else _checkers().submit(self._run)

    def _run(self) -> None:
        try:
            self.result = self._finish()
        except Exception as error:  # noqa: BLE001 - kept for the caller, see the class docstring
            self.error = error

    def wait(self, timeout: float | None = None) -> CounterCheck | None:
        if self._future is not None:
            wait([self._future], timeout)
        return self.result


@functools.cache
def _checkers() -> ThreadPoolExecutor:
    # A few workers: a check waits up to a few seconds for a counter that
    # does not settle, and one such must not hold up the other sessions'.
    return ThreadPoolExecutor(max_workers=4, thread_name_prefix="longctx-counter-check")


def _settled_counter(backend: Backend, url: str, expected: int | None, timeout: float = 5.0) -> int | None:
    """The counter once it reaches ``expected`` or stops moving for a while.

    Engines publish metrics a moment after the response, so one read right
    after the last answer can miss the last request. When the responses
    reported nothing there is nothing to wait for: a short quiet spell is
    enough, so a server without cached-token reporting does not slow every
    turn by a second.
    """
    quiet = 1.0 if expected is not None else 0.2
    deadline = time.monotonic() + timeout
    last: int | None = None
    last_change = time.monotonic()
    while True:
        reading = backend.counters([url]).get(url)
        if reading is None:
            return last
        if reading.hits != last:
            last, last_change = reading.hits, time.monotonic()
        now = time.monotonic()
        # Past the expected value, other traffic is counted too: waiting cannot make it match.
        reached = expected is not None and last >= expected
        if reached or now - last_change >= quiet or now >= deadline:
            return last
        time.sleep(0.1)


def combine_checks(checks: Sequence[CounterCheckRecord]) -> CounterCheck | None:
    """One check over several servers or calls; None when there is none."""
    if not checks:
        return None
    delta = sum(check.after - check.before for check in checks)
    reported_parts = [check.reported for check in checks]
    if any(part is None for part in reported_parts):
        return CounterCheck(
            counter=checks[0].counter,
            server_delta=delta,
            reported=None,
            matches=None,
            note="responses did not report cached tokens; the server counter is the only figure",
        )
    reported = sum(part or 0 for part in reported_parts)
    matches = delta == reported
    note = (
        ""
        if matches
        else (
            f"the server counted {delta - reported:+,} tokens more than the responses reported "
            "(other clients' traffic, or requests longctx did not make, in the same window)"
        )
    )
    return CounterCheck(
        counter=checks[0].counter, server_delta=delta, reported=reported, matches=matches, note=note
    )
