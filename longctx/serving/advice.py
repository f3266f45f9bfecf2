"""Flag advice for a running server, from the settings it reports.

``longctx doctor`` reads a server's settings and passes them here as a flat
mapping, using the engine's own names (values may be strings, as Prometheus
labels are):

- vLLM: the labels of the ``vllm:cache_config_info`` gauge on ``/metrics``
  (``enable_prefix_caching``, ``cache_dtype``, ``block_size``), plus
  ``enable_prompt_tokens_details`` (true when responses carry
  ``usage.prompt_tokens_details``) and, when known, ``max_num_batched_tokens``
  and ``enable_chunked_prefill``.
- SGLang: the keys of ``GET /server_info`` (``disable_radix_cache``,
  ``kv_cache_dtype``, ``enable_cache_report``, ``enable_metrics``,
  ``chunked_prefill_size``).

A key that is absent yields no finding: advice is only given on what was seen.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from longctx.errors import ServingConfigError

__all__ = [
    "CACHE_KEEPING_POLICIES",
    "Finding",
    "detected_router_finding",
    "suggest_router_policy",
    "suggest_server_flags",
]

_CHUNK_TOKENS = 8192
_SIXTEEN_BIT = frozenset({"auto", "bf16", "bfloat16", "fp16", "float16", "half"})


@dataclass(frozen=True)
class Finding:
    """One piece of advice.

    ``severity`` is ``"warning"`` when longctx's savings are lost or cannot be
    measured, ``"suggestion"`` for capacity gains; ``setting`` is the observed
    key, ``observed`` its value as text, ``flag`` what to add to the launch
    command, ``reason`` what it buys.
    """

    severity: Literal["warning", "suggestion"]
    setting: str
    observed: str
    flag: str
    reason: str


CACHE_KEEPING_POLICIES: dict[str, str] = {
    "vllm-router": "--policy consistent_hash",
    "smg": "--policy consistent_hashing",
    "dynamo": "--router-mode kv --router-session-affinity-ttl-secs 3600",
}
"""Per router, the launch flags that keep each pack on one replica with longctx's affinity headers."""

# Policies that send one pack's requests to whichever replica comes next:
# every replica prefills the pack again and each holds every pack, so a
# fleet caches no more than one replica.
_SPREADING = {"round_robin", "roundrobin", "round-robin", "random", "power_of_two", "least_load"}


def suggest_router_policy(router_policy: str, *, cache_salt: bool) -> tuple[Finding, ...]:
    """Findings for the router in front of the replicas, named ``"ROUTER:POLICY"``.

    For example ``"vllm-router:round_robin"`` or ``"smg:cache_aware"``.

    A spreading policy (round robin, random, power of two, least load)
    loses the cache; vllm-router's ``kv_aware`` ignores requests that carry
    a ``cache_salt`` (they fall back to its non-affinity policy), so with a
    salt it is flagged too. A router longctx does not know gets no finding.
    """
    router, _, policy = router_policy.partition(":")
    router, policy = router.strip().lower(), policy.strip().lower()
    fix = CACHE_KEEPING_POLICIES.get(router, "a session-affinity or consistent-hash policy")
    if policy in _SPREADING:
        return (
            Finding(
                "warning",
                "router policy",
                router_policy,
                fix,
                f"{policy} sends a pack's requests to every replica in turn: each prefills the pack again",
            ),
        )
    if policy == "kv_aware" and cache_salt and router == "vllm-router":
        return (
            Finding(
                "warning",
                "router policy",
                f"{router_policy} with cache_salt",
                fix,
                "vllm-router's kv_aware ignores requests that carry cache_salt: "
                "they are spread as if they had no affinity",
            ),
        )
    return ()


def detected_router_finding(router: Any, *, declared: str | None, salted: bool) -> Finding:
    """What doctor says of a router it found in front (a :class:`~longctx.backends.routers.RouterInfo`).

    Its workers' counters are read directly for the counter checks. Its
    policy cannot be read from it: undeclared, a vllm-router is reminded
    that ``kv_aware`` gives requests with ``cache_salt`` no KV score.
    """
    workers = ", ".join(router.workers) or "none healthy"
    reason = (
        f"{router.name} found in front (workers: {workers}); longctx reads each worker's counters"
        " directly for its counter checks"
    )
    if declared is None and salted and router.name == "vllm-router":
        reason += (
            "; if its policy is kv_aware, requests with cache_salt get no KV score and are spread:"
            " declare the policy to have it checked"
        )
    flag = "(nothing to add)" if declared else f"(declare it: router_policy '{router.name}:POLICY')"
    return Finding("suggestion", "router", router.name, flag, reason)


