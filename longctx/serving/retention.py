"""Measured retention: how many packs of a given size a server really keeps in its prefix cache.

``longctx plan`` and the job scheduler's residency model estimate what a
server holds from its KV size; this measures it (the overflow method): send
``packs`` distinct prompts of ``pack_tokens`` tokens each, one after another
(each read cold), then send them again newest first. While the re-sent pack
is still held, its prompt comes back cached (and fast); the first one that
is not marks the oldest pack kept. ``kept_packs`` is how many came back
before it. Re-sending newest first never evicts a pack before it is asked
again: each re-send only refreshes a pack that is held, until the first miss.

Every probe request carries a ``cache_salt`` of its own run, so earlier
traffic and earlier runs do not count as kept; the probes do evict other
clients' prefixes (run it on a server that is not serving users).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from longctx.backends.base import Backend
from longctx.backends.chat import ChatRequest
from longctx.errors import ConfigError
from longctx.recordtypes import record_type

__all__ = ["PackProbe", "RetentionReport", "measure_retention"]

#: A re-sent pack counts as kept when at least this share of its prompt came back cached.
KEPT_SHARE = 0.5
_LINE = "{pack:04d}.{line:04d} the retention probe of run {run} writes pack {pack} line {line} here\n"


@record_type
class PackProbe:
    """One pack of the probe: its prompt tokens, its cold send and its re-send (newest first)."""

    pack: int
    prompt_tokens: int | None
    cold_ttft_seconds: float | None
    cached_tokens: int | None
    ttft_seconds: float | None
    kept: bool


@record_type
class RetentionReport:
    """How many packs of ``pack_tokens`` the server kept, beside the estimate from its KV size.

    ``kept_packs`` is measured (None: the server reports no cached tokens,
    so nothing could be measured): the packs re-sent with at least half their
    prompt cached before the first that was not (the last may be kept in part:
    its probe says how much); ``estimated_packs`` is the KV cache the server
    reports (or the one given) over the packs' mean prompt tokens, as
    ``longctx plan`` and the job scheduler count. ``kv_tokens`` is the measured figure as KV
    tokens (the cached tokens of the packs kept), what :class:`~longctx.jobs.JobOptions` ``kv_tokens`` takes.
    """

    engine: str
    pack_tokens: int
    packs_sent: int
    kept_packs: int | None
    server_kv_tokens: int | None
    estimated_packs: int | None
    probes: tuple[PackProbe, ...]
    salt: str

    @property
    def kv_tokens(self) -> int | None:
        """The KV tokens the kept packs were found to hold (their cached tokens); None if unmeasured."""
        if self.kept_packs is None:
            return None
        return max(1, sum(p.cached_tokens or 0 for p in self.probes if p.kept))

    @property
    def saturated(self) -> bool:
        """Every pack came back: the server keeps at least ``packs_sent`` (send more to find the limit)."""
        return self.kept_packs == self.packs_sent

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "kv_tokens": self.kv_tokens, "saturated": self.saturated}

    def to_text(self) -> str:
        lines = [f"retention on {self.engine}: packs of ~{self.pack_tokens:,} tokens, {self.packs_sent} sent"]
        for probe in self.probes:
            lines.append(
                f"  pack {probe.pack:>3}: {probe.prompt_tokens or 0:>7,} tokens, cold TTFT "
                f"{_seconds(probe.cold_ttft_seconds)}, re-sent {_count(probe.cached_tokens):>7} "
                f"cached, TTFT {_seconds(probe.ttft_seconds)}  {'kept' if probe.kept else 'gone'}"
            )
        kept = "unknown (no cached tokens reported)" if self.kept_packs is None else str(self.kept_packs)
        lines.append(
            f"measured: {kept} packs kept" + (" (all sent: the limit is higher)" if self.saturated else "")
        )
        if self.kv_tokens is not None:
            lines.append(
                f"  = {self.kv_tokens:,} KV tokens for packs (longctx job --kv-tokens {self.kv_tokens})"
            )
        if self.estimated_packs is not None:
            lines.append(
                f"estimate: {self.estimated_packs} packs "
                f"({self.server_kv_tokens:,} KV tokens over the pack size)"
            )
        return "\n".join(lines) + "\n"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def measure_retention(
    backend: Backend,
    pack_tokens: int,
    *,
    packs: int | None = None,
    kv_tokens: int | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> RetentionReport:
    """Measure how many packs of about ``pack_tokens`` tokens the server keeps (see the module docstring).

    ``packs`` is how many to send (default: 1.5 times the estimate plus two,
    at least four); ``kv_tokens`` the KV size to estimate from where the
    server does not report it.
    """
    if pack_tokens < 16:
        raise ConfigError("--pack-tokens: a pack is at least 16 tokens")
    server = backend.server_for(None)
    reported_kv = kv_tokens if kv_tokens is not None else server.kv_cache_tokens
    estimate = None if reported_kv is None else reported_kv // pack_tokens
    count = packs if packs is not None else max(4, math.ceil((estimate or 4) * 1.5) + 2)
    if count < 2:
        raise ConfigError("--packs: at least two packs")
    run = uuid.uuid4().hex[:10]
    salt = f"retention-{run}"
    texts = _pack_texts(backend, pack_tokens, count, run)
    tell = on_progress or (lambda message: None)

    def send(text: str) -> Any:
        request = ChatRequest(
            messages=({"role": "user", "content": text},), max_tokens=1, temperature=0.0, cache_salt=salt
        )
        return backend.complete(request).completion.usage

    cold = []
    for index, text in enumerate(texts):
        tell(f"filling: pack {index + 1} of {count}")
        cold.append(send(text))
    probes: dict[int, PackProbe] = {}
    kept: int | None = 0
    missed = False
    for index in reversed(range(count)):
        tell(f"re-sending newest first: pack {index + 1}")
        usage = send(texts[index])
        prompt = usage.prompt_tokens or cold[index].prompt_tokens
        hit = (
            usage.cached_tokens is not None
            and prompt is not None
            and usage.cached_tokens >= KEPT_SHARE * prompt
        )
        if usage.cached_tokens is None:
            kept = None
        probes[index] = PackProbe(
            index, prompt, cold[index].ttft_seconds, usage.cached_tokens, usage.ttft_seconds, hit
        )
        if kept is not None and not missed:
            if hit:
                kept += 1
            else:
                missed = True
        if missed:
            break  # a miss's prefill evicts older packs: what follows measures nothing
    sizes = [usage.prompt_tokens for usage in cold if usage.prompt_tokens]
    if reported_kv is not None and sizes:
        estimate = reported_kv // round(sum(sizes) / len(sizes))  # the packs as the server counted them
    return RetentionReport(
        engine=server.engine,
        pack_tokens=pack_tokens,
        packs_sent=count,
        kept_packs=kept,
        server_kv_tokens=reported_kv,
        estimated_packs=estimate,
        probes=tuple(probes[i] for i in sorted(probes, reverse=True)),
        salt=salt,
    )


def _pack_texts(backend: Backend, pack_tokens: int, count: int, run: str) -> list[str]:
    """``count`` distinct texts of about ``pack_tokens`` tokens each (counted with the server's tokenizer)."""
    tokenizer = backend.tokenizer()
    sample = "".join(_LINE.format(pack=0, line=line, run=run) for line in range(8))
    per_line = max(1, tokenizer.count(sample) / 8)
    lines = max(1, int(pack_tokens / per_line))
    return [
        "".join(_LINE.format(pack=pack, line=line, run=run) for line in range(lines)) for pack in range(count)
    ]
