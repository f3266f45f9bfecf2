"""How long a streamed request may wait for its first token: a cold prefill is not a stall.

A server says nothing between accepting a request and its first token: it
prefills the prompt. For a prompt whose prefix it holds that takes a moment;
for a cold million tokens it takes minutes (and on a CPU a 30k-token pack
took 19 minutes), longer than the stall timeout that catches a server which
went silent. So the wait before the first token follows what the prefill
should take:

    gives up after = stall timeout + margin x uncached tokens / prefill rate

- the **uncached tokens** are the prompt's tokens past the longest prefix
  this process already sent to the same server under the same cache salt
  (:class:`PrefixMemory`: chained hashes of blocks of the prompt, token ids
  or the messages' text; for text the characters are turned into tokens by
  the ratio the server's own counts showed, else a low guess that errs
  towards waiting longer);
- the **prefill rate** is measured on this server (:class:`PrefillRates`:
  the slowest of the recent requests that prefilled most of their prompt,
  uncached tokens over time to first token), or handed in by the caller
  (a rate measured earlier on this server, kept in the store); without one
  the wait is the stall timeout as before, and the progress line says why;
- once the expected time has passed, a silent server is caught within the
  stall timeout, as before.

The whole stream of such a request reads under that bound (the HTTP client
sets one read timeout per response), so a stream that stalls after its first
token is caught after it too; a request whose prompt is cached keeps the
plain stall timeout. :class:`FirstTokenWait` is what the progress line shows:
what the request waits for and how long it expects.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from longctx.recordtypes import record_type
from longctx.usage import Usage

__all__ = [
    "MARGIN",
    "MIN_PREFILL_TOKENS",
    "FirstTokenWait",
    "PrefillRate",
    "PrefillRates",
    "PrefillWatch",
    "PrefixMemory",
]

MARGIN = 3.0
"""How many times the expected prefill a request may take before its silence counts as a stall.

A rate measured on short prompts overstates the speed on long ones (attention
grows with the context): on the CPU vLLM a 0.5B model prefilled 67-137
tokens/s on short packs and 27 tokens/s on a 30.6k-token one.
"""

MIN_PREFILL_TOKENS = 256
"""A request prefilled at least this many tokens (and most of its prompt) for its time to measure a rate."""

RECENT_RATES = 8
"""How many measured rates are kept per server; the slowest of them is used."""

ID_BLOCK = 256
"""Token ids per hashed block of a prompt sent as ids."""

TEXT_BLOCK = 1024
"""Characters per hashed block of a prompt sent as messages."""

GUESSED_CHARS_PER_TOKEN = 2.0
"""Characters per token before the server's counts said: low, so the guess errs towards waiting longer."""

MEMORY_BLOCKS = 1 << 18
"""Block hashes kept per server (about 64M tokens of ids, 256M characters of text): the oldest go first."""


@record_type
class PrefillRate:
    """A prefill rate in tokens per second and where it came from (``measured on this server``)."""

    tokens_per_second: float
    source: str


@record_type
class FirstTokenWait:
    """The wait of one request for its first token: what it prefills, at what rate, and its bound."""

    uncached_tokens: int
    prompt_tokens: int
    #: The token counts come from characters (a prompt sent as text), not from ids.
    estimated: bool
    rate: PrefillRate | None
    stall_seconds: float
    margin: float = MARGIN

    @property
    def expected_seconds(self) -> float | None:
        """How long the prefill should take at the rate (no margin); None without a rate."""
        if self.rate is None or self.rate.tokens_per_second <= 0:
            return None
        return self.uncached_tokens / self.rate.tokens_per_second

    @property
    def gives_up_after(self) -> float:
        """The bound on the wait for the first token (and each later read of the stream)."""
        expected = self.expected_seconds
        return self.stall_seconds + (self.margin * expected if expected else 0.0)

    def describe(self) -> str:
        """``a prefill of ~30,600 uncached tokens of 30,700, expected about 306 s at 100 tokens/s (...)``."""
        about = "~" if self.estimated else ""
        what = (
            f"a prefill of {about}{self.uncached_tokens:,} uncached tokens of {about}{self.prompt_tokens:,}"
        )
        expected = self.expected_seconds
        if expected is None or self.rate is None:
            return f"{what}, no prefill rate measured on this server yet"
        rate = self.rate
        return (
            f"{what}, expected about {_seconds(expected)} s at {rate.tokens_per_second:,.0f} tokens/s"
            f" ({rate.source})"
        )


