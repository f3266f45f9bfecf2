"""What a command waits on, said on stderr while a server is silent.

A watcher thread reads the process's open requests
(:class:`~longctx.backends.waits.Waits`) a few times a second. Once a request
has waited :data:`SHOW_AFTER` seconds without a byte, it is shown: on a
terminal in the live status line (``waiting for http://host/v1/models (3 s,
gives up after 30 s)``, replacing the command's own message until the
answer starts), elsewhere as a plain line, repeated every
:data:`REPEAT_EVERY` seconds while the same request waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from longctx.backends import Wait, Waits
from longctx.process_state import PROCESS

__all__ = ["REPEAT_EVERY", "SHOW_AFTER", "StatusLine", "watching_waits"]

SHOW_AFTER = 0.5
"""Seconds a request waits before it is shown (a person sees it within a second)."""

REPEAT_EVERY = 10.0
"""Seconds between two plain lines about the same wait."""

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
    gets one line when a wait is first shown and every
    :data:`REPEAT_EVERY` seconds after.
    """
    stop = threading.Event()
    waits = PROCESS.get(Waits)

    def watch() -> None:
        shown: Wait | None = None
        said_at = 0.0
        while not stop.wait(_POLL_SECONDS):
            now = time.monotonic()
            oldest = waits.oldest()
            current = oldest if oldest is not None and now - oldest.since >= SHOW_AFTER else None
            if live is not None and (current is not None or shown is not None):
                live(current)
            if (
                plain is not None
                and current is not None
                and (current != shown or now - said_at >= REPEAT_EVERY)
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
