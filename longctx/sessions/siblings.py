"""How sibling questions go out: one shared prefix, many questions after it.

Siblings are requests that share everything up to their question. The
first goes alone; the moment its first token arrives the server holds the
whole shared prefix, and the others follow with bounded concurrency, so
each of them reads the prefix from the cache whatever the engine's
scheduler does with simultaneous arrivals.

This module only sends and collects: what an answered request becomes (a
branch session, its records) is the caller's ``commit``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from longctx.backends.base import Backend, Sent
from longctx.backends.chat import ChatRequest

if TYPE_CHECKING:
    from longctx.sessions.session import Answer

__all__ = ["Outcome", "Plan", "arun", "run"]


class _Committed(Protocol):
    @property
    def answer(self) -> Answer: ...


C = TypeVar("C", bound=_Committed)


@dataclass(frozen=True)
class Plan:
    """The requests of one batch of siblings, their questions, and where they are recorded."""

    requests: tuple[ChatRequest, ...]
    questions: tuple[str, ...]
    batch_id: str
    session_id: str


@dataclass(frozen=True)
class Outcome(Generic[C]):
    """What came back: committed results by question index, and the errors of the others."""

    results: Mapping[int, C]
    failures: Sequence[BaseException]


def run(
    backend: Backend,
    plan: Plan,
    *,
    limit: int,
    commit: Callable[[Sent, int], C],
    on_answer: Callable[[Answer], None] | None = None,
) -> Outcome[C]:
    """Send ``plan``'s requests (lead first, then at most ``limit`` at a time) and commit each answer.

    Every request is sent even when one fails; the failures are returned,
    not raised, so the caller can store what was answered first.
    """
    lead_ready = threading.Event()
    results: dict[int, C] = {}
    failures: list[BaseException] = []

    def send(index: int) -> None:
        on_first = lead_ready.set if index == 0 else None
        try:
            sent = backend.complete(plan.requests[index], on_first_token=on_first)
            results[index] = commit(sent, index)
            if on_answer is not None:
                on_answer(results[index].answer)
        finally:
            if index == 0:
                # Also on failure, so the others are not held forever.
                lead_ready.set()

    pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="longctx-sibling")
    try:
        lead: Future[None] = pool.submit(send, 0)
        lead_ready.wait()
        rest = [pool.submit(send, index) for index in range(1, len(plan.requests))]
        pending = {lead, *rest}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            failures.extend(error for future in done if (error := future.exception()) is not None)
    except BaseException:
        # Ctrl-C (or any error here): the questions not yet sent are dropped at
        # once rather than waited for; those in flight end when the caller
        # closes the backend. What was answered is already stored.
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return Outcome(results, failures)


async def arun(backend: Backend, plan: Plan, *, limit: int, commit: Callable[[Sent, int], C]) -> Outcome[C]:
    """The async twin of :func:`run`."""
    gate = asyncio.Semaphore(limit)
    lead_ready = asyncio.Event()
    results: dict[int, C] = {}

    async def send(index: int) -> None:
        async with gate:
            try:
                sent = await backend.acomplete(
                    plan.requests[index], on_first_token=lead_ready.set if index == 0 else None
                )
                results[index] = await asyncio.to_thread(commit, sent, index)
            finally:
                if index == 0:
                    lead_ready.set()

    lead = asyncio.ensure_future(send(0))
    await lead_ready.wait()
    outcomes = await asyncio.gather(
        lead, *(send(i) for i in range(1, len(plan.requests))), return_exceptions=True
    )
    return Outcome(results, [outcome for outcome in outcomes if isinstance(outcome, BaseException)])
