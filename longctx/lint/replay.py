"""A log replayed against a live server: its cached tokens per request against the simulation's.

Each request goes out as the token ids the lint rendered (``/v1/completions``
where the engine takes ids, else as chat messages), one after another, with
one token of answer. Every request of a replay carries a ``cache_salt`` of
its own run (joined to the request's own salt, if any): the replay starts
from an empty cache in its namespace, so neither earlier traffic nor an
earlier replay warms it and no cache reset (a dev-mode route on vLLM) is
needed. The simulation is the engine's own kind (the profile's
``prefix_cache``), with the server's block or page size and KV tokens.

Trust: the responses' cached tokens are checked against the server's own
counter with longctx's counter check (:mod:`longctx.verification.counters`),
which notices other clients' traffic on the server (it then gives no check
and says why, rather than a false error); a request that failed (an HTTP
404, a refused body) makes the replay fail, never "match".
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from longctx.backends.base import Backend, ServerInfo
from longctx.backends.chat import ChatRequest
from longctx.errors import BackendError
from longctx.lint.logs import LoggedRequest, message_text
from longctx.lint.rendering import Renderer
from longctx.lint.sglang_cache import SglangCache
from longctx.lint.vllm_cache import VllmCache
from longctx.recordtypes import record_type
from longctx.report import CounterCheck
from longctx.store import RequestRecord
from longctx.verification.counters import CounterSnapshot, combine_checks

__all__ = ["ReplayReport", "ReplayedRequest", "replay"]

# How long a check waits for the server's counter to settle (a few seconds at most; longer while
# other calls of this process share the window).
_CHECK_SECONDS = 15.0


@record_type
class ReplayedRequest:
    """One request replayed: the simulation's cached tokens, the server's, its TTFT, or its error."""

    label: str
    prompt_tokens: int
    simulated: int
    reported: int | None
    ttft_seconds: float | None
    error: str | None = None

    @property
    def matches(self) -> bool:
        return self.error is None and self.reported == self.simulated


@record_type
class ReplayReport:
    """A replay: per request the simulated and reported cached tokens, and the counter check over all."""

    engine: str
    block_tokens: int
    kv_tokens: int | None
    salt: str
    requests: tuple[ReplayedRequest, ...]
    counter_check: CounterCheck | None

    @property
    def failed(self) -> int:
        return sum(request.error is not None for request in self.requests)

    @property
    def simulated_tokens(self) -> int:
        return sum(request.simulated for request in self.requests)

    @property
    def reported_tokens(self) -> int | None:
        values = [request.reported for request in self.requests]
        return None if any(v is None for v in values) else sum(v for v in values if v is not None)

    @property
    def matches(self) -> bool:
        """Every request answered and reported what the simulation said, and the counter did not disagree."""
        counter_ok = self.counter_check is None or self.counter_check.matches is not False
        return bool(self.requests) and all(r.matches for r in self.requests) and counter_ok

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "block_tokens": self.block_tokens,
            "kv_tokens": self.kv_tokens,
            "salt": self.salt,
            "matches": self.matches,
            "failed": self.failed,
            "simulated_tokens": self.simulated_tokens,
            "reported_tokens": self.reported_tokens,
            "counter_check": None if self.counter_check is None else asdict(self.counter_check),
            "requests": [asdict(request) for request in self.requests],
        }

    def to_text(self) -> str:
        lines = [f"replay on {self.engine} (block {self.block_tokens}, salt {self.salt}):"]
        for request in self.requests:
            if request.error is not None:
                lines.append(f"  {request.label}: FAILED: {request.error}")
                continue
            mark = "ok" if request.matches else "DIFFERS"
            lines.append(
                f"  {request.label}: {request.prompt_tokens:,} prompt, simulated {request.simulated:,}, "
                f"server {'-' if request.reported is None else f'{request.reported:,}'} cached  {mark}"
            )
        reported = self.reported_tokens
        lines.append(
            f"  total: simulated {self.simulated_tokens:,}, server "
            f"{'unknown' if reported is None else f'{reported:,}'}"
        )
        check = self.counter_check
        if check is None:
            lines.append("  counter check: none")
        elif check.matches is None:
            lines.append(f"  counter check: not made ({check.note})")
        else:
            verdict = "matches" if check.matches else "DIFFERS"
            lines.append(
                f"  counter check: {check.counter} grew {check.server_delta}, "
                f"responses said {check.reported}: {verdict}" + (f" ({check.note})" if check.note else "")
            )
        if self.failed:
            lines.append(f"  {self.failed} request(s) failed: no match can be claimed")
        lines.append(
            "  verdict: " + ("the server agrees with the simulation" if self.matches else "MISMATCH")
        )
        return "\n".join(lines) + "\n"


def replay(
    requests: Sequence[LoggedRequest],
    renderer: Renderer,
    backend: Backend,
    *,
    kv_tokens: int | None = None,
    salt: str | None = None,
) -> ReplayReport:
    """Send ``requests`` to ``backend``'s server one by one (see the module docstring) and compare."""
    server = backend.server_for(None)
    block = server.cache_block_tokens or (1 if server.profile.prefix_cache == "radix" else 16)
    budget = kv_tokens if kv_tokens is not None else server.kv_cache_tokens
    run_salt = salt or f"lint-{uuid.uuid4().hex[:12]}"
    simulate = _simulation(server, block, budget)
    snapshot = CounterSnapshot.take(backend)
    records: list[RequestRecord] = []
    replayed: list[ReplayedRequest] = []
    with snapshot:
        for request in requests:
            tokens = renderer.tokens(request)
            request_salt = (
                run_salt if request.cache_salt is None else f"{run_salt}-{request.cache_salt}"[:128]
            )
            simulated = simulate(tokens, request_salt)
            outgoing = _outgoing(request, tokens, request_salt, server)
            started = time.time()
            try:
                sent = backend.complete(outgoing)
            except BackendError as error:
                replayed.append(
                    ReplayedRequest(request.label, len(tokens), simulated, None, None, str(error)[:300])
                )
                continue
            usage = sent.completion.usage
            replayed.append(
                ReplayedRequest(
                    request.label, len(tokens), simulated, usage.cached_tokens, usage.ttft_seconds
                )
            )
            records.append(
                RequestRecord(
                    id=sent.request_id,
                    session_id=None,
                    batch_id=None,
                    purpose="lint replay",
                    started_at=started,
                    base_url=sent.server.api_url,
                    engine=sent.server.engine,
                    model=sent.server.model,
                    usage=usage,
                    attempts=sent.attempts,
                )
            )
        settling = snapshot.close("lint-replay", None, records)
    checks = settling.wait(timeout=_CHECK_SECONDS)
    check = combine_checks(checks or [], notes=settling.notes)
    return ReplayReport(server.engine, block, budget, run_salt, tuple(replayed), check)


def _simulation(server: ServerInfo, block: int, budget: int | None) -> Any:
    if server.profile.prefix_cache == "radix":
        radix = SglangCache(block, budget)
        return lambda tokens, _salt: radix.send(tokens)  # one salt per replay: one namespace
    blocks = VllmCache(block, None if budget is None else budget // block)
    return blocks.send


def _outgoing(request: LoggedRequest, tokens: Sequence[int], salt: str, server: ServerInfo) -> ChatRequest:
    if server.profile.takes_prompt_ids:
        return ChatRequest(
            messages=(), prompt_ids=tuple(tokens), max_tokens=1, temperature=0.0, cache_salt=salt
        )
    messages = tuple(
        {"role": str(message.get("role", "user")), "content": message_text(message)}
        for message in request.messages
    )
    return ChatRequest(messages=messages, max_tokens=1, temperature=0.0, cache_salt=salt)
