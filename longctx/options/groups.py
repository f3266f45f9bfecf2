"""Option objects, every default, and every ``LONGCTX_*`` read.

The options that travel together are one frozen object each, written once
here and taken as they are by every call that needs them:

- :class:`CorpusOptions`: what :func:`~longctx.sources.corpus.load_corpus` reads and
  in which order (also :func:`~longctx.packing.pack`, every session, the CLI);
- :class:`Limits`: how much of it (part of :class:`CorpusOptions`);
- :class:`RequestOptions`: how each request of a session is made (answer
  length, sampling, cache namespace, concurrency, room kept for questions);
- :class:`ServerOptions`: where the server is and how long to wait for it
  (:func:`~longctx.backends.connect`, every session, the CLI).

Each option is one field (:func:`longctx.options.option`): its default, its
check, whether it is stored with a session and applied on resume, and its
command-line flag with the flag's help text; ``to_dict``, ``from_dict``, the
validation and the CLI's flags (:mod:`longctx.cli.flags`) follow from it.

An explicit value (an argument, a flag) wins over the environment, which
wins over the project file (``.longctx.toml``), which wins over the user
file, which wins over the default (:mod:`longctx.options.settings`; every option with
a flag can be set so, as ``LONGCTX_<NAME>`` or a key of that name). Among them:

- ``LONGCTX_BASE_URL``: the server (default ``http://127.0.0.1:8000/v1``); a
  comma-separated list names several replicas of one model;
- ``LONGCTX_MODEL``: the served model name (default: the server's only model);
- ``LONGCTX_API_KEY``: sent as a bearer token, never printed;
- ``LONGCTX_AFFINITY_HEADERS``: the headers that carry a request's affinity
  key to a router, comma-separated (default :data:`DEFAULT_AFFINITY_HEADERS`;
  a list starting with ``+`` adds to the default set), or ``affinity_headers``
  in a file, as every setting;
- ``LONGCTX_HOME``: where the store lives (see :mod:`longctx.store`);
- ``LONGCTX_STORE``: a ``postgresql://`` URL that puts the store on a server
  shared by many machines (see :mod:`longctx.options.store_location`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from longctx.options.checks import (
    cache_salt,
    server_urls,
    spellings,
    stored_dict,
    stored_optional_int,
    stored_optional_tuple,
    stored_tuple,
    url_list,
)
from longctx.options.fields import OptionFields, option
from longctx.options.settings import settable, setting
from longctx.options.store_location import checked_store
from longctx.recordtypes import record_type

__all__ = [
    "AFFINITY_BODY_FIELD",
    "DEFAULT_AFFINITY_HEADERS",
    "DEFAULT_BASE_URL",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_MAX_STALE_SHARE",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_PAGE_IMAGE_SIDE",
    "DEFAULT_REPLICA_RETRY_SECONDS",
    "DEFAULT_RESERVED_QUESTION_TOKENS",
    "DEFAULT_STALL_TIMEOUT_SECONDS",
    "DEFAULT_TIMEOUT_SECONDS",
    "DISPATCHES",
    "ECHOED_HEADERS",
    "ORDERINGS",
    "PDF_PAGE_MODES",
    "CorpusOptions",
    "Limits",
    "RequestOptions",
    "ResolvedServer",
    "ServerOptions",
    "configured_base_url",
    "configured_store",
    "default_home",
    "instant_retries_requested",
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

DEFAULT_TIMEOUT_SECONDS: Final = 3600.0
"""Longest a whole request may take (:attr:`ServerOptions.timeout`)."""

DEFAULT_STALL_TIMEOUT_SECONDS: Final = 600.0
"""Longest wait for any byte of a response (:attr:`ServerOptions.stall_timeout`); above any prefill."""

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

PDF_PAGE_MODES: Final[tuple[str, ...]] = ("server", "text", "auto", "images")
"""How a PDF's pages go (:mod:`longctx.sources.images`): text only, images of pages without a usable
text layer, images of every page."""

DEFAULT_PAGE_IMAGE_SIDE: Final = 1120
"""The longer side, in pixels, of a PDF page rendered as an image.

