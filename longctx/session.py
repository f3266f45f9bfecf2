"""Sessions: conversations over a pack whose prefix the server keeps cached.

A :class:`Session` holds an append-only history. Each request is the pack's
system header, the pack's prefix with the first question, then the turns in
order, so every request starts with every byte of the one before it and the
server prefills only what is new.

- :meth:`Session.ask` adds a turn, committed to the store in one
  transaction once the answer arrived (a crash loses no completed turn and
  leaves no half turn).
- :meth:`Session.ask_many` fans sibling questions out from the current
  point. The first sibling goes alone; the moment its first token arrives
  the server holds the whole shared prefix, and the others follow with
  bounded concurrency, so each of them reads the prefix from the cache
  whatever the engine's scheduler does with simultaneous arrivals. Each
  sibling becomes a branch session.
- :meth:`Session.fork` branches explicitly at any turn.

Assistant turns are kept the way the chat template renders them in later
requests: reasoning (``<think>...</think>``, or the server's separate
reasoning field) is dropped, as reasoning models' templates (Qwen3,
DeepSeek-R1, Kimi K2-Thinking) drop it from earlier turns. The history a
session sends is then byte-for-byte what the server renders next time.

Every request of a pack carries one affinity key derived from the pack's
fingerprint (``x-session-id`` header and ``user`` field), so cache-aware
routers keep the pack on one replica.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from longctx.backends.base import Backend, Sent, connect
from longctx.backends.chat import ChatRequest
from longctx.corpus import Corpus, load_corpus
from longctx.counters import CounterSnapshot, combine_checks
from longctx.errors import ConfigError, LongctxError, StoreError
from longctx.pack import Budget, Pack, ShardedPack, build_pack, build_shards
from longctx.config import CorpusOptions
from longctx.store import (
    RequestRecord,
    SessionRecord,
    Store,
    StoredPack,
    TurnRecord,
)
from longctx.tokens import EstimateTokenizer, Tokenizer
from longctx.usage import Prices, SavingsReport, Usage, build_report, cold_prefill_rate

__all__ = ["Answer", "Batch", "DocSession", "RepoSession", "Session", "history_form", "pack_for_server"]

DEFAULT_MAX_TOKENS = 512
THINK_END = "</think>"


def history_form(answer: str) -> str:
    """``answer`` as a reasoning model's chat template renders it in a later turn.

    Everything up to the last ``</think>`` is dropped, then leading newlines
    (the rule of Qwen3's template, which DeepSeek-R1 and Kimi K2-Thinking
    follow in substance).
    """
    if THINK_END in answer:
        return answer.rsplit(THINK_END, maxsplit=1)[-1].lstrip("\n")
    return answer


def affinity_key(fingerprint: str | None, session_id: str) -> str:
    """The routing key of a pack's requests: the same for every session over one pack."""
    return f"longctx-{fingerprint[:32]}" if fingerprint else f"longctx-session-{session_id}"


@dataclass(frozen=True)
class Answer:
    """One answered question. ``str(answer)`` is its text."""

    question: str
    text: str
    reasoning: str | None
    finish_reason: str | None
    usage: Usage
    session_id: str
    turn: int
    request_id: str
    attempts: int

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Batch:
    """The answers of :meth:`Session.ask_many`, in question order, and their report."""

    answers: tuple[Answer, ...]
    report: SavingsReport

    def __iter__(self) -> Any:
        return iter(self.answers)

    def __len__(self) -> int:
        return len(self.answers)

    def __getitem__(self, index: int) -> Answer:
        return self.answers[index]


