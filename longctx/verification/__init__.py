"""Verification: whether the cache did what the responses say, checked against the server.

A service the sessions and jobs use; it imports none of them.

- :mod:`~longctx.verification.counters`: the server's own prefix-cache
  counters read around calls (:class:`CounterSnapshot`), compared with the
  cached tokens the responses reported; calls of the process that overlap on
  one server share a window; the checks settle off the answer's path;
- :mod:`~longctx.verification.canary`: the cache-correctness canary, a probe
  asked cold, cold again and from the cache, compared token by token
  (:func:`canary`, :func:`acanary`, one plan), and :class:`CanarySampler`,
  a session's one-request-in-N sampling of it.
"""

from __future__ import annotations

from longctx.verification.canary import (
    CanaryComparison,
    CanaryOptions,
    CanaryResult,
    CanaryRun,
    CanarySampler,
    acanary,
    canary,
)
from longctx.verification.counters import CounterSnapshot, wait_for_checks

__all__ = [
    "CanaryComparison",
    "CanaryOptions",
    "CanaryResult",
    "CanaryRun",
    "CanarySampler",
    "CounterSnapshot",
    "acanary",
    "canary",
    "wait_for_checks",
]