40 patches of 28 pixels: a US Letter page renders to 866 x 1120, 1,242
image tokens for a Qwen2-VL-style processor (A4: 792 x 1120, 1,122), inside
the 1,280-token budget such models' cards suggest per document image; body
text of 10 points has an x-height of about 7 pixels. The measurement that
chose it is in ``docs/benchmarks.md`` (page images).
"""

_MIB: Final = 1024 * 1024


@record_type(slots=True)
class Limits(OptionFields):
    """How much :func:`~longctx.sources.corpus.load_corpus` reads.

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

    # The command line leaves these out unless given (cli_default None), so Limits' defaults hold.
    max_file_bytes: int = option(
        4 * _MIB,
        load=int,
        flag="--max-file-bytes",
        value_type="int",
        minimum=1,
        cli_default=None,
        help="Skip files larger than this (default {default}).",
    )
    max_total_bytes: int = option(
        128 * _MIB,
        load=int,
        flag="--max-total-bytes",
        value_type="int",
        minimum=1,
        cli_default=None,
        help="Stop adding files past this total (default {default}).",
    )
    max_files: int = option(
        50_000,
        load=int,
        flag="--max-files",
        value_type="int",
        minimum=1,
        cli_default=None,
        help="Stop adding files past this count (default {default}).",
    )

    def __post_init__(self) -> None:
        self._check_fields()