@dataclass
class _Settings:
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float | None = None
    seed: int | None = None
    cache_salt: str | None = None
    concurrency: int = 4
    base_urls: tuple[str, ...] = ()
    model: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        # The salt namespaces a tenant's cache; it is kept so a resumed
        # session keeps hitting its own prefix, but it is no secret of the
        # server's and no key: API keys are never stored.
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "seed": self.seed,
            "cache_salt": self.cache_salt,
            "concurrency": self.concurrency,
            "base_urls": list(self.base_urls),
            "model": self.model,
            "extra_body": self.extra_body,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> _Settings:
        return cls(
            max_tokens=int(data.get("max_tokens", DEFAULT_MAX_TOKENS)),
            temperature=data.get("temperature"),
            seed=data.get("seed"),
            cache_salt=data.get("cache_salt"),
            concurrency=int(data.get("concurrency", 4)),
            base_urls=tuple(data.get("base_urls", ())),
            model=data.get("model"),
            extra_body=dict(data.get("extra_body", {})),
        )


def _validate_salt(salt: str | None) -> None:
    if salt is None:
        return
    # vLLM's rule (1..128 characters, none of @ / \ or NUL); SGLang accepts these too.
    if not 1 <= len(salt) <= 128 or any(c in salt for c in "@/\\\0"):
        raise ConfigError("cache_salt must be 1 to 128 characters without @, /, \\ or NUL")


