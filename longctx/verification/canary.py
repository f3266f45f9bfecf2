"""The cache-correctness canary: does an answer served from the prefix cache equal a cold one?

Engines have had silent wrong output on cache hits (vLLM with CPU
offloading under concurrency, a missing stream sync; LMCache with packed KV
layouts and hybrid models; SGLang HiCache host-tier hits on a hybrid model,
20 of 20 answers wrong while ``cached_tokens`` said the whole prefix was
read). A client cannot assume a cached answer equals a cold one; the canary
checks it from the client side, with greedy decoding and log probabilities:

1. *cold*: the probe under a fresh ``cache_salt`` (a namespace nothing has
   filled: the whole prompt is computed);
2. *cold again*: the same probe under another fresh salt. The largest
   log-probability difference between the two is the server's own numerical
   spread, and sets the tolerance;
3. *cached*: the probe again under the first salt (or under a session's own
   salt: its real cache entries), so its prefix is read from the cache;
4. *host tier* (asked for with :attr:`CanaryOptions.host_tier`): the device
   cache is filled under another salt with more tokens than it holds, so
   the probe's blocks leave it (to the host tier where the server has one,
   else they are dropped), and the probe is asked once more.

They are asked in the order cold, cached, cold again (a session's own salt:
cached first), so that a cache too small for two probes still holds the
whole probe for the cached run; the host-tier run comes last. Each later
answer is compared with the cold one: the generated token ids
(the text where a server sends no ids) and the log probability of each of
the first :attr:`CanaryOptions.compare_tokens` tokens. The verdict:

- ``same``: the same tokens and bit-identical log probabilities;
- ``within tolerance``: the same tokens, log probabilities within the
  tolerance, or a token that differs where the cold answer had a near tie
  (its two best tokens within the tolerance of each other);
- ``diverged``: anything else. It is a finding with the two outputs as
  evidence (:class:`~longctx.errors.CanaryDiverged` from :meth:`CanaryResult.raise_for_divergence`;
  ``longctx doctor --canary`` exits with code 10);
- ``inconclusive``: the check could not be made (the two cold answers
  already differ, or the server reported no cached token for the cached
  run).

The tolerance is ``max(margin * spread, floor)``: the measured cold-vs-cold
spread, times a margin, but never below a floor, since two cold runs on one
server are often bit-identical while a cached prefill legitimately takes
another numerical path (the prompt's KV computed in one pass, the rest in
another). The floor's default, 0.2 nats, is about four times the largest
legitimate cold-vs-cached difference measured: 0.053 nats with a real model
in bf16 on vLLM 0.24 (H100, 2026-12-06: the same tokens, where a floor of
0.05 called a healthy server diverged), 0.093 with its fp8 KV cache; on the
CPU engines 0.0039 (docs/canary.md). The corruption the canary is for
changes tokens, and log probabilities by whole nats.

The canary is a plan (:mod:`longctx.drivers`): :func:`canary` runs it
blocking, :func:`acanary` on an event loop.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any, Literal

from longctx.backends.base import Backend, Sent
from longctx.backends.chat import ChatRequest, TokenLogprob
from longctx.backends.metrics import Sample
from longctx.backends.tiers import CacheTiers, read_tiers
from longctx.drivers import Io, Plan, arun, run
from longctx.errors import CanaryDiverged, ConfigError
from longctx.options.fields import OptionFields, option
from longctx.recordtypes import record_type

__all__ = [
    "CANARY_QUESTION",
    "CanaryComparison",
    "CanaryOptions",
    "CanaryResult",
    "CanaryRun",
    "CanarySampler",
    "acanary",
    "canary",
    "canary_plan",
    "probe_messages",
]

Verdict = Literal["same", "within tolerance", "diverged", "inconclusive"]
_RANK: dict[str, int] = {"same": 0, "within tolerance": 1, "inconclusive": 2, "diverged": 3}

CANARY_QUESTION = "List the first five records above, one per line, exactly as written."
"""The question the canary asks after the probe document or a session's pack."""

_AFFINITY = "longctx-canary"