@settable
@record_type(slots=True)
class CorpusOptions(OptionFields):
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
    server. ``default_ignores`` leaves out of a folder outside git the folders tools
    make (:data:`longctx.sources.files.DEFAULT_IGNORED_FOLDERS`, virtual environments).

    Images, for vision-language models (:mod:`longctx.sources.images`):
    ``pdf_pages`` is ``"text"`` (text only), ``"auto"`` (each page whose text
    layer is not usable also goes as an image), ``"images"`` (every page
    also goes as an image) or ``"server"`` (the default: ``"auto"`` where the
    server's model takes images, as its model card or a probe says, else
    ``"text"``; without a server, ``"text"``: a text-only model never gets an
    image), rendered with the longer side
    ``page_image_side`` pixels; ``image_files`` sends image files (png, jpg)
    and notebooks' image outputs as images.
    """

    ordering: str | None = option(
        None,
        value_type="str",
        flag="--ordering",
        choices=ORDERINGS,
        help="Document order (default: stability in git repositories, else path).",
    )
    include: tuple[str, ...] = option(
        (),
        value_type="strings",
        load=stored_tuple,
        flag="--include",
        multiple=True,
        metavar="GLOB",
        help="Only paths matching this gitignore-style pattern (repeatable).",
    )
    exclude: tuple[str, ...] = option(
        (),
        value_type="strings",
        load=stored_tuple,
        flag="--exclude",
        multiple=True,
        metavar="GLOB",
        help="Leave out paths matching this pattern (repeatable).",
    )
    limits: Limits = option(default_factory=Limits, nested=Limits)
    allow_secrets: bool = option(
        False,
        value_type="bool",
        load=bool,
        flag="--allow-secrets",
        help="Include files that look like credentials.",
    )
    max_stale_share: float = option(
        DEFAULT_MAX_STALE_SHARE,
        load=float,
        flag="--max-stale-share",
        value_type="float",
        minimum=0,
        maximum=1,
        maximum_open=True,
        show_default=True,
        help="Largest share of a repository's tracked bytes kept as earlier copies of changed files,"
        " so that commits change only the pack's tail (0: no layering).",
    )
    default_ignores: bool = option(
        True,
        value_type="bool",
        load=bool,
        flag="--default-ignores/--no-default-ignores",
        show_default=True,
        help="Outside git, skip the folders tools make (.venv, node_modules, __pycache__, .tox...).",
    )
    pdf_pages: str = option(
        "server",
        value_type="str",
        load=str,
        flag="--pdf-pages",
        choices=PDF_PAGE_MODES,
        show_default=True,
        help="How PDF pages go: server: auto where the server's model takes images, else text;"
        " text only; auto: pages without a usable text layer also as images;"
        " images: every page also as an image (vision-language models).",
    )
    page_image_side: int = option(
        DEFAULT_PAGE_IMAGE_SIDE,
        value_type="int",
        load=int,
        flag="--page-image-side",
        minimum=56,
        maximum=8192,
        show_default=True,
        help="Longer side in pixels of a PDF page sent as an image.",
    )
    image_files: bool = option(
        False,
        value_type="bool",
        load=bool,
        flag="--image-files/--no-image-files",
        show_default=True,
        help="Send image files (png, jpg) and notebooks' image outputs as images (vision-language models).",
    )
    # Not stored: sessions learn them from the server each time.
    special_tokens: tuple[str, ...] = option((), value_type="strings", check=spellings, stored=False)

    def __post_init__(self) -> None:
        self._check_fields()


@settable
@record_type
class RequestOptions(OptionFields):
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
    ``prompt_ids`` (on) sends the prompt as the exact token ids the server
    would make of it, where it takes them (:mod:`longctx.sessions.prompt_ids`).
    ``counter_check`` (on by default) reads the serving replica's
    prefix-cache counter around each call and compares its growth with the
    cached tokens the responses reported; a job over many packs
    (:mod:`longctx.jobs.job`) turns it off for its sessions and checks
    once over the whole job, where concurrent packs would blur each call's
    reading. ``offload_prefix_only`` (off by default) caps, on a server with
    a host tier whose engine takes a per-request cap (vLLM's
    ``kv_transfer_params.max_offload_tokens``, experimental), what each
    request offloads to the pack's tokens: the shared prefix goes to host
    memory, each question and answer does not. ``canary_every`` (off by
    default) runs the cache canary (:mod:`longctx.verification.canary`) on the
    session's own prefix after one request in that many (turns and siblings
    count, per session: in a job, per pack); each run costs two cold
    prefills of the prefix.
    ``prompt_cache_key`` (OpenAI's name) is the affinity key to route by
    instead of the one longctx derives from the pack: every request of the
    session carries it in the affinity headers, ``user``, and the body
    fields of :attr:`ServerOptions.affinity_body_fields`. Raises
    :class:`~longctx.errors.ConfigError` for a value the servers would refuse.
    """

    max_tokens: int = option(
        DEFAULT_MAX_TOKENS,
        load=int,
        on_resume=True,
        flag="--max-tokens",
        value_type="int",
        minimum=1,
        show_default=True,
        help="Longest answer, in tokens.",
    )
    # vLLM and SGLang refuse a temperature above 2 (OpenAI's range) with an HTTP 400.
    temperature: float | None = option(None, value_type="float", minimum=0, maximum=2)
    seed: int | None = option(None, value_type="int")
    # Stored: a resumed session keeps its namespace (the CLI refuses another on resume).
    cache_salt: str | None = option(
        None,
        value_type="str",
        check=cache_salt,
        flag="--cache-salt",
        help="Namespace for the server's prefix cache (keeps tenants apart).",
    )
    concurrency: int | None = option(
        None,
        load=stored_optional_int,
        flag="--concurrency",
        value_type="int",
        minimum=1,
        group="concurrency",
        help=f"Questions in flight at once (default: the engine's measured one, else {DEFAULT_CONCURRENCY}).",
    )
    dispatch: str = option(
        "auto",
        value_type="str",
        load=str,
        flag="--dispatch",
        choices=DISPATCHES,
        show_default=True,
        group="concurrency",
        help="How sibling questions go out: all together, the lead's first token first,"
        " the lead's admission first, or what was measured fastest for the engine.",
    )
    reserved_question_tokens: int = option(
        DEFAULT_RESERVED_QUESTION_TOKENS,
        load=int,
        flag="--reserved-question-tokens",
        value_type="int",
        minimum=0,
        show_default=True,
        help="Room kept in the window, besides the answer, for the questions and turns after the pack"
        " (the pack gets the rest).",
    )
    extra_body: Mapping[str, Any] = option(
        default_factory=dict,
        value_type="mapping",
        load=stored_dict,
        flag="--extra-body",
        metavar="JSON",
        help="Engine fields merged into every request body, as a JSON object"
        " ('{{\"top_k\": 20}}'); the Python API's extra_body.",
    )
    follow_changes: bool = option(
        True,
        value_type="bool",
        load=bool,
        on_resume=True,
        flag="--follow-changes/--no-follow-changes",
        show_default=True,
        group="follow_changes",
        help="Append files changed since the pack to the next question.",
    )
    warm_start: bool = option(
        False,
        value_type="bool",
        load=bool,
        on_resume=True,
        flag="--warm-start/--no-warm-start",
        show_default=True,
        # On at the command line: a chat's first question is typed while the pack warms.
        cli_default=True,
        group="warm_start",
        help="Prefill the pack in the background while the first question is typed.",
    )
    counter_check: bool = option(True, value_type="bool", load=bool)
    token_history: bool = option(
        False,
        value_type="bool",
        load=bool,
        on_resume=True,
        flag="--token-history/--no-token-history",
        show_default=True,
        group="token_history",
        help="Send earlier answers as the token ids the model generated (vLLM, SGLang),"
        " so the next turn reads them from the cache.",
    )
    prompt_ids: bool = option(
        True,
        value_type="bool",
        load=bool,
        on_resume=True,
        flag="--prompt-ids/--text-prompts",
        show_default=True,
        help="Send the pack as exact token ids where the server takes them (vLLM,"
        " SGLang); --text-prompts sends chat messages always.",
    )
    offload_prefix_only: bool = option(
        False,
        value_type="bool",
        load=bool,
        on_resume=True,
        flag="--offload-prefix-only/--no-offload-prefix-only",
        show_default=True,
        help="On a server with a host tier that takes a per-request cap (vLLM): offload only the pack,"
        " not each question and answer.",
    )

    canary_every: int | None = option(
        None,
        load=stored_optional_int,
        flag="--canary-every",
        value_type="int",
        minimum=1,
        help="Run the cache canary on the session's own prefix after one request in this many.",
    )
    prompt_cache_key: str | None = option(
        None,
        value_type="str",
        on_resume=True,
        flag="--prompt-cache-key",
        help="The routing key to send instead of the pack's (OpenAI's name; routers keep one key"
        " on one replica).",
    )

    def __post_init__(self) -> None:
        self._check_fields()


