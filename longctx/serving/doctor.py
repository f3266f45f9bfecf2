"""``longctx doctor``: what each server of a backend is, and the launch flags that keep its cache.

:func:`diagnose` reads what the backend learnt of each replica (its engine
profile, settings, window, KV size), checks the settings against the
profile's checks and the router policy against the request options, and
returns a :class:`Diagnosis`: the servers, the findings (each with the flag
that fixes it) and whether each replica is up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any

from longctx.backends.base import Backend, ReplicaStatus, ServerInfo
from longctx.backends.profiles import CHECKPOINT_KV_SCALES, Finding
from longctx.options.groups import RequestOptions
from longctx.recordtypes import record_type
from longctx.serving.advice import detected_router_finding, suggest_router_policy
from longctx.serving.kv_scales import KVScales, find_kv_scales

__all__ = ["Diagnosis", "diagnose"]


@record_type
class Diagnosis:
    """The outcome of :func:`diagnose`: ``ok`` when no finding is a warning.

    ``kv_scales`` holds, per server (its API URL), what its checkpoint says
    of KV-cache scales: fp8 KV is suggested only where they are found.
    """

    servers: tuple[ServerInfo, ...]
    findings: tuple[Finding, ...]
    replicas: tuple[ReplicaStatus, ...] = ()
    kv_scales: Mapping[str, KVScales] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(finding.severity == "warning" for finding in self.findings)

    @property
    def caching_off(self) -> tuple[str, ...]:
        """The servers (API URLs) that report prefix caching off: nothing longctx sends is reused there."""
        return tuple(info.api_url for info in self.servers if info.prefix_caching is False)

    def to_text(self) -> str:
        lines = []
        if len(self.replicas) > 1:
            for replica in self.replicas:
                state = "up" if replica.up else f"DOWN ({replica.last_error or 'never answered'})"
                lines.append(f"replica {replica.api_url}: {state}")
        for info in self.servers:
            lines.append(
                f"{info.api_url}: {info.engine} {info.version or '(version unknown)'}, model {info.model}, "
                f"context {info.context_length or 'unknown'}"
            )
            lines.append(f"  prefix caching: {_state(info.prefix_caching)}")
            lines.append(f"  cached-token reporting: {_state(info.cache_reporting)}")
            lines.append(f"  metrics: {_state(info.metrics)}")
            if info.cache_block_tokens:
                lines.append(f"  cache block: {info.cache_block_tokens} tokens")
            if info.kv_cache_tokens:
                lines.append(f"  KV cache: {info.kv_cache_tokens:,} tokens")
            lines.append(f"  {info.host_tier.describe() if info.host_tier else 'host tier: none seen'}")
            if (scales := self.kv_scales.get(info.api_url)) is not None:
                state = {True: "found", False: "none", None: "unknown"}[scales.found]
                lines.append(f"  checkpoint KV scales: {state} ({scales.source})")
        if not self.findings:
            lines.append("no changes needed")
        for finding in self.findings:
            lines.append(
                f"{finding.severity}: add {finding.flag} "
                f"({finding.reason}; {finding.setting}={finding.observed})"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "servers": [{**info.to_dict(), **self._scales_dict(info)} for info in self.servers],
            "findings": [finding.__dict__ for finding in self.findings],
            "replicas": [replica.to_dict() for replica in self.replicas],
        }

    def _scales_dict(self, info: ServerInfo) -> dict[str, Any]:
        scales = self.kv_scales.get(info.api_url)
        return {} if scales is None else {"kv_scales": {"found": scales.found, "source": scales.source}}


def _state(value: bool | None) -> str:
    return "unknown" if value is None else ("on" if value else "OFF")


def diagnose(backend: Backend, *, probe: bool = True, request: RequestOptions | None = None) -> Diagnosis:
    """Findings about every replica of ``backend`` and the router in front, each with the flag that fixes it.

    With ``probe``, one one-token request per server settles whether it
    reports cached tokens (vLLM does not say otherwise). A replica that
    cannot be reached is a warning, a router found in front (vllm-router,
    smg: :mod:`longctx.backends.routers`) a suggestion; the router policy
    (:attr:`ServerOptions.router_policy <longctx.options.groups.ServerOptions.router_policy>`)
    is checked against ``request``'s ``cache_salt``.
    """
    if probe:
        backend.probe_cache_reporting()
    servers: list[ServerInfo] = []
    findings: list[Finding] = []
    kv_scales: dict[str, KVScales] = {}
    salted = bool(request is not None and request.cache_salt)
    if backend.router_policy:
        findings.extend(suggest_router_policy(backend.router_policy, cache_salt=salted))
    for replica in backend.replicas:
        # A router found in front (its /workers), declared or not: say so, and what it means.
        router = backend.router(replica.api_url) if replica.up else None
        if router is not None:
            findings.append(detected_router_finding(router, declared=backend.router_policy, salted=salted))
        info = replica.info
        if not replica.up or info is None:
            findings.append(
                Finding(
                    "warning",
                    "replica",
                    f"{replica.api_url} down",
                    "(start the replica, or drop its URL)",
                    f"its packs go to the next replica meanwhile: {replica.last_error or 'never answered'}",
                )
            )
            if info is None:
                continue
        servers.append(info)
        profile = info.profile
        if profile.doctor_note is not None:
            findings.append(profile.doctor_note)
        observed: dict[str, Any] = dict(info.settings)
        # fp8 KV is advised only for a checkpoint with calibrated scales (the profile's checks read it).
        kv_scales[info.api_url] = scales = _checkpoint_scales(info)
        observed[CHECKPOINT_KV_SCALES] = scales.found
        if profile.reporting_setting and info.cache_reporting is not None:
            observed[profile.reporting_setting] = info.cache_reporting
        for finding in profile.advise(observed):
            if finding not in findings:
                findings.append(finding)
        # Nothing is suggested for what the server does not report (vLLM
        # publishes its scheduler settings only in dev mode): a deployment
        # that already sets them would be told to set them again.
    ordered = sorted(findings, key=lambda f: f.severity != "warning")
    return Diagnosis(tuple(servers), tuple(ordered), backend.replicas, kv_scales)


def _checkpoint_scales(info: ServerInfo) -> KVScales:
    """The KV scales of the checkpoint ``info`` says it loaded, where that is a folder on this machine."""
    if info.checkpoint is None:
        return KVScales(None, "the server does not say where its model was loaded from")
    return find_kv_scales(None, info.checkpoint)