@record_type
class CanaryOptions(OptionFields):
    """How the canary probes.

    ``max_tokens`` generated per run (greedy); the log probabilities of the
    first ``compare_tokens`` are compared; ``top_logprobs`` alternatives
    are asked for each (2 are enough to see a near tie). The tolerance is
    ``max(margin * cold spread, floor)`` (see the module docstring).
    ``host_tier`` adds the run after the device cache was filled under
    another salt with ``fill_tokens`` tokens (default: 1.25 times the KV
    cache the server reports). ``probe_lines`` sizes the built-in probe
    document (about 17 tokens a line; a cache block on the CPU vLLM is 128
    tokens, so the default's ~3,400 tokens span many blocks).
    """

    max_tokens: int = option(16, value_type="int", minimum=1)
    compare_tokens: int = option(8, value_type="int", minimum=1)
    top_logprobs: int = option(2, value_type="int", minimum=0, maximum=20)
    margin: float = option(4.0, value_type="float", minimum=1)
    floor: float = option(0.2, value_type="float", minimum=0)
    host_tier: bool = option(False, value_type="bool")
    fill_tokens: int | None = option(None, value_type="int", minimum=1)
    probe_lines: int = option(200, value_type="int", minimum=1)

    def __post_init__(self) -> None:
        self._check_fields()


@record_type
class CanaryRun:
    """One answer to the probe: under which salt, where, what the cache said, what came out."""

    label: str
    salt: str | None
    server: str
    text: str
    token_ids: tuple[int, ...] | None
    logprobs: tuple[TokenLogprob, ...]
    prompt_tokens: int | None
    cached_tokens: int | None
    tier: str | None = None

    @property
    def tokens(self) -> tuple[Any, ...]:
        """What is compared token by token: the ids, else the logprob tokens' text."""
        if self.token_ids is not None:
            return self.token_ids
        return tuple(entry.token for entry in self.logprobs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "salt": self.salt,
            "server": self.server,
            "text": self.text,
            "token_ids": None if self.token_ids is None else list(self.token_ids),
            "logprobs": [entry.logprob for entry in self.logprobs],
            "tokens": [entry.token for entry in self.logprobs],
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "tier": self.tier,
        }


@record_type
class CanaryComparison:
    """A later run against the cold one: where the tokens first differ, the largest logprob gap.

    ``largest_difference`` is the largest absolute difference of the chosen
    tokens' log probabilities over the compared positions up to the first
    differing token (None when no position could be compared), ``at`` its
    position.
    """

    run: str
    against: str
    first_difference: int | None
    largest_difference: float | None
    at: int | None
    verdict: Verdict
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@record_type
class CanaryResult:
    """What the canary found: every run, each comparison with the cold run, and the worst verdict."""

    runs: tuple[CanaryRun, ...]
    spread: CanaryComparison
    comparisons: tuple[CanaryComparison, ...]
    tolerance: float
    tolerance_rule: str
    notes: tuple[str, ...] = field(default=())

    @property
    def verdict(self) -> Verdict:
        verdicts = [c.verdict for c in self.comparisons]
        if self.spread.verdict == "inconclusive" and "diverged" not in verdicts:
            return "inconclusive"
        worst: Verdict = max(verdicts, key=lambda v: _RANK[v], default="inconclusive")
        return worst

    @property
    def diverged(self) -> bool:
        return self.verdict == "diverged"

    @property
    def largest_divergence(self) -> CanaryComparison | None:
        """The comparison that diverged first (or differs most), the one to show."""
        if not self.comparisons:
            return None
        return max(
            self.comparisons,
            key=lambda c: (_RANK[c.verdict], c.largest_difference or 0.0),
        )

    def run(self, label: str) -> CanaryRun:
        return next(r for r in self.runs if r.label == label)

    def raise_for_divergence(self) -> None:
        """Raise :class:`CanaryDiverged` (with this result) when a cached answer diverged."""
        if self.diverged:
            worst = self.largest_divergence
            assert worst is not None
            raise CanaryDiverged(f"cache canary: {worst.run} answer diverged: {worst.reason}", result=self)

    def to_text(self) -> str:
        cold = self.runs[0]
        lines = [
            f"cache canary on {cold.server}: {self.verdict}",
            f"  tolerance {self.tolerance:.3g} nats ({self.tolerance_rule})",
            f"  cold vs cold again: largest logprob difference {_figure(self.spread.largest_difference)}"
            f" ({self.spread.reason})",
        ]
        for comparison in self.comparisons:
            run = self.run(comparison.run)
            cached = "unknown" if run.cached_tokens is None else f"{run.cached_tokens:,}"
            tier = f", {run.tier}" if run.tier else ""
            lines.append(
                f"  cold vs {comparison.run} ({cached} of {run.prompt_tokens or 0:,} prompt tokens cached"
                f"{tier}): {comparison.verdict}, largest logprob difference "
                f"{_figure(comparison.largest_difference)}: {comparison.reason}"
            )
            if comparison.verdict == "diverged":
                lines.append(f"    cold:          {cold.text!r}")
                lines.append(f"    {comparison.run + ':':<14} {run.text!r}")
                if cold.token_ids is not None and run.token_ids is not None:
                    lines.append(f"    cold ids:      {list(cold.token_ids)}")
                    lines.append(f"    {comparison.run + ' ids:':<14} {list(run.token_ids)}")
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        worst = self.largest_divergence
        return {
            "verdict": self.verdict,
            "tolerance": self.tolerance,
            "tolerance_rule": self.tolerance_rule,
            "spread": self.spread.to_dict(),
            "largest_divergence": None if worst is None else worst.to_dict(),
            "comparisons": [c.to_dict() for c in self.comparisons],
            "runs": [r.to_dict() for r in self.runs],
            "notes": list(self.notes),
        }


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def probe_messages(lines: int = 200) -> tuple[dict[str, str], ...]:
    """The built-in probe: a document of numbered records and the canary question, deterministic."""
    body = "".join(
        f"record {n:04d}: sensor {chr(65 + n % 26)}{n % 7} read {(n * 7919) % 10007} units at step {n * 3}\n"
        for n in range(lines)
    )
    return (
        {"role": "system", "content": "You copy records exactly."},
        {"role": "user", "content": f"<records>\n{body}</records>\n\n{CANARY_QUESTION}"},
    )


