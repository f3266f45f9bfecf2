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
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypedDict, Unpack

from longctx.backends.chat import ChatClient, ChatRequest, Completion
from longctx.backends.engines import (
    MISSING_REPORT_FLAG,
    CacheCounters,
    Engine,
    EngineFacts,
    discover_engine,
    read_counters,
)
from longctx.backends.http import AsyncTransport, HttpEndpoint, Transport, split_base_url
from longctx.backends.metrics import Sample, parse_metrics
from longctx.backends.routers import RouterInfo, detect_router
from longctx.backends.tokenizer import ServerTokenizer
from longctx.config import AFFINITY_BODY_FIELD, RequestOptions, ServerOptions
from longctx.drivers import Io, Plan, arun, run
from longctx.errors import BackendError, ConfigError, ServerUnreachable
from longctx.retry import OnRetry, RetryPolicy, call_with_retry, retried
from longctx.serving.advice import (
    Finding,
    detected_router_finding,
    suggest_router_policy,
    suggest_server_flags,
)

__all__ = ["Backend", "DeliveryHooks", "Diagnosis", "ReplicaStatus", "Sent", "ServerInfo", "connect"]


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
    kv_cache_tokens: int | None = None
    settings: Mapping[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Diagnosis:
    """The outcome of :meth:`Backend.doctor`."""

    servers: tuple[ServerInfo, ...]
    findings: tuple[Finding, ...]
    replicas: tuple[ReplicaStatus, ...] = ()

    @property
    def ok(self) -> bool:
        return not any(finding.severity == "warning" for finding in self.findings)

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
            "replicas": [replica.to_dict() for replica in self.replicas],
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


class DeliveryHooks(TypedDict, total=False):
    """Who hears of a request's progress; each may be called once per attempt.

    ``on_retry``: an attempt failed and will be retried. ``on_admitted``: the
    server accepted the request (its response headers arrived).
    ``on_first_token``: the first token arrived (the prompt is prefilled).
    """

    on_retry: OnRetry
    on_first_token: Callable[[], None]
    on_admitted: Callable[[], None]


@dataclass(frozen=True)
class ReplicaStatus:
    """One replica URL of a backend as it stands: up (answering) or down since when, and why.

    ``info`` is None for a replica that has not answered since the backend
    was connected (so nothing is known of it yet).
    """

    api_url: str
    up: bool
    info: ServerInfo | None
    down_since: float | None = None
    last_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "api_url": self.api_url,
            "up": self.up,
            "down_since": self.down_since,
            "last_error": self.last_error,
        }


# How long a revival probe of a replica that was down may wait: it runs on a
# request's path, so a replica that hangs must not stall that request long.
_PROBE_TIMEOUT = 5.0


class _Replica:
    """One URL: its facts and clients once discovered, and whether it answers."""

    def __init__(
        self,
        api_url: str,
        opener: Callable[[], tuple[ServerInfo, HttpEndpoint, ChatClient]],
        transport: Transport | None = None,
    ):
        self.api_url = api_url
        self.transport = transport  # for the endpoints of a router's workers
        self._opener = opener
        self.info: ServerInfo | None = None
        self.endpoint: HttpEndpoint | None = None
        self.chat: ChatClient | None = None
        self.down_since: float | None = None
        self.retry_at = 0.0
        self.last_error: str | None = None
        self.lock = threading.Lock()
        # The router this URL is, once asked (see longctx.backends.routers).
        self.router: RouterInfo | None = None
        self.router_asked = False
        self.workers: dict[str, HttpEndpoint] = {}
        self.counter_note: str | None = None  # why its workers' counters could not be read

    @property
    def up(self) -> bool:
        return self.down_since is None and self.info is not None

    def open(self) -> None:
        """Discover the server once (raises as discovery does); then it is up."""
        if self.info is None:
            self.info, self.endpoint, self.chat = self._opener()
        self.down_since = None
        self.last_error = None

    def mark_down(self, error: BaseException, retry_seconds: float) -> None:
        now = time.time()
        if self.down_since is None:
            self.down_since = now
        self.last_error = str(error)
        self.retry_at = time.monotonic() + retry_seconds

    def status(self) -> ReplicaStatus:
        return ReplicaStatus(self.api_url, self.up, self.info, self.down_since, self.last_error)


def rendezvous_order(key: str, urls: Sequence[str]) -> list[str]:
    """``urls`` ordered by highest random weight for ``key`` (stable when a URL is added or removed)."""
    return sorted(urls, key=lambda url: hashlib.sha256(f"{url}\0{key}".encode()).digest(), reverse=True)


