"""Jobs larger than the cache: many packs, many questions, each pack prefilled once.

A :class:`Job` is a list of :class:`~longctx.jobs.items.JobItem` (the paths of
one pack and a question about it), read from JSONL by
:func:`~longctx.jobs.items.read_job` or made in Python;
docs/api.md ("Jobs over many packs") says what a run gives back. It is
scheduled for the cache, not in the order given:

- every question of one pack goes out together, as siblings
  (:meth:`Session.ask_many <longctx.sessions.Session.ask_many>`), so the pack
  is prefilled once however its questions were spread through the input;
- packs are spread over the replicas by their affinity key, and no replica
  gets more packs in flight than its KV cache holds (as the server reports
  it, or :attr:`JobOptions.kv_tokens`; one at a time where unknown), so no
  pack's blocks are evicted before its last question has read them. A host
  tier adds no room: a pack it holds must come back into GPU memory to be read;
- packs are visited cheapest first (:mod:`longctx.jobs.residency`), in
  input order within each tier, and read and counted ahead on worker
  threads while the servers prefill others.

Every answer is stored in the transaction of its turn under a key made of
everything that shapes it (:mod:`longctx.jobs.keys`), so a run
after a crash or Ctrl-C asks only what has no answer yet. Each item has one
owner (:mod:`longctx.jobs.ownership`): two runs of one job at once never ask
one item twice; an item another run is asking is taken from it when stored. The job checks the
servers' own cache counters once over the whole run (per-call checks would
be blurred by the packs running beside each call).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import field, replace
from typing import Any

from longctx.backends.base import Backend
from longctx.errors import ConfigError, LongctxError
from longctx.interrupts import wait_first
from longctx.jobs.items import JobItem
from longctx.jobs.keys import NEW, AnswerFacts, StoredAnswer, decide, item_key, stored_for_job
from longctx.jobs.ownership import ItemOwnership
from longctx.jobs.residency import TIER_RANK, Residency, Sizes, Tier
from longctx.jobs.room import KvRoom
from longctx.jobs.stored import answer_request
from longctx.options.checks import not_blank
from longctx.options.fields import OptionFields, option
from longctx.options.groups import CorpusOptions, RequestOptions, ServerOptions
from longctx.process_state import PROCESS
from longctx.recordtypes import record_type
from longctx.report import CounterCheck
from longctx.schemas import json_value
from longctx.sessions.answers import Answer
from longctx.sessions.corpus_sessions import CorpusSession, RepoSession
from longctx.sessions.records import stored_data
from longctx.sessions.resources import Resources
from longctx.sessions.siblings import choose_dispatch
from longctx.store import Store, TurnRecord
from longctx.usage import Usage
from longctx.verification.canary import CanaryResult
from longctx.verification.counters import CounterSnapshot, combine_checks

__all__ = [
    "Job",
    "JobOptions",
    "JobProgress",
    "JobReport",
    "JobResult",
]

# The room one sibling takes in the KV cache beyond the shared prefix, on top
# of its answer: the question and the chat template's turn markers.
_QUESTION_ROOM_TOKENS = 256


@record_type
class JobOptions(OptionFields):
    """How a job is scheduled.

    ``kv_tokens`` is the KV cache of each server URL in tokens, for servers
    that do not report it (or to use less of it); behind a router, give what
    one replica holds and raise ``packs_in_flight`` to the replicas' count.
    ``kv_share`` is the share of it the packs in flight on one URL may
    claim (the rest is headroom for the answers and other clients).
    ``packs_in_flight`` bounds the packs in flight in all (default: two per
    server URL, so one pack's reading overlaps another's prefill).
    ``job_id`` names the job in the store; by default it is derived from the
    items, so running the same file again resumes it. ``fresh`` asks every
    item again, whatever is stored (the new answers are reused from then on). ``host_kv_tokens`` is
    the host tier of each server URL in tokens, where the server does not
    say (vLLM gives its size in GiB: ``longctx plan --host-memory`` turns it
    into tokens); it orders the packs, it never adds room in flight.
    ``lease_seconds`` is how long an item stays this run's after its last
    renewal (renewed every third of it while the run lives): a run killed
    on another host holds its items that long (on this host, none).
    """

    kv_tokens: int | None = option(None, value_type="int", minimum=1)
    host_kv_tokens: int | None = option(None, value_type="int", minimum=0)
    kv_share: float = option(0.9, value_type="float", minimum=0, minimum_open=True, maximum=1)
    packs_in_flight: int | None = option(None, value_type="int", minimum=1)
    job_id: str | None = option(None, value_type="str", check=not_blank)
    fresh: bool = option(False, value_type="bool")
    lease_seconds: float = option(60.0, value_type="float", minimum=0, minimum_open=True)

    def __post_init__(self) -> None:
        self._check_fields()


@record_type
class JobResult:
    """What became of one item: its answer (or the error that stopped it) and where it is stored.

    ``resumed`` marks an answer stored by an earlier run of the same job
    under the same facts (not asked again: see
    :mod:`longctx.jobs.keys`); ``asked_because`` says why an item
    was asked in this run (``"new"``: nothing was stored for it; else what
    changed since its stored answer, or that the run was fresh; None for a
    reused answer); ``usage`` and ``replica`` are those of the request that
    answered it (in an earlier run, for a reused answer). ``asked_by``
    names the other run that asked it while this one ran (then ``resumed``).
    ``data``: the validated value of an item asked with a schema (as JSON values).
    """

    index: int
    item: JobItem
    answer: str | None
    session_id: str | None
    error: str | None = None
    resumed: bool = False
    usage: Usage | None = None
    replica: str | None = None
    asked_because: str | None = None
    asked_by: str | None = None
    data: Any = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        """One line of the results JSONL: the same keys for every answer, asked or reused (and ``error``).

        An item asked with a schema has ``data`` too (unless it failed).
        """
        data: dict[str, Any] = {
            "index": self.index,
            **self.item.to_dict(),
            "answer": self.answer,
            "session_id": self.session_id,
            "resumed": self.resumed,
            "usage": self.usage.to_dict() if self.usage is not None else None,
            "replica": self.replica,
            "asked_because": self.asked_because,
            "asked_by": self.asked_by,
        }
        if self.item.schema is not None and self.error is None:
            data["data"] = self.data
        return data | ({"error": self.error} if self.error is not None else {})


@record_type
class JobProgress:
    """Where a running job stands, for a progress bar."""

    answered: int
    total: int
    packs_done: int
    packs: int
    in_flight: int
    message: str


@record_type
class JobReport:
    """A job's results in item order, with what the servers prefilled for it."""

    job_id: str
    results: tuple[JobResult, ...]
    packs: int
    counter_check: CounterCheck | None = None
    #: The packs asked in this run by where they were likely held when the job began
    #: (``device``, ``host``, ``cold``: see :mod:`longctx.jobs.residency`).
    packs_by_tier: dict[str, int] = field(default_factory=dict)
    #: The cache canaries run on the packs (RequestOptions.canary_every), in the order they ended.
    canaries: tuple[CanaryResult, ...] = ()

    @property
    def diverged(self) -> tuple[CanaryResult, ...]:
        """The canaries whose cached answer diverged from the cold one (the findings)."""
        return tuple(result for result in self.canaries if result.diverged)

    @property
    def failed(self) -> tuple[JobResult, ...]:
        return tuple(result for result in self.results if not result.ok)

    @property
    def resumed(self) -> int:
        return sum(result.resumed for result in self.results)

    @property
    def asked(self) -> int:
        """Items asked in this run (answered or not)."""
        return len(self.results) - self.resumed

    @property
    def asked_again(self) -> dict[str, int]:
        """Items that had a stored answer but were asked again, counted by why."""
        reasons = [r.asked_because for r in self.results if r.asked_because not in (None, NEW)]
        return {reason: reasons.count(reason) for reason in dict.fromkeys(reasons) if reason}

    @property
    def prompt_tokens(self) -> int:
        return sum((result.usage.prompt_tokens or 0) for result in self.results if result.usage is not None)

    @property
    def cached_tokens(self) -> int:
        return sum((result.usage.cached_tokens or 0) for result in self.results if result.usage is not None)

    @property
    def prefilled_tokens(self) -> int:
        """Prompt tokens the servers computed in this run: prompt less cached."""
        return self.prompt_tokens - self.cached_tokens

    def to_jsonl(self) -> str:
        """The results, one JSON object per line, in item order."""
        return "".join(json.dumps(result.to_dict(), sort_keys=True) + "\n" for result in self.results)

    def summary_line(self) -> str:
        answered = len(self.results) - len(self.failed)
        parts = [
            f"job {self.job_id}: {answered} of {len(self.results)} answered over {self.packs} packs",
            f"{self.resumed} from an earlier run",
        ]
        elsewhere = sum(result.asked_by is not None for result in self.results)
        if elsewhere:
            parts[-1] = f"{self.resumed - elsewhere} from an earlier run, {elsewhere} asked by another run"
        again = self.asked_again
        if again:
            why = ", ".join(f"{count} because {reason}" for reason, count in again.items())
            parts.append(f"{sum(again.values())} asked again ({why})")
        if self.prompt_tokens:
            share = self.cached_tokens / self.prompt_tokens
            parts.append(
                f"{self.prefilled_tokens:,} tokens prefilled of {self.prompt_tokens:,} ({share:.1%} cached)"
            )
        check = self.counter_check
        if check is not None and check.matches is not None:
            parts.append("server counters agree" if check.matches else check.note)
        if check is not None and (check.host_tokens or check.external_tokens):
            below = f"{check.host_tokens or 0:,} cached tokens came from host memory"
            parts.append(
                below + (f", {check.external_tokens:,} from storage" if check.external_tokens else "")
            )
        device, host = self.packs_by_tier.get("device", 0), self.packs_by_tier.get("host", 0)
        if device or host:
            parts.append(
                f"{device + host} packs revisited first ({device} likely on a GPU, {host} on a host tier)"
            )
        if self.canaries:
            bad = len(self.diverged)
            parts.append(
                f"cache canary DIVERGED on {bad} of {len(self.canaries)} runs"
                if bad
                else f"cache canary agreed on {len(self.canaries)} runs"
            )
        return "; ".join(parts)


