"""A connection to one model on one or several servers: :func:`connect` and :class:`Backend`.

``connect`` asks the server what it is (vLLM, SGLang or another
OpenAI-compatible server), which model it serves, its context length, and
whether prefix caching and cached-token reporting are on;
:func:`longctx.serving.doctor.diagnose` turns that into findings with the
exact launch flag to add. Several base URLs are replicas of one model: see
:class:`Backend` for how a pack's requests stay on one and fail over.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from longctx.backends.chat import ChatClient, ChatRequest, Completion
from longctx.backends.continuation import Continuations
from longctx.backends.engines import GENERIC, identify, profiles
from longctx.backends.http import HttpEndpoint, connection_refused, split_base_url, timed_out
from longctx.backends.images import ImageCounter
from longctx.backends.metrics import Sample, parse_metrics
from longctx.backends.prefill_wait import PrefillRate
from longctx.backends.profiles import CacheCounters, EngineProfile
from longctx.backends.routers import RouterInfo, detect_router
from longctx.backends.tiers import HostTier
from longctx.backends.tokenizer import ServerTokenizer
from longctx.drivers import Io, Plan, arun, run
from longctx.errors import BackendError, ConfigError, ServerUnreachable
from longctx.options.groups import AFFINITY_BODY_FIELD, ServerOptions
from longctx.recordtypes import record_type
from longctx.retry import OnRetry, RetryPolicy, call_with_retry, is_retryable, retried

if TYPE_CHECKING:
    from longctx.backends.httpx2_bridge import AsyncTransport, Transport

__all__ = ["Backend", "DeliveryHooks", "ReplicaStatus", "Sent", "ServerInfo", "connect"]


@record_type
class ServerInfo:
    """What one server said about itself. ``None`` means unknown, not false.

    ``profile`` is what longctx knows of its engine; ``engine`` its name.
    """

    api_url: str
    root_url: str
    profile: EngineProfile = field(repr=False)
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
    #: The tier below GPU memory (host memory, disk), as the server's settings say; None: none seen.
    host_tier: HostTier | None = None
    #: ``root`` of the model's ``/v1/models`` entry (vLLM: the folder or hub name it loaded).
    model_root: str | None = None

    @property
    def engine(self) -> str:
        return self.profile.name

    @property
    def checkpoint(self) -> str | None:
        """Where the server loaded its model from (a folder or a hub name), as it says; None: unsaid."""
        setting = self.profile.checkpoint_setting
        where = self.settings.get(setting) if setting is not None else self.model_root
        return where if isinstance(where, str) and where else None

    def to_dict(self) -> dict[str, Any]:
        """The facts as JSON values (the engine by name; the raw settings left out)."""
        facts = {key: value for key, value in self.__dict__.items() if key not in ("profile", "settings")}
        if self.host_tier is not None:
            facts["host_tier"] = asdict(self.host_tier)
        return {"engine": self.engine, **facts}


@record_type
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
    ``on_away``: the request is about to go to replica ``url``, not the first
    of its key's order (that one is down, or failed it); it may block (a
    counter window opened there before the request is sent).
    """

    on_retry: OnRetry
    on_first_token: Callable[[], None]
    on_admitted: Callable[[], None]
    on_away: Callable[[str], None]


@record_type
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
        """Every field but ``info`` (the server's facts have their own ``to_dict``)."""
        return {key: value for key, value in vars(self).items() if key != "info"}


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
        self.images: ImageCounter | None = None  # its image counts, once asked

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
        if self.down_since is None:
            self.down_since = time.time()
        self.last_error = str(error)
        self.retry_at = time.monotonic() + retry_seconds

    def status(self) -> ReplicaStatus:
        return ReplicaStatus(self.api_url, self.up, self.info, self.down_since, self.last_error)


def rendezvous_order(key: str, urls: Sequence[str]) -> list[str]:
    """``urls`` ordered by highest random weight for ``key`` (stable when a URL is added or removed)."""
    return sorted(urls, key=lambda url: hashlib.sha256(f"{url}\0{key}".encode()).digest(), reverse=True)