def _store_url(name: str, value: str | None) -> str | None:
    return checked_store(value)


@settable
@record_type
class ServerOptions(OptionFields):
    """Where the server is and how long to wait for it.

    ``base_url`` is one URL, a comma-separated string or a sequence of
    replicas of one model (default ``LONGCTX_BASE_URL``, then
    ``http://127.0.0.1:8000/v1``); ``model`` the served name (default
    ``LONGCTX_MODEL``, then the server's only model); ``api_key`` a bearer
    token (default ``LONGCTX_API_KEY``; never printed, never stored).
    ``stall_timeout`` bounds the wait for any byte of a response (the first
    comes after prefill, so keep it above the longest prefill); ``timeout``
    a whole request with its retries, and the first contact. The environment is read when a
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

    # The flags' values, like the fields, are None unless given: the environment is
    # read by the resolve_* functions below, when a connection is made.
    base_url: str | Sequence[str] | None = option(
        None,
        value_type="urls",
        check=server_urls,
        flag="--base-url",
        help=f"Server URL (default {DEFAULT_BASE_URL}; env LONGCTX_BASE_URL; comma-separated replicas).",
    )
    model: str | None = option(
        None,
        value_type="str",
        flag="--model",
        help="Served model name (env LONGCTX_MODEL; default: the server's model).",
    )
    api_key: str | None = option(
        None,
        value_type="str",
        repr=False,
        stored=False,
        flag="--api-key",
        help="Bearer token (env LONGCTX_API_KEY); never printed.",
    )
    store: str | None = option(
        None,
        value_type="str",
        check=_store_url,
        repr=False,
        stored=False,
        flag="--store",
        metavar="URL",
        help="The store: a postgresql:// URL shared by many machines (env LONGCTX_STORE; default: the"
        " embedded SQLite file in LONGCTX_HOME); its password is never printed.",
    )
    timeout: float = option(
        DEFAULT_TIMEOUT_SECONDS,
        value_type="float",
        minimum=0,
        minimum_open=True,
        load=float,
        flag="--timeout",
        metavar="SECONDS",
        help="Give up on a request, its retries and the first contact included, after this many seconds"
        " (default {default:g}; env LONGCTX_TIMEOUT).",
    )
    stall_timeout: float = option(
        DEFAULT_STALL_TIMEOUT_SECONDS,
        value_type="float",
        minimum=0,
        minimum_open=True,
        load=float,
        flag="--stall-timeout",
        metavar="SECONDS",
        help="Give up on a request after this many seconds without a byte from the server; keep it above"
        " the longest prefill (default {default:g}; env LONGCTX_STALL_TIMEOUT).",
    )
    affinity_headers: Sequence[str] | None = option(
        None, value_type="strings", load=stored_optional_tuple, settable=True
    )
    replica_retry_seconds: float = option(
        DEFAULT_REPLICA_RETRY_SECONDS, value_type="float", minimum=0, load=float
    )
    router_policy: str | None = option(None, value_type="str")
    affinity_body_fields: Sequence[str] | None = option(
        None, value_type="strings", load=stored_optional_tuple
    )

    def __post_init__(self) -> None:
        self._check_fields()

    def names_a_server(self) -> bool:
        """Whether a server was chosen: ``base_url`` given or ``LONGCTX_BASE_URL`` set (not the default)."""
        return self.base_url is not None or configured_base_url() is not None

    def resolved(self) -> ServerOptions:
        """These options with what they leave unset read from the settings, once: what a backend is made from.

        The URLs, model, API key and affinity headers come from the
        arguments, else ``LONGCTX_*``, ``.longctx.toml`` or the user file
        (:func:`~longctx.options.settings.setting`, one rule for all), else
        the defaults. :func:`~longctx.backends.connect` calls it once, and
        reads nothing of the environment after: the options it returns (a
        :class:`ResolvedServer`) read nothing more, and resolve to themselves.
        """
        return ResolvedServer(
            base_url=resolve_base_urls(self.base_url),
            model=resolve_model(self.model),
            api_key=resolve_api_key(self.api_key),
            timeout=self.timeout,
            stall_timeout=self.stall_timeout,
            affinity_headers=resolve_affinity_headers(self.affinity_headers),
            replica_retry_seconds=self.replica_retry_seconds,
            router_policy=self.router_policy,
            affinity_body_fields=self.affinity_body_fields,
        )

    def base_urls(self) -> tuple[str, ...]:
        """The replicas' URLs: the option, else ``LONGCTX_BASE_URL`` (or a file), else the default."""
        return resolve_base_urls(self.base_url)

    def resolved_model(self) -> str | None:
        """The served model's name: the option, else the settings, else None (the server's only one)."""
        return resolve_model(self.model)

    def resolved_api_key(self) -> str | None:
        """The API key: the option, else the settings, else None."""
        return resolve_api_key(self.api_key)

    def resolved_affinity_headers(self) -> tuple[str, ...]:
        """The affinity headers: the option, else the settings, else :data:`DEFAULT_AFFINITY_HEADERS`."""
        return resolve_affinity_headers(self.affinity_headers)


