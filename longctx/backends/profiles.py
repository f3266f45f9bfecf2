"""An engine's profile: all longctx knows of one engine, as data (the registry is :mod:`.engines`).

What a profile holds: docs/architecture.md, "The engine as data". Code
outside the registry asks the server's profile (``ServerInfo.profile``),
never its name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, Literal

from longctx.backends.http import HttpEndpoint
from longctx.backends.metrics import parse_metrics, total
from longctx.backends.tiers import CacheTiers, HostTier, TierReading, hits_by_label, read_tiers
from longctx.errors import BackendError
from longctx.recordtypes import record_type

__all__ = [
    "CHECKPOINT_KV_SCALES",
    "CacheCounters",
    "CacheTiers",
    "Check",
    "EngineFacts",
    "EngineProfile",
    "Finding",
    "HostTierRecipe",
    "Measured",
    "RecipeSwitches",
    "RouterProfile",
    "SchemaForm",
    "truth",
]


CHECKPOINT_KV_SCALES = "checkpoint_kv_scales"
"""The setting doctor adds to what a server reports: whether its checkpoint carries KV-cache scales.

True, False, or None (unknown), from :func:`longctx.serving.kv_scales.find_kv_scales` on the folder
the server loaded; the fp8 checks read it.
"""


@record_type
class Finding:
    """One piece of advice.

    ``severity`` is ``"warning"`` when longctx's savings are lost or cannot be
    measured, ``"suggestion"`` for capacity gains; ``setting`` is the observed
    key, ``observed`` its value as text, ``flag`` what to add to the launch
    command, ``reason`` what it buys.
    """

    severity: Literal["warning", "suggestion"]
    setting: str
    observed: str
    flag: str
    reason: str


@record_type
class Check:
    """One setting doctor reads (in the engine's own name) and the flag to add when ``off`` holds for it.

    ``flag`` and ``reason`` may name the observed value as ``{value}``. A
    setting the server did not report yields no finding; nor does a server
    ``applies`` (given) says the flag does not fit (vLLM's CPU build takes
    no fp8 KV cache).
    """

    severity: Literal["warning", "suggestion"]
    setting: str
    off: Callable[[Any], bool]
    flag: str
    reason: str
    applies: Callable[[Mapping[str, Any]], bool] | None = None

    def finding(self, observed: Mapping[str, Any]) -> Finding | None:
        if self.setting not in observed or not self.off(observed[self.setting]):
            return None
        if self.applies is not None and not self.applies(observed):
            return None
        value = "null" if observed[self.setting] is None else str(observed[self.setting])
        return Finding(
            self.severity, self.setting, value, self.flag.format(value=value), self.reason.format(value=value)
        )


@record_type
class Measured:
    """A measured sibling dispatch: the fastest strategy for versions starting ``version_prefix``."""

    version_prefix: str
    strategy: str
    concurrency: int
    source: str


@record_type
class HostTierRecipe:
    """A launch recipe's host tier: flags (``{size}`` is its GiB), setup commands and notes."""

    flags: tuple[str, ...]
    setup: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@record_type
class RecipeSwitches:
    """A generic launch recipe's parts: ``launch`` (``{model}`` is the model) and the long-context switches.

    ``tensor_parallel`` and ``context`` are the flags that take the GPU
    count and the context length; ``mla_note`` (with ``{gpus}``) is said of
    an MLA model on several GPUs.
    """

    launch: tuple[str, ...]
    tensor_parallel: str
    context: str
    switches: tuple[str, ...]
    notes: tuple[str, ...] = ()
    mla_note: str = ""
    #: The flags of an fp8 KV cache; a recipe adds them where the checkpoint carries KV scales.
    fp8_kv: tuple[str, ...] = ()
    #: What an fp8 KV cache at scale 1.0 (no scales in the checkpoint) did to answers, measured.
    fp8_kv_unscaled: str = ""
    #: The host tiers a recipe can add, by name (``recipe_for(host_tier=...)``).
    host_tiers: Mapping[str, HostTierRecipe] = field(default_factory=dict)
    #: Launch flags that cut a cached follow-up's remaining per-token work in the engine (block
    #: hashing, the id list), with the measurement that chose them: filled from
    #: benchmarks/gpu/followup_probe.py runs (``--server-label``), empty until one shows a gain.
    followup_switches: tuple[str, ...] = ()
    followup_source: str = ""


@record_type
class SchemaForm:
    """How requests to versions from ``since`` constrain the answer to a JSON Schema (decoding, not prompt).

    ``body_field`` is the body field: ``response_format`` (OpenAI's
    ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``)
    or ``structured_outputs`` (vLLM's ``{"json": schema, **options}``).
    ``options`` go beside the schema where the field takes them.
    ``disabled_by`` names a setting (the engine's own name) and the value with
    which the server cannot constrain decoding, and ``fix`` the flag that
    turns it on: such a server is refused before anything is sent.
    """

    since: str
    body_field: Literal["response_format", "structured_outputs"] = "response_format"
    options: Mapping[str, Any] = field(default_factory=dict)
    disabled_by: tuple[str, Any] | None = None
    fix: str = ""

    def body(self, name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
        """The body fields of a request whose answer must satisfy ``schema`` (named ``name``)."""
        if self.body_field == "structured_outputs":
            return {"structured_outputs": {"json": dict(schema), **self.options}}
        wrapped = {"name": name, "schema": dict(schema), "strict": True, **self.options}
        return {"response_format": {"type": "json_schema", "json_schema": wrapped}}

    def refusal(self, settings: Mapping[str, Any]) -> str | None:
        """Why a server with ``settings`` cannot constrain decoding (with the fix), or None."""
        if self.disabled_by is None:
            return None
        setting, value = self.disabled_by
        if setting in settings and settings[setting] == value:
            return (
                f"it runs with {setting}={value!r}, so it cannot constrain an answer to a schema; {self.fix}"
            )
        return None


@record_type
class EngineFacts:
    """What discovery learnt beyond ``/v1/models``.

    ``None`` means unknown, not false. ``settings`` holds what was observed,
    in the engine's own names (what the profile's checks read).
    """

    version: str | None = None
    prefix_caching: bool | None = None
    cache_reporting: bool | None = None
    metrics: bool | None = None
    cache_block_tokens: int | None = None
    schedule_policy: str | None = None
    kv_cache_tokens: int | None = None
    settings: Mapping[str, Any] = field(default_factory=dict, repr=False)
    #: The tier below GPU memory the server's settings show (None: none seen).
    host_tier: HostTier | None = None


@record_type
class CacheCounters:
    """A reading of the server's own prefix-cache counters (tokens, since start).

    ``by_source`` splits the hits by cache tier where the engine's version
    exports it (e.g. ``{"device": 9000, "host": 1200}``), else None;
    ``tiers`` holds the same by longctx's tiers with the host transfers
    (:mod:`longctx.backends.tiers`). Where the engine's hit counter leaves out
    what a connector supplied (vLLM), ``hits`` includes it and ``counter``
    names both, so the growth equals the cached tokens the responses report.
    ``started`` tells the server processes read apart: their
    ``process_start_time_seconds`` (one per worker, for a router's sum),
    when ``/metrics`` has it. Two readings with different ``started`` are
    two processes' counters (a load balancer in front of ``/metrics``, or a
    restart), and their difference means nothing.
    """

    counter: str
    hits: int
    queries: int | None
    by_source: Mapping[str, int] | None = None
    tiers: TierReading | None = None
    started: tuple[float, ...] = ()

    def plus(self, other: CacheCounters) -> CacheCounters:
        """The sum of two servers' readings (a router's workers)."""
        queries = None if self.queries is None or other.queries is None else self.queries + other.queries
        sources = None
        if self.by_source is not None and other.by_source is not None:
            sources = {
                k: self.by_source.get(k, 0) + other.by_source.get(k, 0)
                for k in {*self.by_source, *other.by_source}
            }
        tiers = None if self.tiers is None or other.tiers is None else self.tiers.plus(other.tiers)
        return CacheCounters(
            self.counter, self.hits + other.hits, queries, sources, tiers, self.started + other.started
        )


@record_type
class EngineProfile:
    """What longctx knows of one engine (docs/architecture.md). Frozen: register a new one to change it.

    Discovery: ``owned_by`` values of ``/v1/models`` name it; else a 200 on
    ``probe_path`` does; ``discover`` then reads its facts, and
    ``context_setting`` names the setting that gives the context length when
    ``/v1/models`` does not. ``tokenize_path`` (None: no tokenize route) is
    under the server's root; a route that ``tokenize_batches`` takes a list
    of texts; ``tokenize_generation_flag`` says whether
    ``add_generation_prompt=True`` is sent (else only False is, the route's
    default being a chat completion's rendering). ``hit_counter`` is the
    ``/metrics`` counter whose growth equals the cached tokens the responses
    report (None: no counters). ``reporting_setting`` is the setting a
    probe's answer on cached-token reporting fills in (the server does not
    say it); ``doctor_note`` is said of every server of the engine.
    ``caching_setting`` is the setting that turns prefix caching on or off
    (its check's flag is the fix :meth:`caching_fix` names).
    ``checkpoint_setting`` names the setting that holds the folder the model
    was loaded from (None: ``/v1/models``' ``root`` does).
    """

    name: str
    label: str
    missing_report: str
    owned_by: tuple[str, ...] = ()
    probe_path: str | None = None
    discover: Callable[[HttpEndpoint, str], EngineFacts] | None = None
    context_setting: str | None = None
    tokenize_path: str | None = None
    tokenize_batches: bool = False
    tokenize_generation_flag: bool = True
    metrics_path: str = "/metrics"
    hit_counter: str | None = None
    query_counter: str | None = None
    tiers: tuple[CacheTiers, ...] = ()
    chat_id_switches: tuple[str, ...] = ()
    completions_id_switches: tuple[str, ...] = ()
    #: Whether ``/v1/completions`` takes ``prompt`` as a list of token ids (sessions then send the
    #: pack as ids: longctx.sessions.prompt_ids).
    takes_prompt_ids: bool = False
    #: Whether the engine continues a stored prompt in a session without it being resent
    #: (SGLang's ``/open_session`` and ``session_params`` on ``/generate``: longctx.backends.continuation).
    session_api: bool = False
    #: Body fields that make the engine say per request where its cached tokens came from.
    tier_detail_switches: tuple[str, ...] = ()
    #: Where a request caps the prompt tokens it offloads to a host tier: (body field, key in it).
    offload_cap: tuple[str, str] | None = None
    dispatch: tuple[Measured, ...] = ()
    checks: tuple[Check, ...] = ()
    reporting_setting: str | None = None
    caching_setting: str | None = None
    checkpoint_setting: str | None = None
    doctor_note: Finding | None = None
    recipe: RecipeSwitches | None = None
    #: How a request constrains its answer to a JSON Schema, by version (oldest first); () : it cannot.
    schema_forms: tuple[SchemaForm, ...] = ()
    #: Where the server says whether its model takes images: a GET route and the boolean key of its
    #: JSON answer. None: no such route; where the tokenize route takes images (below), a probe asks.
    image_flag: tuple[str, str] | None = None
    #: Whether the tokenize route, given chat messages, expands an image part to all of the image's
    #: tokens (so it counts an image without running the model); else an image's tokens are the
    #: prompt tokens of a one-token chat request less those of the same request without the image.
    tokenize_expands_images: bool = False
    #: How its prefix cache finds a hit (longctx.lint simulates it): ``blocks``, a hash chain over
    #: full blocks up to the first miss (vLLM); ``radix``, a token radix tree in pages (SGLang).
    prefix_cache: Literal["blocks", "radix"] = "blocks"

    @property
    def tokenizes(self) -> bool:
        """Whether the engine has a tokenize route (exact counts, special tokens, token history)."""
        return self.tokenize_path is not None

    def facts(self, endpoint: HttpEndpoint, model: str) -> EngineFacts:
        """What the server says of itself beyond ``/v1/models`` (nothing, for an engine without a reader)."""
        return self.discover(endpoint, model) if self.discover is not None else EngineFacts()

    def id_switches(self, *, completions: bool) -> dict[str, bool]:
        """The body fields that make the engine send the prompt's and the answer's token ids."""
        return dict.fromkeys(self.completions_id_switches if completions else self.chat_id_switches, True)

    def advise(self, observed: Mapping[str, Any]) -> tuple[Finding, ...]:
        """The findings of the profile's checks on ``observed`` settings, warnings first."""
        found = [finding for check in self.checks if (finding := check.finding(observed)) is not None]
        return tuple(sorted(found, key=lambda finding: finding.severity != "warning"))

    def caching_fix(self, observed: Mapping[str, Any]) -> str | None:
        """The launch flag that turns prefix caching on where ``observed`` settings have it off; else None."""
        return next(
            (finding.flag for finding in self.advise(observed) if finding.setting == self.caching_setting),
            None,
        )

    def tiers_for(self, version: str | None) -> CacheTiers | None:
        """The tier metrics of ``version`` (the newest known when it is unknown); None before the first."""
        if version is None:
            return self.tiers[-1] if self.tiers else None
        key = _version_key(version)
        return next((t for t in reversed(self.tiers) if key >= _version_key(t.since)), None)

    def schema_form_for(self, version: str | None) -> SchemaForm | None:
        """How ``version`` takes a schema (the newest known form when unknown); None: it cannot."""
        if version is None:
            return self.schema_forms[-1] if self.schema_forms else None
        key = _version_key(version)
        return next((f for f in reversed(self.schema_forms) if key >= _version_key(f.since)), None)

    def read_counters(self, endpoint: HttpEndpoint, model: str, version: str | None) -> CacheCounters | None:
        """The server's prefix-cache hit counter now, or None where it has none."""
        if self.hit_counter is None:
            return None
        try:
            samples = parse_metrics(endpoint.get_text(self.metrics_path))
        except BackendError:
            return None
        hits = total(samples, self.hit_counter, model=model)
        if hits is None:
            # SGLang creates its labelled counter at the first hit; a server that
            # exports its other metrics (in the counter's namespace) has had none yet.
            namespace = self.hit_counter.partition(":")[0] + ":"
            if not any(sample.name.startswith(namespace) for sample in samples):
                return None
            hits = 0.0
        queries = total(samples, self.query_counter, model=model) if self.query_counter else None
        tiers = self.tiers_for(version)
        counter = self.hit_counter
        reading = read_tiers(samples, tiers, model)
        split = {} if tiers is None else hits_by_label(samples, tiers, model)
        if reading is not None and reading.connector is not None and tiers is not None:
            labels = ",".join(f'{key}="{value}"' for key, value in tiers.connector_labels)
            counter = f"{counter} + {tiers.connector_hits}" + (f"{{{labels}}}" if labels else "")
            hits += reading.connector
        return CacheCounters(
            counter,
            int(hits),
            None if queries is None else int(queries),
            {source: int(tokens) for source, tokens in split.items() if source} or None,
            reading,
            tuple(s.value for s in samples if s.name == "process_start_time_seconds")[:1],
        )


@record_type
class RouterProfile:
    """A router in front of replicas, as data: the router registry's entry (:mod:`.engines`).

    ``keeping_policy`` is the launch flags that keep each pack on one
    replica with longctx's affinity headers. ``salt_blind_policies`` are
    policies that spread a request carrying ``cache_salt`` as if it had no
    affinity. ``lists_workers``: the router answers ``GET /workers``;
    ``probe`` is a route and a key of its JSON answer that tell it from the
    other routers that do (None: the one that answers no probe).
    """

    name: str
    keeping_policy: str
    salt_blind_policies: tuple[str, ...] = ()
    lists_workers: bool = False
    probe: tuple[str, str] | None = None


def _version_key(version: str) -> tuple[int, ...]:
    """``"0.32.0rc1"`` -> ``(0, 32, 0)``: the leading numbers, for ordering."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+", maxsplit=1)[0])[:3])


def truth(value: Any) -> bool | None:
    """A boolean from a JSON bool or a Prometheus label ("True", "false", "1"); None for anything else."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
    return None
