"""The harness's extra servers: bounded ones boot only while a slot is free; a waiting test gets its own."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from longctx.testing import LocalServer
from longctx.testing import harness as harness_module
from longctx.testing.harness import EngineHarness


class Stand:
    """What the harness reads of a started server, and whether it was stopped."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.api_base = f"http://{name}.invalid/v1"
        self.startup_seconds = 0.0
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


def _starter(started: list[str], name: str) -> Callable[[EngineHarness], LocalServer]:
    def start(harness: EngineHarness) -> LocalServer:
        started.append(name)
        return cast(LocalServer, Stand(name))

    return start


def _wait_for(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_bounded_extra_boots_only_once_an_earlier_one_is_stopped(tmp_path: Path) -> None:
    harness = EngineHarness(tmp_path, bounded_extras=1)
    started: list[str] = []
    try:
        harness.prepare_extra("first", _starter(started, "first"), bounded=True)
        harness.prepare_extra("second", _starter(started, "second"), bounded=True)
        assert _wait_for(lambda: started == ["first"])
        time.sleep(1.0)  # two slot waits of the second's boot
        assert started == ["first"], "the second booted while the first held the only slot"
        first = cast(Stand, harness.extra_server("first", _starter(started, "first")))
        harness.stop_extra("first")
        assert first.stopped
        assert _wait_for(lambda: started == ["first", "second"])
    finally:
        harness.close()


def test_a_test_waiting_for_a_bounded_extra_gets_it_whatever_the_slots(tmp_path: Path) -> None:
    harness = EngineHarness(tmp_path, bounded_extras=1)
    started: list[str] = []
    try:
        harness.prepare_extra("first", _starter(started, "first"), bounded=True)
        harness.prepare_extra("second", _starter(started, "second"), bounded=True)
        assert _wait_for(lambda: started == ["first"])
        got: list[LocalServer] = []
        waiter = threading.Thread(
            target=lambda: got.append(harness.extra_server("second", _starter(started, "x")))
        )
        waiter.start()
        waiter.join(timeout=10)
        assert not waiter.is_alive(), "a test asking for the second extra waited on the first's slot"
        assert [cast(Stand, server).name for server in got] == ["second"]
        assert started == ["first", "second"]
    finally:
        harness.close()


def test_an_unbounded_extra_never_waits_for_a_slot(tmp_path: Path) -> None:
    harness = EngineHarness(tmp_path, bounded_extras=1)
    started: list[str] = []
    try:
        harness.prepare_extra("bounded", _starter(started, "bounded"), bounded=True)
        harness.prepare_extra("replica", _starter(started, "replica"))
        assert _wait_for(lambda: sorted(started) == ["bounded", "replica"])
    finally:
        harness.close()


def test_closing_the_harness_ends_a_boot_still_waiting_for_a_slot(tmp_path: Path) -> None:
    before = set(threading.enumerate())  # the test session's own harness has threads of that name too
    harness = EngineHarness(tmp_path, bounded_extras=1)
    started: list[str] = []
    harness.prepare_extra("first", _starter(started, "first"), bounded=True)
    harness.prepare_extra("second", _starter(started, "second"), bounded=True)
    assert _wait_for(lambda: started == ["first"])
    harness.close()
    waiting = [
        thread for thread in set(threading.enumerate()) - before if thread.name.startswith("longctx-harness")
    ]
    assert _wait_for(lambda: not any(thread.is_alive() for thread in waiting)), "a boot thread still waits"
    assert started == ["first"]


def test_a_bounded_extra_waits_for_the_memory_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    available = [2.0]
    monkeypatch.setattr(harness_module, "_available_gib", lambda: available[0])
    harness = EngineHarness(tmp_path, bounded_extras=3)
    started: list[str] = []
    try:
        harness.prepare_extra("real", _starter(started, "real"), bounded=True, memory_gib=7.0)
        time.sleep(1.0)
        assert started == [], "it booted with 2 GiB available where it needs 7"
        available[0] = 9.0  # a stopped server gave its memory back
        assert _wait_for(lambda: started == ["real"])
    finally:
        harness.close()


def test_a_later_extra_never_takes_the_memory_an_earlier_one_waits_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Room for the small one only: it must not boot before the big one, prepared first, has begun.
    available = [4.0]
    monkeypatch.setattr(harness_module, "_available_gib", lambda: available[0])
    harness = EngineHarness(tmp_path, bounded_extras=3)
    started: list[str] = []
    try:
        harness.prepare_extra("big", _starter(started, "big"), bounded=True, memory_gib=7.0)
        harness.prepare_extra("small", _starter(started, "small"), bounded=True, memory_gib=3.0)
        time.sleep(1.5)  # three turns of each wait
        assert started == [], "the later extra booted while the earlier one waited for memory"
        available[0] = 12.0
        assert _wait_for(lambda: started == ["big", "small"])
        harness.extra_server("small", _starter(started, "small"))
        # The run's summary says when each was ready, from the harness's creation.
        assert re.fullmatch(r"0 s \(ready at [0-9]+ s\)", harness.timings["small start"])
    finally:
        harness.close()


def test_a_later_extra_a_test_needs_now_boots_before_its_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(harness_module, "_available_gib", lambda: 4.0)
    harness = EngineHarness(tmp_path, bounded_extras=3)
    started: list[str] = []
    try:
        harness.prepare_extra("big", _starter(started, "big"), bounded=True, memory_gib=7.0)
        harness.prepare_extra("small", _starter(started, "small"), bounded=True, memory_gib=3.0)
        assert harness.extra_server("small", _starter(started, "small")).name == "small"
        assert started == ["small"]
    finally:
        harness.close()
