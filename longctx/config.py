"""Option objects, every default, and every ``LONGCTX_*`` read.

The options that travel together are one frozen object each, written once
here and taken as they are by every call that needs them:

- :class:`CorpusOptions`: what :func:`~longctx.corpus.load_corpus` reads and
  in which order (also :func:`~longctx.packing.pack`, every session, the CLI);
- :class:`Limits`: how much of it (part of :class:`CorpusOptions`);
- :class:`RequestOptions`: how each request of a session is made (answer
  length, sampling, cache namespace, concurrency, room kept for questions);
- :class:`ServerOptions`: where the server is and how long to wait for it
  (:func:`~longctx.backends.connect`, every session, the CLI).

An explicit value wins over the environment, which wins over the default:

- ``LONGCTX_BASE_URL``: the server (default ``http://127.0.0.1:8000/v1``); a
  comma-separated list names several replicas of one model;
- ``LONGCTX_MODEL``: the served model name (default: the server's only model);
- ``LONGCTX_API_KEY``: sent as a bearer token, never printed;
- ``LONGCTX_AFFINITY_HEADERS``: the headers that carry a request's affinity
  key to a router, comma-separated (default :data:`DEFAULT_AFFINITY_HEADERS`;
  a list starting with ``+`` adds to the default set);
- ``LONGCTX_HOME``: where the store lives (see :mod:`longctx.store`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from longctx.errors import ConfigError

__all__ = [
    "AFFINITY_BODY_FIELD",
    "DEFAULT_AFFINITY_HEADERS",
    "DEFAULT_BASE_URL",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_MAX_STALE_SHARE",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_REPLICA_RETRY_SECONDS",
    "DEFAULT_RESERVED_QUESTION_TOKENS",
    "DISPATCHES",
    "ECHOED_HEADERS",
    "ORDERINGS",
    "CorpusOptions",
    "Limits",
    "RequestOptions",
    "ServerOptions",
    "default_home",
    "resolve_affinity_headers",
    "resolve_api_key",
    "resolve_base_urls",
    "resolve_model",
]

DEFAULT_BASE_URL: Final = "http://127.0.0.1:8000/v1"

DEFAULT_AFFINITY_HEADERS: Final[tuple[str, ...]] = (
    "x-session-id",
    "X-SMG-Routing-Key",
    "X-Dynamo-Session-ID",
)
"""The headers a request's affinity key goes out in, one per router that reads one.

``x-session-id``: vllm-router (``consistent_hash``, ``cache_aware``'s session
key); ``X-SMG-Routing-Key``: SGLang's model gateway (``smg``);
``X-Dynamo-Session-ID``: NVIDIA Dynamo (with
``--router-session-affinity-ttl-secs``). The key also goes out as the body's
``user`` field. A router reading another name: set
:attr:`ServerOptions.affinity_headers` or ``LONGCTX_AFFINITY_HEADERS``.
llm-d's ``x-session-token`` is not a key the client picks: its gateway
sets it on a response (the serving pod, encoded) and the client echoes it
(:data:`ECHOED_HEADERS`).
"""

ECHOED_HEADERS: Final[tuple[str, ...]] = ("x-session-token",)
"""Headers a gateway sets on a response that the client sends back with the next request of the same key.

``x-session-token``: llm-d's session affinity (the inference scheduler
routes a request carrying it to the pod it names).
"""

AFFINITY_BODY_FIELD: Final = "prompt_cache_key"
"""OpenAI's name for a request's routing key, read by hosted APIs and gateways in the body."""

DEFAULT_REPLICA_RETRY_SECONDS: Final = 5.0
"""How long a replica that could not be reached is left out before it is tried again."""

DEFAULT_MAX_TOKENS: Final = 512
"""Longest answer, in tokens, unless a request says otherwise."""

DEFAULT_CONCURRENCY: Final = 4
"""Sibling requests in flight at once on a server whose engine has no measured default."""

DISPATCHES: Final[tuple[str, ...]] = ("auto", "together", "lead", "admitted")
"""How sibling requests go out (see :mod:`longctx.sessions.siblings`); ``auto`` picks per engine."""

DEFAULT_RESERVED_QUESTION_TOKENS: Final = 1024
"""Room kept in the window, besides the answer, for the question and the turns after it."""

DEFAULT_MAX_STALE_SHARE: Final = 0.2
"""Largest share of a repository's tracked bytes kept as earlier copies of changed files (layering).

