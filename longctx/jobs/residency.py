"""Where a pack's KV probably is now: on the GPU, in the host tier, or gone.

A server keeps prefix blocks in LRU order: the GPU the most recent, a host
tier (vLLM native offloading, LMCache, SGLang HiCache) the ones evicted from
it, up to its size. This process does not see the server's cache, but it
knows the packs it sent to each replica and when: walking them from the
most recent, the packs within the GPU's tokens are likely still there, the
next ones within the host tier's tokens are likely parked on the host (a
revisit costs a transfer, not a prefill), and the rest are gone (a revisit
prefills again). With an inclusive tier (every block is written to the host
as it is computed) the host holds copies of the GPU's packs too, so the
packs kept are those within the larger of the two sizes.

It is an estimate, used only to order work: other clients' traffic, and
packs this process sent before it started, are not in it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Literal, NamedTuple

__all__ = ["TIER_RANK", "Placement", "Residency", "Sizes", "Tier"]

Tier = Literal["device", "host", "cold"]

#: The order a job visits packs in: cheapest first.
TIER_RANK: dict[Tier, int] = {"device": 0, "host": 1, "cold": 2}

Sizes = dict[str, tuple[int | None, int | None]]
"""Each replica URL's (GPU tokens, host tier tokens); None where not known."""


class Placement(NamedTuple):
    """Where a pack's KV likely is: the cheapest tier, and the replica that holds it (None: cold)."""

    tier: Tier
    replica: str | None


class Residency:
    """The packs sent to each replica, most recent last, with their prefix tokens."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._replicas: dict[str, OrderedDict[Hashable, int]] = {}

    def touch(self, url: str, key: Hashable, tokens: int) -> None:
        """``key``'s pack of ``tokens`` tokens was just read on ``url`` (it is now the most recent)."""
        with self._lock:
            seen = self._replicas.setdefault(url, OrderedDict())
            seen.pop(key, None)
            seen[key] = tokens
            # Each replica keeps only what a server could still hold a trace of.
            while len(seen) > 4096:
                seen.popitem(last=False)

    def where(self, key: Hashable, tiers: Sizes) -> Placement:
        """The cheapest tier ``key``'s pack is likely in, and the replica, given each URL's tier sizes.

        ``tiers`` maps a replica URL to its (GPU tokens, host tokens); a
        None GPU size counts as one pack (the one sent last), a None host
        size as no host tier.
        """
        best = Placement("cold", None)
        for url, seen in self.sent().items():
            if url not in tiers:
                continue
            gpu, host = tiers[url]
            newer = 0
            for seen_key, tokens in reversed(seen):
                if seen_key == key:
                    tier = _tier(newer, tokens, gpu, host)
                    if TIER_RANK[tier] < TIER_RANK[best.tier]:
                        best = Placement(tier, url)
                    break
                newer += tokens
        return best

    def sent(self) -> dict[str, list[tuple[Hashable, int]]]:
        """Per replica URL, the packs recorded and their tokens, oldest first."""
        with self._lock:
            return {url: list(seen.items()) for url, seen in self._replicas.items()}

    def forget(self) -> None:
        """Drop everything (a test, or servers restarted)."""
        with self._lock:
            self._replicas.clear()


def _tier(newer: int, tokens: int, gpu: int | None, host: int | None) -> Tier:
    """The tier of a pack of ``tokens`` with ``newer`` tokens of packs sent after it."""
    held = newer + tokens
    if (gpu is None and newer == 0) or (gpu is not None and held <= gpu):
        return "device"
    if host is not None and held <= max(host, gpu or 0):
        return "host"
    return "cold"


"""The process's record (jobs write it as their packs finish and read it to order the next)."""