def _dropped_midway(error: ServerUnreachable) -> BackendError:
    """The error of a streamed answer cut off after its first piece: not retried (no retry takes it back)."""
    return BackendError(
        f"the answer's stream broke after its first piece went out, so it is not retried: {error}",
        url=error.url,
        request_id=error.request_id,
        server_request_id=error.server_request_id,
    )


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
        up_first = sorted(self._replicas.values(), key=lambda replica: not replica.up)
        known = [replica.info for replica in up_first if replica.info is not None]
        if known:
            return known[0]
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
        info = self._serving(affinity_key).info
        assert info is not None
        return info

    def _serving(self, affinity_key: str | None) -> _Replica:
        """The replica that serves ``affinity_key`` now, discovered."""
        replica = self._pick(affinity_key, set())
        assert replica is not None  # a backend has at least one replica
        self._ready(replica)
        return replica

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

    def delivery(
        self, request: ChatRequest, *, streamed: bool = False, **hooks: Unpack[DeliveryHooks]
    ) -> Plan[Sent]:
        """The plan that sends ``request`` with the retry policy, failing over between replicas.

        Carried out by :func:`~longctx.drivers.run` or :func:`~longctx.drivers.arun`
        (:meth:`complete` and :meth:`acomplete` do that); raises the last error.
        See :class:`DeliveryHooks` for what hears of its progress. ``streamed``:
        its request step hands out the answer's text as it comes (carried out
        by :func:`~longctx.drivers.stream`); once a piece of an answer went
        out, a stream that drops is not retried (the text handed out cannot be
        taken back): it raises a :class:`~longctx.errors.BackendError`.
        """
        on_admitted, on_away = hooks.get("on_admitted"), hooks.get("on_away")
        stamped = replace(request, request_id=request.request_id or uuid.uuid4().hex)
        home = self._order(stamped.affinity_key)[0].api_url if on_away and len(self._replicas) > 1 else None
        failovers = 0
        answering = False  # a token of this attempt arrived (and, streamed, may have been handed out)

        def on_first_token() -> None:
            nonlocal answering
            answering = True
            if (heard := hooks.get("on_first_token")) is not None:
                heard()

        def attempt() -> Plan[tuple[Completion, _Replica]]:
            nonlocal answering, failovers
            tried: set[str] = set()
            while True:
                # Picking may probe a replica that was down: a blocking step then.
                if all(replica.up for replica in self._replicas.values()):
                    replica = self._pick(stamped.affinity_key, tried)
                else:
                    replica = yield Io(partial(self._pick, stamped.affinity_key, tried))
                if replica is None:
                    raise ServerUnreachable(
                        "no replica answered", url=", ".join(tried), request_id=stamped.request_id
                    )
                tried.add(replica.api_url)
                try:
                    chat = replica.chat or (yield Io(partial(self._ready, replica)))
                    if on_away is not None and home is not None and replica.api_url != home:
                        yield Io(partial(on_away, replica.api_url))
                    outgoing = self._with_body_affinity(stamped, replica)
                    answering = False
                    completion = yield chat.sending(outgoing, on_first_token, on_admitted, streamed=streamed)
                except ServerUnreachable as error:
                    if streamed and answering:
                        raise _dropped_midway(error) from error
                    if len(self._replicas) > 1:
                        replica.mark_down(error, self.retry_seconds)
                    if len(tried) == len(self._replicas):
                        raise
                    failovers += 1
                    continue
                return completion, replica

        outcome = yield from retried(attempt, self.retry, on_retry=hooks.get("on_retry"))
        completion, replica = outcome.value
        assert replica.info is not None
        reason = stamped.text_reason
        form = "ids" if stamped.prompt_ids is not None else reason and f"text: {reason}"
        # A request sent in a session (longctx.backends.continuation) says so in its own form.
        form = completion.usage.prompt_form or form
        if form:
            completion = replace(completion, usage=replace(completion.usage, prompt_form=form))
        return Sent(completion, outcome.attempts + failovers, replica.info, stamped.request_id or "")

    def _with_body_affinity(self, request: ChatRequest, replica: _Replica) -> ChatRequest:
        """``request`` with the body fields that carry its affinity key on ``replica`` (prompt_cache_key).

        By default only a server that is not an engine gets one (a hosted
        API or a gateway that routes on it): the engines do not route.
        """
        if request.body_affinity or not request.affinity_key:
            return request
        fields = self._body_fields
        if fields is None:
            generic = replica.info is not None and replica.info.profile is GENERIC
            fields = (AFFINITY_BODY_FIELD,) if generic else ()
        return replace(request, body_affinity=fields) if fields else request

    def complete(self, request: ChatRequest, **hooks: Unpack[DeliveryHooks]) -> Sent:
        """:meth:`delivery` carried out in this thread (the same keywords)."""
        return run(self.delivery(request, **hooks))

    async def acomplete(self, request: ChatRequest, **hooks: Unpack[DeliveryHooks]) -> Sent:
        """:meth:`delivery` carried out on the running event loop (the same keywords)."""
        return await arun(self.delivery(request, **hooks))

    def expect_prefill_rate(self, url: str, rate: PrefillRate) -> None:
        """A prefill rate known for the replica at ``url`` (measured there before), until one is measured.

        It bounds how long a cold request there may wait for its first token
        (:mod:`longctx.backends.prefill_wait`); an unknown or undiscovered URL is ignored.
        """
        replica = self._replicas.get(url)
        if replica is not None and replica.chat is not None:
            replica.chat.prefill.rates.give(rate)

    def continue_in_sessions(self, enabled: bool = True) -> list[str]:
        """Send id prompts that continue an earlier one in a server session, without the shared ids.

        Only where the engine has such sessions (SGLang; see
        :mod:`longctx.backends.continuation`); the URLs of the replicas it is
        now on for (undiscovered replicas are left as they are).
        """
        found = []
        for replica in self._replicas.values():
            chat = replica.chat
            if chat is None or replica.info is None or not replica.info.profile.session_api:
                continue
            if enabled and chat.continuations is None:
                chat.continuations = Continuations()
            elif not enabled and chat.continuations is not None:
                chat.close_sessions()
                chat.continuations = None
            if enabled:
                found.append(replica.api_url)
        return found

    def prefill_rate(self, url: str) -> PrefillRate | None:
        """The prefill rate that bounds a cold request's wait at ``url`` now; None: none known."""
        replica = self._replicas.get(url)
        return None if replica is None or replica.chat is None else replica.chat.prefill.rates.current

    def tokenizer(self, affinity_key: str | None = None) -> ServerTokenizer:
        """The server's own tokenizer (exact counts for this model), on the key's replica."""
        replica = self._serving(affinity_key)
        info, endpoint = replica.info, replica.endpoint
        assert info is not None and endpoint is not None
        if not info.profile.tokenizes:
            labels = " and ".join(profile.label for profile in profiles() if profile.tokenizes)
            raise ConfigError(f"only {labels} servers offer a tokenize endpoint")
        return ServerTokenizer(endpoint, info.profile, info.model)

    def image_counter(self, affinity_key: str | None = None) -> ImageCounter:
        """The image questions to the key's replica (:mod:`longctx.backends.images`), its counts cached."""
        replica = self._serving(affinity_key)
        info, endpoint = replica.info, replica.endpoint
        assert info is not None and endpoint is not None
        with replica.lock:
            if replica.images is None or replica.images.endpoint is not endpoint:
                replica.images = ImageCounter(endpoint, info.profile, info.model)
            return replica.images

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
                    info = replica.info
                    readings[url] = info.profile.read_counters(replica.endpoint, info.model, info.version)
        return readings

    def started_at(self, affinity_key: str | None = None) -> float | None:
        """When the server that serves ``affinity_key`` started (unix seconds, its own clock), or None.

        Read from its ``/metrics``: ``process_start_time_seconds``, the
        standard Prometheus process collector that vLLM exports (SGLang with
        ``--enable-metrics``). None where the server does not say, cannot be
        reached, or sits behind a declared router (whose ``/metrics`` is not
        the worker's). Nothing is computed: one small GET.
        """
        if self.router_policy:
            return None
        replica = self._pick(affinity_key, set())
        if replica is None or not replica.up or replica.endpoint is None:
            return None
        try:
            samples = parse_metrics(replica.endpoint.get_text("/metrics", timeout=_PROBE_TIMEOUT))
        except BackendError:
            return None
        starts = [sample.value for sample in samples if sample.name == "process_start_time_seconds"]
        return max(starts) if starts else None

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
        endpoint = self._serving(affinity_key).endpoint
        assert endpoint is not None
        try:
            return parse_metrics(endpoint.get_text("/metrics"))
        except BackendError:
            return []

    def probe_cache_reporting(self) -> dict[str, bool]:
        """Send a one-token request to each replica up and see whether it reports cached tokens.

        What is learnt becomes each replica's ``ServerInfo.cache_reporting``
        (vLLM does not say it otherwise).
        """
        seen: dict[str, bool] = {}
        request = ChatRequest(messages=({"role": "user", "content": "longctx doctor probe"},), max_tokens=1)
        for url, replica in self._replicas.items():
            if not self._usable(replica) or replica.chat is None or replica.info is None:
                continue
            completion = call_with_retry(partial(replica.chat.complete, request), self.retry).value
            seen[url] = completion.usage.cached_tokens is not None
            replica.info = replace(replica.info, cache_reporting=seen[url])
        return seen

    def close(self) -> None:
        """Close the connections; idempotent. An async client's are left to :meth:`aclose`."""
        for replica in self._replicas.values():
            for worker in replica.workers.values():
                worker.close()
            if replica.chat is not None:
                replica.chat.close()
            if replica.endpoint is not None:
                replica.endpoint.close()

    async def aclose(self) -> None:
        """:meth:`close`, and the async clients' connections too, on the running event loop.

        Those connections belong to the loop that opened them (``aask``,
        ``aask_many``), so only a coroutine can close them; ``close`` alone
        leaves them open until the garbage collector finds them.
        """
        for replica in self._replicas.values():
            if replica.chat is not None:
                await replica.chat.aclose()
        self.close()

    @property
    def is_closed(self) -> bool:
        """True once every replica's chat clients are closed, the async ones too (:meth:`aclose`)."""
        return all(replica.chat is None or replica.chat.is_closed for replica in self._replicas.values())

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _any_engine_counters(endpoint: HttpEndpoint, model: str) -> CacheCounters | None:
    """A router's worker's counter, whichever engine it is (the router's own listing may not say)."""
    for profile in profiles():
        try:
            reading = profile.read_counters(endpoint, model, None)
        except BackendError:
            return None
        if reading is not None:
            return reading
    return None


