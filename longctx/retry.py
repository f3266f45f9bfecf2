"""The one retry policy of longctx, on tenacity (imported here and nowhere else).

tenacity is imported at a call's first failure: a healthy call, and a whole healthy command, never
loads it (2% of a new `longctx batch` process's instructions).

What is retried: a connection that failed, dropped or stalled
(:class:`ServerUnreachable`), HTTP 429 (:class:`RateLimited`) and 5xx
(:class:`ServerError`). What is not: every other 4xx, a context overflow,
anything that is not a server error. Attempts and total time are bounded; a
``Retry-After`` from the server (a 429's, a 503's) is the wait before the
next attempt, capped by the policy's ``max_wait`` and the time left.

Tests never sleep in retries: :func:`instant_retries` (or
``LONGCTX_INSTANT_RETRIES=1``) keeps the attempts and drops the waiting.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Generic, TypeVar

from longctx.drivers import Io, Plan, run, sleep
from longctx.errors import (
    BackendError,
    ConfigError,
    ContextOverflow,
    RateLimited,
    ServerError,
    ServerUnreachable,
)
from longctx.options.groups import instant_retries_requested
from longctx.recordtypes import record_type

if TYPE_CHECKING:
    import tenacity

__all__ = [
    "OnRetry",
    "RetryEvent",
    "RetryOutcome",
    "RetryPolicy",
    "call_with_retry",
    "instant_retries",
    "is_retryable",
    "parse_retry_after",
    "retried",
]

T = TypeVar("T")

# A process-wide switch, not thread-local: sibling requests run on worker threads.
_instant_depth = 0
_instant_lock = threading.Lock()


@record_type
class RetryPolicy:
    """Bounds of retrying: ``attempts`` in all, within ``total_seconds``.

    Waits grow from ``initial_wait`` (doubling, with jitter) up to
    ``max_wait``; a server's ``Retry-After`` replaces the computed wait,
    bounded by ``max_wait`` too (a server asking for minutes is asked again
    after ``max_wait``, until the attempts or ``total_seconds`` are spent).
    """

    attempts: int = 5
    total_seconds: float = 300.0
    initial_wait: float = 0.5
    max_wait: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigError(f"retry attempts must be at least 1, not {self.attempts}")
        if self.total_seconds <= 0 or self.initial_wait < 0 or self.max_wait < 0:
            raise ConfigError("retry times must be positive")


@record_type
class RetryEvent:
    """A failed attempt that will be retried after ``wait_seconds``."""

    attempt: int
    error: BaseException
    wait_seconds: float


OnRetry = Callable[[RetryEvent], None]


@record_type
class RetryOutcome(Generic[T]):
    """A result and how many attempts it took (1 when the first one worked)."""

    value: T
    attempts: int


def is_retryable(error: BaseException) -> bool:
    """True for failures that another attempt may fix."""
    if isinstance(error, ContextOverflow):
        return False
    if isinstance(error, (ServerUnreachable, RateLimited)):
        return True
    if isinstance(error, ServerError) and error.status is not None:
        return error.status == 429 or error.status >= 500
    return False


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date); None: absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:  # "-0000": a UTC time whose zone is not known to the sender
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (moment - datetime.now(UTC)).total_seconds())


@contextmanager
def instant_retries() -> Iterator[None]:
    """Within the block, retries happen without waiting (attempts still count)."""
    global _instant_depth  # noqa: PLW0603 - one process-wide switch, guarded by its lock
    with _instant_lock:
        _instant_depth += 1
    try:
        yield
    finally:
        with _instant_lock:
            _instant_depth -= 1


def _waiting_disabled() -> bool:
    return _instant_depth > 0 or instant_retries_requested()


def _wait_strategy(policy: RetryPolicy) -> Callable[[tenacity.RetryCallState], float]:
    def wait(state: tenacity.RetryCallState) -> float:
        if _waiting_disabled():
            return 0.0
        error = state.outcome.exception() if state.outcome else None
        left = max(0.0, policy.total_seconds - (state.seconds_since_start or 0.0))
        if isinstance(error, BackendError) and error.retry_after is not None:
            return min(error.retry_after, policy.max_wait, left)
        base = min(policy.max_wait, policy.initial_wait * 2.0 ** (state.attempt_number - 1))
        return min(base * (0.5 + random.random() / 2), left)

    return wait


def _retrying_arguments(policy: RetryPolicy, on_retry: OnRetry | None) -> dict[str, object]:
    import tenacity

    def before_sleep(state: tenacity.RetryCallState) -> None:
        if on_retry and state.outcome is not None:
            error = state.outcome.exception()
            if error is not None:
                wait_seconds = float(state.next_action.sleep) if state.next_action else 0.0
                on_retry(RetryEvent(state.attempt_number, error, wait_seconds))

    return {
        "stop": tenacity.stop_after_attempt(policy.attempts)
        | tenacity.stop_after_delay(policy.total_seconds),
        "wait": _wait_strategy(policy),
        "retry": tenacity.retry_if_exception(is_retryable),
        "before_sleep": before_sleep,
        "reraise": True,
    }


class _Attempts:
    """The policy's decisions for one call, without I/O: after each failure, how long to wait or to give up.

    tenacity decides (its stop, wait and retry strategies, its before-sleep
    hook) from the state it is told; the plan that owns this object does
    the waiting, so one body serves both drivers. Its state is made at the
    first failure, timed from the call's start.
    """

    def __init__(self, policy: RetryPolicy, on_retry: OnRetry | None) -> None:
        self._policy = policy
        self._on_retry = on_retry
        self._started = time.monotonic()
        self._tenacity: tuple[tenacity.Retrying, tenacity.RetryCallState] | None = None

    @property
    def made(self) -> int:
        """Attempts made so far, the current one included."""
        return 1 if self._tenacity is None else int(self._tenacity[1].attempt_number)

    def failed(self, error: BaseException) -> float:
        """Seconds to wait before the next attempt; re-raises ``error`` when the policy gives up."""
        import tenacity

        if self._tenacity is None:
            retrying = tenacity.Retrying(**_retrying_arguments(self._policy, self._on_retry))  # type: ignore[arg-type]
            retrying.begin()
            state = tenacity.RetryCallState(retrying, fn=None, args=(), kwargs={})
            state.start_time = self._started  # the total time counts from the first attempt
            self._tenacity = (retrying, state)
        retrying, state = self._tenacity
        state.set_exception((type(error), error, error.__traceback__))
        action = retrying.iter(state)  # raises error itself when giving up (reraise)
        if not isinstance(action, tenacity.DoSleep):
            raise error
        state.prepare_for_next_attempt()
        return float(action)


def retried(
    attempt: Callable[[], Plan[T]],
    policy: RetryPolicy = RetryPolicy(),
    *,
    on_retry: OnRetry | None = None,
) -> Plan[RetryOutcome[T]]:
    """The plan that carries out ``attempt()`` until it succeeds or the policy gives up.

    The last error is re-raised when it gives up.

    ``on_retry`` is told of each failed attempt that will be retried.
    """
    attempts = _Attempts(policy, on_retry)
    while True:
        try:
            value = yield from attempt()
        except Exception as error:  # noqa: BLE001 - the policy decides, re-raising what it does not retry
            yield sleep(attempts.failed(error))
        else:
            return RetryOutcome(value, attempts.made)


def call_with_retry(
    function: Callable[[], T],
    policy: RetryPolicy = RetryPolicy(),
    *,
    on_retry: OnRetry | None = None,
) -> RetryOutcome[T]:
    """Call ``function`` (blocking) with the policy: :func:`retried` over one step, carried out here."""

    def attempt() -> Plan[T]:
        value: T = yield Io(function)
        return value

    return run(retried(attempt, policy, on_retry=on_retry))