class Backend:
    """One model served by one server or several replicas.

    With several replicas, the requests of one affinity key (one pack) go
    to the first replica of its rendezvous order that is up. A replica that
    cannot be reached is marked down at once and the request goes on to the
    next replica of the order (so only that replica's packs move); after
    ``retry_seconds`` the next request that would go to it tries it again,
    and once it answers its packs go back to it. A request is answered
    once: it fails over only when no answer came back.
    """

    def __init__(
        self,
        replicas: Sequence[_Replica],
        retry: RetryPolicy,
        retry_seconds: float = 5.0,
        *,
        router_policy: str | None = None,
        affinity_body_fields: Sequence[str] | None = None,
    ) -> None:
        self._replicas = {replica.api_url: replica for replica in replicas}
        self._body_fields = None if affinity_body_fields is None else tuple(affinity_body_fields)
        self.retry = retry
        self.retry_seconds = retry_seconds
        self.router_policy = router_policy

    @property
    def info(self) -> ServerInfo:
        """The first answering server's facts (all replicas serve the same model)."""
        for replica in self._replicas.values():
            if replica.info is not None and replica.up:
                return replica.info
        for replica in self._replicas.values():
            if replica.info is not None:
                return replica.info
        raise ServerUnreachable("no replica of this backend has answered", url=next(iter(self._replicas)))

    @property
    def servers(self) -> tuple[ServerInfo, ...]:
        """The facts of every replica discovered so far."""
        return tuple(replica.info for replica in self._replicas.values() if replica.info is not None)

    @property
    def replicas(self) -> tuple[ReplicaStatus, ...]:
        """Every replica URL, in the order given, with whether it is up."""
        return tuple(replica.status() for replica in self._replicas.values())

    def _order(self, affinity_key: str | None) -> list[_Replica]:
        if len(self._replicas) == 1 or not affinity_key:
            return list(self._replicas.values())
        return [self._replicas[url] for url in rendezvous_order(affinity_key, list(self._replicas))]

    def _usable(self, replica: _Replica) -> bool:
        """Whether ``replica`` takes requests now; a down one past its wait is tried (once per wait)."""
        if replica.up:
            return True
        if time.monotonic() < replica.retry_at or not replica.lock.acquire(blocking=False):
            return False
        try:
            if replica.info is not None and replica.endpoint is not None:
                replica.endpoint.get_json("/v1/models", timeout=_PROBE_TIMEOUT)
            replica.open()
            return True
        except BackendError as error:
            replica.mark_down(error, self.retry_seconds)
            return False
        finally:
            replica.lock.release()

    def _pick(self, affinity_key: str | None, tried: set[str]) -> _Replica | None:
        """The first replica of the key's order that is up and not tried yet, else any untried one."""
        untried = [replica for replica in self._order(affinity_key) if replica.api_url not in tried]
        for replica in untried:
            if self._usable(replica):
                return replica
        return untried[0] if untried else None

    def server_for(self, affinity_key: str | None) -> ServerInfo:
        """The server that requests with ``affinity_key`` go to now."""
        replica = self._pick(affinity_key, set())
        assert replica is not None  # a backend has at least one replica
        self._ready(replica)
        assert replica.info is not None
        return replica.info

    def _ready(self, replica: _Replica) -> ChatClient:
        """The replica's chat client, discovering it first if it never answered."""
        if replica.chat is None:
            try:
                replica.open()
            except ServerUnreachable as error:
                replica.mark_down(error, self.retry_seconds)
                raise
        assert replica.chat is not None
        return replica.chat

    def _failed(self, replica: _Replica, error: ServerUnreachable) -> None:
        if len(self._replicas) > 1:
            replica.mark_down(error, self.retry_seconds)

    def delivery(self, request: ChatRequest, **hooks: Unpack[DeliveryHooks]) -> Plan[Sent]:
        """The plan that sends ``request`` with the retry policy, failing over between replicas.

        Carried out by :func:`~longctx.drivers.run` or :func:`~longctx.drivers.arun`
        (:meth:`complete` and :meth:`acomplete` do that); raises the last error.
        See :class:`DeliveryHooks` for what hears of its progress.
        """
        on_first_token, on_admitted = hooks.get("on_first_token"), hooks.get("on_admitted")
        stamped = replace(request, request_id=request.request_id or uuid.uuid4().hex)
        failovers = [0]

        def attempt() -> Plan[tuple[Completion, _Replica]]:
            tried: set[str] = set()
            while True:
                # Picking may probe a replica that was down: a blocking step then.
                if all(replica.up for replica in self._replicas.values()):
                    replica = self._pick(stamped.affinity_key, tried)
                else:
                    replica = yield Io(partial(self._pick, stamped.affinity_key, tried))
                if replica is None:
                    raise ServerUnreachable("no replica answered", url=", ".join(tried))
                tried.add(replica.api_url)
                try:
                    chat = replica.chat or (yield Io(partial(self._ready, replica)))
                    outgoing = self._with_body_affinity(stamped, replica)
                    completion = yield chat.sending(outgoing, on_first_token, on_admitted)
                except ServerUnreachable as error:
                    self._failed(replica, error)
                    if len(tried) == len(self._replicas):
                        raise
                    failovers[0] += 1
                    continue
                return completion, replica

        outcome = yield from retried(attempt, self.retry, on_retry=hooks.get("on_retry"))
        completion, replica = outcome.value
        assert replica.info is not None
        return Sent(completion, outcome.attempts + failovers[0], replica.info, stamped.request_id or "")

    def _with_body_affinity(self, request: ChatRequest, replica: _Replica) -> ChatRequest:
        """``request`` with the body fields that carry its affinity key on ``replica`` (prompt_cache_key).

        By default only a server that is not an engine gets one (a hosted
        API or a gateway that routes on it): the engines do not route.
        """
        if request.body_affinity or not request.affinity_key:
            return request
        fields = self._body_fields
        if fields is None:
            generic = replica.info is not None and replica.info.engine == "generic"
            fields = (AFFINITY_BODY_FIELD,) if generic else ()
        return replace(request, body_affinity=fields) if fields else request

    def complete(self, request: ChatRequest, **hooks: Unpack[DeliveryHooks]) -> Sent:
        """:meth:`delivery` carried out in this thread (the same keywords)."""
        return run(self.delivery(request, **hooks))

    async def acomplete(self, request: ChatRequest, **hooks: Unpack[DeliveryHooks]) -> Sent:
        """:meth:`delivery` carried out on the running event loop (the same keywords)."""
        return await arun(self.delivery(request, **hooks))

    def tokenizer(self, affinity_key: str | None = None) -> ServerTokenizer:
        """The server's own tokenizer (exact counts for this model), on the key's replica."""
        replica = self._pick(affinity_key, set())
        assert replica is not None
        self._ready(replica)
        assert replica.info is not None and replica.endpoint is not None
        if replica.info.engine == "generic":
            raise ConfigError("only vLLM and SGLang servers offer a tokenize endpoint")
        return ServerTokenizer(replica.endpoint, replica.info.engine, replica.info.model)

    def counters(self, urls: Iterable[str] | None = None) -> dict[str, CacheCounters | None]:
        """The prefix-cache hit counter of each replica up now (None where it has none).

        ``urls`` limits the reading to those replicas (the one that serves a
        call): a reading is one ``/metrics`` request per replica. A URL that
        is a router (:meth:`router`) is read through the workers it lists,
        each directly, their counters summed (its own ``/metrics`` would be
        one worker's, not always the same one); None when they cannot all be
        read, and :meth:`counter_note` says why.
        """
        wanted = set(self._replicas) if urls is None else set(urls)
        readings: dict[str, CacheCounters | None] = {}
        for url, replica in self._replicas.items():
            if url in wanted and replica.up and replica.info is not None and replica.endpoint is not None:
                router = self.router(url)
                if router is not None:
                    readings[url] = self._worker_counters(replica, router)
                else:
                    readings[url] = read_counters(replica.endpoint, replica.info.engine, replica.info.model)
        return readings

    def router(self, url: str) -> RouterInfo | None:
        """The router at replica ``url`` (vllm-router, smg), or None for an engine; asked once."""
        replica = self._replicas[url]
        if not replica.router_asked and replica.endpoint is not None:
            replica.router = detect_router(replica.endpoint)
            replica.router_asked = True
        return replica.router

    def counter_note(self, url: str) -> str | None:
        """Why no counter check can be made on replica ``url`` (None when it can, or is no router)."""
        router = self.router(url) if url in self._replicas else None
        if router is None:
            return None
        if not router.workers:
            return f"{url} is {router.name}, which lists no healthy worker: its counters cannot be read"
        return self._replicas[url].counter_note

    def _worker_counters(self, replica: _Replica, router: RouterInfo) -> CacheCounters | None:
        """The sum of every listed worker's counter, read directly; None if one cannot be read."""
        assert replica.info is not None
        total: CacheCounters | None = None
        for worker in router.workers:
            endpoint = replica.workers.get(worker)
            if endpoint is None:
                endpoint = HttpEndpoint(worker, timeout=10.0, transport=replica.transport)
                replica.workers[worker] = endpoint
            reading = _any_engine_counters(endpoint, replica.info.model)
            if reading is None:
                replica.counter_note = (
                    f"{replica.api_url} is {router.name}; the counters of its worker {worker} cannot be read"
                    " from here (its /metrics does not answer, or has no prefix-cache counter)"
                )
                return None
            total = reading if total is None else total.plus(reading)
        replica.counter_note = None
        return total

    def metric_samples(self, affinity_key: str | None = None) -> list[Sample]:
        """Every ``/metrics`` sample of the replica that serves ``affinity_key`` (none where it has none)."""
        replica = self._pick(affinity_key, set())
        assert replica is not None
        self._ready(replica)
        assert replica.endpoint is not None
        try:
            return parse_metrics(replica.endpoint.get_text("/metrics"))
        except BackendError:
            return []

    def probe_cache_reporting(self) -> dict[str, bool]:
        """Send a one-token request to each replica up and see whether it reports cached tokens."""
        seen: dict[str, bool] = {}
        request = ChatRequest(messages=({"role": "user", "content": "longctx doctor probe"},), max_tokens=1)
        for url, replica in self._replicas.items():
            if not self._usable(replica) or replica.chat is None:
                continue
            completion = call_with_retry(partial(replica.chat.complete, request), self.retry).value
            seen[url] = completion.usage.cached_tokens is not None
        return seen

    def doctor(self, *, probe: bool = True, request: RequestOptions | None = None) -> Diagnosis:
        """Findings about every replica and the router in front, each with the flag that fixes it.

        With ``probe``, one one-token request per server settles whether it
        reports cached tokens (vLLM does not say otherwise). A replica that
        cannot be reached is a warning; the router policy
        (:attr:`ServerOptions.router_policy`) is checked against
        ``request``'s ``cache_salt``.
        """
        reporting = self.probe_cache_reporting() if probe else {}
        servers: list[ServerInfo] = []
        findings: list[Finding] = []
        salted = bool(request is not None and request.cache_salt)
        if self.router_policy:
            findings.extend(suggest_router_policy(self.router_policy, cache_salt=salted))
        for url, replica in self._replicas.items():
            router = self.router(url) if replica.up else None
            if router is not None:
                findings.append(detected_router_finding(router, declared=self.router_policy, salted=salted))
            info = replica.info
            if not replica.up or info is None:
                findings.append(
                    Finding(
                        "warning",
                        "replica",
                        f"{url} down",
                        "(start the replica, or drop its URL)",
                        "its packs go to the next replica meanwhile: "
                        f"{replica.last_error or 'never answered'}",
                    )
                )
                if info is None:
                    continue
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
        return Diagnosis(tuple(servers), tuple(ordered), self.replicas)

    def close(self) -> None:
        for replica in self._replicas.values():
            for worker in replica.workers.values():
                worker.close()
            if replica.chat is not None:
                replica.chat.close()
            if replica.endpoint is not None:
                replica.endpoint.close()

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _any_engine_counters(endpoint: HttpEndpoint, model: str) -> CacheCounters | None:
    """A router's worker's counter, whichever engine it is (the router's own listing may not say)."""
    try:
        return read_counters(endpoint, "vllm", model) or read_counters(endpoint, "sglang", model)
    except BackendError:
        return None


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
        kv_cache_tokens=facts.kv_cache_tokens,
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
    urls = options.base_urls()
    key = options.resolved_api_key()
    headers = options.resolved_affinity_headers()
    # With replicas, a dead URL is tried once, not retried: it is marked
    # down and tried again later, and the others serve meanwhile.
    discovery = policy if len(urls) == 1 else RetryPolicy(attempts=1)
    chosen: list[str | None] = [options.resolved_model()]

    def opener(url: str) -> Callable[[], tuple[ServerInfo, HttpEndpoint, ChatClient]]:
        def open_replica() -> tuple[ServerInfo, HttpEndpoint, ChatClient]:
            info, endpoint = _discover(url, chosen[0], key, discovery, transport)
            chosen[0] = chosen[0] or info.model
            chat = ChatClient(
                info.api_url,
                info.model,
                api_key=key,
                timeout=options.timeout,
                stall_timeout=options.stall_timeout,
                missing_cache_reason=MISSING_REPORT_FLAG[info.engine],
                engine=info.engine,
                affinity_headers=headers,
                transport=transport,
                async_transport=async_transport,
            )
            return info, endpoint, chat

        return open_replica

    replicas = [_Replica(split_base_url(url)[1], opener(url), transport) for url in urls]
    failures: list[ServerUnreachable] = []
    for replica in replicas:
        try:
            replica.open()
        except ServerUnreachable as error:
            if len(replicas) == 1:
                raise
            replica.mark_down(error, options.replica_retry_seconds)
            failures.append(error)
    if len(failures) == len(replicas):
        raise ServerUnreachable(
            "no replica answers: " + "; ".join(str(error) for error in failures), url=", ".join(urls)
        )
    return Backend(
        replicas,
        policy,
        options.replica_retry_seconds,
        router_policy=options.router_policy,
        affinity_body_fields=options.affinity_body_fields,
    )
