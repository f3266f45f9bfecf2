"""The "waiting for URL" line: only after a silence worth saying, at most one a minute off a terminal.

A healthy run's requests (each a second or two of prefill or tokenizing,
bounded to the default 600 s) print nothing; a request silent for a tenth
of its bound is said; a file or a pipe gets at most one such line every
:data:`~longctx.cli.waiting.REPEAT_EVERY` seconds, however many requests
wait; a terminal's live line is updated in place.
"""

from __future__ import annotations

import time

import pytest

from longctx.backends.waits import Wait, Waits
from longctx.cli import waiting
from longctx.cli.waiting import silent_for_a_while, watching_waits
from longctx.process_state import PROCESS


def test_the_silence_shown_is_a_tenth_of_the_bound_between_half_a_second_and_30_s() -> None:
    assert not silent_for_a_while(Wait("u", 0.0, 600.0), 29.0)
    assert silent_for_a_while(Wait("u", 0.0, 600.0), 30.0)
    assert not silent_for_a_while(Wait("u", 0.0, 3.0), 0.4)
    assert silent_for_a_while(Wait("u", 0.0, 3.0), 0.5)
    assert silent_for_a_while(Wait("u", 0.0, 60.0), 6.0) and not silent_for_a_while(Wait("u", 0.0, 60.0), 5.9)


def test_a_healthy_run_of_many_short_requests_prints_no_waiting_line() -> None:
    waits = PROCESS.get(Waits)
    lines: list[str] = []
    live: list[Wait | None] = []
    with watching_waits(plain=lines.append, live=live.append):
        for _ in range(8):  # each 0.3 s without a byte, bounded to 600 s: a tokenize call of a big file
            with waits.waiting("http://server/tokenize", 600.0):
                time.sleep(0.3)
    assert lines == [] and all(shown is None for shown in live)


def test_a_silent_server_is_said_once_a_minute_at_most_in_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "REPEAT_EVERY", 60.0)
    waits = PROCESS.get(Waits)
    lines: list[str] = []
    with watching_waits(plain=lines.append):
        for number in range(3):  # three requests, one after another, each silent past its threshold
            with waits.waiting(f"http://server/v1/models#{number}", 3.0):
                time.sleep(1.0)
    assert len(lines) == 1, lines
    assert lines[0].startswith("waiting for http://server/v1/models#0 (") and "gives up after 3 s" in lines[0]
    monkeypatch.setattr(waiting, "REPEAT_EVERY", 0.6)
    again: list[str] = []
    with watching_waits(plain=again.append), waits.waiting("http://server/v1/chat", 3.0):
        time.sleep(2.0)
    assert 2 <= len(again) <= 3, again  # 0.5 s, then one each 0.6 s


def test_on_a_terminal_the_line_is_updated_in_place() -> None:
    waits = PROCESS.get(Waits)
    live: list[Wait | None] = []
    with watching_waits(live=live.append):
        with waits.waiting("http://server/v1/models", 3.0):
            time.sleep(1.2)
        time.sleep(0.5)
    shown = [wait for wait in live if wait is not None]
    assert shown and {wait.url for wait in shown} == {"http://server/v1/models"}
    assert live[-1] is None  # the command's own message again once the answer came