def _salt() -> str:
    return f"longctx-canary-{uuid.uuid4().hex[:16]}"


_DEFAULT_SALT = object()


def canary_plan(
    backend: Backend,
    messages: Sequence[Mapping[str, str]] | None = None,
    options: CanaryOptions | None = None,
    *,
    affinity_key: str | None = None,
    cached_salt: Any = _DEFAULT_SALT,
) -> Plan[CanaryResult]:
    """The canary's plan over ``messages`` (default :func:`probe_messages`); see the module docstring.

    Every run carries ``affinity_key`` (default one of the canary's own), so
    all go to one replica. ``cached_salt`` is the salt of the cached run: by
    default the cold run's; a session passes its own (None for none) so its
    real cache entries are read. Raises what the requests raise, and
    :class:`ConfigError` for the host tier when the server's KV size is
    unknown and no :attr:`CanaryOptions.fill_tokens` is given.
    """
    options = options or CanaryOptions()
    probe = tuple(dict(m) for m in (messages or probe_messages(options.probe_lines)))
    key = affinity_key or _AFFINITY
    notes: list[str] = []

    def ask(label: str, salt: str | None, tier: str | None = None) -> Plan[CanaryRun]:
        request = ChatRequest(
            messages=probe,
            max_tokens=options.max_tokens,
            temperature=0.0,
            seed=0,
            cache_salt=salt,
            affinity_key=key,
            token_ids=True,
            logprobs=options.top_logprobs,
        )
        sent: Sent = yield from backend.delivery(request)
        return _run(label, salt, sent, tier)

    cold_salt = _salt()
    home = cold_salt if cached_salt is _DEFAULT_SALT else cached_salt
    # The cached run is asked before the second cold run, and a session's own namespace before
    # either: a cache that holds one probe but not two (a long-context replica holds a handful of
    # packs) would otherwise have dropped part of what the cached run is to read. Measured on an
    # H200 with a 65,536-token cache and a 47.5k-token probe asked cold, cold again, cached: 17,968
    # of its 47,509 tokens were found.
    if home == cold_salt:
        cold = yield from ask("cold", cold_salt)
        cached = yield from ask("cached", home)
    else:
        cached = yield from ask("cached", home)
        if not cached.cached_tokens:
            # A session's own namespace that did not hold the pack yet: that run filled it.
            notes.append("the session's cache did not hold the prompt: it was asked twice")
            cached = yield from ask("cached", home)
        cold = yield from ask("cold", cold_salt)
    again = yield from ask("cold again", _salt())
    runs = [cold, again, cached]
    if options.host_tier:
        runs.append((yield from _after_filling(backend, options, key, probe, cold, ask, home, notes)))
    if not cold.logprobs:
        notes.append("the server sent no log probabilities: only the tokens are compared")
    spread = _compare(again, cold, options, tolerance=None)
    measured = spread.largest_difference or 0.0
    tolerance = max(options.margin * measured, options.floor)
    rule = f"max({options.margin:g} x the cold-vs-cold spread {measured:.3g}, floor {options.floor:g})"
    spread = _compare(again, cold, options, tolerance=tolerance, spread_check=True)
    comparisons = tuple(_compare(run, cold, options, tolerance=tolerance) for run in runs[2:])
    return CanaryResult(tuple(runs), spread, comparisons, tolerance, rule, tuple(notes))


