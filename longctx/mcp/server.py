"""The MCP server: longctx as tools a coding agent calls over stdio (the one module importing the mcp SDK).

Tools (each result is a short structured object; an answer is the model's text):

- ``ask``: a question about a repository, folder or documents. One session
  per source (the resolved paths), kept for the server's lifetime: the
  agent's next question about the same source is the next turn of that
  session, so the pack and every earlier turn are read from the server's
  prefix cache. ``new_conversation`` starts again from the pack (still
  cached) when the history has grown too long. The answer streams where the
  protocol allows: a client that sends a progress token gets progress
  notifications whose ``message`` is the answer's text so far (``progress``:
  its characters so far), at most every :data:`PROGRESS_SECONDS`; the tool's
  result is the same either way.
- ``ask_many``: sibling questions from the current point of that session,
  sent together so they share the cached prefix.
- ``show_pack``: what was packed: documents with their tokens (largest
  first), skipped paths with their reasons, the pack's tokens and the
  server's budget.
- ``savings``: the savings report of one source, or of every source asked
  about so far.

Reach: a tool reads only inside the server's roots (:mod:`longctx.mcp.roots`):
the client's declared roots (``roots/list``, listed again after
``notifications/roots/list_changed``), else the ``--root`` folders, else the
folder it was started in. A path outside, through ``..`` or a symbolic link
too, is a tool error naming the rule, raised before anything is read.

Errors: a :class:`~longctx.errors.LongctxError` becomes a tool error (the
result has ``isError`` set, as the MCP specification asks for errors of a
tool's execution) whose text is the error's class and message, the path
first when the error carries one; never a traceback. Anything else is a bug:
the SDK logs its traceback on stderr and the client sees only that the tool
failed.

Configuration: :class:`~longctx.options.groups.ServerOptions`,
:class:`~longctx.options.groups.RequestOptions` and
:class:`~longctx.options.groups.CorpusOptions` given to :func:`serve` (the
``longctx mcp`` flags), the server's URL, model and key otherwise from
``LONGCTX_*`` variables when the first session connects.

Concurrency: the SDK runs each tool call in a worker thread. The table of
sessions is guarded by one lock; each session serialises its own turns
(its turn lock), so concurrent calls about one source queue up while
calls about different sources run at once. Nothing is read or contacted
until a tool needs it; :meth:`Toolbox.close` closes every session and the
store.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from functools import partial
from typing import Any

import anyio.from_thread
import anyio.to_thread
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPDeprecationWarning

from longctx.errors import ContextOverflow, InvalidAnswer, LongctxError
from longctx.mcp.roots import AllowedRoots, resolved_path
from longctx.options.groups import CorpusOptions, RequestOptions, ServerOptions
from longctx.recordtypes import record_type
from longctx.report import SavingsReport
from longctx.schemas import json_value
from longctx.sessions import RepoSession, Session
from longctx.sessions.corpus_sessions import server_budget
from longctx.store import Store

__all__ = [
    "AskManyResult",
    "AskResult",
    "ClientRoots",
    "DocumentTokens",
    "PackInfo",
    "SavingsResult",
    "SiblingAnswer",
    "SkippedPath",
    "SourceSavings",
    "Toolbox",
    "build_server",
    "serve",
]

SERVER_NAME = "longctx"
#: The shortest time between two progress notifications of a streamed answer (each carries the
#: whole text so far, so one per token would send the answer's square).
PROGRESS_SECONDS = 0.25
INSTRUCTIONS = (
    "Questions about a code repository, a folder or documents (PDFs, notebooks, text), answered by the "
    "long-context model this server talks to. Pass absolute paths. Ask follow-ups about the same path: "
    "they continue one conversation whose pack and history the model server keeps cached. Use ask_many "
    "for several independent questions at once, show_pack to see what was packed, savings for what the "
    "cache saved."
)


@record_type
class AskResult:
    """One answered question and what it cost (``turn`` numbered from 1, as the CLI numbers turns).

    ``cached_tokens`` of ``prompt_tokens`` were read from the server's prefix
    cache (None: the server did not say, ``cached_reason`` says why);
    ``pack_tokens`` is the size of the pack every request of the source
    starts with. ``data``: the validated JSON value of an answer asked with a
    ``schema`` (None without one).
    """

    answer: str
    session_id: str
    turn: int
    finish_reason: str | None
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    pack_tokens: int | None
    cached_reason: str | None
    summary: str
    data: Any = None


@record_type
class SiblingAnswer:
    """One answer of ``ask_many``."""

    question: str
    answer: str
    prompt_tokens: int | None
    cached_tokens: int | None


@record_type
class AskManyResult:
    """The answers of ``ask_many`` in question order, and the batch's totals."""

    answers: list[SiblingAnswer]
    prompt_tokens: int
    cached_tokens: int | None
    pack_tokens: int | None
    summary: str


