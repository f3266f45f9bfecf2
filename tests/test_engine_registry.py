"""The engine as data: one registry names engines, and a new engine is one profile.

``test_no_module_outside_the_registry_compares_engine_names`` holds the
rule (like the import-circle rule of tests/test_layout.py): outside
``longctx/backends/engines.py``, no module compares a string against a
registered engine's name (``==``, ``!=``, ``in``, ``not in``), matches a
``case`` on one, keys a dict literal by one or looks one up by it
(``x["vllm"]``, ``x.get("vllm")``). Names in data that is no comparison
(a launch command's argv, ``Recipe(engine="vllm")``, the catalogue of
validated (model, engine) deployments, messages) are fine.
``longctx/testing/`` is left out: the harness builds and starts the real
engines by name, it knows nothing of what they serve.

``test_no_module_outside_the_registry_names_a_metric_or_a_router`` holds
the same for the engines' metric names (a string literal that starts with
``vllm:``, ``sglang:`` or ``lmcache``) and the routers' names (compared,
matched or keyed like an engine's): they live in the registry
(``backends/engines.py``, its data types in ``backends/profiles.py``), and
other modules ask it (``CacheTiers``, ``RouterProfile``, ``find_router``).

``test_a_new_engine_is_one_profile`` registers a stand-in engine and runs
a session against a fake server of it, changing no other module.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fake_engine import FakeEngine
from pack_fixtures import corpus_of, document

from longctx.backends.base import connect
from longctx.backends.engines import GENERIC, SGLANG, VLLM, find_profile, profiles, registered, routers
from longctx.backends.http import HttpEndpoint
from longctx.backends.profiles import CacheTiers, Check, EngineFacts, EngineProfile, Measured, truth
from longctx.errors import ServingConfigError
from longctx.options.groups import RequestOptions
from longctx.serving import recipe_for, suggest_server_flags
from longctx.serving.doctor import diagnose
from longctx.sessions import Session
from longctx.sessions.corpus_sessions import pack_for_server
from longctx.store import Store
from longctx.verification import counters

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "longctx" / "backends" / "engines.py"
#: The registry's data types: they may name what they describe in their docstrings and defaults.
REGISTRY_TYPES = ROOT / "longctx" / "backends" / "profiles.py"
METRIC_PREFIXES = ("vllm:", "sglang:", "lmcache")
HARNESS = ROOT / "longctx" / "testing"


def _named(node: ast.AST | None, names: set[str]) -> bool:
    """Whether ``node`` is a string literal naming an engine, or a tuple/list/set holding one."""
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(isinstance(item, ast.Constant) and item.value in names for item in node.elts)
    return False


def engine_name_uses(source: str, names: set[str]) -> list[str]:
    """Each comparison, case, table key or lookup in ``source`` naming one of ``names``, as ``line: code``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        hit = False
        if isinstance(node, ast.Compare):
            hit = any(_named(operand, names) for operand in (node.left, *node.comparators))
        elif isinstance(node, ast.MatchValue):
            hit = _named(node.value, names)
        elif isinstance(node, ast.Dict):
            hit = any(isinstance(key, ast.Constant) and key.value in names for key in node.keys)
        elif isinstance(node, ast.Subscript):
            hit = isinstance(node.slice, ast.Constant) and node.slice.value in names
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            hit = bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value in names
        if hit:
            found.append(f"{getattr(node, 'lineno', '?')}: {ast.unparse(node)[:80]}")
    return found


def test_no_module_outside_the_registry_compares_engine_names() -> None:
    names = {profile.name for profile in profiles()}
    assert {"vllm", "sglang", "generic"} <= names
    strays = []
    for path in sorted((ROOT / "longctx").rglob("*.py")):
        if path == REGISTRY or HARNESS in path.parents:
            continue
        for use in engine_name_uses(path.read_text(encoding="utf-8"), names):
            strays.append(f"{path.relative_to(ROOT)}:{use}")
    assert not strays, "engine names compared outside backends/engines.py (ask the profile):\n" + "\n".join(
        strays
    )


def test_the_engine_name_check_finds_each_kind_of_use() -> None:
    names = {"vllm", "sglang"}
    flagged = [
        'if engine == "vllm": pass',
        'ok = info.engine in ("vllm", "sglang")',
        'ok = "sglang" != engine',
        'match engine:\n    case "vllm":\n        pass',
        'TABLE = {"vllm": 1}',
        'flag = TABLE["sglang"]',
        'flag = TABLE.get("vllm", 0)',
    ]
    for source in flagged:
        assert engine_name_uses(source, names), source
    allowed = [
        'argv = ["vllm", "serve", model]',
        'recipe = Recipe(engine="vllm")',
        'message = f"use vllm or {other}"',
        'CATALOGUE = {("kimi", "vllm"): build}',
        "if engine == profile.name: pass",
    ]
    for source in allowed:
        assert not engine_name_uses(source, names), source


