"""The server's own prefix-cache counters, read around a call, against what the responses said.

A :class:`CounterSnapshot` reads each server's hit counter
(``vllm:prefix_cache_hits_total``, ``sglang:cached_tokens_total``) before a
call; after it, the counter is read again until it settles (engines publish
metrics a moment after the response) and its growth is compared with the
cached tokens the responses reported. Each check is stored with the
session, so a report can show it later.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from longctx.backends.base import Backend
from longctx.report import CounterCheck
from longctx.store import CounterCheckRecord, RequestRecord, Store

__all__ = ["CounterSnapshot", "combine_checks"]


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

    def finish(
        self, store: Store, session_id: str, batch_id: str | None, records: Iterable[RequestRecord]
    ) -> CounterCheck | None:
        """Read the counters again (until they settle), store and return the check."""
        checks = self.settle(session_id, batch_id, records)
        for check in checks:
            store.record_counter_check(check)
        return combine_checks(checks)

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
        if last == expected or now - last_change >= quiet or now >= deadline:
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