@record_type
class ResolvedServer(ServerOptions):
    """:class:`ServerOptions` with every setting read (:meth:`ServerOptions.resolved`): reads nothing more.

    ``base_url`` is the tuple of URLs, ``affinity_headers`` the tuple of
    names; ``model`` and ``api_key`` are None only where nothing sets them.
    """

    def resolved(self) -> ResolvedServer:
        return self

    def base_urls(self) -> tuple[str, ...]:
        return tuple(self.base_url or ())

    def resolved_model(self) -> str | None:
        return self.model

    def resolved_api_key(self) -> str | None:
        return self.api_key

    def resolved_affinity_headers(self) -> tuple[str, ...]:
        return tuple(self.affinity_headers or ())


def instant_retries_requested() -> bool:
    """Whether ``LONGCTX_INSTANT_RETRIES=1`` asks retries not to wait (a switch for tests)."""
    return os.environ.get("LONGCTX_INSTANT_RETRIES") == "1"


def configured_base_url() -> str | None:
    """The server URL(s) configured (``LONGCTX_BASE_URL``, else a config file), comma-separated; else None."""
    found = setting(ServerOptions, "base_url")
    if found is None:
        return None
    return found.value if isinstance(found.value, str) else ",".join(found.value)


def resolve_base_urls(base_url: str | Sequence[str] | None) -> tuple[str, ...]:
    """The server URL(s) to use: the argument, else the configured ones, else the default.

    Checked by the one URL rule (:func:`~longctx.options.checks.server_urls`).
    """
    if base_url is None:
        base_url = configured_base_url() or DEFAULT_BASE_URL
    return url_list(server_urls("base_url", base_url))


def resolve_model(model: str | None) -> str | None:
    """The served model name: the argument, else the configured one (``LONGCTX_MODEL``, a file), else None."""
    return model or _configured_text(ServerOptions, "model")


def resolve_affinity_headers(headers: Sequence[str] | None) -> tuple[str, ...]:
    """The affinity headers: the argument, else the configured ones, else the default set.

    Configured as every setting is (``LONGCTX_AFFINITY_HEADERS``, comma-separated,
    or ``affinity_headers`` in ``.longctx.toml`` or the user file, a list of
    strings); a list whose first name starts with ``+`` (``+x-mine,x-other``)
    adds its names to the default set rather than replacing it.
    """
    if headers is not None:
        return tuple(headers)
    found = setting(ServerOptions, "affinity_headers")
    names = tuple(found.value) if found is not None else ()
    if not names:
        return DEFAULT_AFFINITY_HEADERS
    if names[0].startswith("+"):
        added = (names[0][1:].strip(), *names[1:])
        return DEFAULT_AFFINITY_HEADERS + tuple(n for n in added if n and n not in DEFAULT_AFFINITY_HEADERS)
    return names


def resolve_api_key(api_key: str | None) -> str | None:
    """The API key: the argument, else the configured one (``LONGCTX_API_KEY``, a file), else None."""
    return api_key or _configured_text(ServerOptions, "api_key")


def configured_store() -> str | None:
    """The store's server URL configured (``LONGCTX_STORE``, a config file's ``store``); None: the file."""
    found = setting(ServerOptions, "store")
    return None if found is None or found.value is None else str(found.value)


def _configured_text(options: type[OptionFields], name: str) -> str | None:
    found = setting(options, name)
    return None if found is None else str(found.value) or None


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