def registry_literals(source: str, routers: set[str]) -> list[str]:
    """Each string literal in ``source`` (f-string parts included) that is a metric name or a router's name.

    A metric name starts with an engine's metric prefix; a router's name is
    the whole literal (a router appears outside the registry only as data it
    returned, never written out: ``"vllm-router:consistent_hash"`` in a
    docstring is no router's name).
    """
    return [
        f"{node.lineno}: {node.value[:60]!r}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value.startswith(METRIC_PREFIXES) or node.value in routers)
    ]


def test_no_module_outside_the_registry_names_a_metric_or_a_router() -> None:
    router_names = {router.name for router in routers()}
    assert {"vllm-router", "smg"} <= router_names
    strays = []
    for path in sorted((ROOT / "longctx").rglob("*.py")):
        if path in (REGISTRY, REGISTRY_TYPES) or HARNESS in path.parents:
            continue
        for use in registry_literals(path.read_text(encoding="utf-8"), router_names):
            strays.append(f"{path.relative_to(ROOT)}:{use}")
    assert not strays, "metric or router names outside backends/engines.py (ask the registry):\n" + "\n".join(
        strays
    )


def test_the_metric_and_router_check_finds_a_planted_use() -> None:
    routers = {"vllm-router", "smg"}
    for source in (
        'HOST = (("vllm:kv_offload_total_bytes_total", {"transfer_type": "CPU_to_GPU"}),)',
        'found = total(samples, "sglang:cached_tokens_total")',
        'name = f"vllm:{kind}_total"',
        'HITS = "lmcache_mp_lookup_hit_tokens_total"',
        'if router.name == "vllm-router": pass',
        'POLICIES = {"smg": "--policy consistent_hashing"}',
        'name = "vllm-router" if listed else "smg"',
    ):
        assert registry_literals(source, routers), source
    for source in (
        '"""The vllm:cache_config_info gauge and its labels."""',
        'label = "vllm"',
        'example = "vllm-router:round_robin"',
        'reason = f"{router.name} found in front"',
    ):
        assert not registry_literals(source, routers), source


def test_the_built_in_profiles_keep_what_the_engines_said() -> None:
    assert [VLLM.tokenize_path, SGLANG.tokenize_path, GENERIC.tokenize_path] == [
        "/tokenize",
        "/v1/tokenize",
        None,
    ]
    assert VLLM.id_switches(completions=False) == {"return_token_ids": True}
    assert SGLANG.id_switches(completions=True) == {"return_token_ids": True}
    assert SGLANG.id_switches(completions=False) == {
        "return_input_ids_in_sglext": True,
        "return_output_ids_in_sglext": True,
    }
    assert GENERIC.id_switches(completions=True) == {}
    # Tier metrics by version: 0.24 counts prompt tokens by source (local hit, connector) and the
    # offload transfers; 0.32 splits the cached tokens by tier.
    early, late = VLLM.tiers_for("0.24.0"), VLLM.tiers_for("0.32.0")
    assert early is not None and early.hits_by_source == "vllm:prompt_tokens_by_source_total"
    assert early.host_sources == ("external_kv_transfer",)
    assert "vllm:kv_offload_total_bytes_total" in early.metrics
    assert late is not None and late.hits_by_source == "vllm:prompt_tokens_cached_by_source_total"
    assert VLLM.tiers_for("0.10.1") is None and VLLM.tiers_for(None) == late
    sglang = SGLANG.tiers_for("0.5.23")
    assert sglang is not None and sglang.source_label == "cache_source"
    assert "sglang:hicache_host_used_tokens" in sglang.metrics


def _metrics_endpoint(text: str) -> HttpEndpoint:
    return HttpEndpoint(
        "http://metrics.test:8000/v1",
        timeout=5.0,
        transport=httpx2.MockTransport(lambda request: httpx2.Response(200, text=text)),
    )


def test_counters_split_hits_by_tier_where_the_version_exports_it() -> None:
    text = (
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 900.0\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0\n'
        'vllm:prompt_tokens_cached_by_source_total{model_name="m",source="device"} 700.0\n'
        'vllm:prompt_tokens_cached_by_source_total{model_name="m",source="host"} 200.0\n'
        'vllm:prompt_tokens_cached_by_source_total{model_name="other",source="host"} 50.0\n'
    )
    reading = VLLM.read_counters(_metrics_endpoint(text), "m", "0.32.0")
    assert reading is not None and (reading.hits, reading.queries) == (900, 1000)
    assert reading.by_source == {"device": 700, "host": 200}
    older = VLLM.read_counters(_metrics_endpoint(text), "m", "0.24.0")
    assert older is not None and older.hits == 900 and older.by_source is None
    sglang = (
        'sglang:cached_tokens_total{cache_source="device",model_name="m"} 30.0\n'
        'sglang:cached_tokens_total{cache_source="host",model_name="m"} 12.0\n'
    )
    reading = SGLANG.read_counters(_metrics_endpoint(sglang), "m", "0.5.23")
    assert reading is not None and reading.hits == 42 and reading.by_source == {"device": 30, "host": 12}
    assert GENERIC.read_counters(_metrics_endpoint(sglang), "m", None) is None


# -- a new engine: one profile ---------------------------------------------------

TOY_URL = "http://toy-engine:9000/v1"


