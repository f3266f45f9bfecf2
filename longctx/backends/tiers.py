"""Cache tiers beyond GPU memory: the metrics that tell them apart, and what a server's tier holds.

Engines keep prefix blocks evicted from GPU memory in host memory (or on
disk, or in a cache server) and load them back instead of prefilling them
again. Each engine's profile (:mod:`longctx.backends.engines`) names its
tier metrics per version in a :class:`CacheTiers`; this module reads them
into engine-neutral objects, :class:`TierReading` and :class:`HostTier`.
Where an engine version counts only the bytes its offloading moved (no
tokens by tier), the responses' cached tokens less the GPU hit counter are
what came from the host (:mod:`longctx.verification.counters`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from longctx.backends.metrics import Sample, total
from longctx.recordtypes import record_type

__all__ = ["CacheTiers", "HostTier", "TierReading", "hits_by_label", "read_tiers"]

TierSource = Literal["by_source", "transfers"]

_GIB = 1 << 30


@record_type
class CacheTiers:
    """The metrics that tell cache tiers apart (device, host, disk...), from version ``since`` on.

    ``hits_by_source`` counts cached tokens with the tier in label
    ``source_label``; its values for the GPU, the host and storage below it
    are ``device_sources``, ``host_sources`` and ``external_sources`` (a value
    counts for a tier when it starts with one of them: SGLang names storage
    backends ``storage_...``). ``connector_hits`` counts every token a
    connector (host memory, disk, LMCache) supplied where the engine's hit
    counter leaves them out although its responses count them as cached
    (vLLM's ``external_prefix_cache_hits``), read from the samples whose
    labels include ``connector_labels`` (vLLM 0.24 counts them in
    ``prompt_tokens_by_source{source="external_kv_transfer"}``). ``load_bytes`` and
    ``store_bytes`` are the host -> GPU and GPU -> host transfer counters,
    each a metric name and the labels its samples must have (the first
    present is read). ``host_capacity_tokens`` is a gauge of the host tier's
    tokens. ``metrics`` names every tier metric of the version.
    """

    since: str
    hits_by_source: str | None = None
    source_label: str = "source"
    metrics: tuple[str, ...] = ()
    device_sources: tuple[str, ...] = ("device",)
    host_sources: tuple[str, ...] = ("host",)
    external_sources: tuple[str, ...] = ()
    connector_hits: str | None = None
    connector_labels: tuple[tuple[str, str], ...] = ()
    load_bytes: tuple[tuple[str, Mapping[str, str]], ...] = ()
    store_bytes: tuple[tuple[str, Mapping[str, str]], ...] = ()
    host_capacity_tokens: str | None = None


@record_type
class HostTier:
    """The tier below GPU memory a server runs with, as its settings say.

    ``backend`` is the engine's name for it (vLLM ``native`` or ``lmcache``,
    or a connector's name; SGLang ``hicache``); ``size_bytes`` its size for the
    whole server where the settings give it; ``size_tokens`` its capacity in
    tokens where the server reports that (SGLang), else None (``longctx plan
    --host-memory`` computes it from the model's shape); ``storage`` names a
    tier below it (SGLang's storage backend, vLLM's secondary tiers).
    ``inclusive`` is true when every block the GPU computes is also written to
    the host (vLLM native, LMCache, SGLang ``write_through``): the host then
    holds copies of what the GPU holds, and the two together hold about the
    larger of them, not their sum.
    """

    backend: str
    size_bytes: int | None = None
    size_tokens: int | None = None
    storage: str | None = None
    inclusive: bool = True

    def describe(self) -> str:
        """One line for doctor: what the tier is and what it holds."""
        parts = [f"host tier {self.backend}"]
        if self.size_bytes is not None:
            parts.append(f"{self.size_bytes / _GIB:,.1f} GiB")
        if self.size_tokens is not None:
            parts.append(f"{self.size_tokens:,} tokens")
        elif self.size_bytes is not None:
            parts.append("tokens: `longctx plan --host-memory` from the model's shape")
        if self.storage:
            parts.append(f"storage below it: {self.storage}")
        if not self.inclusive:
            parts.append("write-back (holds what the GPU evicted)")
        return ", ".join(parts)


@record_type
class TierReading:
    """A server's cumulative cached tokens by tier and its GPU <-> host transfers, since it started.

    ``source`` says how the split was counted: ``by_source`` (the engine
    counts tokens per tier) or ``transfers`` (bytes moved only, no tokens by
    tier). ``connector`` is every token a connector supplied, where the
    engine counts it apart from its GPU hits. A count the server does not
    expose is None.
    """

    source: TierSource
    device: int | None = None
    host: int | None = None
    external: int | None = None
    connector: int | None = None
    load_bytes: int | None = None
    store_bytes: int | None = None

    def from_host(self) -> tuple[int, Literal["tokens", "bytes"]] | None:
        """What the host tier handed back so far, as a count and its unit; None where unknown.

        Its tokens where the engine counts them by tier, else the bytes it
        loaded host -> GPU.
        """
        if self.source == "by_source" and self.host is not None:
            return self.host, "tokens"
        if self.load_bytes is not None:
            return self.load_bytes, "bytes"
        return None

    def plus(self, other: TierReading) -> TierReading:
        """The sum of two servers' readings (a router's workers); a count either lacks stays None.

        Two readings counted differently (one by source, one by transfers
        only) sum as transfers: the split by tier is then known for neither.
        """
        source: TierSource = self.source if self.source == other.source else "transfers"

        def added(a: int | None, b: int | None) -> int | None:
            return None if a is None or b is None else a + b

        by_source = source == "by_source"
        return TierReading(
            source=source,
            device=added(self.device, other.device) if by_source else None,
            host=added(self.host, other.host) if by_source else None,
            external=added(self.external, other.external) if by_source else None,
            connector=added(self.connector, other.connector),
            load_bytes=added(self.load_bytes, other.load_bytes),
            store_bytes=added(self.store_bytes, other.store_bytes),
        )


def read_tiers(
    samples: list[Sample], tiers: CacheTiers | None, model: str | None = None
) -> TierReading | None:
    """The tier counters of ``tiers`` in ``samples``; None when the server exports none of them.

    Hits labelled only ``total`` (SGLang when it cannot tell the tiers
    apart) split nothing.
    """
    if tiers is None:
        return None
    loads = _first_total(samples, tiers.load_bytes, model)
    stores = _first_total(samples, tiers.store_bytes, model)
    connector = None
    if tiers.connector_hits is not None:
        connector = _first_total(samples, ((tiers.connector_hits, dict(tiers.connector_labels)),), model)
    by_label = hits_by_label(samples, tiers, model)
    if by_label and set(by_label) != {"total"}:
        return TierReading(
            source="by_source",
            device=_summed(by_label, tiers.device_sources),
            host=_summed(by_label, tiers.host_sources),
            external=_summed(by_label, tiers.external_sources),
            connector=connector,
            load_bytes=loads,
            store_bytes=stores,
        )
    if loads is not None or stores is not None or connector is not None:
        return TierReading(source="transfers", connector=connector, load_bytes=loads, store_bytes=stores)
    return None


def hits_by_label(samples: list[Sample], tiers: CacheTiers, model: str | None) -> dict[str, float]:
    """``tiers.hits_by_source`` summed by the value of its ``source_label`` ("" where it has none)."""
    by_label: dict[str, float] = {}
    for sample in samples:
        if sample.name == tiers.hits_by_source and sample.serves(model):
            label = sample.labels.get(tiers.source_label, "")
            by_label[label] = by_label.get(label, 0.0) + sample.value
    return by_label


def _first_total(
    samples: list[Sample], candidates: tuple[tuple[str, Mapping[str, str]], ...], model: str | None
) -> int | None:
    """The first candidate metric present, summed over the samples whose labels include the given ones."""
    for name, wanted in candidates:
        if (found := total(samples, name, model=model, labels=wanted)) is not None:
            return int(found)
    return None


def _summed(by_label: Mapping[str, float], prefixes: tuple[str, ...]) -> int:
    return int(sum(value for label, value in by_label.items() if label.startswith(prefixes) and prefixes))
