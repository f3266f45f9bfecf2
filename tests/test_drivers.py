"""The two drivers carry one plan out the same way: values, errors, fan-outs, the lead gate, retries."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from longctx.drivers import Fanout, Gate, Io, Plan, arun, run
from longctx.errors import ConfigError, ServerUnreachable
from longctx.retry import RetryEvent, RetryPolicy, instant_retries, retried


def both(plan: Callable[[], Plan[object]]) -> tuple[object, object]:
    """The plan's value under each driver (a fresh plan for each)."""
    return run(plan()), asyncio.run(arun(plan()))


def test_steps_values_and_errors_reach_the_plan_under_both_drivers() -> None:
    def failing() -> int:
        raise ServerUnreachable("gone", url="http://x")

    async def native() -> int:
        return 5

    def plan() -> Plan[object]:
        blocking = yield Io(lambda: 2)
        awaited = yield Io(lambda: 3, native)  # the async driver awaits the native form
        try:
            yield Io(failing)
        except ServerUnreachable as error:
            caught = str(error)
        return blocking, awaited, caught

    sync, asynchronous = both(plan)
    assert sync == (2, 3, "gone")
    assert asynchronous == (2, 5, "gone")


def test_an_error_the_plan_does_not_handle_leaves_the_driver() -> None:
    def plan() -> Plan[None]:
        yield Io(lambda: None)
        raise ConfigError("bad question")

    with pytest.raises(ConfigError, match="bad question"):
        run(plan())
    with pytest.raises(ConfigError, match="bad question"):
        asyncio.run(arun(plan()))


def test_blocking_steps_leave_the_event_loop_free() -> None:
    main = threading.get_ident()
    seen: list[int] = []

    def plan() -> Plan[None]:
        yield Io(lambda: seen.append(threading.get_ident()))

    run(plan())
    asyncio.run(arun(plan()))
    assert seen[0] == main  # the sync driver blocks in the caller's thread
    assert seen[1] != main  # the async driver sends blocking work to a worker thread


def test_a_fanout_keeps_each_plans_result_and_error_in_order_and_bounds_concurrency() -> None:
    in_flight: list[int] = []
    peak: list[int] = [0]
    lock = threading.Lock()

    def member(index: int) -> Plan[int]:
        def enter() -> None:
            with lock:
                in_flight.append(index)
                peak[0] = max(peak[0], len(in_flight))
            time.sleep(0.02)
            with lock:
                in_flight.remove(index)

        yield Io(enter)
        if index == 2:
            raise ConfigError("third fails")
        return index * 10

    def plan() -> Plan[object]:
        results = yield Fanout([lambda i=i: member(i) for i in range(6)], limit=2)
        return [(r.value, type(r.error).__name__ if r.error else None) for r in results]

    expected = [(0, None), (10, None), (None, "ConfigError"), (30, None), (40, None), (50, None)]
    for outcome in both(plan):
        assert outcome == expected
        assert peak[0] <= 2
        peak[0] = 0


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_with_a_gate_the_rest_start_only_once_the_first_opened_it(driver: str) -> None:
    events: list[str] = []
    gate = Gate()

    def lead() -> Plan[str]:
        yield Io(lambda: events.append("lead sent"))
        yield Io(lambda: time.sleep(0.05))  # nobody else may start meanwhile
        events.append("gate opened")
        gate.open()
        yield Io(lambda: time.sleep(0.05))  # the rest run beside the lead's remainder
        events.append("lead done")
        return "lead"

    def follower(index: int) -> Plan[str]:
        yield Io(lambda: events.append(f"follower {index} sent"))
        return f"f{index}"

    def plan() -> Plan[object]:
        results = yield Fanout([lead, lambda: follower(1), lambda: follower(2)], limit=4, gate=gate)
        return [r.value for r in results]

    value = run(plan()) if driver == "sync" else asyncio.run(arun(plan()))
    assert value == ["lead", "f1", "f2"]
    assert events[:2] == ["lead sent", "gate opened"]
    assert events.index("follower 1 sent") < events.index("lead done")


def test_a_gate_opens_when_the_first_plan_fails_so_the_rest_are_not_held() -> None:
    def lead() -> Plan[None]:
        yield Io(lambda: None)
        raise ServerUnreachable("down", url="http://x")

    def follower() -> Plan[str]:
        yield Io(lambda: None)
        return "answered"

    def plan() -> Plan[object]:
        results = yield Fanout([lead, follower], limit=2, gate=Gate())
        return [r.value for r in results]

    assert both(plan) == ([None, "answered"], [None, "answered"])


def test_retries_are_one_body_under_both_drivers() -> None:
    def attempts_of(driver: str) -> tuple[int, list[int]]:
        calls = [0]
        heard: list[int] = []

        def flaky() -> str:
            calls[0] += 1
            if calls[0] < 3:
                raise ServerUnreachable("try again", url="http://x")
            return "ok"

        def attempt() -> Plan[str]:
            value: str = yield Io(flaky)
            return value

        def on_retry(event: RetryEvent) -> None:
            heard.append(event.attempt)

        plan = retried(attempt, RetryPolicy(attempts=5), on_retry=on_retry)
        with instant_retries():
            outcome = run(plan) if driver == "sync" else asyncio.run(arun(plan))
        assert outcome.value == "ok"
        return outcome.attempts, heard

    assert attempts_of("sync") == attempts_of("async") == (3, [1, 2])


def test_a_policy_that_gives_up_re_raises_the_last_error_and_never_retries_a_client_error() -> None:
    calls = [0]

    def unreachable() -> Plan[None]:
        calls[0] += 1
        yield Io(lambda: None)
        raise ServerUnreachable(f"attempt {calls[0]}", url="http://x")

    with instant_retries(), pytest.raises(ServerUnreachable, match="attempt 3"):
        run(retried(unreachable, RetryPolicy(attempts=3)))

    def refused() -> Plan[None]:
        calls[0] += 1
        yield Io(lambda: None)
        raise ConfigError("not retryable")

    calls[0] = 0
    with pytest.raises(ConfigError):
        asyncio.run(arun(retried(refused, RetryPolicy(attempts=3))))
    assert calls[0] == 1


def test_the_total_time_of_retries_counts_from_the_first_attempt() -> None:
    """The policy's state is made at the first failure; its clock still starts at the first attempt."""
    calls = [0]

    def slow_then_unreachable() -> Plan[None]:
        calls[0] += 1
        yield Io(lambda: time.sleep(0.3))  # the first attempt outlasts the whole time allowed
        raise ServerUnreachable(f"attempt {calls[0]}", url="http://x")

    with instant_retries(), pytest.raises(ServerUnreachable, match="attempt 1"):
        run(retried(slow_then_unreachable, RetryPolicy(attempts=5, total_seconds=0.2)))
    assert calls[0] == 1
    calls[0] = 0
    with instant_retries(), pytest.raises(ServerUnreachable, match="attempt 5"):
        run(retried(slow_then_unreachable, RetryPolicy(attempts=5, total_seconds=60)))