def canary(
    backend: Backend,
    messages: Sequence[Mapping[str, str]] | None = None,
    options: CanaryOptions | None = None,
    *,
    affinity_key: str | None = None,
) -> CanaryResult:
    """:func:`canary_plan` carried out in this thread."""
    return run(canary_plan(backend, messages, options, affinity_key=affinity_key))


async def acanary(
    backend: Backend,
    messages: Sequence[Mapping[str, str]] | None = None,
    options: CanaryOptions | None = None,
    *,
    affinity_key: str | None = None,
) -> CanaryResult:
    """:func:`canary_plan` carried out on the running event loop."""
    return await arun(canary_plan(backend, messages, options, affinity_key=affinity_key))


def _run(label: str, salt: str | None, sent: Sent, tier: str | None) -> CanaryRun:
    completion = sent.completion
    return CanaryRun(
        label=label,
        salt=salt,
        server=sent.server.api_url,
        text=completion.text,
        token_ids=completion.token_ids,
        logprobs=completion.logprobs or (),
        prompt_tokens=completion.usage.prompt_tokens,
        cached_tokens=completion.usage.cached_tokens,
        tier=tier,
    )


def _compare(
    run: CanaryRun,
    cold: CanaryRun,
    options: CanaryOptions,
    *,
    tolerance: float | None,
    spread_check: bool = False,
) -> CanaryComparison:
    """``run`` against ``cold``; without a ``tolerance`` only the figures (the spread's first pass)."""
    ours, theirs = run.tokens, cold.tokens
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    if first is None and len(ours) != len(theirs):
        first = min(len(ours), len(theirs))
    limit = min(options.compare_tokens, len(run.logprobs), len(cold.logprobs))
    if first is not None:
        limit = min(limit, first)
    gaps = [abs(run.logprobs[i].logprob - cold.logprobs[i].logprob) for i in range(limit)]
    largest = max(gaps) if gaps else None
    at = gaps.index(max(gaps)) if gaps else None
    verdict: Verdict = "inconclusive"
    reason = ""
    if tolerance is not None:
        verdict, reason = _judge(
            run, cold, (first, largest, at), tolerance=tolerance, spread_check=spread_check
        )
    return CanaryComparison(run.label, cold.label, first, largest, at, verdict, reason)


def _judge(
    run: CanaryRun,
    cold: CanaryRun,
    figures: tuple[int | None, float | None, int | None],
    *,
    tolerance: float,
    spread_check: bool,
) -> tuple[Verdict, str]:
    """The verdict on a comparison's figures (first differing token, largest gap, its position), and why."""
    first, largest, at = figures
    over = largest is not None and largest > tolerance
    over_reason = (
        f"the logprob of token {at} differs by {largest or 0:.3g}, over the tolerance {tolerance:.3g}"
    )
    if not spread_check and run.cached_tokens == 0 and run.label != "host tier":
        return (
            "inconclusive",
            "the server reported no cached token: the answer was computed cold, nothing checked",
        )
    # A host-tier run that read nothing was evicted and recomputed (no host tier held the
    # blocks): a cold run, judged as one.
    if first is not None:
        tie = _near_tie(cold, run, first, tolerance)
        if tie is None and spread_check:
            return "inconclusive", (
                f"two cold answers differ at token {first}: the server is not deterministic"
                " under greedy decoding, so a cached answer cannot be judged"
            )
        if tie is None:
            return "diverged", f"the generated tokens differ from token {first} on, with no near tie there"
        return ("diverged", over_reason) if over else ("within tolerance", tie)
    if over and not spread_check:
        return "diverged", over_reason
    if not largest:
        return "same", "the same tokens and logprobs"
    return "within tolerance", f"the same tokens; logprobs differ by at most {largest:.3g}"


def _near_tie(cold: CanaryRun, run: CanaryRun, position: int, tolerance: float) -> str | None:
    """Why the first differing token is a near tie of the cold answer, or None when it is not."""
    if position >= len(cold.logprobs) or position >= len(run.logprobs):
        return None
    chosen, other = cold.logprobs[position], run.logprobs[position]
    alternatives = dict(chosen.top)
    # The same text under another id is no tie: the ids say a different token came out.
    if other.token == chosen.token or other.token not in alternatives:
        return None
    gap = chosen.logprob - alternatives[other.token]
    if gap > tolerance:
        return None
    return (
        f"token {position} differs where the cold answer had a near tie ({chosen.token!r} and"
        f" {other.token!r} {gap:.3g} nats apart, within the tolerance); the rest follows from it"
    )