def _seconds(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


class PrefillRates:
    """The prefill rates measured on one server; :attr:`current` is the slowest recent one."""

    def __init__(self) -> None:
        self._measured: list[float] = []
        self._given: PrefillRate | None = None
        self._lock = threading.Lock()

    def observe(self, usage: Usage) -> float | None:
        """Take in a finished request's usage; the rate it measured (None when it measured none)."""
        prompt, cached, ttft = usage.prompt_tokens, usage.cached_tokens, usage.ttft_seconds
        if prompt is None or cached is None or ttft is None or ttft <= 0:
            return None
        uncached = prompt - cached
        if uncached < MIN_PREFILL_TOKENS or uncached < 0.5 * prompt:
            return None
        rate = uncached / ttft
        with self._lock:
            self._measured = [*self._measured, rate][-RECENT_RATES:]
        return rate

    def give(self, rate: PrefillRate) -> None:
        """A rate known from elsewhere (measured earlier on this server), used until one is measured here."""
        if rate.tokens_per_second <= 0:
            raise ValueError(f"a prefill rate must be positive, not {rate.tokens_per_second}")
        with self._lock:
            self._given = rate

    @property
    def current(self) -> PrefillRate | None:
        with self._lock:
            if self._measured:
                return PrefillRate(min(self._measured), "measured on this server")
            return self._given


def _chained(prompt: Sequence[int] | str, block: int, salt: str) -> list[int]:
    """Each block's hash chained to every block before it (and the salt): equal only for equal prefixes.

    Python's own hash of a tuple of ints or of a string (64 bits, in C): about
    0.025 s for a million ids on a loaded 2-core CPU, where blake2b over the
    packed ids took 0.09 s. A collision only makes a request look cached (its
    wait the stall timeout, as before); the hashes never leave the process.
    """
    chained = hash(salt)
    found = []
    as_tuple = isinstance(prompt, list)
    for start in range(0, len(prompt), block):
        piece = prompt[start : start + block]
        chained = hash((chained, tuple(piece) if as_tuple else piece))
        found.append(chained)
    return found


def messages_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The messages as one canonical text (what a prefix of them shares with a later request)."""
    return json.dumps([dict(message) for message in messages], ensure_ascii=False, sort_keys=True)


@record_type
class _Prompt:
    """A request's prompt as hashed blocks: ids or text, its length in its units."""

    hashes: list[int]
    units: int
    block: int
    as_ids: bool


class PrefixMemory:
    """The prompts this process sent to one server, as chained block hashes (oldest forgotten first)."""

    def __init__(self, limit: int = MEMORY_BLOCKS) -> None:
        self._limit = limit
        self._known: OrderedDict[int, None] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def prompt(
        prompt_ids: Sequence[int] | None, messages: Sequence[Mapping[str, Any]], salt: str | None
    ) -> _Prompt:
        salted = "ids\0" if prompt_ids is not None else "text\0"
        salted += salt or ""
        if prompt_ids is not None:
            ids = prompt_ids if isinstance(prompt_ids, (tuple, list)) else list(prompt_ids)
            return _Prompt(_chained(ids, ID_BLOCK, salted), len(ids), ID_BLOCK, True)
        text = messages_text(messages)
        return _Prompt(_chained(text, TEXT_BLOCK, salted), len(text), TEXT_BLOCK, False)

    def cached_units(self, prompt: _Prompt) -> int:
        """How many of the prompt's units (ids or characters) lie in blocks sent before."""
        with self._lock:
            known = 0
            for digest in prompt.hashes:
                if digest not in self._known:
                    break
                known += 1
        return min(prompt.units, known * prompt.block)

    def remember(self, prompt: _Prompt) -> None:
        with self._lock:
            for digest in prompt.hashes:
                self._known[digest] = None
                self._known.move_to_end(digest)
            while len(self._known) > self._limit:
                self._known.popitem(last=False)


class PrefillWatch:
    """One server's prefill rates, the prompts sent to it, and its characters per token.

    :meth:`wait` says how long a request may wait for its first token;
    :meth:`observe` takes in its usage once it finished.
    """

    def __init__(self, stall_seconds: float, margin: float = MARGIN) -> None:
        self.stall_seconds = stall_seconds
        self.margin = margin
        self.rates = PrefillRates()
        self.memory = PrefixMemory()
        self._chars_per_token: float | None = None

    def wait(
        self, prompt_ids: Sequence[int] | None, messages: Sequence[Mapping[str, Any]], salt: str | None
    ) -> tuple[FirstTokenWait, _Prompt]:
        """The request's wait (and its hashed prompt, for :meth:`observe`)."""
        prompt = self.memory.prompt(prompt_ids, messages, salt)
        cached = self.memory.cached_units(prompt)
        if prompt.as_ids:
            uncached, total = prompt.units - cached, prompt.units
        else:
            ratio = self._chars_per_token or GUESSED_CHARS_PER_TOKEN
            uncached, total = round((prompt.units - cached) / ratio), round(prompt.units / ratio)
        wait = FirstTokenWait(
            uncached_tokens=uncached,
            prompt_tokens=total,
            estimated=not prompt.as_ids,
            rate=self.rates.current,
            stall_seconds=self.stall_seconds,
            margin=self.margin,
        )
        return wait, prompt

    def observe(self, prompt: _Prompt, usage: Usage) -> None:
        """A request finished: remember its prompt, measure the rate and the characters per token."""
        self.memory.remember(prompt)
        self.rates.observe(usage)
        if not prompt.as_ids and usage.prompt_tokens:
            self._chars_per_token = prompt.units / usage.prompt_tokens