@record_type
class DocumentTokens:
    """A packed document and its tokens (None when they were not counted)."""

    path: str
    tokens: int | None


@record_type
class SkippedPath:
    """A path left out of the pack, and why (binary, too-large, secret, ignored...)."""

    path: str
    reason: str


@record_type
class PackInfo:
    """What a source's pack holds, and whether it fits the server's window.

    ``documents`` and ``skipped`` list at most ``limit`` entries each
    (documents largest first); ``document_count`` and ``skipped_count``
    count them all, ``skipped_by_reason`` groups every skipped path.
    ``prompt_budget`` is the window less the room kept for the answer and
    the questions (None when the server does not say its window).
    """

    paths: list[str]
    fingerprint: str
    document_count: int
    documents: list[DocumentTokens]
    skipped_count: int
    skipped_by_reason: dict[str, int]
    skipped: list[SkippedPath]
    pack_tokens: int | None
    estimated: bool
    tokenizer: str | None
    context_length: int | None
    prompt_budget: int | None
    fits: bool | None


@record_type
class SourceSavings:
    """The savings of one source: every request of its conversations and their siblings."""

    paths: list[str]
    session_ids: list[str]
    requests: int
    prompt_tokens: int
    cached_tokens: int | None
    hit_rate: float | None
    prefill_seconds_saved_estimate: float | None
    missing_reason: str | None
    server_counters_match: bool | None
    summary: str


@record_type
class SavingsResult:
    """The ``savings`` tool's answer: one entry per source, in the order they were first asked about."""

    sources: list[SourceSavings]


@record_type(frozen=False)
class _Source:
    """A source's sessions: the one that holds the pack, and the conversation now continued."""

    paths: tuple[str, ...]
    root: RepoSession
    conversation: Session
    conversations: list[Session] = field(default_factory=list)


def _given_paths(paths: str | Sequence[str]) -> list[str]:
    """The paths of a tool call, as the agent wrote them."""
    given = [paths] if isinstance(paths, str) else list(paths)
    if not given:
        raise ToolError("ConfigError: no path given")
    return given


def _source_key(paths: str | Sequence[str]) -> tuple[str, ...]:
    """The absolute, resolved paths of a tool call: the same source however the agent spells it."""
    return tuple(resolved_path(path) for path in _given_paths(paths))


def _tool_error(error: LongctxError) -> ToolError:
    """The MCP tool error for ``error``: its class and message, the path first when it carries one."""
    message = str(error)
    path = getattr(error, "path", None)
    if path is not None and str(path) not in message:
        message = f"{path}: {message}"
    if isinstance(error, ContextOverflow):
        message += " (ask again with new_conversation=true to start over from the pack, which stays cached)"
    if isinstance(error, InvalidAnswer):
        message += f" (the answer as it came: {error.text[:2000]!r})"
    return ToolError(f"{type(error).__name__}: {message}")


