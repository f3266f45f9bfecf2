"""Waits on worker threads that a Ctrl-C ends at once, whichever thread the kernel handed it to.

A Ctrl-C is a signal to the whole process: the kernel delivers it to any one
of its threads, and CPython runs the handler (``KeyboardInterrupt``) only on
the main thread, at its next bytecode. A main thread asleep in a lock or an
event without a timeout sleeps on when the signal lands on a worker thread:
a job's Ctrl-C was then seen only once the pack in flight had every answer
stored, which for a long prefill is minutes (seen on a CI machine; sending
the signal to a worker thread repeats it every time). The waits here wake
every :data:`TICK` seconds, so the pending handler runs within a tick,
wherever the signal landed.

Masking the signal in the worker threads instead would steer it to the main
thread, but a mask is inherited by every process a thread starts (git, an
engine), which would then ignore the terminal's Ctrl-C.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, TypeVar

__all__ = ["TICK", "acquire", "result_of", "wait_first", "wait_set"]

T = TypeVar("T")

# Seconds between two looks at a pending signal: a tenth of a second is no
# delay a person notices, and ten wakeups a second cost nothing measurable.
TICK = 0.1


def acquire(lock: threading.Lock) -> None:
    """``lock.acquire()``, waited for in ticks."""
    while not lock.acquire(timeout=TICK):
        pass


def wait_first(futures: Collection[Future[Any]]) -> set[Future[Any]]:
    """The futures of ``futures`` done, once at least one is (``futures`` must not be empty)."""
    if not futures:
        raise ValueError("wait_first needs at least one future")
    while True:
        done, _ = wait(futures, timeout=TICK, return_when=FIRST_COMPLETED)
        if done:
            return done


def result_of(future: Future[T]) -> T:
    """``future.result()``, waited for in ticks: its value, or the exception it raised."""
    wait_first((future,))
    return future.result()


def wait_set(event: threading.Event, timeout: float | None = None) -> bool:
    """``event.wait(timeout)`` in ticks: True once ``event`` is set, False if ``timeout`` passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = TICK if deadline is None else min(TICK, deadline - time.monotonic())
        if left <= 0:
            return event.is_set()
        if event.wait(left):
            return True
