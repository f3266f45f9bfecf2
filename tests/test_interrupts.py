"""A Ctrl-C the kernel hands to a worker thread ends the main thread's wait on that worker at once.

Each wait below is on work that ends only when the test releases it (or, if
the interrupt were missed, when a timer does, half a minute later). Once the
main thread waits, the worker sends SIGINT to its own thread, where the
kernel may deliver a terminal's Ctrl-C; the main thread must raise
KeyboardInterrupt while the work is still pending. With a plain
``Future.result()``, ``wait()``, ``Event.wait()`` or ``Lock.acquire()`` in
their place, every test here fails: the interrupt is seen once the work ends.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from longctx.drivers import Fanout, Gate, Io, Plan, run
from longctx.interrupts import acquire, result_of, wait_first, wait_set

# When the work ends if the interrupt is missed: long enough that a missed one
# shows as work done however slowly a loaded machine schedules the worker that
# sends it (5 s was not, once, on a CI machine running the engine tests beside),
# short enough that a broken wait fails the test within a minute.
RELEASE_AFTER = 30.0


class CtrlC:
    """A Ctrl-C that a worker thread sends to itself once the main thread waits on it."""

    def __init__(self) -> None:
        self.waiting = threading.Event()

    def send(self) -> None:
        self.waiting.wait()
        # Some time for the main thread to go from ``ends`` into the wait itself: a signal
        # that comes sooner is seen at its next bytecode, which would prove nothing of the wait.
        time.sleep(0.2)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    def ends(self, waits: Callable[[], object], pending: Callable[[], bool]) -> str:
        """How ``waits()`` ended: ``"interrupted"`` (while ``pending()`` still held) is the pass."""
        try:
            self.waiting.set()
            waits()
        except KeyboardInterrupt:
            return "interrupted" if pending() else "interrupted only once the work had ended"
        return "not interrupted: the work ended first"


@pytest.fixture
def released() -> Iterator[threading.Event]:
    event = threading.Event()
    timer = threading.Timer(RELEASE_AFTER, event.set)
    timer.start()
    yield event
    event.set()
    timer.cancel()


def held(ctrl_c: CtrlC, released: threading.Event) -> Callable[[], str]:
    def work() -> str:
        ctrl_c.send()
        released.wait()
        return "done"

    return work


def test_wait_first_sees_a_ctrl_c_on_the_worker(released: threading.Event) -> None:
    ctrl_c = CtrlC()
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(held(ctrl_c, released))
        try:
            assert ctrl_c.ends(lambda: wait_first([future]), lambda: not future.done()) == "interrupted"
        finally:
            released.set()


def test_result_of_sees_a_ctrl_c_on_the_worker(released: threading.Event) -> None:
    ctrl_c = CtrlC()
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(held(ctrl_c, released))
        try:
            assert ctrl_c.ends(lambda: result_of(future), lambda: not future.done()) == "interrupted"
        finally:
            released.set()
        assert result_of(future) == "done"


def test_wait_set_sees_a_ctrl_c_on_the_worker(released: threading.Event) -> None:
    ctrl_c, done = CtrlC(), threading.Event()

    def work() -> None:
        held(ctrl_c, released)()
        done.set()

    threading.Thread(target=work, daemon=True).start()
    assert ctrl_c.ends(lambda: wait_set(done), lambda: not done.is_set()) == "interrupted"
    released.set()
    assert wait_set(done, timeout=RELEASE_AFTER)
    assert not wait_set(threading.Event(), timeout=0.05)


def test_acquire_sees_a_ctrl_c_on_the_holder(released: threading.Event) -> None:
    # A question waiting for the turn lock a warm start holds over its prefill.
    ctrl_c, lock, ended = CtrlC(), threading.Lock(), threading.Event()
    lock.acquire()

    def hold() -> None:
        held(ctrl_c, released)()
        ended.set()
        lock.release()

    threading.Thread(target=hold, daemon=True).start()
    assert ctrl_c.ends(lambda: acquire(lock), lambda: not ended.is_set()) == "interrupted"
    released.set()
    acquire(lock)  # given back once the holder ends


def test_a_fanned_out_batch_sees_a_ctrl_c_on_a_member(released: threading.Event) -> None:
    # The blocking driver's fan-out (a batch's siblings): the main thread waits on the members.
    ctrl_c, ended = CtrlC(), []

    def member(index: int) -> Callable[[], Plan[str]]:
        def plan() -> Plan[str]:
            answer: str = yield Io(held(ctrl_c, released) if index == 0 else released.wait)
            ended.append(answer)
            return answer

        return plan

    def batch() -> Plan[Any]:
        results = yield Fanout([member(0), member(1)], limit=2)
        return results

    try:
        assert ctrl_c.ends(lambda: run(batch()), lambda: not ended) == "interrupted"
    finally:
        released.set()


def test_a_gate_sees_a_ctrl_c_on_the_thread_that_opens_it(released: threading.Event) -> None:
    ctrl_c, gate = CtrlC(), Gate()

    def opens() -> None:
        held(ctrl_c, released)()
        gate.open()

    threading.Thread(target=opens, daemon=True).start()
    assert ctrl_c.ends(gate.wait, lambda: not released.is_set()) == "interrupted"


def test_wait_first_needs_a_future() -> None:
    with pytest.raises(ValueError, match="at least one future"):
        wait_first([])
    done: Future[str] = Future()
    done.set_result("value")
    assert result_of(done) == "value"