def suggest_server_flags(engine: str, observed: Mapping[str, Any]) -> tuple[Finding, ...]:
    """Flags to add to a ``"vllm"`` or ``"sglang"`` server, given its ``observed`` settings.

    Warnings come first. Raises :class:`ServingConfigError` for another engine.
    """
    if engine == "vllm":
        findings = _vllm(observed)
    elif engine == "sglang":
        findings = _sglang(observed)
    else:
        raise ServingConfigError(f"unknown engine {engine!r}; use vllm or sglang", field="engine")
    return tuple(sorted(findings, key=lambda f: f.severity != "warning"))


def _vllm(seen: Mapping[str, Any]) -> list[Finding]:
    findings = []
    if _is_false(seen, "enable_prefix_caching"):
        findings.append(
            Finding(
                "warning",
                "enable_prefix_caching",
                _text(seen["enable_prefix_caching"]),
                "--enable-prefix-caching",
                "without it every request prefills the whole document again",
            )
        )
    if _is_false(seen, "enable_prompt_tokens_details"):
        findings.append(
            Finding(
                "warning",
                "enable_prompt_tokens_details",
                _text(seen["enable_prompt_tokens_details"]),
                "--enable-prompt-tokens-details",
                "responses then report cached tokens, so longctx can show what the cache saved",
            )
        )
    if _is_false(seen, "enable_chunked_prefill"):
        findings.append(
            Finding(
                "warning",
                "enable_chunked_prefill",
                _text(seen["enable_chunked_prefill"]),
                f"--enable-chunked-prefill --max-num-batched-tokens {_CHUNK_TOKENS}",
                "a long prompt otherwise takes whole steps and stalls every running decode",
            )
        )
    batched = _as_int(seen.get("max_num_batched_tokens"))
    if batched is not None and batched < _CHUNK_TOKENS:
        findings.append(
            Finding(
                "suggestion",
                "max_num_batched_tokens",
                str(batched),
                f"--max-num-batched-tokens {_CHUNK_TOKENS}",
                f"prefill of long prompts runs in chunks of {batched} tokens; "
                f"{_CHUNK_TOKENS} prefills faster at a small cost in decode latency",
            )
        )
    dtype = seen.get("cache_dtype")
    if isinstance(dtype, str) and dtype.lower() in _SIXTEEN_BIT:
        findings.append(
            Finding(
                "suggestion",
                "cache_dtype",
                dtype,
                "--kv-cache-dtype fp8",
                "halves KV memory: twice the context x concurrency (check answer quality)",
            )
        )
    return findings


def _sglang(seen: Mapping[str, Any]) -> list[Finding]:
    findings = []
    if _is_true(seen, "disable_radix_cache"):
        findings.append(
            Finding(
                "warning",
                "disable_radix_cache",
                _text(seen["disable_radix_cache"]),
                "remove --disable-radix-cache",
                "without the radix cache every request prefills the whole document again",
            )
        )
    if _is_false(seen, "enable_cache_report"):
        findings.append(
            Finding(
                "warning",
                "enable_cache_report",
                _text(seen["enable_cache_report"]),
                "--enable-cache-report",
                "responses then report cached tokens, so longctx can show what the cache saved",
            )
        )
    if "chunked_prefill_size" in seen:
        # -1 (or 0) turns chunking off; None means SGLang has not resolved its default, so say nothing.
        size = _as_int(seen["chunked_prefill_size"])
        if size is not None and size <= 0:
            findings.append(
                Finding(
                    "warning",
                    "chunked_prefill_size",
                    _text(seen["chunked_prefill_size"]),
                    f"--chunked-prefill-size {_CHUNK_TOKENS}",
                    "chunked prefill is off: a long prompt stalls every running decode",
                )
            )
    if _is_false(seen, "enable_metrics"):
        findings.append(
            Finding(
                "suggestion",
                "enable_metrics",
                _text(seen["enable_metrics"]),
                "--enable-metrics",
                "exposes server-wide cached-token counters to cross-check longctx's figures",
            )
        )
    dtype = seen.get("kv_cache_dtype")
    if isinstance(dtype, str) and dtype.lower() in _SIXTEEN_BIT:
        findings.append(
            Finding(
                "suggestion",
                "kv_cache_dtype",
                dtype,
                "--kv-cache-dtype fp8_e4m3",
                "halves KV memory: twice the context x concurrency (check answer quality)",
            )
        )
    return findings


def _truth(value: Any) -> bool | None:
    """A boolean from a JSON bool or a Prometheus label ("True", "false", "1")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
    return None


def _is_false(seen: Mapping[str, Any], key: str) -> bool:
    return key in seen and _truth(seen[key]) is False


def _is_true(seen: Mapping[str, Any], key: str) -> bool:
    return key in seen and _truth(seen[key]) is True


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _text(value: Any) -> str:
    return "null" if value is None else str(value)
