"""What a command waits on, said on stderr while a server is silent.

A watcher thread reads the process's open requests
(:class:`~longctx.backends.waits.Waits`) a few times a second. A request is
shown once it has waited, without a byte, a tenth of the time it is
allowed (:func:`silent_for_a_while`: between :data:`SHOW_AFTER` and
:data:`SHOW_AFTER_AT_MOST` seconds): a server silent for long enough to
worry about, never the prefill of a healthy run (with the default 600 s
timeout, 30 s of silence). On a terminal it is shown in the live status
line, updated in place (``waiting for http://host/v1/models (31 s, gives
up after 600 s)``, replacing the command's own message until the answer
starts); elsewhere (a file, a pipe) as a plain line, at most one every
:data:`REPEAT_EVERY` seconds, whichever requests wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from longctx.backends import Wait, Waits
from longctx.process_state import PROCESS

__all__ = [
    "REPEAT_EVERY",
    "SHOW_AFTER",
    "SHOW_AFTER_AT_MOST",
    "StatusLine",
    "silent_for_a_while",
    "watching_waits",
]

SHOW_AFTER = 0.5
"""The least silence shown (a request bounded to a few seconds is shown within a second)."""

SHOW_AFTER_AT_MOST = 30.0
"""The most silence before a request is shown, however long it may wait."""

REPEAT_EVERY = 60.0
"""Seconds between two plain lines (a file or a pipe): at most one a minute."""


def silent_for_a_while(wait: Wait, now: float) -> bool:
    """Whether ``wait`` has gone without a byte long enough to be shown: a tenth of its bound, capped."""
    threshold = min(max(SHOW_AFTER, wait.gives_up_after / 10), SHOW_AFTER_AT_MOST)
    return now - wait.since >= threshold


_POLL_SECONDS = 0.2


class StatusLine:
    """A live status line shared by the command's messages and the waits: a wait shows while it lasts."""

    def __init__(self, update: Callable[[str], None]) -> None:
        self._update = update
        self._message = "starting"
        self._waiting = False
        self._lock = threading.Lock()

    def say(self, message: str) -> None:
        """The command's own message (shown now, or once no wait is shown)."""
        with self._lock:
            self._message = message
            if not self._waiting:
                self._update(message)

    def wait(self, wait: Wait | None) -> None:
        """Show ``wait``, or with None the command's message again."""
        with self._lock:
            self._waiting = wait is not None
            self._update(wait.describe() if wait is not None else self._message)


@contextmanager
def watching_waits(
    *, live: Callable[[Wait | None], None] | None = None, plain: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Within the block, show each request that waits past :data:`SHOW_AFTER`.

    ``live`` is told the wait to show (None: none now) each poll; ``plain``
    gets one line when a wait is first shown, then none for
    :data:`REPEAT_EVERY` seconds (whichever request waits then).
    """
    stop = threading.Event()
    waits = PROCESS.get(Waits)

    def watch() -> None:
        shown: Wait | None = None
        said_at: float | None = None
        while not stop.wait(_POLL_SECONDS):
            now = time.monotonic()
            oldest = waits.oldest()
            current = oldest if oldest is not None and silent_for_a_while(oldest, now) else None
            if live is not None and (current is not None or shown is not None):
                live(current)
            if (
                plain is not None
                and current is not None
                and (said_at is None or now - said_at >= REPEAT_EVERY)
            ):
                plain(current.describe(now))
                said_at = now
            shown = current

    thread = threading.Thread(target=watch, name="longctx-waits", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