A fifth keeps a layered pack at most 20% larger than a fresh one; past it a
commit falls back to a fresh pack (see :mod:`longctx.sources.history`).
"""

ORDERINGS: Final[tuple[str, ...]] = ("stability", "path")
"""The ordering policies :class:`CorpusOptions` accepts."""

_MIB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """How much :func:`~longctx.corpus.load_corpus` reads.

    - ``max_file_bytes`` (4 MiB): a file larger than this is ``too-large``.
      A 1M-token context holds about 4 MB of text, so a bigger single file
      cannot be packed whole anyway. Real source files are far below it
      (the largest text file of CPython's standard library,
      ``pydoc_data/topics.py``, is 0.75 MB), while generated dumps, data
      files and static libraries above it are skipped. Repomix uses 50 MB
      and gitingest 10 MB, but neither aims at one context window.
    - ``max_total_bytes`` (128 MiB): about 32 one-million-token windows of
      text, room for a sharded corpus (a standard library is ~40 MB of
      text) but a stop before a mistaken ``/`` reads a disk.
    - ``max_files`` (50,000): ten times a large application repository;
      gitingest stops at 10,000, too low for the Linux kernel's documentation
      or a monorepo folder.

    Files are taken in corpus order; when the next document would pass
    ``max_total_bytes`` or ``max_files`` documents are already in, that file
    and every later one are skipped (``total-size-limit`` /
    ``file-count-limit``), so a limited corpus is a prefix of the unlimited
    one and keeps its cache-friendly order.
    """

    max_file_bytes: int = 4 * _MIB
    max_total_bytes: int = 128 * _MIB
    max_files: int = 50_000

    def __post_init__(self) -> None:
        for name in ("max_file_bytes", "max_total_bytes", "max_files"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"Limits.{name} must be a positive integer, not {value!r}")


@dataclass(frozen=True, slots=True)
class CorpusOptions:
    """What a corpus is made of: the same options give the same documents in the same order.

    ``ordering`` is ``"stability"`` (files that change least first; layered
    as of a recent base commit in a git repository), ``"path"``, or None
    (``stability`` when a git repository is among the sources, else
    ``path``). ``include`` / ``exclude`` are gitignore-style patterns
    matched against paths relative to each source. Credentials are skipped
    unless ``allow_secrets``. ``max_stale_share`` bounds the earlier copies
    of a layered repository (0 turns layering off). Raises
    :class:`~longctx.errors.ConfigError` for an unknown ordering or a share
    outside [0, 1). ``special_tokens`` are the served model's special-token
    spellings: broken in document text (see
    :mod:`longctx.sources.special_tokens`) beside the common chat formats'
    control spellings, which are always broken; sessions fill it from the
    server.
    """

    ordering: str | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    allow_secrets: bool = False
    max_stale_share: float = DEFAULT_MAX_STALE_SHARE
    special_tokens: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.ordering is not None and self.ordering not in ORDERINGS:
            raise ConfigError(f"unknown ordering {self.ordering!r}; use one of {', '.join(ORDERINGS)}")
        share = self.max_stale_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not (0 <= share < 1):
            raise ConfigError(
                f"max_stale_share must be a number from 0 up to (not including) 1, not {share!r}"
            )
        for name in ("include", "exclude", "special_tokens"):
            patterns = getattr(self, name)
            if isinstance(patterns, str):
                raise ConfigError(f"CorpusOptions.{name} takes a sequence of patterns, not one string")
            # A list given by the caller becomes a tuple, so the options stay hashable and frozen.
            object.__setattr__(self, name, tuple(patterns))
        if not all(isinstance(spelling, str) and spelling for spelling in self.special_tokens):
            raise ConfigError("CorpusOptions.special_tokens takes non-empty strings")
        # Sorted and unique: the same spellings given in another order are the same options.
        object.__setattr__(self, "special_tokens", tuple(sorted(set(self.special_tokens))))
        if not isinstance(self.limits, Limits):
            raise ConfigError(f"CorpusOptions.limits must be a Limits, not {self.limits!r}")

    def to_dict(self) -> dict[str, Any]:
        """The form kept with a living session, so a resumed one reads its paths the same way."""
        return {
            "ordering": self.ordering,
            "include": list(self.include),
            "exclude": list(self.exclude),
            "limits": {
                "max_file_bytes": self.limits.max_file_bytes,
                "max_total_bytes": self.limits.max_total_bytes,
                "max_files": self.limits.max_files,
            },
            "allow_secrets": self.allow_secrets,
            "max_stale_share": self.max_stale_share,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CorpusOptions:
        """The options :meth:`to_dict` wrote; missing keys take their defaults."""
        defaults = cls()
        return cls(
            ordering=data.get("ordering"),
            include=tuple(data.get("include") or ()),
            exclude=tuple(data.get("exclude") or ()),
            limits=Limits(**(data.get("limits") or {})),
            allow_secrets=bool(data.get("allow_secrets", False)),
            max_stale_share=float(data.get("max_stale_share", defaults.max_stale_share)),
        )


@dataclass(frozen=True)
class RequestOptions:
    """How a session makes each request.

    ``max_tokens`` bounds each answer; ``temperature`` and ``seed`` are
    passed to the server when set; ``cache_salt`` namespaces the server's
    prefix cache (1 to 128 characters, none of ``@ / \\`` or NUL: vLLM's
    rule); ``concurrency`` bounds sibling requests in flight (None: the
    engine's measured default); ``dispatch`` is how siblings go out:
    ``together`` (all at once, up to ``concurrency``), ``lead`` (the first
    alone until its first token), ``admitted`` (the first alone until the
    server accepted it), or ``auto`` (what the benchmark measured fastest for
    the engine and version; see :mod:`longctx.sessions.siblings`);
    ``reserved_question_tokens`` is the room kept in the window for the
    questions and turns that follow the pack; ``extra_body`` is merged into
    every request body. ``follow_changes`` (on by default) makes a
    repository session append the files changed since its pack to the next
    user message (see :mod:`longctx.sessions.changes`). ``warm_start``
    (off by default; ``longctx chat`` turns it on) makes a session prefill
    its prefix with a one-token request in the background as soon as it is
    opened, so the first question is served from the cache (see
    :mod:`longctx.sessions.warm`). ``token_history`` (off by default) makes
    a session on vLLM or SGLang send each turn after the first as token ids,
    each earlier answer as the ids the model generated, so the next turn
    reads the whole previous answer from the cache even where re-tokenising
    its text gives other tokens (see :mod:`longctx.sessions.token_history`).
    ``counter_check`` (on by default) reads the serving replica's
    prefix-cache counter around each call and compares its growth with the
    cached tokens the responses reported; a job over many packs
    (:mod:`longctx.sessions.jobs`) turns it off for its sessions and checks
    once over the whole job, where concurrent packs would blur each call's
    reading. ``canary_every`` (off by default) runs the cache canary
    (:mod:`longctx.cache_canary`) on the session's own prefix after one request
    in that many (turns and siblings count, per session: in a job, per
    pack); each run costs two cold prefills of the prefix.
    ``prompt_cache_key`` (OpenAI's name) is the affinity key to route by
    instead of the one longctx derives from the pack: every request of the
    session carries it in the affinity headers, ``user``, and the body
    fields of :attr:`ServerOptions.affinity_body_fields`. Raises
    :class:`~longctx.errors.ConfigError` for a value the servers would refuse.
    """

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float | None = None
    seed: int | None = None
    cache_salt: str | None = None
    concurrency: int | None = None
    dispatch: str = "auto"
    reserved_question_tokens: int = DEFAULT_RESERVED_QUESTION_TOKENS
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    follow_changes: bool = True
    warm_start: bool = False
    counter_check: bool = True
    token_history: bool = False
    canary_every: int | None = None
    prompt_cache_key: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_tokens", "concurrency", "canary_every"):
            value = getattr(self, name)
            if value is None and name in ("concurrency", "canary_every"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be at least 1, not {value!r}")
        if self.dispatch not in DISPATCHES:
            raise ConfigError(f"unknown dispatch {self.dispatch!r}; use one of {', '.join(DISPATCHES)}")
        if self.reserved_question_tokens < 0:
            raise ConfigError("reserved_question_tokens must not be negative")
        salt = self.cache_salt
        if salt is not None and (not 1 <= len(salt) <= 128 or any(c in salt for c in "@/\\\0")):
            raise ConfigError("cache_salt must be 1 to 128 characters without @, /, \\ or NUL")
        object.__setattr__(self, "extra_body", dict(self.extra_body))

    def to_dict(self) -> dict[str, Any]:
        """The form kept with a stored session (the salt too: a resumed session keeps its namespace)."""
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "seed": self.seed,
            "cache_salt": self.cache_salt,
            "concurrency": self.concurrency,
            "dispatch": self.dispatch,
            "reserved_question_tokens": self.reserved_question_tokens,
            "extra_body": dict(self.extra_body),
            "follow_changes": self.follow_changes,
            "warm_start": self.warm_start,
            "counter_check": self.counter_check,
            "token_history": self.token_history,
            "canary_every": self.canary_every,
            "prompt_cache_key": self.prompt_cache_key,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestOptions:
        """The options :meth:`to_dict` wrote; keys an older release did not write take their defaults."""
        defaults = cls()
        return cls(
            max_tokens=int(data.get("max_tokens", defaults.max_tokens)),
            temperature=data.get("temperature"),
            seed=data.get("seed"),
            cache_salt=data.get("cache_salt"),
            concurrency=None if data.get("concurrency") is None else int(data["concurrency"]),
            dispatch=str(data.get("dispatch", defaults.dispatch)),
            reserved_question_tokens=int(
                data.get("reserved_question_tokens", defaults.reserved_question_tokens)
            ),
            extra_body=dict(data.get("extra_body") or {}),
            follow_changes=bool(data.get("follow_changes", True)),
            warm_start=bool(data.get("warm_start", False)),
            counter_check=bool(data.get("counter_check", True)),
            token_history=bool(data.get("token_history", False)),
            canary_every=None if data.get("canary_every") is None else int(data["canary_every"]),
            prompt_cache_key=data.get("prompt_cache_key"),
        )


@dataclass(frozen=True)
class ServerOptions:
    """Where the server is and how long to wait for it.

    ``base_url`` is one URL, a comma-separated string or a sequence of
    replicas of one model (default ``LONGCTX_BASE_URL``, then
    ``http://127.0.0.1:8000/v1``); ``model`` the served name (default
    ``LONGCTX_MODEL``, then the server's only model); ``api_key`` a bearer
    token (default ``LONGCTX_API_KEY``; never printed, never stored).
    ``stall_timeout`` bounds the wait for any byte of a response (the first
    comes after prefill, so keep it above the longest prefill);
    ``timeout`` bounds a whole request. The environment is read when a
    connection is made, not when the options are built.

    ``affinity_headers`` names the headers that carry each request's
    affinity key (one key per pack) to a router in front of the replicas
    (default ``LONGCTX_AFFINITY_HEADERS``, then :data:`DEFAULT_AFFINITY_HEADERS`;
    to add one, give ``(*DEFAULT_AFFINITY_HEADERS, "x-mine")``; to rename,
    give only the names wanted). With several URLs, a replica that cannot be
    reached is left out for ``replica_retry_seconds`` and then tried again.
    ``router_policy`` names the router in front and its policy
    (``"vllm-router:consistent_hash"``, ``"smg:cache_aware"``), for doctor to
    flag one that loses the cache; longctx cannot ask a router for it.
    ``affinity_body_fields`` names body fields that carry the affinity key
    too (default: ``prompt_cache_key`` on a server that is not vLLM or
    SGLang, a hosted API or gateway that routes on it; none on the engines,
    which do not route); ``()`` sends none.
    """

    base_url: str | Sequence[str] | None = None
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 3600.0
    stall_timeout: float = 600.0
    affinity_headers: Sequence[str] | None = None
    replica_retry_seconds: float = DEFAULT_REPLICA_RETRY_SECONDS
    router_policy: str | None = None
    affinity_body_fields: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.base_url, (str, type(None))):
            object.__setattr__(self, "base_url", tuple(self.base_url))
        if self.affinity_headers is not None:
            object.__setattr__(self, "affinity_headers", tuple(self.affinity_headers))
        if self.affinity_body_fields is not None:
            object.__setattr__(self, "affinity_body_fields", tuple(self.affinity_body_fields))
        if self.replica_retry_seconds < 0:
            raise ConfigError("replica_retry_seconds cannot be negative")

    def base_urls(self) -> tuple[str, ...]:
        """The replicas' URLs: the option, else ``LONGCTX_BASE_URL``, else the default."""
        return resolve_base_urls(self.base_url)

    def resolved_model(self) -> str | None:
        return resolve_model(self.model)

    def resolved_api_key(self) -> str | None:
        return resolve_api_key(self.api_key)

    def resolved_affinity_headers(self) -> tuple[str, ...]:
        return resolve_affinity_headers(self.affinity_headers)


def resolve_base_urls(base_url: str | Sequence[str] | None) -> tuple[str, ...]:
    """The server URL(s) to use: the argument, else ``LONGCTX_BASE_URL``, else the default."""
    if base_url is None:
        base_url = os.environ.get("LONGCTX_BASE_URL") or DEFAULT_BASE_URL
    urls = [part.strip() for part in base_url.split(",")] if isinstance(base_url, str) else list(base_url)
    urls = [url for url in urls if url]
    if not urls:
        raise ConfigError("no server URL given (argument or LONGCTX_BASE_URL)")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"server URL must start with http:// or https://, got {url!r}")
    return tuple(urls)


def resolve_model(model: str | None) -> str | None:
    """The served model name: the argument, else ``LONGCTX_MODEL``, else None (ask the server)."""
    return model or os.environ.get("LONGCTX_MODEL") or None


def resolve_affinity_headers(headers: Sequence[str] | None) -> tuple[str, ...]:
    """The affinity headers: the argument, else ``LONGCTX_AFFINITY_HEADERS``, else the default set.

    A ``LONGCTX_AFFINITY_HEADERS`` starting with ``+`` (``+x-mine,x-other``)
    adds its names to the default set rather than replacing it.
    """
    if headers is not None:
        return tuple(headers)
    configured = os.environ.get("LONGCTX_AFFINITY_HEADERS", "").strip()
    if not configured:
        return DEFAULT_AFFINITY_HEADERS
    adding = configured.startswith("+")
    names = tuple(name.strip() for name in configured.lstrip("+").split(",") if name.strip())
    if adding:
        return DEFAULT_AFFINITY_HEADERS + tuple(n for n in names if n not in DEFAULT_AFFINITY_HEADERS)
    return names


def resolve_api_key(api_key: str | None) -> str | None:
    """The API key: the argument, else ``LONGCTX_API_KEY``, else None."""
    return api_key or os.environ.get("LONGCTX_API_KEY") or None


def default_home() -> Path:
    """``$LONGCTX_HOME`` if set, else the platform's user data folder for longctx."""
    configured = os.environ.get("LONGCTX_HOME")
    if configured:
        return Path(configured).expanduser()
    # Imported here: with LONGCTX_HOME set (tests, scripts) its import
    # (tempfile, shutil, ...) takes about 10 ms, a re-pack of an unchanged
    # repository no more than 250.
    import platformdirs

    return Path(platformdirs.user_data_dir("longctx", appauthor=False))