class Session:
    """A conversation over an optional pack, persisted in the store.

    Create one with a :class:`~longctx.backends.base.Backend` (from
    :func:`~longctx.backends.base.connect`) and a pack (a
    :class:`longctx.packing.Pack` or a :class:`longctx.store.StoredPack`);
    resume one by id with :meth:`resume`.
    """

    def __init__(
        self,
        backend: Backend | None = None,
        pack: Any | None = None,
        *,
        store: Store | None = None,
        title: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        temperature: float | None = None,
        seed: int | None = None,
        cache_salt: str | None = None,
        concurrency: int = 4,
        extra_body: Mapping[str, Any] | None = None,
        _record: SessionRecord | None = None,
    ) -> None:
        _validate_salt(cache_salt)
        if max_tokens < 1 or concurrency < 1:
            raise ConfigError("max_tokens and concurrency must be at least 1")
        self._backend = backend
        self.store = store or Store.open()
        self.pack: StoredPack | None = _stored_pack(pack) if pack is not None else None
        self._lock = threading.Lock()
        if _record is not None:
            self._record = _record
            self.settings = _Settings.from_json(_record.settings)
        else:
            backend = self._backend = backend or connect()
            self.settings = _Settings(
                max_tokens=max_tokens,
                temperature=temperature,
                seed=seed,
                cache_salt=cache_salt,
                concurrency=concurrency,
                base_urls=tuple(info.api_url for info in backend.servers),
                model=backend.info.model,
                extra_body=dict(extra_body or {}),
            )
            if self.pack is not None:
                self.store.save_pack(self.pack)
            self._record = SessionRecord(
                id=uuid.uuid4().hex[:16],
                created_at=time.time(),
                kind="session",
                title=title or (self.pack.summary.get("title", "") if self.pack else "") or "session",
                pack_fingerprint=self.pack.fingerprint if self.pack else None,
                parent_id=None,
                parent_turns=None,
                settings=self.settings.to_json(),
            )
            self.store.create_session(self._record)
        self._turns: list[TurnRecord] = self._load_history(self._record)

    @property
    def backend(self) -> Backend:
        """The connection to the server, made on first use for a resumed session."""
        if self._backend is None:
            self._backend = connect(list(self.settings.base_urls) or None, model=self.settings.model)
        return self._backend

    # -- identity and history -----------------------------------------------

    @property
    def id(self) -> str:
        return self._record.id

    @property
    def title(self) -> str:
        return self._record.title

    @property
    def turns(self) -> tuple[TurnRecord, ...]:
        """Every turn of the conversation, inherited ones first."""
        return tuple(self._turns)

    @property
    def affinity_key(self) -> str:
        if self.pack is not None:
            return affinity_key(self.pack.fingerprint, self.id)
        return affinity_key(None, self._root_id())

    def _root_id(self) -> str:
        record = self._record
        while record.parent_id is not None:
            try:
                record = self.store.session(record.parent_id)
            except LongctxError:
                break
        return record.id

    def _load_history(self, record: SessionRecord) -> list[TurnRecord]:
        """The turns a session sees: its ancestors' up to each branch point, then its own."""
        own = self.store.turns(record.id)
        if record.parent_id is None:
            return own
        parent = self.store.session(record.parent_id)
        inherited = self._load_history(parent)[: record.parent_turns]
        return inherited + own

    @classmethod
    def resume(
        cls, session_id: str, backend: Backend | None = None, *, store: Store | None = None
    ) -> Session:
        """The stored session ``session_id`` with every committed turn.

        Without ``backend``, the session connects to the server(s) it used
        when it first needs one (reading its turns or report needs none).
        Raises :class:`SessionNotFound` for an unknown id.
        """
        store = store or Store.open()
        record = store.session(session_id)
        pack = store.pack(record.pack_fingerprint) if record.pack_fingerprint else None
        if record.pack_fingerprint and pack is None:
            raise StoreError(
                f"session {session_id} refers to pack {record.pack_fingerprint} missing from the store"
            )
        return cls(backend, pack, store=store, _record=record)

    def messages(self, question: str, *, history: Sequence[TurnRecord] | None = None) -> list[dict[str, str]]:
        """The messages of the request that would ask ``question`` now."""
        turns = self._turns if history is None else history
        messages: list[dict[str, str]] = []
        if self.pack is not None:
            messages.append({"role": "system", "content": self.pack.system})
        for index, turn in enumerate(turns):
            messages.append({"role": "user", "content": self._user_content(turn.question, first=index == 0)})
            messages.append({"role": "assistant", "content": turn.history_answer})
        messages.append({"role": "user", "content": self._user_content(question, first=not turns)})
        return messages

    def _user_content(self, question: str, *, first: bool) -> str:
        if first and self.pack is not None:
            return self.pack.prefix + question
        return question

    # -- requests -----------------------------------------------------------

    def _request(self, question: str, history: Sequence[TurnRecord], max_tokens: int | None) -> ChatRequest:
        if not question.strip():
            raise ConfigError("the question is empty")
        return ChatRequest(
            messages=tuple(self.messages(question, history=history)),
            max_tokens=max_tokens or self.settings.max_tokens,
            temperature=self.settings.temperature,
            seed=self.settings.seed,
            cache_salt=self.settings.cache_salt,
            affinity_key=self.affinity_key,
            extra_body=self.settings.extra_body,
        )

    def _records(
        self, sent: Sent, *, session_id: str, position: int, question: str, purpose: str, batch_id: str | None
    ) -> tuple[TurnRecord, RequestRecord, Answer]:
        completion = sent.completion
        usage = completion.usage
        now = time.time()
        request = RequestRecord(
            id=sent.request_id,
            session_id=session_id,
            batch_id=batch_id,
            purpose=purpose,
            started_at=now - (usage.total_seconds or 0.0),
            base_url=sent.server.api_url,
            engine=sent.server.engine,
            model=sent.server.model,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            created_cache_tokens=usage.created_cache_tokens,
            completion_tokens=usage.completion_tokens,
            ttft_seconds=usage.ttft_seconds,
            total_seconds=usage.total_seconds,
            attempts=sent.attempts,
            cached_reason=usage.cached_reason,
        )
        turn = TurnRecord(
            session_id=session_id,
            position=position,
            question=question,
            answer=completion.text,
            history_answer=history_form(completion.text),
            reasoning=completion.reasoning,
            request_id=sent.request_id,
            created_at=now,
        )
        answer = Answer(
            question=question,
            text=completion.text,
            reasoning=completion.reasoning,
            finish_reason=completion.finish_reason,
            usage=usage,
            session_id=session_id,
            turn=position,
            request_id=sent.request_id,
            attempts=sent.attempts,
        )
        return turn, request, answer

    def _own_position(self) -> int:
        """The position of the next turn among this session's own turns."""
        return len(self._turns) - (self._record.parent_turns or 0)

    def ask(self, question: str, *, max_tokens: int | None = None, purpose: str = "turn") -> Answer:
        """Ask ``question`` as the next turn; the turn is stored once the answer arrived.

        ``purpose`` labels the request in reports (``turn``; map-reduce uses ``map 2/3``).
        """
        with self._lock:
            request = self._request(question, self._turns, max_tokens)
            snapshot = CounterSnapshot.take(self.backend)
            answer, record = self._commit_turn(self.backend.complete(request), question, purpose)
            snapshot.finish(self.store, self.id, None, [record])
            return answer

    async def aask(self, question: str, *, max_tokens: int | None = None, purpose: str = "turn") -> Answer:
        """The async twin of :meth:`ask`."""
        request = self._request(question, self._turns, max_tokens)
        snapshot = await asyncio.to_thread(CounterSnapshot.take, self.backend)
        answer, record = self._commit_turn(await self.backend.acomplete(request), question, purpose)
        await asyncio.to_thread(snapshot.finish, self.store, self.id, None, [record])
        return answer

    def _commit_turn(self, sent: Sent, question: str, purpose: str) -> tuple[Answer, RequestRecord]:
        """Store the answered turn (one transaction) and add it to the history."""
        turn, record, answer = self._records(
            sent,
            session_id=self.id,
            position=self._own_position(),
            question=question,
            purpose=purpose,
            batch_id=None,
        )
        self.store.commit_turn(turn, record)
        self._turns.append(turn)
        return answer, record

    # -- siblings -----------------------------------------------------------

    def _sibling_plan(
        self, questions: Sequence[str], max_tokens: int | None
    ) -> tuple[list[ChatRequest], str]:
        if not questions:
            raise ConfigError("ask_many needs at least one question")
        history = list(self._turns)
        return [self._request(question, history, max_tokens) for question in questions], uuid.uuid4().hex[:16]

    def _commit_sibling(self, sent: Sent, question: str, batch_id: str) -> tuple[RequestRecord, Answer]:
        branch = SessionRecord(
            id=uuid.uuid4().hex[:16],
            created_at=time.time(),
            kind="sibling",
            title=question[:80],
            pack_fingerprint=self._record.pack_fingerprint,
            parent_id=self.id,
            parent_turns=len(self._turns),
            settings=self.settings.to_json(),
        )
        turn, record, answer = self._records(
            sent, session_id=branch.id, position=0, question=question, purpose="sibling", batch_id=batch_id
        )
        self.store.commit_turn(turn, record, new_session=branch)
        return record, answer

    def ask_many(
        self,
        questions: Sequence[str],
        *,
        max_tokens: int | None = None,
        concurrency: int | None = None,
        on_answer: Callable[[Answer], None] | None = None,
    ) -> Batch:
        """Ask sibling ``questions`` from the current point; each becomes a branch.

        The first question goes alone until its first token arrives (the
        shared prefix is then in the server's cache); the rest follow, at
        most ``concurrency`` at a time. Answers come back in question order;
        ``on_answer`` hears of each as it is stored (for progress). A
        question that fails after its retries raises once the others are
        done; the answered ones are stored.
        """
        requests, batch_id = self._sibling_plan(questions, max_tokens)
        limit = concurrency or self.settings.concurrency
        snapshot = CounterSnapshot.take(self.backend)
        lead_ready = threading.Event()
        results: dict[int, tuple[RequestRecord, Answer]] = {}
        failures: list[BaseException] = []

        def run(index: int) -> None:
            on_first = lead_ready.set if index == 0 else None
            try:
                sent = self.backend.complete(requests[index], on_first_token=on_first)
                results[index] = self._commit_sibling(sent, questions[index], batch_id)
                if on_answer is not None:
                    on_answer(results[index][1])
            finally:
                if index == 0:
                    # Also on failure, so the others are not held forever.
                    lead_ready.set()

        with ThreadPoolExecutor(max_workers=limit, thread_name_prefix="longctx-sibling") as pool:
            lead: Future[None] = pool.submit(run, 0)
            lead_ready.wait()
            rest = [pool.submit(run, index) for index in range(1, len(requests))]
            pending = {lead, *rest}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                failures.extend(error for future in done if (error := future.exception()) is not None)
        return self._finish_batch(batch_id, questions, results, failures, snapshot)

    async def aask_many(
        self, questions: Sequence[str], *, max_tokens: int | None = None, concurrency: int | None = None
    ) -> Batch:
        """The async twin of :meth:`ask_many`."""
        requests, batch_id = self._sibling_plan(questions, max_tokens)
        gate = asyncio.Semaphore(concurrency or self.settings.concurrency)
        snapshot = await asyncio.to_thread(CounterSnapshot.take, self.backend)
        lead_ready = asyncio.Event()
        results: dict[int, tuple[RequestRecord, Answer]] = {}

        async def run(index: int) -> None:
            async with gate:
                try:
                    sent = await self.backend.acomplete(
                        requests[index], on_first_token=lead_ready.set if index == 0 else None
                    )
                    results[index] = self._commit_sibling(sent, questions[index], batch_id)
                finally:
                    if index == 0:
                        lead_ready.set()

        lead = asyncio.ensure_future(run(0))
        await lead_ready.wait()
        outcomes = await asyncio.gather(
            lead, *(run(i) for i in range(1, len(requests))), return_exceptions=True
        )
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        return await asyncio.to_thread(self._finish_batch, batch_id, questions, results, failures, snapshot)

    def _finish_batch(
        self,
        batch_id: str,
        questions: Sequence[str],
        results: Mapping[int, tuple[RequestRecord, Answer]],
        failures: Sequence[BaseException],
        snapshot: CounterSnapshot,
    ) -> Batch:
        records = [results[i][0] for i in sorted(results)]
        check = snapshot.finish(self.store, self.id, batch_id, records)
        if failures:
            raise failures[0]
        answers = tuple(results[i][1] for i in range(len(questions)))
        report = build_report(
            records, title=f"batch of {len(questions)} sibling questions", counter_check=check
        )
        return Batch(answers, report)

    # -- branches -----------------------------------------------------------

    def fork(self, at: int | None = None, *, title: str | None = None) -> Session:
        """A new session sharing this one's first ``at`` turns (all by default)."""
        keep = len(self._turns) if at is None else at
        if not 0 <= keep <= len(self._turns):
            raise ConfigError(f"cannot fork at turn {at}: the session has {len(self._turns)} turns")
        record = SessionRecord(
            id=uuid.uuid4().hex[:16],
            created_at=time.time(),
            kind="fork",
            title=title or f"fork of {self.title}",
            pack_fingerprint=self._record.pack_fingerprint,
            parent_id=self.id,
            parent_turns=keep,
            settings=self.settings.to_json(),
        )
        self.store.create_session(record)
        return Session(self._backend, self.pack, store=self.store, _record=record)

    def branch(self, answer: Answer) -> Session:
        """The branch session an ``ask_many`` answer lives in, to continue it."""
        return Session(
            self._backend, self.pack, store=self.store, _record=self.store.session(answer.session_id)
        )

    # -- reports ------------------------------------------------------------

    def report(self, *, include_branches: bool = True, prices: Prices | None = None) -> SavingsReport:
        """Savings over every request of this session (and of its sibling branches)."""
        ids = [self.id, *(self.branch_ids() if include_branches else [])]
        records = self.store.requests(session_ids=ids)
        checks = self.store.counter_checks(ids)
        notes: list[str] = []
        fallback_rate = None
        if cold_prefill_rate(records) is None and records:
            # Every request of this session hit the cache; the rate a hit
            # saves is measured on earlier cold requests to the same model.
            servers = sorted({(r.base_url, r.model) for r in records})
            earlier = [r for url, model in servers for r in self.store.requests(base_url=url, model=model)]
            fallback_rate = cold_prefill_rate(earlier)
            if fallback_rate is not None:
                notes.append("cold prefill rate measured on earlier requests to the same server and model")
        return build_report(
            records,
            title=f"session {self.id}: {self.title}",
            counter_check=combine_checks(checks),
            prices=prices,
            notes=notes,
            cold_rate=fallback_rate,
        )

    def branch_ids(self) -> list[str]:
        """Ids of the sessions branched from this one (siblings and forks)."""
        return [child.id for child in self.store.children(self.id)]

    def close(self) -> None:
        """Close the connection to the server, if one was made (the store stays open)."""
        if self._backend is not None:
            self._backend.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Session {self.id} {self.title!r}: {len(self._turns)} turns>"


