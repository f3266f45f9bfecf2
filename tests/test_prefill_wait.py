"""A cold prefill is not a stall: the wait for a first token follows the prefill it expects.

Unit parts (the prefix memory, the bound, the line), then a listener that
accepts the stream's request and never answers: without a rate it is caught
after the stall timeout, as before; with a rate and a cold prompt after the
expected prefill plus the stall timeout, and the progress line says what it
waits for; a prompt sent before (its prefix cached) is caught after the stall
timeout again.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from longctx.backends.base import Backend
from longctx.backends.chat import ChatClient, ChatRequest
from longctx.backends.engines import VLLM
from longctx.backends.prefill_wait import (
    MARGIN,
    FirstTokenWait,
    PrefillRate,
    PrefillRates,
    PrefillWatch,
    PrefixMemory,
)
from longctx.backends.waits import Waits
from longctx.errors import ServerUnreachable
from longctx.process_state import PROCESS
from longctx.store import RequestRecord, Store
from longctx.usage import Usage


def _usage(prompt: int, cached: int, ttft: float) -> Usage:
    return Usage(
        prompt_tokens=prompt, cached_tokens=cached, created_cache_tokens=None, completion_tokens=1,
        ttft_seconds=ttft, total_seconds=ttft,
    )  # fmt: skip


def test_the_memory_counts_the_ids_of_a_prefix_sent_before_under_the_same_salt() -> None:
    memory = PrefixMemory()
    first = memory.prompt(list(range(2000)), (), "a")
    assert memory.cached_units(first) == 0
    memory.remember(first)
    longer = memory.prompt([*range(2000), *range(5000, 6000)], (), "a")
    # Whole blocks of 256 ids: 7 of the 2,000 ids' blocks are whole.
    assert memory.cached_units(longer) == 7 * 256
    assert memory.cached_units(memory.prompt(list(range(2000)), (), "b")) == 0
    changed = memory.prompt([1, *range(1, 3000)], (), "a")
    assert memory.cached_units(changed) == 0


def test_the_memory_counts_the_characters_of_messages_sent_before() -> None:
    memory = PrefixMemory()
    pack = {"role": "user", "content": "x" * 5000}
    memory.remember(memory.prompt(None, ({"role": "system", "content": "s"}, pack), None))
    follow_up = memory.prompt(
        None, ({"role": "system", "content": "s"}, pack, {"role": "user", "content": "q"}), None
    )
    assert 4000 <= memory.cached_units(follow_up) < follow_up.units


def test_the_memory_forgets_the_oldest_blocks_past_its_limit() -> None:
    memory = PrefixMemory(limit=4)
    old = memory.prompt(list(range(4 * 256)), (), None)
    memory.remember(old)
    memory.remember(memory.prompt(list(range(10_000, 10_000 + 2 * 256)), (), None))
    assert memory.cached_units(old) == 0


def test_rates_come_from_requests_that_prefilled_most_of_their_prompt_slowest_first() -> None:
    rates = PrefillRates()
    assert rates.current is None
    rates.give(PrefillRate(500.0, "measured earlier on this server"))
    assert rates.current == PrefillRate(500.0, "measured earlier on this server")
    assert rates.observe(_usage(10_000, 9_000, 0.1)) is None  # mostly cached: no rate
    assert rates.observe(_usage(200, 0, 0.1)) is None  # too short to measure
    assert rates.observe(_usage(4_000, 0, 2.0)) == 2_000.0
    assert rates.observe(_usage(8_000, 0, 2.0)) == 4_000.0
    assert rates.current == PrefillRate(2_000.0, "measured on this server")
    with pytest.raises(ValueError):
        rates.give(PrefillRate(0.0, "nothing"))


def test_the_bound_is_the_stall_timeout_plus_the_margin_on_the_expected_prefill() -> None:
    rate = PrefillRate(100.0, "measured on this server")
    wait = FirstTokenWait(30_000, 30_100, False, rate, stall_seconds=600.0)
    assert wait.expected_seconds == 300.0
    assert wait.gives_up_after == 600.0 + MARGIN * 300.0
    assert wait.describe() == (
        "a prefill of 30,000 uncached tokens of 30,100, expected about 300 s at 100 tokens/s"
        " (measured on this server)"
    )
    unknown = FirstTokenWait(30_000, 30_100, True, None, stall_seconds=600.0)
    assert unknown.gives_up_after == 600.0
    assert unknown.describe() == (
        "a prefill of ~30,000 uncached tokens of ~30,100, no prefill rate measured on this server yet"
    )


def test_the_watch_learns_the_characters_per_token_from_the_servers_counts() -> None:
    watch = PrefillWatch(stall_seconds=1.0)
    messages = ({"role": "user", "content": "y" * 9000},)
    wait, prompt = watch.wait(None, messages, None)
    assert wait.estimated and wait.uncached_tokens == round(prompt.units / 2.0)
    watch.observe(prompt, _usage(prompt.units // 4, 0, 1.0))
    again, _ = watch.wait(None, ({"role": "user", "content": "z" * 9000},), None)
    assert abs(again.uncached_tokens - prompt.units // 4) <= 1
    assert watch.rates.current is not None


class Listener:
    """Accepts every connection and reads what comes; never writes a byte."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.server.settimeout(0.05)
        while not self._stop.is_set():
            try:
                connection, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.held.append(connection)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for connection in self.held:
            connection.close()
        self.server.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