def _toy_facts(endpoint: HttpEndpoint, model: str) -> EngineFacts:
    info = endpoint.get_json("/toy/info")
    return EngineFacts(version=info["version"], prefix_caching=True, metrics=True, settings=info["settings"])


TOY = EngineProfile(
    name="toyengine",
    label="ToyEngine",
    missing_report="ToyEngine does not report cached tokens: start it with --report-cache",
    owned_by=("toyengine",),
    discover=_toy_facts,
    tokenize_path="/toy/tokenize",
    metrics_path="/toy/metrics",
    hit_counter="toy:hit_tokens_total",
    query_counter="toy:prompt_tokens_total",
    tiers=(CacheTiers("1.0", hits_by_source="toy:hit_tokens_by_tier_total", source_label="tier"),),
    chat_id_switches=("toy_ids",),
    dispatch=(Measured("1.", "together", 3, "the toy's own measurement"),),
    checks=(
        Check(
            "suggestion", "fp8_cache", lambda value: truth(value) is False, "--fp8-cache", "halves KV memory"
        ),
    ),
)


class ToyServer:
    """A fake ToyEngine: its own discovery, tokenize and metrics routes; the chat of :class:`FakeEngine`."""

    def __init__(self) -> None:
        self.chat = FakeEngine(engine="generic", block=1)
        self.tokenized: list[dict[str, Any]] = []
        self.paths: set[str] = set()

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        path, model = request.url.path, self.chat.model
        self.paths.add(path)
        if path == "/v1/models":
            entry = {"id": model, "owned_by": "toyengine", "max_model_len": 32768}
            return httpx2.Response(200, json={"data": [entry]})
        if path == "/toy/info":
            return httpx2.Response(200, json={"version": "1.2", "settings": {"fp8_cache": False}})
        if path == "/toy/tokenize":
            body = json.loads(request.content)
            self.tokenized.append(body)
            texts = (
                [message["content"] for message in body["messages"]]
                if "messages" in body
                else [body["prompt"]]
            )
            # One token per word, and five for a chat template's framing.
            ids = [3] * 5 * ("messages" in body) + [len(word) for text in texts for word in text.split()]
            return httpx2.Response(200, json={"tokens": ids})
        if path == "/toy/metrics":
            hits = float(self.chat.hits_total)
            return httpx2.Response(
                200,
                text=f'toy:hit_tokens_total{{model_name="{model}"}} {hits}\n'
                f'toy:prompt_tokens_total{{model_name="{model}"}} {float(self.chat.queries_total)}\n'
                f'toy:hit_tokens_by_tier_total{{model_name="{model}",tier="hbm"}} {hits}\n',
            )
        return self.chat.handle(request)


def test_a_new_engine_is_one_profile(tmp_path: Path) -> None:
    server = ToyServer()
    transport = httpx2.MockTransport(server.handle)
    with registered(TOY), Store.open(tmp_path / "home") as store:
        backend = connect(TOY_URL, transport=transport, async_transport=transport)
        info = backend.info
        assert (info.profile, info.engine, info.version) == (TOY, "toyengine", "1.2")

        # Packing counts with the toy's own tokenize route (exact, not the estimate).
        corpus = corpus_of([document("a.py", "x = 1\n" * 50), document("b.py", "y = 2\n" * 40)])
        pack = pack_for_server(corpus, backend, store=store, request=RequestOptions())
        assert not pack.estimated and server.tokenized

        session = Session(backend, pack, store=store, request=RequestOptions(counter_check=True))
        assert session.ask("What is x?").text == server.chat.answer
        batch = session.ask_many([f"sibling {index}?" for index in range(5)])
        assert len(batch.answers) == 5
        assert batch.report.dispatch is not None
        assert batch.report.dispatch.startswith(
            "together, up to 3 in flight (auto for toyengine 1.2: the toy's own measurement)"
        )
        assert counters.wait_for_checks(10)

        # The counter check read the toy's counter on its metrics route, and it matched.
        check = session.report().counter_check
        assert check is not None and check.matches is True, check
        assert check.counter == "toy:hit_tokens_total"
        assert check.server_delta == check.reported == server.chat.hits_total > 0
        reading = backend.counters()[info.api_url]
        assert reading is not None and reading.by_source == {"hbm": server.chat.hits_total}

        # Doctor runs the toy's checks; the advice and the registry list it.
        assert suggest_server_flags("toyengine", {"fp8_cache": "false"})[0].flag == "--fp8-cache"
        assert [finding.flag for finding in diagnose(backend, probe=False).findings] == ["--fp8-cache"]
        assert find_profile("toyengine") is TOY and TOY in profiles()
        backend.close()
    # Nothing asked another engine's routes of it.
    assert not server.paths & {"/metrics", "/tokenize", "/v1/tokenize", "/server_info", "/version"}

    # Unregistered again: the same server is any OpenAI-compatible one.
    assert find_profile("toyengine") is None
    with connect(TOY_URL, transport=transport) as plain:
        assert plain.info.profile is GENERIC
    with pytest.raises(ServingConfigError, match="unknown engine 'toyengine'"):
        recipe_for("m", "toyengine", config={})
