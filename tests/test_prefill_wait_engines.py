"""A cold prefill longer than the stall timeout, on the real vLLM and SGLang (CPU, tiny model).

The stall timeout is set to a quarter of what this server's cold prefill of
a long prompt takes now. Without a rate that healthy prefill ends as a stall
(as every cold prefill past the stall timeout did before); once the rate
measured earlier on this server is handed in (as a session reads it from its
store), a cold prefill of the same size is waited for, the progress line says
what is awaited and how long it should take, and a cached follow-up keeps the
plain stall timeout.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from test_session_engines import STDLIB

from longctx.backends.base import Backend, connect
from longctx.backends.chat import ChatRequest
from longctx.backends.prefill_wait import PrefillRate
from longctx.backends.waits import Waits
from longctx.errors import ServerUnreachable
from longctx.options.groups import ServerOptions
from longctx.process_state import PROCESS
from longctx.retry import RetryPolicy
from longctx.testing import LocalServer

BIG_CHARS = 60_000  # about 20k tokens of the tiny tokenizer: a cold prefill of a second or more here


def _messages(chars: int, question: str) -> tuple[dict[str, str], ...]:
    text = "".join(path.read_text() for path in sorted(Path(STDLIB).glob("a*.py")))[:chars]
    return (
        {"role": "system", "content": f"Answer questions. [{uuid.uuid4().hex}]"},
        {"role": "user", "content": f"<documents>\n{text}\n</documents>\n\n{question}"},
    )


def _ask(backend: Backend, messages: tuple[dict[str, str], ...], salt: str) -> float:
    sent = backend.complete(ChatRequest(messages=messages, max_tokens=1, temperature=0.0, cache_salt=salt))
    assert sent.completion.usage.ttft_seconds is not None
    return sent.completion.usage.ttft_seconds


def _lines_while(call: Callable[[], object]) -> list[str]:
    """The progress lines (the oldest wait's) seen every 0.05 s while ``call`` runs."""
    lines: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if (wait := PROCESS.get(Waits).oldest()) is not None:
                lines.append(wait.describe())
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        call()
    finally:
        done.set()
        watcher.join()
    return lines


def test_a_cold_prefill_past_the_stall_timeout_is_waited_for_once_the_rate_is_known(
    engine_server: LocalServer,
) -> None:
    big = _messages(BIG_CHARS, "Which module is first?")
    with connect(engine_server.api_base) as roomy:
        # The faster of two cold prefills: a single one, slowed by servers starting beside it, set a
        # stall timeout that the next, faster one stayed under (a fresh clone's run, 2026-12-06).
        cold_seconds = min(_ask(roomy, big, uuid.uuid4().hex) for _ in range(2))
        measured = roomy.prefill_rate(roomy.info.api_url)
    assert measured is not None and measured.source == "measured on this server"
    # Half that cold prefill: it still ends the healthy cold request as a stall, and leaves SGLang's CPU
    # build room for its cached follow-up, which takes seconds there (a quarter ran out in a CI run).
    stall = cold_seconds / 2
    options = ServerOptions(base_url=engine_server.api_base, stall_timeout=stall)
    with connect(options, retry=RetryPolicy(attempts=1)) as strict:
        # No rate yet: the healthy cold prefill outlasts the stall timeout and ends as a stall.
        lines: list[str] = []
        with pytest.raises(ServerUnreachable):
            lines = _lines_while(lambda: _ask(strict, big, uuid.uuid4().hex))
        # SGLang goes on with a prefill its client left: let it end before the next cold request.
        time.sleep(cold_seconds)
        # The rate measured earlier on this server (as a session reads it from its store): now the
        # long cold prefill is waited for.
        # Half the rate measured: a 2-core machine booting other servers beside this one may prefill
        # slower now than when it measured (a CI run saw the three-fold margin run out).
        strict.expect_prefill_rate(
            strict.info.api_url, PrefillRate(measured.tokens_per_second / 2, "measured earlier")
        )
        salt = uuid.uuid4().hex
        lines = _lines_while(lambda: _ask(strict, big, salt))
        assert any("uncached tokens" in line and "(measured earlier)" in line for line in lines), lines
        assert strict.prefill_rate(strict.info.api_url).source == "measured on this server"
    # The follow-up's prefix is cached: its wait expects the prefill of its few new tokens. Its time is not
    # the point here, and SGLang's CPU build took longer than half the cold prefill for it in a fresh
    # clone's run (2026-12-06): it is asked with room to finish.
    follow_up = (big[0], {"role": "user", "content": big[1]["content"] + " And the last?"})
    patient_options = ServerOptions(base_url=engine_server.api_base, stall_timeout=cold_seconds * 2)
    with connect(patient_options, retry=RetryPolicy(attempts=1)) as patient:
        patient.expect_prefill_rate(
            patient.info.api_url, PrefillRate(measured.tokens_per_second / 2, "measured earlier")
        )
        _ask(patient, big, salt)  # the server has it cached; now this connection knows it sent it
        lines = _lines_while(lambda: _ask(patient, follow_up, salt))
        for line in lines:
            if found := re.search(r"prefill of ~([\d,]+) uncached tokens of ~([\d,]+)", line):
                uncached, prompt = (int(number.replace(",", "")) for number in found.groups())
                assert uncached < prompt / 10, line
