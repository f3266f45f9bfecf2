"""Every error longctx raises on purpose.

One tree, rooted at :class:`LongctxError`. Anything else that escapes the
library is a bug. Each error carries the context a caller needs to act on it
(a path, a status, a body, a log tail) and a message that names the problem
without repeating secrets.

    LongctxError
    ├── ConfigError            bad arguments or LONGCTX_* settings
    │   └── ServingConfigError     a model config or serving setting (.field) longctx cannot plan with
    │       ├── UnsupportedArchitecture  a config whose attention layout longctx does not know
    │       └── InsufficientMemory       the KV cache does not fit (.shortfall_bytes)
    ├── InputError             a path or document longctx cannot use
    │   ├── SourceError        a source (repo, folder, PDF) failed as a whole
    │   └── EmptyCorpus        the paths hold no document to pack (.skipped)
    ├── PackError              the pack cannot be built as asked
    │   └── BudgetError        the pack does not fit the token budget
    ├── OutputError            a result could not be saved to the user's file (.path); the file is as it was
    ├── TokenizerError         no tokenizer, or it failed
    ├── StoreError             the store (SQLite file or PostgreSQL server) failed
    │   ├── SessionNotFound    no session with that id
    │   └── LeaseLost          a job item's lease lapsed and another run took it: its answer not stored
    ├── SessionClosed          a session (or a job that has run) used after close
    ├── CanaryDiverged         a cached answer differs from a cold one (.result holds the evidence)
    ├── InvalidAnswer          an answer asked with a schema is cut, not JSON or refused (.text keeps it)
    ├── StreamIncomplete       a streamed answer read before its end, or stopped before it (.text)
    └── BackendError           talking to a server failed
        ├── ServerUnreachable  no connection, or it dropped
        ├── ServerError        the server answered with an error status (a fault)
        ├── RateLimited        the server answered 429: slow down (.retry_after)
        └── ContextOverflow    the prompt does not fit the server's window

The errors of the test harness (building and running local servers) are
:mod:`longctx.testing`'s own: :mod:`longctx.testing.errors`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict, Unpack

__all__ = [
    "BackendError",
    "BudgetError",
    "CanaryDiverged",
    "ConfigError",
    "ContextOverflow",
    "EmptyCorpus",
    "InputError",
    "InsufficientMemory",
    "InvalidAnswer",
    "LeaseLost",
    "LongctxError",
    "OutputError",
    "PackError",
    "RateLimited",
    "ServerError",
    "ServerUnreachable",
    "ServingConfigError",
    "SessionClosed",
    "SessionNotFound",
    "SourceError",
    "StoreError",
    "StreamIncomplete",
    "TokenizerError",
    "UnsupportedArchitecture",
]


class LongctxError(Exception):
    """Root of every error longctx raises on purpose.

    ``str()`` of one is the line the CLI prints after ``longctx: error:``:
    the message, led by the path it concerns (an error with a ``path``:
    :class:`InputError`, :class:`OutputError`) when the message does not
    name it. A path is a name the caller gave or a document's path in the
    corpus, never the document's text.
    """

    @property
    def message(self) -> str:
        """The message without the path ``str()`` leads it with (for a caller naming the path itself)."""
        return super().__str__()

    def __str__(self) -> str:
        message = self.message
        path = getattr(self, "path", None)
        if path is not None and str(path) not in message:
            return f"{path}: {message}"
        return message

    def describe(self) -> str:
        """The message, led by the path it concerns when it has one the message does not name: ``str()``."""
        return str(self)


class ConfigError(LongctxError):
    """An argument or a ``LONGCTX_*`` setting is invalid."""


class ServingConfigError(ConfigError):
    """A model config or a serving setting cannot be planned with.

    ``field`` names the offending config key (dotted for nested keys, e.g.
    ``linear_attn_config.num_heads``) or argument (``gpus``, ``kv_cache_dtype``).
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class UnsupportedArchitecture(ServingConfigError):
    """The config describes an attention layout longctx does not model.

    ``architecture`` is the config's ``model_type`` (or architecture name)
    when it has one.
    """

    def __init__(self, message: str, *, architecture: str | None = None, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.architecture = architecture


class InsufficientMemory(ServingConfigError):
    """The asked-for deployment cannot hold its KV cache.

    ``shortfall_bytes`` is how many bytes per GPU are missing; ``field`` names
    the input to change (``gpu_memory``, ``weights``, ``context``, ...).
    """

    def __init__(self, message: str, *, shortfall_bytes: int, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.shortfall_bytes = shortfall_bytes


class InputError(LongctxError):
    """A path or a document cannot be used; ``path`` names it when known."""

    def __init__(self, message: str, *, path: str | Path | None = None) -> None:
        super().__init__(message)
        self.path = path


class SourceError(InputError):
    """A whole source (repository, folder, PDF) could not be read."""


class EmptyCorpus(InputError):
    """The paths hold no document to pack; ``skipped`` counts the paths considered by skip reason.

    The message names what was skipped and why (the first paths of each
    reason), so the user sees why nothing was left.
    """

    def __init__(self, message: str, *, skipped: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.skipped = dict(skipped or {})


class OutputError(LongctxError):
    """A result could not be saved to the user's file, named by ``path``; the file is as it was."""

    def __init__(self, message: str, *, path: str | Path) -> None:
        super().__init__(message)
        self.path = path


class PackError(LongctxError):
    """The pack cannot be built as asked."""


class BudgetError(PackError):
    """The pack does not fit its token budget.

    ``total_tokens`` and ``budget_tokens`` are the two sides of the
    comparison; ``largest`` lists ``(path, tokens)`` of the biggest files and
    folders, the candidates to exclude.
    """

    def __init__(
        self,
        message: str,
        *,
        total_tokens: int,
        budget_tokens: int,
        largest: tuple[tuple[str, int], ...] = (),
    ) -> None:
        super().__init__(message)
        self.total_tokens = total_tokens
        self.budget_tokens = budget_tokens
        self.largest = largest


class TokenizerError(LongctxError):
    """No usable tokenizer, or the tokenizer failed."""


class StoreError(LongctxError):
    """The store (the SQLite file or the PostgreSQL server) failed or holds something unexpected."""


class LeaseLost(StoreError):
    """A job item's answer was not stored: the item's lease lapsed and another run holds it now."""


class SessionNotFound(StoreError):
    """No session with this id in the store."""

    def __init__(self, session_id: str, message: str | None = None) -> None:
        super().__init__(message or f"no session with id {session_id!r}")
        self.session_id = session_id


class SessionClosed(LongctxError):
    """A session was used after :meth:`~longctx.sessions.Conversation.close`, or a job run a second time.

    Raised by every call that would reach the server or the store (ask,
    ask_many, fork, branch, report, a canary, a warm start, ``backend``,
    ``store``), also by a fork, branch or shard whose connection and store
    were closed with the session that lent them; what it holds in memory
    (``id``, ``title``, ``turns``) can still be read. Not a
    :class:`ConfigError`: the arguments are fine, the object is spent.
    """


class CanaryDiverged(LongctxError):
    """The cache canary found a cached answer that differs from a cold one.

    ``result`` is the :class:`~longctx.verification.canary.CanaryResult`: every run's
    output and the comparison that diverged (the evidence).
    """

    def __init__(self, message: str, *, result: object) -> None:
        super().__init__(message)
        self.result = result


class InvalidAnswer(LongctxError):
    """An answer asked with a schema (:mod:`longctx.schemas`) has no valid value.

    It was cut at ``max_tokens`` (``finish_reason`` ``"length"``), is not
    JSON, or the schema or its model class refused it. ``text`` is the raw
    answer, ``finish_reason`` the server's. Such an answer is not stored as a
    turn: the history holds only answers that were what they were asked to be.
    """

    def __init__(self, message: str, *, text: str, finish_reason: str | None = None) -> None:
        super().__init__(message)
        self.text = text
        self.finish_reason = finish_reason


class StreamIncomplete(LongctxError):
    """A streamed answer's :attr:`~longctx.sessions.streams.AnswerStream.answer` read before its end.

    Either the stream is still going (iterate it to the end first), or it
    stopped before the end (closed, left, interrupted, or failed): then no
    turn was stored. ``text`` is the answer's text that arrived before.
    """

    def __init__(self, message: str, *, text: str) -> None:
        super().__init__(message)
        self.text = text


class ServerContext(TypedDict, total=False):
    """What a :class:`BackendError` knows of the exchange that failed (each key is its attribute)."""

    url: str | None
    status: int | None
    body: str | None
    retry_after: float | None
    request_id: str | None
    server_request_id: str | None


class BackendError(LongctxError):
    """Talking to an inference server failed.

    ``url`` is the endpoint, ``status`` the HTTP status when the server
    answered, ``body`` its (truncated) answer, ``retry_after`` the seconds
    the server asked to wait (``Retry-After``: a 429, a 503), when it did.
    ``request_id`` is the id longctx sent with the request (``X-Request-Id``),
    ``server_request_id`` the one the server gave it (an ``x-request-id``
    response header, a body's ``id``) when it said one; ``str()`` names both
    (the server's when it differs), so the request can be found in the
    server's log. Each is None when unknown.
    """

    def __init__(self, message: str, **context: Unpack[ServerContext]) -> None:
        super().__init__(message)
        self.url = context.get("url")
        self.status = context.get("status")
        self.body = context.get("body")
        self.retry_after = context.get("retry_after")
        self.request_id = context.get("request_id")
        self.server_request_id = context.get("server_request_id")

    def __str__(self) -> str:
        message = super().__str__()
        ids = [f"request id {self.request_id}"] if self.request_id else []
        if self.server_request_id and self.server_request_id != self.request_id:
            ids.append(f"server request id {self.server_request_id}")
        named = [part for part in ids if part.split()[-1] not in message]
        return f"{message} ({'; '.join(named)})" if named else message


class ServerUnreachable(BackendError):
    """No connection to the server, or the connection dropped or stalled."""


class ServerError(BackendError):
    """The server answered with an error status: a fault (5xx), or a request it refused (4xx).

    Not for the two answers that have their own error: a 429
    (:class:`RateLimited`) and a prompt too long (:class:`ContextOverflow`).
    """


class RateLimited(BackendError):
    """The server (or a gateway before it) refused the request for now: HTTP 429.

    ``retry_after`` is how many seconds it asked to wait (its ``Retry-After``
    header, delta-seconds or an HTTP date; None when it gave none). The
    retry policy waits that long (up to its ``max_wait``) before trying
    again, so this is raised only once the attempts are spent.

    A sibling of :class:`ServerError`, not a kind of it: a caller catching
    ``ServerError`` treats the server as faulty (alerts, takes a replica out
    of service), and a server that asks to slow down is working as it
    should. Catch :class:`BackendError` for both.
    """


class ContextOverflow(BackendError):
    """The prompt (plus reserved output) does not fit the server's window.

    Raised the same way for vLLM and SGLang; ``prompt_tokens`` and
    ``context_length`` come from the server's message when it states them.
    """

    def __init__(
        self,
        message: str,
        *,
        prompt_tokens: int | None,
        context_length: int | None,
        **context: Unpack[ServerContext],
    ) -> None:
        super().__init__(message, **context)
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length