@record_type(frozen=False)
class _Pack:
    """The items of one pack, and its session once read."""

    key: tuple[str, ...]
    indices: list[int]
    session: CorpusSession | None = None
    replica: str = ""
    claim: int = 0
    prefix_tokens: int = 0
    tier: Tier = "cold"
    # The items to ask (those without an answer stored under their facts): their new key and why.
    asking: dict[int, tuple[str, str | None]] = field(default_factory=dict)
    results: dict[int, JobResult] = field(default_factory=dict)


def _checked_items(items: Iterable[JobItem]) -> tuple[JobItem, ...]:
    """``items`` as a tuple, each a :class:`JobItem` (TypeError naming the first that is not)."""
    if isinstance(items, (str, bytes, JobItem)) or not isinstance(items, Iterable):
        raise TypeError(f"Job() takes an iterable of JobItem, not {type(items).__name__}")
    checked = tuple(items)
    for index, item in enumerate(checked):
        if not isinstance(item, JobItem):
            hint = " (JobItem.from_dict reads one)" if isinstance(item, dict) else ""
            raise TypeError(f"Job() item {index} is a {type(item).__name__}, not a JobItem{hint}")
    if not checked:
        raise ConfigError("a job needs at least one item")
    return checked


def _check_arguments(**given: Any) -> None:
    """TypeError naming the first of ``given`` that is neither None nor of its type."""
    wanted: dict[str, type] = {
        "backend": Backend,
        "server": ServerOptions,
        "store": Store,
        "corpus": CorpusOptions,
        "request": RequestOptions,
        "options": JobOptions,
    }
    for name, value in given.items():
        if value is not None and not isinstance(value, wanted[name]):
            kind = wanted[name].__name__
            raise TypeError(f"Job({name}=...) takes a {kind}, not {type(value).__name__} ({value!r:.60})")


