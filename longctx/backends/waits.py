"""What the process is waiting on from servers right now: :class:`Waits`, one per process.

Every request to a server is registered here from the moment it is sent
until the first byte of its answer arrives (a JSON request: its whole
answer; a streamed answer: its first event), with the time it gives up
after. The CLI reads :meth:`Waits.oldest` to tell a person what it waits on
while a server says nothing (a server that accepts connections and never
answers would otherwise look like a hung command). The registry is
:data:`longctx.process_state.PROCESS`'s (``PROCESS.get(Waits)``), reset
with it.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from longctx.recordtypes import record_type

__all__ = ["Wait", "WaitHandle", "Waits", "seconds_text"]


def seconds_text(seconds: float) -> str:
    """A bound in seconds as a person reads it: ``3`` (not ``2.99998``), ``0.5``, ``600``."""
    return f"{seconds:.0f}" if seconds >= 10 else f"{seconds:.2g}"


@record_type
class Wait:
    """A request waiting for its answer: where, since when (``time.monotonic``), its bound in seconds."""

    url: str
    since: float
    gives_up_after: float
    #: What the server is expected to be doing meanwhile (a cold prefill and how long it should take).
    about: str | None = None

    def describe(self, now: float | None = None) -> str:
        """``waiting for URL (3 s, gives up after 30 s)``, then what it waits for when known."""
        elapsed = (time.monotonic() if now is None else now) - self.since
        bound = seconds_text(self.gives_up_after)
        line = f"waiting for {self.url} ({elapsed:.0f} s, gives up after {bound} s)"
        return f"{line}: {self.about}" if self.about else line


class WaitHandle:
    """A registered wait; :meth:`end` it when the answer's first byte came (idempotent)."""

    def __init__(self, waits: Waits, number: int) -> None:
        self._waits = waits
        self._number = number

    def end(self) -> None:
        self._waits._forget(self._number)


class Waits:
    """The requests of this process waiting for a first byte; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        self._waiting: dict[int, Wait] = {}

    @contextmanager
    def waiting(self, url: str, gives_up_after: float, about: str | None = None) -> Iterator[WaitHandle]:
        """Register a wait on ``url`` for the block (or until the handle's :meth:`~WaitHandle.end`)."""
        with self._lock:
            number = next(self._numbers)
            self._waiting[number] = Wait(url, time.monotonic(), gives_up_after, about)
        handle = WaitHandle(self, number)
        try:
            yield handle
        finally:
            handle.end()

    def oldest(self) -> Wait | None:
        """The wait that began first among those still open; None when nothing is awaited."""
        with self._lock:
            return min(self._waiting.values(), key=lambda wait: wait.since, default=None)

    def _forget(self, number: int) -> None:
        with self._lock:
            self._waiting.pop(number, None)