# -- the host tier ------------------------------------------------------------


def _after_filling(  # noqa: PLR0917 - the canary plan's own state, passed down once
    backend: Backend,
    options: CanaryOptions,
    key: str,
    probe: Sequence[Mapping[str, str]],
    cold: CanaryRun,
    ask: Any,
    home: str | None,
    notes: list[str],
) -> Plan[CanaryRun]:
    """Fill the device cache under another salt, then ask the probe again under ``home``."""
    server = yield Io(lambda: backend.server_for(key))
    target = options.fill_tokens or (int(server.kv_cache_tokens * 1.25) if server.kv_cache_tokens else None)
    if target is None:
        raise ConfigError(
            "the server does not report its KV cache size: give CanaryOptions.fill_tokens to force the"
            " host tier"
        )
    context = server.context_length or 8192
    # The fill is sized in characters: the probe tells how many make a token on this model.
    chars_per_token = sum(len(m["content"]) for m in probe) / max(1, cold.prompt_tokens or 1)
    per_request = max(256, min(context - 512, target, 32_768))
    salt, filled, number = _salt(), 0, 0
    while filled < target:
        text = _filler(number, int(per_request * chars_per_token * 0.9))
        request = ChatRequest(
            messages=({"role": "user", "content": text},),
            max_tokens=1,
            temperature=0.0,
            cache_salt=salt,
            affinity_key=key,
        )
        sent: Sent = yield from backend.delivery(request)
        filled += sent.completion.usage.prompt_tokens or per_request
        number += 1
    notes.append(f"host tier: {filled:,} tokens in {number} requests filled the device cache first")
    middle = yield Io(lambda: backend.metric_samples(key))
    run: CanaryRun = yield from ask("host tier", home)
    after = yield Io(lambda: backend.metric_samples(key))
    tier = _tier(server.profile.tiers_for(server.version), middle, after, run)
    return CanaryRun(**{**run.__dict__, "tier": tier})


def _filler(number: int, characters: int) -> str:
    """Text of about ``characters`` characters that shares no prefix with any other filler."""
    line = f"filler {number}: " + " ".join(f"w{(number * 31 + i) % 997}" for i in range(40)) + "\n"
    return (line * (characters // len(line) + 1))[:characters]


def _tier(tiers: CacheTiers | None, middle: list[Sample], after: list[Sample], run: CanaryRun) -> str:
    """Where the host-tier run's prefix came from, as the server's counters tell.

    ``tiers`` is the engine registry's tier metrics for the server's version:
    the host tier's tokens where the engine counts them by tier, else the
    bytes it loaded back (:meth:`TierReading.from_host`).
    """
    if not run.cached_tokens:
        return "evicted and recomputed (no host tier held it)"
    was, now = _from_host(middle, tiers), _from_host(after, tiers)
    if now is None:
        return "cached (the server exports no host-tier counter to tell which tier)"
    count, unit = now
    # A counter the engine creates at its first host hit is absent before it: nothing moved then.
    moved = count - (was[0] if was is not None and was[1] == unit else 0)
    if moved > 0:
        return f"read from the host tier ({moved:,} {unit} moved to the device)"
    return "read from the device cache (the fill did not evict it)"


def _from_host(samples: list[Sample], tiers: CacheTiers | None) -> tuple[int, str] | None:
    reading = read_tiers(samples, tiers)
    return None if reading is None else reading.from_host()


class CanarySampler:
    """One request in ``every`` is followed by a canary (none when ``every`` is None); the results so far.

    Thread-safe: a batch's siblings count from their threads.
    """

    def __init__(self, every: int | None) -> None:
        self.every = every
        self._count = 0
        self._results: list[CanaryResult] = []
        self._lock = threading.Lock()

    def due(self, requests: int = 1) -> bool:
        """Count ``requests`` more; True when the count passed a multiple of ``every``."""
        if not self.every:
            return False
        with self._lock:
            before, self._count = self._count, self._count + requests
            return before // self.every != self._count // self.every

    def keep(self, result: CanaryResult) -> None:
        with self._lock:
            self._results.append(result)

    @property
    def results(self) -> tuple[CanaryResult, ...]:
        """Every canary run on this session, oldest first."""
        with self._lock:
            return tuple(self._results)

    @property
    def diverged(self) -> tuple[CanaryResult, ...]:
        """The runs whose cached answer diverged (the findings)."""
        return tuple(result for result in self.results if result.diverged)
