"""The cache canary on a session's own prefix, on request or sampled one request in N.

:func:`session_canary` is the plan of :meth:`Session.canary
<longctx.sessions.session.Session.canary>`: the probe is the request the
session's next turn would send (its system header, its pack, its history)
with the canary's question, so the canary checks the real prefix, not a
toy prompt; the cached run is read under the session's own ``cache_salt``,
so the cache entries its answers are served from are the ones checked.

:class:`CanarySampler` counts a session's requests for
:attr:`RequestOptions.canary_every <longctx.config.RequestOptions.canary_every>`
and keeps the results.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from longctx.cache_canary import CANARY_QUESTION, CanaryOptions, CanaryResult, canary_plan
from longctx.drivers import Plan

if TYPE_CHECKING:
    from longctx.sessions.session import Session

__all__ = ["CanarySampler", "session_canary"]


def session_canary(session: Session, options: CanaryOptions | None = None) -> Plan[CanaryResult]:
    """The canary's plan over ``session``'s own prefix (see the module docstring); the result is kept.

    The session is connected (and its pack made) already: this plan only asks.
    """
    messages = session.messages(CANARY_QUESTION)
    result = yield from canary_plan(
        session.backend,
        messages,
        options,
        affinity_key=session.affinity_key,
        cached_salt=session.request.cache_salt,
    )
    session.canaries.keep(result)
    return result


class CanarySampler:
    """One request in ``every`` is followed by a canary (none when ``every`` is None); the results so far.

    Thread-safe: a batch's siblings count from their threads.
    """

    def __init__(self, every: int | None) -> None:
        self.every = every
        self._count = 0
        self._results: list[CanaryResult] = []
        self._lock = threading.Lock()

    def due(self, requests: int = 1) -> bool:
        """Count ``requests`` more; True when the count passed a multiple of ``every``."""
        if not self.every:
            return False
        with self._lock:
            before, self._count = self._count, self._count + requests
            return before // self.every != self._count // self.every

    def keep(self, result: CanaryResult) -> None:
        with self._lock:
            self._results.append(result)

    @property
    def results(self) -> tuple[CanaryResult, ...]:
        """Every canary run on this session, oldest first."""
        with self._lock:
            return tuple(self._results)

    @property
    def diverged(self) -> tuple[CanaryResult, ...]:
        """The runs whose cached answer diverged (the findings)."""
        return tuple(result for result in self.results if result.diverged)