def _stored_pack(pack: Any) -> StoredPack:
    if isinstance(pack, StoredPack):
        return pack
    summary = pack.summary() if callable(getattr(pack, "summary", None)) else {}
    return StoredPack(
        fingerprint=pack.fingerprint,
        format_version=pack.format_version,
        system=pack.system,
        prefix=pack.prefix,
        summary=summary,
    )


def pack_for_server(
    corpus: Corpus,
    backend: Backend,
    *,
    store: Store,
    max_tokens: int,
    reserved_question_tokens: int = 1024,
    shard: bool = False,
) -> Pack | ShardedPack:
    """The pack of ``corpus`` counted with the server's own tokenizer and checked against its window.

    On a server without a tokenize route (or an unknown window) the
    documented estimate is used and the pack says ``estimated``. Raises
    :class:`~longctx.errors.BudgetError` when it does not fit, unless
    ``shard``: then it is split into shards that each fit.
    """
    info = backend.info
    tokenizer: Tokenizer = backend.tokenizer() if info.engine in ("vllm", "sglang") else EstimateTokenizer()
    budget = (
        Budget(
            info.context_length,
            reserved_output_tokens=max_tokens,
            reserved_question_tokens=reserved_question_tokens,
        )
        if info.context_length
        else None
    )
    if shard and budget is not None:
        return build_shards(corpus, budget=budget, tokenizer=tokenizer, store=store)
    return build_pack(corpus, tokenizer=tokenizer, store=store, budget=budget)


