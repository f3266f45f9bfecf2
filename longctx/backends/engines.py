"""What longctx knows of each engine: discovery, cache counters, missing flags.

Facts from ../shared/design/engines.md, checked against vLLM 0.32 (CPU) and
SGLang 0.5.23 in the test suite:

- both serve ``GET /v1/models`` with ``owned_by`` naming the engine and
  ``max_model_len`` the effective context length;
- vLLM: ``GET /version``; its ``/metrics`` always carries
  ``vllm:cache_config_info`` (labels ``enable_prefix_caching``,
  ``block_size``, ``cache_dtype``, ``num_gpu_blocks``; from 0.32 also
  ``kv_cache_size_tokens``) and the counters
  ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``;
  cached tokens appear in responses only with ``--enable-prompt-tokens-details``;
- SGLang: ``GET /server_info`` (older name ``/get_server_info``) has the flat
  server arguments and ``max_total_num_tokens`` (the KV pool); counters need ``--enable-metrics``
  (``sglang:cached_tokens_total``); cached tokens in OpenAI responses need
  ``--enable-cache-report``.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Literal

from longctx.backends.http import HttpEndpoint
from longctx.backends.metrics import parse_metrics, total
from longctx.errors import BackendError

__all__ = ["CacheCounters", "Engine", "EngineFacts", "discover_engine", "read_counters"]

Engine = Literal["vllm", "sglang", "generic"]

# The counter whose growth equals the cached tokens the responses report.
HIT_COUNTER: dict[str, str] = {"vllm": "vllm:prefix_cache_hits_total", "sglang": "sglang:cached_tokens_total"}

MISSING_REPORT_FLAG: dict[str, str] = {
    "vllm": "vLLM does not report cached tokens: start it with --enable-prompt-tokens-details",
    "sglang": "SGLang does not report cached tokens: start it with --enable-cache-report",
    "generic": "the server does not report cached tokens (usage.prompt_tokens_details.cached_tokens)",
}


@dataclass(frozen=True)
class EngineFacts:
    """What discovery learnt beyond ``/v1/models``.

    ``None`` means unknown, not false. ``settings`` holds what was observed,
    in the engine's own names (for :func:`longctx.serving.suggest_server_flags`).
    """

    engine: Engine
    version: str | None = None
    prefix_caching: bool | None = None
    cache_reporting: bool | None = None
    metrics: bool | None = None
    cache_block_tokens: int | None = None
    schedule_policy: str | None = None
    kv_cache_tokens: int | None = None
    settings: Mapping[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class CacheCounters:
    """A reading of the server's own prefix-cache counters (tokens, since start).

    ``started`` tells the server processes read apart: their
    ``process_start_time_seconds`` (one per worker, for a router's sum),
    when ``/metrics`` has it. Two readings with different ``started`` are
    two processes' counters (a load balancer in front of ``/metrics``, or a
    restart), and their difference means nothing.
    """

    counter: str
    hits: int
    queries: int | None
    started: tuple[float, ...] = ()

    def plus(self, other: CacheCounters) -> CacheCounters:
        """The sum of two servers' readings (a router's workers)."""
        queries = None if self.queries is None or other.queries is None else self.queries + other.queries
        return CacheCounters(self.counter, self.hits + other.hits, queries, self.started + other.started)


def _truth(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def _integer(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def discover_engine(endpoint: HttpEndpoint, owned_by: str | None, model: str) -> EngineFacts:
    """Identify the engine behind ``endpoint`` and read its cache settings."""
    if owned_by == "vllm":
        return _discover_vllm(endpoint, model)
    if owned_by == "sglang" or endpoint.status("/server_info") == 200:
        return _discover_sglang(endpoint)
    return EngineFacts(engine="generic")


def _discover_vllm(endpoint: HttpEndpoint, model: str) -> EngineFacts:
    version = None
    with suppress(BackendError):
        version = str(endpoint.get_json("/version").get("version"))
    settings: dict[str, Any] = {}
    metrics_ok = False
    try:
        samples = parse_metrics(endpoint.get_text("/metrics"))
        metrics_ok = True
        for sample in samples:
            if sample.name == "vllm:cache_config_info" and sample.labels.get("model_name", model) in (
                model,
                None,
            ):
                settings.update(sample.labels)
                break
    except BackendError:
        pass
    return EngineFacts(
        engine="vllm",
        version=version,
        prefix_caching=_truth(settings.get("enable_prefix_caching")),
        # vLLM says nothing of --enable-prompt-tokens-details until a response shows it.
        cache_reporting=None,
        metrics=metrics_ok,
        cache_block_tokens=_integer(settings.get("block_size")),
        kv_cache_tokens=_vllm_kv_tokens(settings),
        settings=settings,
    )


def _vllm_kv_tokens(labels: Mapping[str, Any]) -> int | None:
    """The KV cache's size in tokens: vLLM 0.32's own label, else blocks times block size."""
    tokens = _integer(labels.get("kv_cache_size_tokens"))
    if tokens:
        return tokens
    blocks, block = _integer(labels.get("num_gpu_blocks")), _integer(labels.get("block_size"))
    return blocks * block if blocks and block else None


def _discover_sglang(endpoint: HttpEndpoint) -> EngineFacts:
    info: dict[str, Any] = {}
    for path in ("/server_info", "/get_server_info"):
        try:
            loaded = endpoint.get_json(path)
        except BackendError:
            continue
        if isinstance(loaded, dict):
            info = loaded
            break
    radix_off = _truth(info.get("disable_radix_cache"))
    return EngineFacts(
        engine="sglang",
        version=str(info["version"]) if "version" in info else None,
        prefix_caching=None if radix_off is None else not radix_off,
        cache_reporting=_truth(info.get("enable_cache_report")),
        metrics=_truth(info.get("enable_metrics")),
        cache_block_tokens=_integer(info.get("page_size")),
        schedule_policy=info.get("schedule_policy"),
        kv_cache_tokens=_integer(info.get("max_total_num_tokens")),
        settings=info,
    )


def read_counters(endpoint: HttpEndpoint, engine: Engine, model: str) -> CacheCounters | None:
    """The server's prefix-cache hit counter now, or None where it has none."""
    counter = HIT_COUNTER.get(engine)
    if counter is None:
        return None
    try:
        samples = parse_metrics(endpoint.get_text("/metrics"))
    except BackendError:
        return None
    hits = total(samples, counter, model=model)
    if hits is None:
        # SGLang creates its labelled counter at the first hit; a server that
        # exports its other metrics has simply had none yet.
        exporting = any(sample.name.startswith(f"{engine}:") for sample in samples)
        if not exporting:
            return None
        hits = 0.0
    queries_name = "vllm:prefix_cache_queries_total" if engine == "vllm" else "sglang:prompt_tokens_total"
    queries = total(samples, queries_name, model=model)
    started = tuple(s.value for s in samples if s.name == "process_start_time_seconds")[:1]
    return CacheCounters(
        counter=counter, hits=int(hits), queries=None if queries is None else int(queries), started=started
    )