# The longest one discovery request waits for its answer (a server's facts are small and quick).
_DISCOVERY_TIMEOUT = 60.0


def _first_contact(endpoint: HttpEndpoint, retry: RetryPolicy, options: ServerOptions) -> Any:
    """The server's model listing, asked within ``options.timeout`` in all, retries included.

    A connection refused (nothing listens) fails at once: retrying it only
    delays the one line that says so. So does a server that accepted the
    connection and said nothing within the bound (a listing is small: a
    silent server is hung, and asking again would multiply the wait the
    user was told). What is retried is what a starting server answers
    (a 503, a dropped connection), never past ``options.timeout``.
    """
    deadline = time.monotonic() + options.timeout

    def listing() -> Any:
        left = deadline - time.monotonic()
        return endpoint.get_json("/v1/models", timeout=max(0.05, min(endpoint.timeout, left)))

    try:
        return listing()
    except BackendError as error:
        hopeless = connection_refused(error) or timed_out(error) or not is_retryable(error)
        if hopeless or retry.attempts == 1 or time.monotonic() >= deadline:
            raise
    left = max(0.05, deadline - time.monotonic())
    rest = replace(retry, attempts=retry.attempts - 1, total_seconds=min(retry.total_seconds, left))
    return call_with_retry(listing, rest).value


