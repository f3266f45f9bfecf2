"""The room each replica has for a job's packs in flight: KV tokens claimed against its cache.

A replica always takes one pack, however large; more only while their
claims fit the share of its KV cache the job may use, and never more packs
in flight in all than the job's limit. A replica whose size is unknown takes
one pack at a time.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["KvRoom"]


class KvRoom:
    """The KV tokens each replica URL has left for packs in flight, under one condition."""

    def __init__(self, capacity: dict[str, int | None], share: float, limit: int) -> None:
        self._capacity = {url: None if size is None else int(size * share) for url, size in capacity.items()}
        self._claimed: Counter[str] = Counter()
        self._running: Counter[str] = Counter()
        self.limit = limit

    @property
    def in_flight(self) -> int:
        return self._running.total()

    def fits(self, url: str, claim: int) -> bool:
        """Whether a pack claiming ``claim`` tokens may start on ``url`` now."""
        if self.in_flight >= self.limit:
            return False
        if self._running[url] == 0:
            return True  # a replica always takes one pack, however large
        capacity = self._capacity.get(url)
        if capacity is None:
            return False  # unknown size: one pack at a time
        return self._claimed[url] + claim <= capacity

    def take(self, url: str, claim: int) -> None:
        self._running[url] += 1
        self._claimed[url] += claim

    def give_back(self, url: str, claim: int) -> None:
        self._running[url] -= 1
        self._claimed[url] -= claim
