"""A connection to one model on one or several servers: :func:`connect` and :class:`Backend`.

``connect`` asks the server what it is (vLLM, SGLang or another
OpenAI-compatible server), which model it serves, its context length, and
whether prefix caching and cached-token reporting are on. ``Backend.doctor``
turns that into findings with the exact launch flag to add.

With several base URLs (replicas of one model), each request goes to the
replica chosen by rendezvous hashing of its affinity key, so every request
of one pack lands on the replica that holds that pack's prefix.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from longctx.backends.chat import ChatClient, ChatRequest, Completion
from longctx.backends.engines import (
    MISSING_REPORT_FLAG,
    CacheCounters,
    Engine,
    EngineFacts,
    discover_engine,
    read_counters,
)
from longctx.backends.http import AsyncTransport, HttpEndpoint, Transport
from longctx.backends.tokenizer import ServerTokenizer
from longctx.config import ServerOptions
from longctx.errors import BackendError, ConfigError
from longctx.retry import OnRetry, RetryOutcome, RetryPolicy, acall_with_retry, call_with_retry
from longctx.serving.advice import Finding, suggest_server_flags

__all__ = ["Backend", "Diagnosis", "Sent", "ServerInfo", "connect"]


@dataclass(frozen=True)
class ServerInfo:
    """What one server said about itself. ``None`` means unknown, not false."""

    api_url: str
    root_url: str
    engine: Engine
    version: str | None
    model: str
    context_length: int | None
    prefix_caching: bool | None
    cache_reporting: bool | None
    metrics: bool | None
    cache_block_tokens: int | None
    schedule_policy: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Diagnosis:
    """The outcome of :meth:`Backend.doctor`."""

    servers: tuple[ServerInfo, ...]
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return not any(finding.severity == "warning" for finding in self.findings)

    def to_text(self) -> str:
        lines = []
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
            "servers": [
                {key: value for key, value in info.__dict__.items() if key != "settings"}
                for info in self.servers
            ],
            "findings": [finding.__dict__ for finding in self.findings],
        }


def _state(value: bool | None) -> str:
    return "unknown" if value is None else ("on" if value else "OFF")


@dataclass(frozen=True)
class Sent:
    """A completion, where it was answered, and how many attempts it took."""

    completion: Completion
    attempts: int
    server: ServerInfo
    request_id: str


class _Replica:
    def __init__(self, info: ServerInfo, endpoint: HttpEndpoint, chat: ChatClient) -> None:
        self.info = info
        self.endpoint = endpoint
        self.chat = chat


def rendezvous_order(key: str, urls: Sequence[str]) -> list[str]:
    """``urls`` ordered by highest random weight for ``key`` (stable when a URL is added or removed)."""
    return sorted(urls, key=lambda url: hashlib.sha256(f"{url}\0{key}".encode()).digest(), reverse=True)


class Backend:
    """One model served by one server or several replicas."""

    def __init__(self, replicas: Sequence[_Replica], retry: RetryPolicy) -> None:
        self._replicas = {replica.info.api_url: replica for replica in replicas}
        self.retry = retry

    @property
    def info(self) -> ServerInfo:
        """The first server's facts (all replicas serve the same model)."""
        return next(iter(self._replicas.values())).info

    @property
    def servers(self) -> tuple[ServerInfo, ...]:
        return tuple(replica.info for replica in self._replicas.values())

    def _replica(self, affinity_key: str | None) -> _Replica:
        if len(self._replicas) == 1 or not affinity_key:
            return next(iter(self._replicas.values()))
        return self._replicas[rendezvous_order(affinity_key, list(self._replicas))[0]]

    def server_for(self, affinity_key: str | None) -> ServerInfo:
        """The server that requests with ``affinity_key`` go to."""
        return self._replica(affinity_key).info

    def complete(
        self,
        request: ChatRequest,
        *,
        on_retry: OnRetry | None = None,
        on_first_token: Callable[[], None] | None = None,
        on_admitted: Callable[[], None] | None = None,
    ) -> Sent:
        """Send ``request`` with the retry policy; raises the last error when it gives up.

        ``on_admitted`` hears when the server accepted the request (its
        response headers arrived), ``on_first_token`` when the first token
        did (the prompt is prefilled); each may be called once per attempt.
        """
        replica, stamped = self._route(request)
        outcome: RetryOutcome[Completion] = call_with_retry(
            lambda: replica.chat.complete(stamped, on_first_token, on_admitted), self.retry, on_retry=on_retry
        )
        return Sent(outcome.value, outcome.attempts, replica.info, stamped.request_id or "")

    async def acomplete(
        self,
        request: ChatRequest,
        *,
        on_retry: OnRetry | None = None,
        on_first_token: Callable[[], None] | None = None,
        on_admitted: Callable[[], None] | None = None,
    ) -> Sent:
        """The async twin of :meth:`complete`."""
        replica, stamped = self._route(request)
        outcome = await acall_with_retry(
            lambda: replica.chat.acomplete(stamped, on_first_token, on_admitted),
            self.retry,
            on_retry=on_retry,
        )
        return Sent(outcome.value, outcome.attempts, replica.info, stamped.request_id or "")

    def _route(self, request: ChatRequest) -> tuple[_Replica, ChatRequest]:
        """The replica for ``request`` and the request with its id: one id for all its attempts."""
        return self._replica(request.affinity_key), replace(
            request, request_id=request.request_id or uuid.uuid4().hex
        )

    def tokenizer(self, affinity_key: str | None = None) -> ServerTokenizer:
        """The server's own tokenizer (exact counts for this model)."""

        replica = self._replica(affinity_key)
        if replica.info.engine == "generic":
            raise ConfigError("only vLLM and SGLang servers offer a tokenize endpoint")
        return ServerTokenizer(replica.endpoint, replica.info.engine, replica.info.model)

    def counters(self) -> dict[str, CacheCounters | None]:
        """Each server's prefix-cache hit counter now (None where it has none)."""
        return {
            url: read_counters(replica.endpoint, replica.info.engine, replica.info.model)
            for url, replica in self._replicas.items()
        }

    def probe_cache_reporting(self) -> dict[str, bool]:
        """Send a one-token request to each server and see whether it reports cached tokens."""
        seen: dict[str, bool] = {}
        request = ChatRequest(messages=({"role": "user", "content": "longctx doctor probe"},), max_tokens=1)
        for url, replica in self._replicas.items():
            completion = call_with_retry(partial(replica.chat.complete, request), self.retry).value
            seen[url] = completion.usage.cached_tokens is not None
        return seen

    def doctor(self, *, probe: bool = True) -> Diagnosis:
        """Findings about every server, each with the flag that fixes it.

        With ``probe``, one one-token request per server settles whether it
        reports cached tokens (vLLM does not say otherwise).
        """
        reporting = self.probe_cache_reporting() if probe else {}
        servers: list[ServerInfo] = []
        findings: list[Finding] = []
        for url, replica in self._replicas.items():
            info = replica.info
            if url in reporting:
                info = replace(info, cache_reporting=reporting[url])
                replica.info = info
            servers.append(info)
            if info.engine == "generic":
                findings.append(
                    Finding(
                        "warning",
                        "engine",
                        "unknown",
                        "(serve the model with vLLM or SGLang)",
                        "longctx cannot check prefix caching or read cache counters on this server",
                    )
                )
                continue
            observed: dict[str, Any] = dict(info.settings)
            if info.engine == "vllm" and info.cache_reporting is not None:
                observed["enable_prompt_tokens_details"] = info.cache_reporting
            for finding in suggest_server_flags(info.engine, observed):
                if finding not in findings:
                    findings.append(finding)
            # Nothing is suggested for what the server does not report (vLLM
            # publishes its scheduler settings only in dev mode): a deployment
            # that already sets them would be told to set them again.
        ordered = sorted(findings, key=lambda f: f.severity != "warning")
        return Diagnosis(tuple(servers), tuple(ordered))

    def close(self) -> None:
        for replica in self._replicas.values():
            replica.chat.close()
            replica.endpoint.close()

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _discover(
    base_url: str,
    model: str | None,
    api_key: str | None,
    retry: RetryPolicy,
    transport: Transport | None,
) -> tuple[ServerInfo, HttpEndpoint]:
    endpoint = HttpEndpoint(base_url, api_key=api_key, transport=transport, timeout=60.0)
    listing = call_with_retry(lambda: endpoint.get_json("/v1/models"), retry).value
    entries = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(entries, list) or not entries:
        raise BackendError(f"{endpoint.api_url}/models lists no models", url=endpoint.api_url)
    names = [str(entry.get("id")) for entry in entries]
    if model is None:
        chosen = entries[0]
    else:
        matching = [entry for entry in entries if entry.get("id") == model]
        if not matching:
            raise ConfigError(
                f"the server at {endpoint.api_url} does not serve {model!r}; it serves {', '.join(names)}"
            )
        chosen = matching[0]
    name = str(chosen["id"])
    facts: EngineFacts = discover_engine(endpoint, chosen.get("owned_by"), name)
    context = chosen.get("max_model_len")
    if facts.engine == "sglang" and isinstance(facts.settings.get("context_length"), int):
        context = context or facts.settings["context_length"]
    info = ServerInfo(
        api_url=endpoint.api_url,
        root_url=endpoint.root_url,
        engine=facts.engine,
        version=facts.version,
        model=name,
        context_length=int(context) if isinstance(context, int) else None,
        prefix_caching=facts.prefix_caching,
        cache_reporting=facts.cache_reporting,
        metrics=facts.metrics,
        cache_block_tokens=facts.cache_block_tokens,
        schedule_policy=facts.schedule_policy,
        settings=facts.settings,
    )
    return info, endpoint


