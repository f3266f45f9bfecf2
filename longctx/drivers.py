"""Plans and their two drivers: one body for sync and async.

A *plan* is a generator that says what I/O it needs instead of doing it: it
yields a step (:class:`Io`, or :class:`Fanout` for plans that run side by
side) and is sent that step's result, or has its error thrown in at the
``yield``. A turn, a sibling batch, a shard's map step, a request with its
retries and failover: each is written once, as a plan, and carried out by

- :func:`run`, which performs each step in the calling thread (blocking), or
- :func:`arun`, which awaits each step on the running event loop.

A plan whose answer is read as it comes is carried out by :func:`stream`
or :func:`astream` instead: they do what :func:`run` and :func:`arun` do,
and pass on the pieces of each step that hands some out (an :class:`Io`
with ``pieces``: a streamed answer's text) as they arrive, then the plan's
value as :class:`Done`. Steps inside a :class:`Fanout` never hand pieces
out: only the plan's own steps are streamed.

Only the lowest steps know both forms (:class:`Io` holds a blocking call
and, where a native one exists, an awaitable one: the HTTP transport);
blocking work without an async form goes to a worker thread under
:func:`arun`. Plans compose with ``yield from``. The shape is h11's and
httpcore's: the protocol is a body without I/O, the I/O wrapper is a few
lines per mode.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

from longctx.interrupts import result_of, wait_set
from longctx.recordtypes import record_type

__all__ = [
    "Done",
    "Fanout",
    "Gate",
    "Io",
    "Pieces",
    "Plan",
    "Result",
    "arun",
    "astream",
    "run",
    "sleep",
    "stream",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Pieces(Protocol[T_co]):
    """The work of a step that hands pieces out as they come, then has its value.

    Iterate :meth:`each` (blocking) or :meth:`aeach` (awaiting) to the end,
    then read :attr:`value`. Leaving either early (``close()``) stops the
    work: a streamed answer's connection is closed.
    """

    def each(self) -> Generator[str, None, None]: ...

    def aeach(self) -> AsyncGenerator[str, None]: ...

    @property
    def value(self) -> T_co: ...


@record_type
class Io(Generic[T]):
    """One I/O step: ``call`` blocks for it; ``acall``, when given, awaits it natively.

    Without ``acall`` the async driver runs ``call`` in a worker thread, so
    a plan may yield any blocking work (a store write, a discovery request)
    without stalling an event loop. ``pieces``, when given, is the same work
    as it comes (:class:`Pieces`): :func:`stream` and :func:`astream` use it
    to pass its pieces on; :func:`run` and :func:`arun` call ``call`` or
    ``acall`` as for any step.
    """

    call: Callable[[], T]
    acall: Callable[[], Awaitable[T]] | None = None
    pieces: Callable[[], Pieces[T]] | None = None


Step = Any  # an Io or a Fanout
Plan = Generator[Step, Any, T]
"""A generator of steps that returns its value: see the module docstring."""


def sleep(seconds: float) -> Io[None]:
    """The step that waits ``seconds`` (a retry's back-off)."""
    return Io(partial(time.sleep, seconds), partial(_async_sleep, seconds))


async def _async_sleep(seconds: float) -> None:
    import asyncio  # only async paths load asyncio (about 30 modules); a sync batch never does

    await asyncio.sleep(seconds)


@record_type
class Done(Generic[T]):
    """The last item :func:`stream` and :func:`astream` hand out: the plan's value."""

    value: T


@record_type
class Result(Generic[T]):
    """What one plan of a :class:`Fanout` ended with: its value, or the error it raised."""

    value: T | None = None
    error: BaseException | None = None


class Gate:
    """A one-way signal between plans running side by side: closed, then open for good.

    Safe to open from any thread (a stream callback); :meth:`wait` blocks a
    thread, :meth:`opened` suspends a coroutine.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._wakers: list[Callable[[], None]] = []

    def open(self) -> None:
        with self._lock:
            self._event.set()
            wakers, self._wakers = self._wakers, []
        for wake in wakers:
            wake()

    def wait(self) -> None:
        wait_set(self._event)

    async def opened(self) -> None:
        import asyncio  # only async paths load asyncio (about 30 modules); a sync batch never does

        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not future.done():
                future.set_result(None)

        def wake() -> None:
            loop.call_soon_threadsafe(settle)

        with self._lock:
            if self._event.is_set():
                return
            self._wakers.append(wake)
        await future


@record_type
class Fanout:
    """Plans run side by side, at most ``limit`` at once, each the moment a slot is free.

    With a ``gate``, the first plan runs alone until the gate opens (or that
    plan ends), then the rest. The step's result is one :class:`Result` per
    plan, in order: a plan's error does not stop the others. ``plans`` are
    factories, called when their plan starts.
    """

    plans: Sequence[Callable[[], Plan[Any]]]
    limit: int
    gate: Gate | None = None


def _member(fanout: Fanout, index: int) -> Plan[Result[Any]]:
    """One plan of a fanout, its error kept as its result; the first one opens the gate when it ends."""
    try:
        return Result(value=(yield from fanout.plans[index]()))
    except Exception as error:  # noqa: BLE001 - handed back in the Result, see Fanout
        return Result(error=error)
    finally:
        if index == 0 and fanout.gate is not None:
            fanout.gate.open()


class _Stepper:
    """A plan being carried out: the step it waits on, then its value."""

    def __init__(self, plan: Plan[Any]) -> None:
        self._plan = plan
        self.done = False
        self.value: Any = None
        self.step: Step = self._next(lambda: next(plan))

    def _next(self, move: Callable[[], Step]) -> Step:
        try:
            return move()
        except StopIteration as stop:
            self.done, self.value = True, stop.value
            return None

    def resume(self, outcome: Result[Any]) -> None:
        """Hand the step's outcome to the plan and take its next step."""
        error = outcome.error
        if error is not None:
            self.step = self._next(lambda: self._plan.throw(error))
        else:
            self.step = self._next(lambda: self._plan.send(outcome.value))


def run(plan: Plan[T]) -> T:
    """Carry ``plan`` out in this thread; its value, or the error it raised."""
    stepper = _Stepper(plan)
    while not stepper.done:
        stepper.resume(_outcome(stepper.step))
    result: T = stepper.value
    return result


async def arun(plan: Plan[T]) -> T:
    """Carry ``plan`` out on the running event loop; its value, or the error it raised."""
    stepper = _Stepper(plan)
    while not stepper.done:
        stepper.resume(await _aoutcome(stepper.step))
    result: T = stepper.value
    return result


def stream(plan: Plan[T]) -> Generator[str | Done[T], None, None]:
    """Carry ``plan`` out in this thread, handing out each piece its steps hand out, then :class:`Done`.

    Closing the generator early (``close()``, or dropping it) stops the step
    in progress and throws :class:`GeneratorExit` into the plan, so its
    ``finally`` blocks run (steps it still yields then run without handing
    anything out). An error of the plan propagates; ``Done`` then never comes.
    """
    stepper = _Stepper(plan)
    while not stepper.done:
        step = stepper.step
        if isinstance(step, Io) and step.pieces is not None:
            source = step.pieces()
            pieces = source.each()
            try:
                # Handed out from this frame, so that a close() meanwhile is caught below
                # and reaches the plan.
                yield from pieces
                outcome: Result[Any] = Result(value=source.value)
            except BaseException as error:  # noqa: BLE001 - thrown into the plan, which decides
                outcome = Result(error=error)
            finally:
                pieces.close()  # left early: the work stops (a streamed answer's connection closes)
        else:
            outcome = _outcome(step)
        if isinstance(outcome.error, GeneratorExit):
            stepper.resume(outcome)
            while not stepper.done:  # the plan's cleanup, when it yields steps
                stepper.resume(_outcome(stepper.step))
            return  # the plan swallowed the exit and returned: the consumer left all the same
        stepper.resume(outcome)
    yield Done(stepper.value)


async def astream(plan: Plan[T]) -> AsyncGenerator[str | Done[T], None]:
    """:func:`stream` on the running event loop (``aclose()`` or a cancellation stops it)."""
    stepper = _Stepper(plan)
    while not stepper.done:
        step = stepper.step
        if isinstance(step, Io) and step.pieces is not None:
            source = step.pieces()
            pieces = source.aeach()
            try:
                async for piece in pieces:
                    yield piece
                outcome: Result[Any] = Result(value=source.value)
            except BaseException as error:  # noqa: BLE001 - thrown into the plan, which decides
                outcome = Result(error=error)
            finally:
                await pieces.aclose()
        else:
            outcome = await _aoutcome(step)
        if isinstance(outcome.error, GeneratorExit):
            stepper.resume(outcome)
            while not stepper.done:
                stepper.resume(await _aoutcome(stepper.step))
            return
        stepper.resume(outcome)
    yield Done(stepper.value)


def _outcome(step: Step) -> Result[Any]:
    try:
        return Result(value=_fan_out(step) if isinstance(step, Fanout) else step.call())
    except BaseException as error:  # noqa: BLE001 - thrown into the plan, which decides
        return Result(error=error)


async def _aoutcome(step: Step) -> Result[Any]:
    import asyncio  # only async paths load asyncio (about 30 modules); a sync batch never does

    try:
        if isinstance(step, Fanout):
            return Result(value=await _afan_out(step))
        return Result(value=await (step.acall() if step.acall else asyncio.to_thread(step.call)))
    except BaseException as error:  # noqa: BLE001 - thrown into the plan, which decides
        return Result(error=error)


def _fan_out(fanout: Fanout) -> list[Result[Any]]:
    if not fanout.plans:
        return []
    pool = ThreadPoolExecutor(max_workers=max(1, fanout.limit), thread_name_prefix="longctx-plan")
    try:
        first = pool.submit(run, _member(fanout, 0))
        if fanout.gate is not None:
            fanout.gate.wait()
        # The pool is the refill: a slot freed by one plan takes the next.
        rest = [pool.submit(run, _member(fanout, index)) for index in range(1, len(fanout.plans))]
        results = [result_of(future) for future in (first, *rest)]
    except BaseException:
        # Ctrl-C (or any error here): plans not yet started are dropped at once
        # rather than waited for; those in flight end when their connection closes.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return results


async def _afan_out(fanout: Fanout) -> list[Result[Any]]:
    if not fanout.plans:
        return []
    import asyncio  # only async paths load asyncio (about 30 modules); a sync batch never does

    slots = asyncio.Semaphore(max(1, fanout.limit))

    async def member(index: int) -> Result[Any]:
        async with slots:
            return await arun(_member(fanout, index))

    first = asyncio.ensure_future(member(0))
    if fanout.gate is not None:
        await fanout.gate.opened()
    return list(await asyncio.gather(first, *(member(index) for index in range(1, len(fanout.plans)))))
