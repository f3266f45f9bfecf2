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

``auto`` picks per engine and version from :data:`MEASURED`, the table
the sibling benchmark filled in. A batch larger than the concurrency is
sent as a continuous refill, never in waves: some sibling is always in
flight, so the engine keeps the prefix's blocks referenced (not evictable)
until the last question has read them.

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
from longctx.config import DEFAULT_CONCURRENCY, RequestOptions
from longctx.errors import ConfigError

if TYPE_CHECKING:
    from longctx.sessions.answers import Answer
    from longctx.store import Store

__all__ = ["MEASURED", "Dispatch", "Outcome", "Plan", "arun", "check_keys", "choose_dispatch", "run"]


@dataclass(frozen=True)
class Measured:
    """One row of :data:`MEASURED`: the fastest strategy for an engine (and version prefix)."""

    engine: str
    version_prefix: str
    strategy: str
    concurrency: int
    source: str


# What the sibling benchmarks measured fastest, first match wins (engine, then
# the version's prefix; "" matches any version). Each row names its source:
# - vLLM: docs/benchmarks.md "siblings-dispatch" (benchmarks/siblings.py, the
#   CPU build of the test suite) and issue 13's H200 run of vLLM 0.24.0 (8 at
#   once 8.15 s against 9.7-11.2 s lead-first; benchmarks/gpu/ re-measures it).
#   vLLM v1 shares an in-flight prefix, so sending together costs no prefill.
# - SGLang: docs/benchmarks.md "siblings-dispatch" (the CPU build, 0.5.23): admitted
#   (30.3 s) ahead of lead (45.8-49.4 s) and together (36-58 s, noisy); together cached
#   only 98.4% of the prefix there (followers admitted before the lead's prefix was
#   whole in the radix tree), lead and admitted 100%. SGLang sends its headers with
#   the first token, so admitted waits about as long as lead.
# - any other server: lead-first, the one strategy that caches whatever the
#   scheduler does with simultaneous arrivals.
MEASURED: tuple[Measured, ...] = (
    Measured("vllm", "", "together", 8, "benchmarks/siblings.py (CPU) and issue 13's H200 run"),
    Measured("sglang", "", "admitted", 8, "benchmarks/siblings.py (CPU)"),
    Measured("", "", "lead", DEFAULT_CONCURRENCY, "no measurement: lead-first caches on any scheduler"),
)


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
    stored = store.sessions.answered(keys)
    if stored:
        raise ConfigError(
            f"{len(stored)} answer keys already have a stored answer: {', '.join(sorted(stored)[:5])}"
        )


def choose_dispatch(info: ServerInfo, options: RequestOptions, concurrency: int | None = None) -> Dispatch:
    """The dispatch for siblings sent to ``info``'s server.

    An explicit strategy or concurrency (``concurrency``, else the
    options') wins; what is left to ``auto`` / None comes from the first
    :data:`MEASURED` row matching the engine and version.
    """
    version = info.version or ""
    row = next(
        row for row in MEASURED if row.engine in ("", info.engine) and version.startswith(row.version_prefix)
    )
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