class Toolbox:
    """The tools, without the protocol: what each MCP tool call runs (in a worker thread).

    Sessions are made on a source's first call and kept until :meth:`close`;
    they share one store (``store``, else the default one, opened on first
    use) and each connects to ``server`` on its first question. Every path
    is checked against ``roots`` (default: the folder the process runs in)
    before anything is read or opened.
    """

    def __init__(
        self,
        *,
        server: ServerOptions | None = None,
        request: RequestOptions | None = None,
        corpus: CorpusOptions | None = None,
        store: Store | None = None,
        roots: AllowedRoots | None = None,
    ) -> None:
        self.server = server or ServerOptions()
        self.roots = roots or AllowedRoots()
        self.request = request or RequestOptions()
        self.corpus = corpus or CorpusOptions()
        self._store = store
        self._owns_store = store is None
        self._sources: dict[tuple[str, ...], _Source] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _store_open(self) -> Store:
        with self._lock:
            if self._store is None:
                self._store = Store.open()
            return self._store

    def _source(self, paths: str | Sequence[str]) -> _Source:
        """The source's sessions, its pack prepared; a source whose pack cannot be made is not kept.

        A path outside the roots is refused here, before the store is opened or a file read.
        """
        key = self.roots.check(_given_paths(paths))
        store = self._store_open()
        with self._lock:
            if self._closed:
                raise ToolError("ConfigError: the longctx MCP server is shutting down")
            source = self._sources.get(key)
            if source is None:
                root = RepoSession(
                    list(key), server=self.server, store=store, corpus=self.corpus, request=self.request
                )
                source = _Source(key, root, root, [root])
                self._sources[key] = source
        try:
            # Outside the table's lock: packing a large repository must not hold up other sources.
            source.root.full_pack  # noqa: B018
        except BaseException:
            with self._lock:
                if self._sources.get(key) is source:
                    del self._sources[key]
            source.root.close()
            raise
        return source

    def ask(
        self,
        paths: str | Sequence[str],
        question: str,
        *,
        max_tokens: int | None = None,
        new_conversation: bool = False,
        schema: Mapping[str, Any] | str | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> AskResult:
        """Ask ``question`` as the next turn of the source's conversation (or of a new one from the pack).

        ``schema`` (a JSON Schema object or a concise spec: :mod:`longctx.schemas`) types the answer.
        ``on_text`` hears the answer's text so far as it streams (the whole text each time).
        """
        try:
            source = self._source(paths)
            conversation = self._conversation(source, new=new_conversation)
            if on_text is None:
                answer = conversation.ask(question, max_tokens=max_tokens, schema=schema)
            else:
                with conversation.stream(question, max_tokens=max_tokens, schema=schema) as answer_stream:
                    for _ in answer_stream:
                        on_text(answer_stream.text)
                answer = answer_stream.answer
        except LongctxError as error:
            raise _tool_error(error) from None
        usage = answer.usage
        return AskResult(
            answer=answer.text,
            session_id=answer.session_id,
            turn=answer.turn + 1,  # numbered from 1, as the CLI, the chat and the report number turns
            finish_reason=answer.finish_reason,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
            pack_tokens=source.root.full_pack.total_tokens,
            cached_reason=usage.cached_reason,
            summary=usage.summary_line(),
            data=json_value(answer.data),
        )

    def _conversation(self, source: _Source, *, new: bool) -> Session:
        with self._lock:
            if new:
                # A session of its own over the same pack (not a fork), so the
                # source's savings are the sum of its conversations' reports.
                root = source.root
                fresh = Session(
                    root.backend,
                    root.pack,
                    store=root.store,
                    request=root.request,
                    title=f"{root.title} (conversation {len(source.conversations) + 1})",
                )
                source.conversations.append(fresh)
                source.conversation = fresh
            return source.conversation

    def ask_many(
        self, paths: str | Sequence[str], questions: Sequence[str], *, max_tokens: int | None = None
    ) -> AskManyResult:
        """Ask sibling ``questions`` from the current point of the source's conversation, together."""
        try:
            source = self._source(paths)
            batch = self._conversation(source, new=False).ask_many(list(questions), max_tokens=max_tokens)
        except LongctxError as error:
            raise _tool_error(error) from None
        answers = [
            SiblingAnswer(a.question, a.text, a.usage.prompt_tokens, a.usage.cached_tokens)
            for a in batch.answers
        ]
        report = batch.report
        return AskManyResult(
            answers=answers,
            prompt_tokens=report.prompt_tokens,
            cached_tokens=report.cached_tokens,
            pack_tokens=source.root.full_pack.total_tokens,
            summary=report.summary_line(),
        )

    def show_pack(self, paths: str | Sequence[str], *, limit: int = 50) -> PackInfo:
        """What the source's pack holds (``limit`` entries per list) and how it fits the server's window."""
        try:
            source = self._source(paths)
            pack = source.root.full_pack
            manifest = source.root.corpus.manifest
            backend = source.root.backend
            budget = server_budget(backend, source.root.request)
        except LongctxError as error:
            raise _tool_error(error) from None
        documents = sorted(pack.documents, key=lambda section: -(section.tokens or 0))
        skipped = manifest.skipped
        total = pack.total_tokens
        return PackInfo(
            paths=list(source.paths),
            fingerprint=pack.fingerprint,
            document_count=len(pack.documents),
            documents=[
                DocumentTokens(section.path or section.name, section.tokens) for section in documents[:limit]
            ],
            skipped_count=len(skipped),
            skipped_by_reason=manifest.skipped_by_reason(),
            skipped=[SkippedPath(entry.path, str(entry.reason)) for entry in skipped[:limit]],
            pack_tokens=total,
            estimated=pack.estimated,
            tokenizer=pack.tokenizer,
            context_length=backend.info.context_length,
            prompt_budget=budget.prompt_budget if budget else None,
            fits=None if budget is None or total is None else total <= budget.prompt_budget,
        )

    def savings(self, paths: str | Sequence[str] | None = None) -> SavingsResult:
        """The savings of the source of ``paths``, or of every source asked about so far."""
        with self._lock:
            if paths is None:
                sources = list(self._sources.values())
            else:
                source = self._sources.get(_source_key(paths))
                if source is None:
                    raise ToolError("InputError: nothing was asked about these paths yet")
                sources = [source]
        try:
            return SavingsResult([self._source_savings(source) for source in sources])
        except LongctxError as error:
            raise _tool_error(error) from None

    def _source_savings(self, source: _Source) -> SourceSavings:
        with self._lock:
            conversations = list(source.conversations)
        reports: list[SavingsReport] = [conversation.report() for conversation in conversations]
        requests = sum(len(report.requests) for report in reports)
        prompt_tokens = sum(report.prompt_tokens for report in reports)
        known = [report.cached_tokens for report in reports if report.cached_tokens is not None]
        cached = sum(known) if known else None
        saved = [
            report.prefill_seconds_saved for report in reports if report.prefill_seconds_saved is not None
        ]
        checks = [report.counter_check.matches for report in reports if report.counter_check is not None]
        missing = next((report.missing_reason for report in reports if report.missing_reason), None)
        hit_rate = cached / prompt_tokens if cached is not None and prompt_tokens else None
        if cached is None:
            summary = (
                f"{requests} requests, {prompt_tokens:,} prompt tokens; cached tokens unknown: {missing}"
            )
        else:
            share = f"{hit_rate or 0:.1%}"
            summary = f"{requests} requests, {cached:,} of {prompt_tokens:,} prompt tokens cached ({share})"
        return SourceSavings(
            paths=list(source.paths),
            session_ids=[conversation.id for conversation in conversations],
            requests=requests,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            hit_rate=hit_rate,
            prefill_seconds_saved_estimate=sum(saved) if saved else None,
            missing_reason=missing,
            server_counters_match=all(checks) if checks else None,
            summary=summary,
        )

    def close(self) -> None:
        """Close every session, then the store if this toolbox opened it; idempotent."""
        with self._lock:
            self._closed = True
            sources, self._sources = list(self._sources.values()), {}
        for source in sources:
            for conversation in reversed(source.conversations):
                conversation.close()
        with self._lock:
            if self._owns_store and self._store is not None:
                self._store.close()
                self._store = None


class ClientRoots:
    """Keeps ``roots`` in step with the client's declared roots (a server middleware).

    Before a tool call, when the roots are not known to be current, it asks
    the client (``roots/list``): at the first call, after each
    ``notifications/roots/list_changed``, and at every call of a client
    that declares roots but not that it announces their changes. A client
    that declares no roots leaves the server's own (``--root``, else the
    folder it was started in); one whose listing fails has every path
    refused until a listing succeeds.
    """

    def __init__(self, roots: AllowedRoots) -> None:
        self.roots = roots
        self._changes = 0  # notifications seen
        self._listed: int | None = None  # the count of changes the roots in force were listed after

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method == "notifications/roots/list_changed":
            self._changes += 1
        elif ctx.method == "tools/call" and self._listed != self._changes:
            await self._list(ctx)
        return await call_next(ctx)

    async def _list(self, context: ServerRequestContext[Any, Any]) -> None:
        changes = self._changes
        capabilities = context.session.client_capabilities
        declared = capabilities.roots if capabilities is not None else None
        if declared is None:
            self.roots.use_client_roots(None)
            self._listed = changes
            return
        with warnings.catch_warnings():
            # The SDK marks roots deprecated for a protocol revision clients do not speak yet.
            warnings.simplefilter("ignore", MCPDeprecationWarning)
            listing = context.session.list_roots()
        try:
            result = await listing
        except Exception as error:  # noqa: BLE001 - any failure of the client's answer refuses every path
            self.roots.client_roots_failed(f"{type(error).__name__}: {error}")
            return
        self.roots.use_client_roots([str(root.uri) for root in result.roots])
        # A client that does not announce changes is asked again at every call.
        self._listed = changes if declared.list_changed else None


class _ProgressText:
    """Sends a streamed answer's text so far as MCP progress, from the tool's worker thread, throttled."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._sent_at = 0.0

    def __call__(self, text: str) -> None:
        now = time.monotonic()
        if now - self._sent_at < PROGRESS_SECONDS:
            return
        self._sent_at = now
        anyio.from_thread.run(partial(self._ctx.report_progress, len(text), None, text))


def build_server(toolbox: Toolbox) -> MCPServer[Any]:
    """An MCP server whose tools call ``toolbox``, its roots following the client's (:class:`ClientRoots`)."""
    server: MCPServer[Any] = MCPServer(
        SERVER_NAME, instructions=INSTRUCTIONS, log_level="WARNING", middleware=[ClientRoots(toolbox.roots)]
    )

    @server.tool()
    async def ask(
        path: str | list[str],
        question: str,
        ctx: Context,
        *,  # the SDK passes every argument by name
        max_tokens: int | None = None,
        new_conversation: bool = False,
        schema: dict[str, Any] | str | None = None,
    ) -> AskResult:
        """Ask a question about a repository, folder or documents (absolute paths; one path or several).

        Follow-up questions about the same path continue the conversation, reading the pack and the
        earlier turns from the model server's cache. new_conversation=true starts over from the pack.
        schema (a JSON Schema object, or a spec such as "name, age int, bio: their biography") makes
        the answer JSON that satisfies it, returned parsed in data.
        With a progress token, the answer's text so far comes in progress notifications.
        """
        streamed = ctx.request_context.meta is not None and ctx.request_context.meta.get("progress_token")
        on_text = _ProgressText(ctx) if streamed else None
        return await anyio.to_thread.run_sync(
            partial(
                toolbox.ask,
                path,
                question,
                max_tokens=max_tokens,
                new_conversation=new_conversation,
                schema=schema,
                on_text=on_text,
            )
        )

    @server.tool()
    def ask_many(path: str | list[str], questions: list[str], max_tokens: int | None = None) -> AskManyResult:
        """Ask several independent questions about the same path at once; they share the cached pack."""
        return toolbox.ask_many(path, questions, max_tokens=max_tokens)

    @server.tool()
    def show_pack(path: str | list[str], limit: int = 50) -> PackInfo:
        """Show what was packed for a path: documents and tokens (largest first), skipped paths and why,
        the pack's tokens and the server's budget."""
        return toolbox.show_pack(path, limit=limit)

    @server.tool()
    def savings(path: str | list[str] | None = None) -> SavingsResult:
        """What the prefix cache saved: for one path, or for every path asked about so far."""
        return toolbox.savings(path)

    return server


def serve(
    *,
    server: ServerOptions | None = None,
    request: RequestOptions | None = None,
    corpus: CorpusOptions | None = None,
    roots: Sequence[str | os.PathLike[str]] = (),
) -> None:
    """Run the MCP server over stdio until the client closes it, then close every session.

    It reads only inside the client's roots, else ``roots``, else the
    folder it was started in (see :mod:`longctx.mcp.roots`).
    """
    toolbox = Toolbox(server=server, request=request, corpus=corpus, roots=AllowedRoots(roots))
    try:
        build_server(toolbox).run("stdio")
    finally:
        toolbox.close()
