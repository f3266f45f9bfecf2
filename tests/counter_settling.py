"""The test teardown's wait for counter checks: a test whose checks do not settle fails, with why."""

from __future__ import annotations

import pytest

from longctx.process_state import PROCESS
from longctx.verification.counters import wait_for_checks

#: How long a test's counter windows may take to settle after it ends. A settle reads for about a
#: second at most (counters.SETTLE_TIMEOUT bounds it at 5 s); past this, one never will.
SETTLE_SECONDS = 10.0


def settle_counter_checks() -> None:
    """Wait for the counter windows the test left; fail it if they do not settle in :data:`SETTLE_SECONDS`.

    Counter windows are kept per server URL for the process and fake servers reuse URLs from test to
    test, so one test's must settle before the next. A window still open means a call's counter
    snapshot was never closed (a check that can never come); one still settling, a settle that does
    not end. Either fails the test here instead of at the suite's global timeout. The process's state
    is reset either way, so the next test starts with no window of this one's.
    """
    try:
        settled = wait_for_checks(SETTLE_SECONDS)
    finally:
        PROCESS.reset()
    if not settled:
        pytest.fail(
            f"the test's counter checks did not settle within {SETTLE_SECONDS:g} s after it ended: a counter"
            " window was left open (a CounterSnapshot never closed) or its settle never finished",
            pytrace=False,
        )