def _discover(
    base_url: str,
    options: ServerOptions,  # resolved: reads no setting
    model: str | None,
    retry: RetryPolicy,
    transport: Transport | None,
) -> tuple[ServerInfo, HttpEndpoint]:
    endpoint = HttpEndpoint(
        base_url,
        api_key=options.api_key,
        transport=transport,
        timeout=min(_DISCOVERY_TIMEOUT, options.stall_timeout, options.timeout),
    )
    listing = _first_contact(endpoint, retry, options)
    entries = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(entries, list) or not entries:
        raise BackendError(f"{endpoint.api_url}/models lists no models", url=endpoint.api_url)
    chosen = next((entry for entry in entries if model is None or entry.get("id") == model), None)
    if chosen is None:
        names = ", ".join(str(entry.get("id")) for entry in entries)
        raise ConfigError(f"the server at {endpoint.api_url} does not serve {model!r}; it serves {names}")
    name = str(chosen["id"])
    profile = identify(endpoint, chosen.get("owned_by"))
    facts = profile.facts(endpoint, name)
    context = chosen.get("max_model_len")
    if not context and profile.context_setting:
        context = facts.settings.get(profile.context_setting)
    info = ServerInfo(
        api_url=endpoint.api_url,
        root_url=endpoint.root_url,
        profile=profile,
        model=name,
        context_length=int(context) if isinstance(context, int) else None,
        model_root=root if isinstance(root := chosen.get("root"), str) else None,
        **vars(facts),  # EngineFacts' fields are ServerInfo's, by name
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

    ``server`` is a :class:`~longctx.options.groups.ServerOptions`, or just the
    URL(s) (``connect("http://host:8000/v1")``); what it leaves unset falls
    back to the settings (``LONGCTX_BASE_URL``, ``LONGCTX_MODEL``,
    ``LONGCTX_API_KEY``, ...), read once here (:meth:`ServerOptions.resolved`;
    options it resolved already are taken as they are).
    ``transport`` and ``async_transport`` replace the network in tests.
    The caller owns the backend and closes it. Raises
    :class:`ServerUnreachable` when no server answers and
    :class:`ConfigError` when the model is not served.
    """
    given = server if isinstance(server, ServerOptions) else ServerOptions(base_url=server)
    options = given.resolved()  # the settings read once, here, where the backend is made
    # The user's bound on a request holds for its retries too.
    policy = retry or RetryPolicy(total_seconds=min(RetryPolicy.total_seconds, options.timeout))
    urls = options.base_urls()
    # With replicas, a dead URL is tried once, not retried: it is marked
    # down and tried again later, and the others serve meanwhile.
    discovery = policy if len(urls) == 1 else RetryPolicy(attempts=1)
    # The model asked for, else the first replica's: every later replica must serve the same one.
    model = options.model

    def open_replica(url: str) -> tuple[ServerInfo, HttpEndpoint, ChatClient]:
        nonlocal model
        info, endpoint = _discover(url, options, model, discovery, transport)
        model = model or info.model
        chat = ChatClient(
            info.api_url,
            info.model,
            api_key=options.api_key,
            timeout=options.timeout,
            stall_timeout=options.stall_timeout,
            profile=info.profile,
            affinity_headers=options.resolved_affinity_headers(),
            transport=transport,
            async_transport=async_transport,
            tier_details=info.host_tier is not None,
        )
        return info, endpoint, chat

    replicas = [_Replica(split_base_url(url)[1], partial(open_replica, url), transport) for url in urls]
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
