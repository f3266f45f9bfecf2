"""Flag advice for a running server, from the settings it reports, and for the router in front.

``longctx doctor`` reads a server's settings and checks them against its
engine profile's checks (:mod:`longctx.backends.engines`) as a flat
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
from typing import Any

from longctx.backends.engines import SPREADING_POLICIES, find_profile, find_router, profiles, routers
from longctx.backends.profiles import Finding
from longctx.errors import ServingConfigError

__all__ = [
    "CACHE_KEEPING_POLICIES",
    "Finding",
    "detected_router_finding",
    "suggest_router_policy",
    "suggest_server_flags",
]

CACHE_KEEPING_POLICIES: dict[str, str] = {router.name: router.keeping_policy for router in routers()}
"""Per router, the launch flags that keep each pack on one replica with longctx's affinity headers.

From the router registry (:func:`longctx.backends.engines.routers`).
"""


def suggest_router_policy(router_policy: str, *, cache_salt: bool) -> tuple[Finding, ...]:
    """Findings for the router in front of the replicas, named ``"ROUTER:POLICY"``.

    For example ``"vllm-router:round_robin"`` or ``"smg:cache_aware"``.

    A spreading policy (round robin, random, power of two, least load)
    loses the cache; vllm-router's ``kv_aware`` ignores requests that carry
    a ``cache_salt`` (they fall back to its non-affinity policy), so with a
    salt it is flagged too (the router registry says which policies of which
    router). A router the registry does not know is judged on spreading alone.
    """
    router, _, policy = router_policy.partition(":")
    router, policy = router.strip().lower(), policy.strip().lower()
    known = find_router(router)
    fix = known.keeping_policy if known else "a session-affinity or consistent-hash policy"
    if policy in SPREADING_POLICIES:
        return (
            Finding(
                "warning",
                "router policy",
                router_policy,
                fix,
                f"{policy} sends a pack's requests to every replica in turn: each prefills the pack again",
            ),
        )
    if cache_salt and known and policy in known.salt_blind_policies:
        return (
            Finding(
                "warning",
                "router policy",
                f"{router_policy} with cache_salt",
                fix,
                f"{router}'s {policy} ignores requests that carry cache_salt: "
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
    known = find_router(router.name)
    if declared is None and salted and known and known.salt_blind_policies:
        reason += (
            f"; if its policy is {' or '.join(known.salt_blind_policies)}, requests with cache_salt get"
            " no KV score and are spread: declare the policy to have it checked"
        )
    flag = "(nothing to add)" if declared else f"(declare it: router_policy '{router.name}:POLICY')"
    return Finding("suggestion", "router", router.name, flag, reason)


def suggest_server_flags(engine: str, observed: Mapping[str, Any]) -> tuple[Finding, ...]:
    """Flags to add to a server of the registered ``engine``, given its ``observed`` settings.

    The checks are the engine profile's
    (:attr:`longctx.backends.profiles.EngineProfile.checks`). Warnings come
    first. Raises :class:`ServingConfigError` for an engine not registered.
    """
    profile = find_profile(engine)
    if profile is None:
        known = ", ".join(known.name for known in profiles() if known.checks)
        raise ServingConfigError(f"unknown engine {engine!r}; use {known}", field="engine")
    return profile.advise(observed)