class _CorpusSession(Session):
    """A session over the pack of paths: loading, packing and connecting in one call."""

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        backend: Backend | None = None,
        base_url: str | Sequence[str] | None = None,
        model: str | None = None,
        api_key: str | None = None,
        store: Store | None = None,
        corpus: CorpusOptions | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        reserved_question_tokens: int = 1024,
        title: str | None = None,
        on_progress: Callable[[str], None] | None = None,
        **options: Any,
    ) -> None:
        def progress(message: str) -> None:
            if on_progress is not None:
                on_progress(message)

        store = store or Store.open()
        progress("reading files")
        self.corpus = load_corpus(
            paths,
            corpus,
            store=store,
        )
        progress(f"{len(self.corpus.manifest.included)} documents; connecting to the server")
        backend = backend or connect(base_url, model=model, api_key=api_key)
        progress(f"counting tokens with {backend.info.engine}'s tokenizer")
        packed = pack_for_server(
            self.corpus,
            backend,
            store=store,
            max_tokens=max_tokens,
            reserved_question_tokens=reserved_question_tokens,
        )
        assert isinstance(packed, Pack)
        self.full_pack = packed
        label = title or self.corpus.root or "documents"
        super().__init__(backend, packed, store=store, title=label, max_tokens=max_tokens, **options)


class RepoSession(_CorpusSession):
    """A session over a repository (or folder): ``RepoSession("repo/").ask("...")``.

    The corpus is loaded with :func:`longctx.corpus.load_corpus` (``stability``
    order in git repositories: files that change least come first, layered
    as of a recent base commit, see ``max_stale_share``), packed
    and counted with the server's own tokenizer, and checked against the
    server's window less ``max_tokens`` and ``reserved_question_tokens``.
    Raises :class:`~longctx.errors.BudgetError` naming the largest files and
    folders when it does not fit (see :class:`longctx.mapreduce.ShardedSession`).
    """


class DocSession(_CorpusSession):
    """A session over documents (PDFs, notebooks, text files, folders of them).

    ``DocSession(["report.pdf", "notes/"]).ask("...")``; otherwise as
    :class:`RepoSession`.
    """