class Job:
    """Many (paths, question) items answered pack by pack, resumably: see the module docstring.

    Takes the keywords of a corpus session (``backend`` or ``server``,
    ``store``, ``corpus``, ``request``) and ``options``
    (:class:`JobOptions`); ``on_progress`` hears a :class:`JobProgress` as
    packs start and answers arrive, ``on_result`` each item's final
    :class:`JobResult` as soon as it is known (an answer reused, stored or
    failed; from worker threads, one call at a time), so a caller can write
    results as they come. Constructing a job reads nothing and contacts no
    server; :meth:`run` does the work. Its arguments are checked here: an
    argument of the wrong type (an item that is not a :class:`JobItem`,
    ``request={...}``) is a TypeError naming it, no item a
    :class:`~longctx.errors.ConfigError`.
    """

    def __init__(
        self,
        items: Iterable[JobItem],
        *,
        backend: Backend | None = None,
        server: ServerOptions | None = None,
        store: Store | None = None,
        corpus: CorpusOptions | None = None,
        request: RequestOptions | None = None,
        options: JobOptions | None = None,
        on_progress: Callable[[JobProgress], None] | None = None,
        on_result: Callable[[JobResult], None] | None = None,
    ) -> None:
        self.items = _checked_items(items)
        _check_arguments(
            backend=backend, server=server, store=store, corpus=corpus, request=request, options=options
        )
        for name, hook in (("on_progress", on_progress), ("on_result", on_result)):
            if hook is not None and not callable(hook):
                raise TypeError(f"Job({name}=...) takes a function, not {type(hook).__name__}")
        self.options = options or JobOptions()
        self.corpus_options = corpus or CorpusOptions()
        # Each call's own counter check would be blurred by the packs beside it: the job checks
        # once over the whole run, unless asked not to check at all.
        given = request or RequestOptions()
        self._check_counters = given.counter_check
        self.request = replace(given, counter_check=False, warm_start=False)
        self._resources = Resources(
            server=server,
            backend=backend,
            store=store,
            closed_message="this job has run and closed what it used: make a new Job to run its items again",
        )
        self._on_progress = on_progress
        self._on_result = on_result
        self._lock = threading.Lock()
        self._result_lock = threading.Lock()
        # The answers earlier runs stored, by item (read once when the run starts).
        self._stored: dict[int, list[StoredAnswer]] = {}
        # What the progress reports: answers stored, packs finished, of how many, and in flight now.
        self._answered = 0
        self._packs_done = 0
        self._packs_total = 0
        self._in_flight = 0
        self._canaries: list[CanaryResult] = []
        # The run's one counter window (empty when it checks nothing).
        self._window = CounterSnapshot()
        # The leases of the run's items (made when it starts).
        self._owners: ItemOwnership | None = None

    @property
    def id(self) -> str:
        """The job's name in the store: :attr:`JobOptions.job_id`, else a hash of its items."""
        if self.options.job_id:
            return self.options.job_id
        canonical = json.dumps([[list(item.pack_key), item.question] for item in self.items])
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def answered(self) -> int:
        """Items with an answer so far in the current (or last) run: reused or asked and stored."""
        return self._answered

    def stored_answers(self, store: Store) -> dict[int, TurnRecord]:
        """The latest answer ``store`` holds for each item of this job, under whatever facts it was asked."""
        return {
            index: answers[-1].turn
            for index, answers in stored_for_job(store, self.id).items()
            if index < len(self.items)
        }

    def run(self) -> JobReport:
        """Answer every item not answered by an earlier run under the same facts; results in item order.

        Every pack is read (to know its content's fingerprint: token counts
        are cached, so an unchanged pack costs little); an item whose
        answer was stored under the same facts is reused, the others are
        asked (see :mod:`longctx.jobs.keys`). An item whose pack
        cannot be made (a missing path, a pack over the window) or whose
        request fails after its retries gets a result with ``error``; the
        others go on. KeyboardInterrupt stops sending new packs and is
        raised again at once, whichever thread the signal landed on (see
        :mod:`longctx.interrupts`); a pack in flight ends when the backend
        closes, and everything answered by then is stored. A job runs once:
        it closes what it opened, and a second ``run`` raises
        :class:`~longctx.errors.SessionClosed`.
        """
        try:
            return self._run()
        finally:
            if self._owners is not None:
                self._owners.close()
            self._resources.close()

    def _run(self) -> JobReport:
        store, backend = self._resources.store, self._resources.backend
        packs = self._packs()
        self._stored = stored_for_job(store, self.id)
        # A fresh run takes another run's answer only if it was made after this run began.
        since = time.time() if self.options.fresh else 0.0
        self._owners = ItemOwnership(store, self.options.lease_seconds, answered_since=since)
        self._answered, self._packs_done, self._packs_total = 0, 0, len(packs)
        earlier = sum(len(answers) for answers in self._stored.values())
        self._tell(f"reading {len(packs)} packs ({earlier} answers stored by earlier runs)")
        # As for one call: nothing to check behind a router (its /metrics is some replica's),
        # nor with canaries sampled: their requests would count in the job's one window.
        checking = self._check_counters and not backend.router_policy and not self.request.canary_every
        with CounterSnapshot.take_all(backend) if checking else CounterSnapshot() as snapshot:
            self._window = snapshot
            self._schedule(packs, backend)
            self._take_from_others(packs, backend)
            results = {index: result for pack in packs for index, result in pack.results.items()}
            served = [result.session_id for result in results.values() if result.usage is not None]
            records = store.sessions.requests(session_ids=[sid for sid in served if sid]) if served else []
            settling = snapshot.close("", None, records)
            checks = settling.wait()
        check = combine_checks(checks or [], notes=settling.notes) if checking and served else None
        ordered = tuple(results[index] for index in range(len(self.items)))
        # The packs asked in this run (not every answer reused), by tier.
        by_tier: dict[str, int] = dict(Counter(pack.tier for pack in packs if pack.asking))
        return JobReport(self.id, ordered, len(packs), check, by_tier, tuple(self._canaries))

    def _packs(self) -> list[_Pack]:
        by_key: dict[tuple[str, ...], _Pack] = {}
        for index, item in enumerate(self.items):
            by_key.setdefault(item.pack_key, _Pack(item.pack_key, [])).indices.append(index)
        return list(by_key.values())

    # -- scheduling -------------------------------------------------------------

    def _schedule(self, pending: list[_Pack], backend: Backend) -> None:
        urls = [replica.api_url for replica in backend.replicas]
        limit = self.options.packs_in_flight or 2 * len(urls)
        sizes = self._sizes(backend, urls)
        room = KvRoom({url: gpu for url, (gpu, _) in sizes.items()}, self.options.kv_share, limit)
        waiting = self._cheapest_first(pending, sizes)  # packs not read yet
        ready: list[_Pack] = []  # read and counted, waiting for room on their replica
        reading: dict[Future[_Pack], _Pack] = {}
        asking: dict[Future[None], _Pack] = {}
        # Reading runs ahead of the asking by at most ``limit`` packs: enough
        # to keep every replica fed, few enough to bound the packs in memory.
        pool = ThreadPoolExecutor(max_workers=2 * limit, thread_name_prefix="longctx-job")
        try:
            while waiting or ready or reading or asking:
                while waiting and len(ready) + len(reading) < limit:
                    pack = waiting.pop(0)
                    reading[pool.submit(self._read, pack)] = pack
                # As they are read, but a pack whose replica is full waits while
                # packs for other replicas go ahead of it, and no pack goes ahead
                # of one of a cheaper tier still being read (its blocks would be
                # evicted by this one's prefill).
                cheapest = min((TIER_RANK[pack.tier] for pack in reading.values()), default=len(TIER_RANK))
                for pack in sorted(ready, key=lambda pack: TIER_RANK[pack.tier]):
                    if TIER_RANK[pack.tier] <= cheapest and room.fits(pack.replica, pack.claim):
                        ready.remove(pack)
                        room.take(pack.replica, pack.claim)
                        asking[pool.submit(self._ask, pack)] = pack
                        self._in_flight = room.in_flight
                        self._tell(f"asking {_name(pack)} on {pack.replica}")
                running: list[Future[Any]] = [*reading, *asking]
                if not running:
                    continue
                done = wait_first(running)  # in ticks: a Ctrl-C on a worker thread is seen
                for future in done:
                    if future in reading:
                        del reading[future]
                        pack = future.result()
                        if pack.session is not None:
                            ready.append(pack)
                        else:
                            self._finished(pack)  # failed, or every answer reused
                    else:
                        pack = asking.pop(future)
                        room.give_back(pack.replica, pack.claim)
                        self._in_flight = room.in_flight
                        future.result()
                        self._finished(pack)
        except BaseException:
            # Ctrl-C or a bug: nothing new starts; what is in flight ends
            # when its owner closes the backend (every answer so far is stored).
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()

    def _cheapest_first(self, pending: list[_Pack], sizes: Sizes) -> list[_Pack]:
        """``pending`` with the packs likely on a GPU first, then those on a host tier, then the rest."""
        for pack in pending:
            pack.tier = PROCESS.get(Residency).where(pack.key, sizes).tier
        ordered = sorted(pending, key=lambda pack: TIER_RANK[pack.tier])  # stable: input order within
        counts = {tier: sum(pack.tier == tier for pack in ordered) for tier in TIER_RANK}
        if counts["device"] or counts["host"]:
            self._tell(
                f"revisits first: {counts['device']} packs likely on a GPU, {counts['host']} on a host tier, "
                f"{counts['cold']} to prefill"
            )
        return ordered

    def _sizes(self, backend: Backend, urls: Sequence[str]) -> Sizes:
        """Each URL's KV cache and host tier in tokens: the options', else what its server reports."""
        sizes: Sizes = {}
        for url in urls:
            info = next((server for server in backend.servers if server.api_url == url), None)
            gpu, host = self.options.kv_tokens, self.options.host_kv_tokens
            if info is not None:
                gpu = gpu or info.kv_cache_tokens
                if host is None and info.host_tier is not None:
                    host = info.host_tier.size_tokens
            sizes[url] = (gpu, host)
        return sizes

    def _read(self, pack: _Pack) -> _Pack:
        """Read and count the pack, reuse what is stored under its facts, and plan the rest (on a worker)."""
        backend, store = self._resources.backend, self._resources.store
        session = RepoSession(
            list(self.items[pack.indices[0]].paths),
            backend=backend,
            store=store,
            corpus=self.corpus_options,
            request=self.request,
            title=f"job {self.id}: {_name(pack)}",
        )
        try:
            full = session.full_pack
            server = backend.server_for(session.affinity_key)
            facts = AnswerFacts.of(
                full.fingerprint, server, [r.api_url for r in backend.replicas], self.request
            )
            for index in pack.indices:
                item_facts = facts.with_schema(self.items[index].answer_schema)
                decision = decide(
                    store,
                    item_facts,
                    self._stored.get(index, []),
                    fresh=self.options.fresh,
                    question=self.items[index].question,
                )
                if decision.reuse is not None:
                    self._settle(pack, _reused(store, index, self.items[index], decision.reuse.turn))
                else:
                    pack.asking[index] = (item_key(self.id, index, item_facts), decision.reason)
            self._claim(pack)
        except LongctxError as error:
            session.close()
            for index in pack.indices:
                if index not in pack.results:
                    self._settle(
                        pack, JobResult(index, self.items[index], None, None, error=error.describe())
                    )
            return pack
        if not pack.asking:
            session.close()
            return pack
        pack.replica = server.api_url
        # As many siblings in flight as ask_many will send to this server.
        siblings = min(len(pack.asking), choose_dispatch(server, self.request).concurrency)
        pack.prefix_tokens = full.total_tokens or 0
        pack.claim = pack.prefix_tokens + siblings * (self.request.max_tokens + _QUESTION_ROOM_TOKENS)
        pack.session = session
        return pack

    def _ask(self, pack: _Pack) -> None:
        """Ask the pack's unanswered questions as siblings; each answer is stored under its item's key."""
        session, owners = pack.session, self._owners
        assert session is not None and owners is not None
        indices = list(pack.asking)
        # Answers come back as they finish: the first item still waiting with that question is its.
        waiting: dict[str, deque[int]] = {}
        for index in indices:
            waiting.setdefault(self.items[index].question, deque()).append(index)

        def answered(answer: Answer) -> None:
            with self._lock:
                index = waiting[answer.question].popleft()
            owners.release([_lease_of(pack.asking[index][0])])
            self._settle(
                pack,
                JobResult(
                    index,
                    self.items[index],
                    answer.text,
                    answer.session_id,
                    usage=answer.usage,
                    replica=pack.replica,
                    asked_because=pack.asking[index][1],
                    data=json_value(answer.data),
                ),
            )
            self._tell(f"{_name(pack)}: answered {answer.question[:60]!r}")

        # A replica back since the run began is not in its window yet: the pack's hits count there.
        self._window.follow(pack.replica)
        try:
            with session:
                for group in _by_schema(self.items, indices):  # one batch of siblings per schema
                    questions = [self.items[index].question for index in group]
                    keys = [pack.asking[index][0] for index in group]
                    schema = self.items[group[0]].answer_schema
                    session.ask_many(questions, keys=keys, on_answer=answered, schema=schema)
                with self._lock:
                    self._canaries.extend(session.canaries.results)
        except LongctxError as error:
            # The answered ones are stored under their keys; the rest carry the error.
            for index in indices:
                if index not in pack.results:
                    because = pack.asking[index][1]
                    self._settle(
                        pack,
                        JobResult(
                            index,
                            self.items[index],
                            None,
                            None,
                            error=error.describe(),
                            replica=pack.replica,
                            asked_because=because,
                        ),
                    )
        finally:
            # The items that failed are free for another run (the answered ones were given back).
            owners.release([_lease_of(key) for key, _ in pack.asking.values()])
        # The server may have read the pack before a failure too: it is the most recent either way.
        PROCESS.get(Residency).touch(pack.replica, pack.key, pack.prefix_tokens)

    # -- one owner per item -------------------------------------------------------

    def _claim(self, pack: _Pack) -> None:
        """Take the leases of the pack's items to ask; leave out those another run asks or has answered."""
        owners = self._owners
        assert owners is not None
        leases = {index: _lease_of(key) for index, (key, _) in pack.asking.items()}
        for index, claimed in owners.claim(leases).items():
            turn = owners.answer_of(leases[index]) if claimed.state == "answered" else None
            if claimed.state == "held" and claimed.holder is not None:
                del pack.asking[index]
                self._tell(
                    f"item {index} is being asked by {claimed.holder.describe()}: waiting for its answer"
                )
            elif turn is not None:
                del pack.asking[index]
                self._settle(
                    pack,
                    JobResult(
                        index,
                        self.items[index],
                        turn.answer,
                        turn.session_id,
                        resumed=True,
                        asked_by="another run",
                        data=stored_data(turn),
                    ),
                )

    def _take_from_others(self, packs: list[_Pack], backend: Backend) -> None:
        """Wait for the items other runs were asking: take their answers, or ask those they left."""
        owners = self._owners
        assert owners is not None
        pack_of = {index: pack for pack in packs for index in pack.indices}
        while owners.deferred:
            self._tell(f"waiting for {len(owners.deferred)} items another run is asking")
            polled = owners.poll(min(1.0, owners.seconds / 3))
            for index, (turn, holder) in polled.answered.items():
                self._settle(
                    pack_of[index],
                    JobResult(
                        index,
                        self.items[index],
                        turn.answer,
                        turn.session_id,
                        resumed=True,
                        asked_by=holder.describe(),
                        data=stored_data(turn),
                    ),
                )
            again: dict[tuple[str, ...], _Pack] = {}
            for item in polled.taken_over:
                key = pack_of[item.index].key
                again.setdefault(key, _Pack(key, [])).indices.append(item.index)
            if again:
                self._tell(f"asking {len(polled.taken_over)} items another run left unanswered")
                self._packs_total += len(again)
                self._schedule(list(again.values()), backend)
                for retried in again.values():
                    pack_of[retried.indices[0]].results.update(retried.results)

    def _settle(self, pack: _Pack, result: JobResult) -> None:
        """Item ``result.index`` is done: keep its result and tell ``on_result``."""
        pack.results[result.index] = result
        if result.ok:
            with self._lock:
                self._answered += 1
        if self._on_result is not None:
            with self._result_lock:
                self._on_result(result)

    def _finished(self, pack: _Pack) -> None:
        self._packs_done += 1
        failed = sum(not result.ok for result in pack.results.values())
        self._tell(f"{_name(pack)}: {f'{failed} failed' if failed else 'done'}")

    def _tell(self, message: str) -> None:
        if self._on_progress is None:
            return
        with self._lock:
            progress = JobProgress(
                self._answered, len(self.items), self._packs_done, self._packs_total, self._in_flight, message
            )
        self._on_progress(progress)


def _by_schema(items: Sequence[JobItem], indices: Sequence[int]) -> list[list[int]]:
    """``indices`` grouped by their items' schema (the plain ones first), each group in input order."""
    groups: dict[str, list[int]] = {}
    for index in indices:
        shape = items[index].answer_schema
        groups.setdefault("" if shape is None else shape.digest, []).append(index)
    return [groups[digest] for digest in sorted(groups)]


def _reused(store: Store, index: int, item: JobItem, turn: TurnRecord) -> JobResult:
    """The result of an item answered by an earlier run: its answer, and what that request cost and where."""
    request = answer_request(store, turn.session_id)
    return JobResult(
        index,
        item,
        turn.answer,
        turn.session_id,
        resumed=True,
        usage=request.usage if request is not None else None,
        replica=request.base_url if request is not None else None,
        data=stored_data(turn),
    )


def _lease_of(answer_key: str) -> str:
    """The lease key of an item's answer key: the key without its nonce (:func:`keys.item_lease_key`)."""
    return answer_key.rsplit(":", 1)[0]


def _name(pack: _Pack) -> str:
    names = [os.path.basename(path.rstrip(os.sep)) or path for path in pack.key]
    return "+".join(names)