STALL = 0.4


def _give_up_after(chat: ChatClient, request: ChatRequest) -> tuple[float, str | None]:
    """Seconds until the client gave up on ``request``, and the progress line while it waited."""
    lines: list[str] = []

    def watch() -> None:
        time.sleep(0.15)
        if (wait := PROCESS.get(Waits).oldest()) is not None:
            lines.append(wait.describe())

    watcher = threading.Thread(target=watch)
    started = time.monotonic()
    watcher.start()
    with pytest.raises(ServerUnreachable):
        chat.complete(request)
    elapsed = time.monotonic() - started
    watcher.join()
    return elapsed, (lines or [None])[0]


def test_a_silent_server_is_caught_after_the_expected_prefill_and_the_stall_timeout(
    listener: Listener,
) -> None:
    chat = ChatClient(f"http://127.0.0.1:{listener.port}/v1", "m", stall_timeout=STALL, profile=VLLM)
    cold = ChatRequest(messages=(), prompt_ids=tuple(range(3000)), cache_salt="s")
    # No rate: the stall timeout, as before.
    elapsed, line = _give_up_after(chat, cold)
    assert STALL <= elapsed < STALL + 0.5
    assert line is not None and "no prefill rate measured on this server yet" in line
    # A rate: 3,000 uncached tokens at 5,000 tokens/s, 0.6 s expected, 1.8 s with the margin.
    chat.prefill.rates.give(PrefillRate(5_000.0, "measured earlier on this server"))
    elapsed, line = _give_up_after(chat, cold)
    bound = STALL + MARGIN * 3000 / 5000
    assert bound <= elapsed < bound + 0.5
    assert line is not None and line.startswith(
        f"waiting for http://127.0.0.1:{listener.port}/v1/completions (0 s"
    )
    assert "a prefill of 3,000 uncached tokens of 3,000, expected about 0.6 s at 5,000 tokens/s" in line
    # The same prompt sent before (its prefix cached): only the last, partial block is expected to prefill.
    _, prompt = chat.prefill.wait(cold.prompt_ids, (), "s")
    chat.prefill.memory.remember(prompt)
    elapsed, line = _give_up_after(chat, cold)
    assert STALL <= elapsed < STALL + 0.5
    assert line is not None and "prefill" not in line
    chat.close()


def test_a_session_hands_the_backend_the_rate_its_store_measured_on_that_server(
    backend: Backend, tmp_path: Path
) -> None:
    from longctx.sessions.resources import Resources, _expect_earlier_rates

    server = backend.info
    with Store.open(tmp_path / "store") as store:
        _expect_earlier_rates(backend, store)
        assert backend.prefill_rate(server.api_url) is None  # nothing measured there yet
        cold = _usage(20_000, 0, 4.0)
        elsewhere = RequestRecord(
            "b", None, None, "ask", 0.0, "http://other/v1", "vllm", server.model, cold, 1
        )
        store.sessions.record(
            RequestRecord("a", None, None, "ask", 0.0, server.api_url, "vllm", server.model, cold, 1)
        )
        store.sessions.record(elsewhere)
        # A session's resources hand it over on the backend's first use, given or made.
        assert Resources(backend=backend, store=store).backend is backend
    assert backend.prefill_rate(server.api_url) == PrefillRate(5_000.0, "measured earlier on this server")
