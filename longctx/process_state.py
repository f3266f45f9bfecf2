"""The state that lives as long as the process: one registry, :data:`PROCESS`.

What follows outlives the call that made them and are shared by every session
and job of the process, whatever backend or store each one uses:

- the counter windows (:mod:`longctx.verification.counters`): the server's
  prefix-cache counter is the server's, not a call's, so calls of this
  process that overlap on one server must share one window;
- the residency of packs on replicas (:mod:`longctx.jobs.residency`): which
  packs this process sent to each replica, and when, so a job can visit the
  packs still cached first;
- the requests waiting for a server's first byte
  (:mod:`longctx.backends.waits`), so the CLI can say what it waits on;
- the threads that settle counter windows and store their checks
  (:mod:`longctx.verification.counters`);
- the config files parsed so far (:mod:`longctx.options.settings`), each
  read again only when it changes.

Each is made on first use, one per process, by ``PROCESS.get(kind)``; no
module keeps such state in a global of its own. :meth:`ProcessState.reset`
forgets them all: for tests, between two of them, once no call is running.
"""

from __future__ import annotations

import threading
from typing import TypeVar, cast

__all__ = ["PROCESS", "ProcessState"]

_T = TypeVar("_T")


class ProcessState:
    """One instance of each registered kind of state, made on first use; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[type, object] = {}

    def get(self, kind: type[_T]) -> _T:
        """The process's one ``kind()``, made now if this is the first call for it."""
        with self._lock:
            found = self._objects.get(kind)
            if found is None:
                found = self._objects[kind] = kind()
            return cast(_T, found)

    def reset(self) -> None:
        """Forget every object made so far, closing those with a ``close``; :meth:`get` makes them anew."""
        with self._lock:
            made, self._objects = list(self._objects.values()), {}
        for found in made:
            close = getattr(found, "close", None)
            if callable(close):
                close()


PROCESS = ProcessState()
"""The registry of this process's long-lived state (see the module docstring)."""