def connect(
    server: ServerOptions | str | Sequence[str] | None = None,
    *,
    retry: RetryPolicy | None = None,
    transport: Transport | None = None,
    async_transport: AsyncTransport | None = None,
) -> Backend:
    """Connect to the server(s) ``server`` names and discover what they are.

    ``server`` is a :class:`~longctx.config.ServerOptions`, or just the
    URL(s) (``connect("http://host:8000/v1")``); what it leaves unset falls
    back to ``LONGCTX_BASE_URL``, ``LONGCTX_MODEL`` and ``LONGCTX_API_KEY``.
    ``transport`` and ``async_transport`` replace the network in tests.
    The caller owns the backend and closes it. Raises
    :class:`ServerUnreachable` when no server answers and
    :class:`ConfigError` when the model is not served.
    """
    options = server if isinstance(server, ServerOptions) else ServerOptions(base_url=server)
    policy = retry or RetryPolicy()
    chosen_model = options.resolved_model()
    key = options.resolved_api_key()
    replicas: list[_Replica] = []
    for url in options.base_urls():
        info, endpoint = _discover(url, chosen_model, key, policy, transport)
        chosen_model = chosen_model or info.model
        chat = ChatClient(
            info.api_url,
            info.model,
            api_key=key,
            timeout=options.timeout,
            stall_timeout=options.stall_timeout,
            missing_cache_reason=MISSING_REPORT_FLAG[info.engine],
            transport=transport,
            async_transport=async_transport,
        )
        replicas.append(_Replica(info, endpoint, chat))
    return Backend(replicas, policy)
