"""How sibling questions go out: one shared prefix, many questions after it.

Siblings are requests that share everything up to their question. Three
dispatch strategies send them:

- ``together``: every sibling at once, at most ``concurrency`` in flight,
  the next sent the moment one finishes. An engine that shares an in-flight
  prefix (vLLM v1) prefills it once, and the server's own preparation of
  each long prompt (chat template, tokenization) overlaps the first
  prefill instead of waiting for it.
- ``lead``: the first alone until its first token (the server then holds
  the whole prefix in its cache), then the rest. For a scheduler that would
  otherwise prefill a shared prefix once per request admitted together.
- ``admitted``: the first alone until the server accepted it (its response
  headers arrived: vLLM sends them after rendering and tokenizing the
  prompt, just before scheduling), then the rest, so the lead is first in
  the queue while the others' preparation still overlaps its prefill.

``auto`` picks per engine and version from the measured rows of the
server's engine profile (``EngineProfile.dispatch``, in
:mod:`longctx.backends.engines`), which the sibling benchmark filled in.
A batch larger than the concurrency is sent as a continuous refill, never
in waves: some sibling is always in flight, so the engine keeps the
prefix's blocks referenced (not evictable) until the last question has
read them.

This module only sends and collects: what an answered request becomes (a
branch session, its records) is the caller's ``commit``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from longctx.backends.base import Backend, Sent, ServerInfo
from longctx.backends.chat import ChatRequest
from longctx.backends.engines import measured_dispatch
from longctx.config import RequestOptions
from longctx.errors import ConfigError

if TYPE_CHECKING:
    from longctx.sessions.answers import Answer
    from longctx.store import Store

__all__ = ["Dispatch", "Outcome", "Plan", "arun", "check_keys", "choose_dispatch", "run"]


@dataclass(frozen=True)
class Dispatch:
    """How one batch of siblings goes out: the strategy, how many in flight, and why."""

    strategy: str
    concurrency: int
    reason: str

    def describe(self) -> str:
        """One line for the batch report, e.g. ``together, up to 8 in flight (auto: ...)``."""
        return f"{self.strategy}, up to {self.concurrency} in flight ({self.reason})"


def check_keys(store: Store, questions: Sequence[str], keys: Sequence[str]) -> None:
    """Refuse answer keys that do not name each question once, or that already have an answer.

    Raises :class:`~longctx.errors.ConfigError` before anything is sent.
    """
    if len(keys) != len(questions):
        raise ConfigError(f"ask_many got {len(keys)} keys for {len(questions)} questions")
    if any(not isinstance(key, str) or not key for key in keys):
        raise ConfigError("every answer key must be a non-empty string")
    repeated = sorted(key for key, count in Counter(keys).items() if count > 1)
    if repeated:
        raise ConfigError(f"answer keys given twice: {', '.join(repeated[:5])}")
    stored = store.answered(keys)
    if stored:
        raise ConfigError(
            f"{len(stored)} answer keys already have a stored answer: {', '.join(sorted(stored)[:5])}"
        )


def choose_dispatch(info: ServerInfo, options: RequestOptions, concurrency: int | None = None) -> Dispatch:
    """The dispatch for siblings sent to ``info``'s server.

    An explicit strategy or concurrency (``concurrency``, else the
    options') wins; what is left to ``auto`` / None comes from the first
    measured row of the server's engine profile for its version
    (:func:`longctx.backends.engines.measured_dispatch`).
    """
    row = measured_dispatch(info.profile, info.version)
    limit = concurrency or options.concurrency or row.concurrency
    if options.dispatch != "auto":
        return Dispatch(options.dispatch, limit, "asked for")
    engine = f"{info.engine} {info.version}" if info.version else info.engine
    return Dispatch(row.strategy, limit, f"auto for {engine}: {row.source}")


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
    dispatch: Dispatch,
    commit: Callable[[Sent, int], C],
    on_answer: Callable[[Answer], None] | None = None,
) -> Outcome[C]:
    """Send ``plan``'s requests as ``dispatch`` says and commit each answer.

    Every request is sent even when one fails; the failures are returned,
    not raised, so the caller can store what was answered first.
    """
    lead_ready = threading.Event()
    if dispatch.strategy == "together":
        lead_ready.set()
    results: dict[int, C] = {}
    failures: list[BaseException] = []

    def send(index: int) -> None:
        first_token = lead_ready.set if index == 0 and dispatch.strategy == "lead" else None
        admitted = lead_ready.set if index == 0 and dispatch.strategy == "admitted" else None
        try:
            sent = backend.complete(plan.requests[index], on_first_token=first_token, on_admitted=admitted)
            results[index] = commit(sent, index)
            if on_answer is not None:
                on_answer(results[index].answer)
        finally:
            if index == 0:
                # Also on failure, so the others are not held forever.
                lead_ready.set()

    pool = ThreadPoolExecutor(max_workers=dispatch.concurrency, thread_name_prefix="longctx-sibling")
    try:
        lead: Future[None] = pool.submit(send, 0)
        lead_ready.wait()
        # The pool is the refill: a slot freed by an answer takes the next question.
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


async def arun(
    backend: Backend, plan: Plan, *, dispatch: Dispatch, commit: Callable[[Sent, int], C]
) -> Outcome[C]:
    """The async twin of :func:`run`."""
    gate = asyncio.Semaphore(dispatch.concurrency)
    lead_ready = asyncio.Event()
    if dispatch.strategy == "together":
        lead_ready.set()
    results: dict[int, C] = {}

    async def send(index: int) -> None:
        first_token = lead_ready.set if index == 0 and dispatch.strategy == "lead" else None
        admitted = lead_ready.set if index == 0 and dispatch.strategy == "admitted" else None
        async with gate:
            try:
                sent = await backend.acomplete(
                    plan.requests[index], on_first_token=first_token, on_admitted=admitted
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
