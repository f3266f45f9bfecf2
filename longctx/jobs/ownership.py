"""One owner per job item: the leases a run holds, renewed while it asks, given back as answers are stored.

Two runs of one job (two terminals, a cron job beside a user, a run
restarted while the old one still answers) would otherwise both ask every
item neither had answered when it began. Before a pack's items are asked,
:class:`ItemOwnership` takes their leases in one transaction
(:meth:`longctx.store.leases.ItemLeases.take`, keyed by
:func:`longctx.jobs.keys.item_lease_key`): an item another live run holds
is *deferred* ("asked by another run"), one answered meanwhile is reused.
A thread renews the run's leases while it runs; each is given back when
its answer is stored, and all of them when the run ends, however it ends.

At the end of its own work a run waits for its deferred items
(:meth:`ItemOwnership.poll`): the other run's answer is taken as it is
stored; an item whose lease the other run gave back unanswered (its
request failed, it was stopped) or let lapse (it died: a lapsed lease, or at
once a process of this host that no longer runs) is taken over and asked.

A run that could not renew its leases for longer than they last (a store
out of reach, a machine suspended) may have lost an item it is still
asking: its answer is then refused in the answer's own transaction
(:meth:`longctx.store.leases.ItemLeases.check_held`), the item's result
carries the :class:`~longctx.errors.LeaseLost` error, and the run that took
it over stores its answer: never stored twice.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import field

from longctx.errors import LongctxError
from longctx.recordtypes import record_type
from longctx.store import LeaseClaim, LeaseHolder, Store, TurnRecord

__all__ = ["Deferred", "ItemOwnership", "Polled"]

logger = logging.getLogger("longctx.jobs")


@record_type
class Deferred:
    """An item another run was asking when this run reached it: its lease key and the run holding it."""

    index: int
    lease_key: str
    holder: LeaseHolder


@record_type
class Polled:
    """What became of the deferred items since the last look.

    ``answered``: the other run's stored answer of each item, by index, with
    the run that asked it; ``taken_over``: the items whose lease this run
    now holds (the other let go unanswered, or died), to be asked here.
    """

    answered: dict[int, tuple[TurnRecord, LeaseHolder]] = field(default_factory=dict)
    taken_over: tuple[Deferred, ...] = ()


class ItemOwnership:
    """The leases of one run of a job, in ``store``, each for ``seconds`` unless renewed.

    Constructing one touches nothing; :meth:`claim` takes leases (and starts
    the renewing thread), :meth:`close` gives every lease back and stops it.
    """

    def __init__(self, store: Store, seconds: float, *, answered_since: float = 0.0) -> None:
        self.holder = LeaseHolder.this_process(uuid.uuid4().hex[:12])
        self.seconds = seconds
        self.deferred: dict[int, Deferred] = {}
        self._store = store
        self._answered_since = answered_since
        self._stop = threading.Event()
        self._renewing: threading.Thread | None = None
        self._lock = threading.Lock()

    def claim(self, keys: dict[int, str]) -> dict[int, LeaseClaim]:
        """Take the leases of ``keys`` (lease key by item index) at once; the claim of each index.

        An item held by another live run is added to :attr:`deferred`.
        """
        indices = list(keys)
        # From the first claim on, this run's answers are stored only under its own leases.
        self._store.leases.hold_for(self.holder.run_id, self.seconds)
        claims = self._store.leases.take(
            [keys[i] for i in indices], self.holder, self.seconds, answered_since=self._answered_since
        )
        by_index = dict(zip(indices, claims, strict=True))
        with self._lock:
            for index, claimed in by_index.items():
                if claimed.state == "held" and claimed.holder is not None:
                    self.deferred[index] = Deferred(index, claimed.key, claimed.holder)
            if self._renewing is None and any(c.state == "taken" for c in claims):
                self._renewing = threading.Thread(target=self._renew, name="longctx-job-leases", daemon=True)
                self._renewing.start()
        return by_index

    def answer_of(self, lease_key: str) -> TurnRecord | None:
        """The latest answer stored under ``lease_key`` since the run began, or None."""
        stored = [
            turn
            for turn in self._store.sessions.answered_under(lease_key + ":").values()
            if turn.created_at >= self._answered_since
        ]
        return max(stored, key=lambda turn: turn.created_at) if stored else None

    def poll(self, wait: float) -> Polled:
        """After ``wait`` s, what became of the deferred items; those settled leave :attr:`deferred`."""
        time.sleep(wait)
        with self._lock:
            waiting = list(self.deferred.values())
        claims = self.claim({item.index: item.lease_key for item in waiting})
        polled = Polled()
        taken: list[Deferred] = []
        for item in waiting:
            state = claims[item.index].state
            if state == "answered":
                turn = self.answer_of(item.lease_key)
                if turn is not None:
                    polled.answered[item.index] = (turn, item.holder)
            elif state == "taken":
                taken.append(item)
            else:
                continue
            with self._lock:
                self.deferred.pop(item.index, None)
        return Polled(polled.answered, tuple(taken))

    def release(self, lease_keys: Sequence[str]) -> None:
        """Give back the leases of ``lease_keys`` (answered, or failed and free for another run)."""
        self._store.leases.release(self.holder.run_id, lease_keys)

    def close(self) -> None:
        """Stop renewing and give every lease back; a store that cannot be written lets them lapse."""
        self._stop.set()
        if self._renewing is not None:
            self._renewing.join()
        # A store that cannot be written: the leases lapse after self.seconds, then another run takes them.
        with suppress(LongctxError):
            self._store.leases.release(self.holder.run_id)
        self._store.leases.done_for(self.holder.run_id)

    def _renew(self) -> None:
        # A third of the lease: two renewals may fail (a store locked a while) before one lapses.
        failing_since: float | None = None
        lapsed = False
        while not self._stop.wait(self.seconds / 3):
            try:
                self._store.leases.renew(self.holder.run_id, self.seconds)
            except LongctxError as error:
                if failing_since is None:
                    failing_since, lapsed = time.monotonic(), False
                    logger.warning("cannot renew the job's item leases (%s); retrying", error)
                elif not lapsed and time.monotonic() - failing_since > self.seconds:
                    lapsed = True
                    logger.warning(
                        "the job's item leases lapsed unrenewed: an answer to an item another run took"
                        " over meanwhile will not be stored"
                    )
                continue
            failing_since = None
