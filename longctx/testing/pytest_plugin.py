"""Pytest fixtures for real vLLM and SGLang servers on this machine.

Enable it in a ``conftest.py``::

    pytest_plugins = ["longctx.testing.pytest_plugin"]

Fixtures (session scope): ``vllm_server``, ``sglang_server``, ``engine_server``
(parametrised over both engines), ``vllm_fleet`` (two vLLM replicas),
``sglang_without_cache_report``, ``vllm_vision_server`` and
``sglang_vision_server`` (the tiny Qwen2-VL, :mod:`longctx.testing.vision`),
``real_vllm_server``, ``real_sglang_server`` and ``real_engine_server``
(parametrised over both engines: a trained instruct model, for tests of what
the answers say, :mod:`longctx.testing.real_model`), ``real_model``,
``tiny_model``, ``vllm_python`` and
``sglang_python`` (the engines' interpreters), ``longctx_harness``.

Markers: ``vllm`` and ``sglang``. A test that uses a server fixture gets the
engine's marker automatically, so ``-m vllm`` selects it; one that uses
``vllm_fleet`` gets ``fleet`` too. As soon as
collection ends, the servers the selected tests need start booting in the
background, and the tests that need no server run first, meanwhile. Every
server starts once per session, whichever modules use it: the extra ones (a
fleet's second replica, SGLang without cache reporting, the vision servers)
boot after the shared two, while the tests run, and the tests that need them
run last, each extra's together; all but the fleet's are stopped after their
last test.

Rules that keep the real-engine tests honest:

- A server that cannot start is an error with its log tail, never a skip.
- A real-engine test that is skipped anyway fails the run, unless
  ``LONGCTX_ALLOW_ENGINE_SKIPS=1`` is set.
- A server that dies during a test fails that test with the server's log tail.

The harness folder is ``LONGCTX_HARNESS_DIR`` or ``.cache/harness`` under
the pytest root; environments and the model built there are reused.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from longctx.testing.errors import ServerDiedError
from longctx.testing.fleet import Fleet, prepare_replicas
from longctx.testing.harness import ENGINES, EngineHarness, harness_dir
from longctx.testing.model import TinyModel
from longctx.testing.real_model import REAL_SERVERS, prepare_real_model, start_real_server
from longctx.testing.real_model import real_model as real_model_of
from longctx.testing.servers import LocalServer, start_sglang
from longctx.testing.vision import VISION_SERVERS, prepare_vision_assets, start_vision_server

_HARNESS_KEY = pytest.StashKey[EngineHarness]()
_SERVER_FIXTURES = {
    "vllm_server": ("vllm",),
    "sglang_server": ("sglang",),
    "engine_server": (),
    "vllm_fleet": ("vllm",),
    "sglang_without_cache_report": ("sglang",),
    "vllm_vision_server": ("vllm",),
    "sglang_vision_server": ("sglang",),
    "real_vllm_server": ("vllm",),
    "real_sglang_server": ("sglang",),
    "real_engine_server": (),
}
# Fixtures that need an engine's environment (the tiny model is built with vLLM's Python) but no
# server: their tests carry the engine's marker too, so ``-m "not vllm and not sglang"`` selects the
# tests that need no engine at all (scripts/test runs those beside the others).
_ENVIRONMENT_FIXTURES = {
    "tiny_model": ("vllm",),
    "vllm_python": ("vllm",),
    "sglang_python": ("sglang",),
    "real_model": ("vllm",),
}
# The real-model servers' fixtures: extras of their own, never the shared tiny-model servers.
_REAL_FIXTURES = ("real_vllm_server", "real_sglang_server", "real_engine_server")
_NO_CACHE_REPORT = "sglang-without-cache-report"
# The vision servers' fixtures, each with its engine.
_VISION_FIXTURES = {"vllm_vision_server": "vllm", "sglang_vision_server": "sglang"}


def _start_sglang_without_cache_report(harness: EngineHarness) -> LocalServer:
    env = harness.environment("sglang")
    return start_sglang(env, harness.model(), harness.base_dir, cache_report=False)


def _vision_starter(engine: str) -> Callable[[EngineHarness], LocalServer]:
    return lambda harness: start_vision_server(harness, engine)


def _real_starter(engine: str) -> Callable[[EngineHarness], LocalServer]:
    return lambda harness: start_real_server(harness, engine)


# Extras stopped after their last test (they hold a core and memory): by fixture, the server's name
# and starter, in the order their tests run. The fleet's replica runs to the end.
_STOPPED_EXTRAS: dict[str, tuple[str, Callable[[EngineHarness], LocalServer]]] = {
    "real_vllm_server": (REAL_SERVERS["vllm"], _real_starter("vllm")),
    "real_sglang_server": (REAL_SERVERS["sglang"], _real_starter("sglang")),
    "sglang_without_cache_report": (_NO_CACHE_REPORT, _start_sglang_without_cache_report),
    "sglang_vision_server": (VISION_SERVERS["sglang"], _vision_starter("sglang")),
    "vllm_vision_server": (VISION_SERVERS["vllm"], _vision_starter("vllm")),
}
# Memory an extra's boot waits to find available (GiB): the real model's servers held 5.8-6.7 GB
# (float32 weights, KV cache, the engine's processes), the tiny model's 2-3.5 GB (2026-12-06).
_MEMORY_GIB = {"real_vllm_server": 7.0, "real_sglang_server": 6.5}
# Fixtures whose servers are the harness's extras: booted after the shared ones.
_EXTRA_FIXTURES = (*_STOPPED_EXTRAS, "vllm_fleet")


def pytest_configure(config: pytest.Config) -> None:
    # One intra-op thread in each server the session starts (they inherit this process's environment),
    # unless the caller chose: a session runs several servers and pytest beside each other on a few
    # cores, where two OpenMP threads a server waited on each other at every operation. With two
    # processes spinning beside it (2 cores, 2026-12-06), the real model's cold prefill and 13 cached
    # siblings took SGLang 148 s and 156 s of CPU with two threads, 63 s and 63 s with one; vLLM 79 s
    # and 83 s against 38 s and 37 s; the same answers.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for engine in ENGINES:
        config.addinivalue_line("markers", f"{engine}: talks to the real {engine} server of the test harness")
    config.addinivalue_line("markers", "fleet: uses vllm_fleet (replicas killed and restarted, routers)")
    base_dir = harness_dir(Path(str(config.rootpath)))

    # The process's own stderr, bound now: the harness boots servers in background threads, and a
    # test that swaps sys.stderr meanwhile (click's CliRunner) would otherwise capture the progress
    # line as its command's output.
    stream = sys.__stderr__ or sys.stderr

    def progress(message: str) -> None:
        print(f"[longctx harness] {message}", file=stream, flush=True)

    harness = EngineHarness(base_dir, on_progress=progress)
    config.stash[_HARNESS_KEY] = harness
    config.pluginmanager.register(_EngineGuard(harness), "longctx-engine-guard")


def harness_of(config: pytest.Config) -> EngineHarness:
    """The :class:`EngineHarness` of a pytest run (to ``adopt`` a server, say)."""
    return config.stash[_HARNESS_KEY]


def _extras_of(item: pytest.Item) -> set[str]:
    """The extra servers' fixtures ``item`` uses (``real_engine_server`` counts as its engine's)."""
    names = set(getattr(item, "fixturenames", ()))
    extras = set(_EXTRA_FIXTURES) & names
    callspec = getattr(item, "callspec", None)
    if "real_engine_server" in names and callspec is not None:
        extras.add(f"real_{callspec.params['real_engine_server']}_server")
    return extras


def _engines_of(item: pytest.Item) -> set[str]:
    engines = {marker.name for marker in item.iter_markers() if marker.name in ENGINES}
    for fixture, names in (*_SERVER_FIXTURES.items(), *_ENVIRONMENT_FIXTURES.items()):
        if fixture in getattr(item, "fixturenames", ()):
            engines.update(names)
    return engines


class _EngineGuard:
    """Boots the needed servers early and keeps real-engine tests honest."""

    def __init__(self, harness: EngineHarness) -> None:
        self.harness = harness
        self.skipped: list[str] = []
        self.outcomes: dict[str, dict[str, int]] = {engine: {} for engine in ENGINES}
        # By node id, from markers: report keywords also hold parameter ids,
        # and a test parametrised with the string "vllm" is no engine test.
        self.engines_by_test: dict[str, set[str]] = {}
        self.allow_skips = os.environ.get("LONGCTX_ALLOW_ENGINE_SKIPS") == "1"
        # The extra servers to stop after a test, by its node id.
        self.stop_after: dict[str, list[str]] = {}

    # Before pytest's own "-m" selection, which must see the engine markers.
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            engines = _engines_of(item)
            for engine in engines:
                item.add_marker(getattr(pytest.mark, engine))
            if engines:
                self.engines_by_test[item.nodeid] = engines
            if "vllm_fleet" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.fleet)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        # After every selection and reordering: tests that need no server run
        # first, while the servers boot; then those of each stopped extra, then
        # those on the shared servers alone, then the fleet's.
        extras = _extras_of
        engine_items = [item for item in session.items if item.nodeid in self.engines_by_test]
        groups: list[list[pytest.Item]] = []
        placed: set[str] = set()
        # Each stopped extra's tests together, SGLang's first: each is stopped after its last
        # test, before the next group's (and the fleet's) tests need the cores.
        for fixture in (*_STOPPED_EXTRAS, "vllm_fleet"):
            group = [item for item in engine_items if fixture in extras(item) and item.nodeid not in placed]
            placed.update(item.nodeid for item in group)
            groups.append(group)
        # The stopped extras' groups before the tests on the shared servers alone: each extra (the
        # real model's servers hold 4-5 GB) is gone before those tests start servers of their own
        # (`longctx serve`, a killed server's restart); a fresh clone's run found under 2 GiB free
        # for them while every extra was still up (2026-12-06). The fleet's group stays last.
        *extra_groups, fleet_group = groups
        session.items[:] = [
            *(item for item in session.items if item.nodeid not in self.engines_by_test),
            *(item for group in extra_groups for item in group),
            *(item for item in engine_items if not extras(item)),
            *fleet_group,
        ]
        self.stop_after = {}
        for fixture, (name, _) in _STOPPED_EXTRAS.items():
            users = [item for item in session.items if fixture in extras(item)]
            if users:
                self.stop_after.setdefault(users[-1].nodeid, []).append(name)
        if session.config.option.collectonly:
            return
        needed: set[str] = set()
        wanted: set[str] = set()
        for item in session.items:
            if (_SERVER_FIXTURES.keys() - set(_REAL_FIXTURES)) & set(getattr(item, "fixturenames", ())):
                needed |= _engines_of(item)
            wanted |= extras(item)
        if wanted & {"real_vllm_server", "real_sglang_server"}:
            # First: its download and conversion need no engine environment (longctx's own Python), so
            # they run while the environments build.
            prepare_real_model(self.harness)
        for engine in ENGINES:
            if engine in needed:
                self.harness.prepare(engine)
        vision = [engine for fixture, engine in _VISION_FIXTURES.items() if fixture in wanted]
        if vision:  # built beside the shared servers' boots, not in the extras' queue behind them
            prepare_vision_assets(self.harness, vision)
        # Queued behind the shared servers' boots (submitted after them), in the order of their tests.
        for fixture, (name, start) in _STOPPED_EXTRAS.items():
            if fixture in wanted:
                self.harness.prepare_extra(
                    name, start, bounded=True, memory_gib=_MEMORY_GIB.get(fixture, 3.0)
                )
        if "vllm_fleet" in wanted:
            prepare_replicas(self.harness)

    def _servers_used(self, item: pytest.Item) -> list[LocalServer]:
        engines = _engines_of(item)
        return [server for server in self.harness.started_servers() if server.name in engines]

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        for server in self._servers_used(item):
            server.check_alive()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.when != "call":
            return report
        for server in self._servers_used(item):
            try:
                server.check_alive()
            except ServerDiedError as error:
                report.outcome = "failed"
                report.longrepr = f"{report.longrepr}\n\n{error}" if report.longrepr else str(error)
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            for name in self.stop_after.get(report.nodeid, ()):
                self.harness.stop_extra(name)  # no later test needs it
        engines = sorted(self.engines_by_test.get(report.nodeid, ()))
        if not engines or (report.when != "call" and report.passed):
            return
        outcome = "error" if report.when != "call" and report.failed else report.outcome
        for engine in engines:
            counts = self.outcomes[engine]
            counts[outcome] = counts.get(outcome, 0) + 1
        if report.skipped:
            self.skipped.append(report.nodeid)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.skipped and not self.allow_skips and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        ran = {engine: counts for engine, counts in self.outcomes.items() if counts}
        if ran:
            terminalreporter.section("real-engine tests", sep="=", bold=True)
            for engine, counts in ran.items():
                summary = ", ".join(f"{count} {outcome}" for outcome, count in sorted(counts.items()))
                terminalreporter.line(f"{engine}: {summary}")
            if self.harness.timings:
                timings = ", ".join(f"{name} {value}" for name, value in self.harness.timings.items())
                terminalreporter.line(f"harness setup: {timings}")
        if not self.skipped:
            return
        verdict = "allowed by LONGCTX_ALLOW_ENGINE_SKIPS=1" if self.allow_skips else "this fails the run"
        terminalreporter.section("real-engine tests skipped", sep="=", red=not self.allow_skips, bold=True)
        for nodeid in self.skipped:
            terminalreporter.line(f"SKIPPED {nodeid}")
        terminalreporter.line(f"{len(self.skipped)} real-engine test(s) skipped: {verdict}")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.harness.close()


@pytest.fixture(scope="session")
def longctx_harness(request: pytest.FixtureRequest) -> EngineHarness:
    """The session's :class:`EngineHarness`."""
    return request.config.stash[_HARNESS_KEY]


@pytest.fixture(scope="session")
def tiny_model(longctx_harness: EngineHarness) -> TinyModel:
    """The locally built tiny Llama served by both engines."""
    return longctx_harness.model()


@pytest.fixture(scope="session")
def vllm_python(longctx_harness: EngineHarness) -> Path:
    """The interpreter of the vLLM environment (for parsing vLLM's own arguments, say)."""
    return longctx_harness.environment("vllm").python


@pytest.fixture(scope="session")
def sglang_python(longctx_harness: EngineHarness) -> Path:
    """The interpreter of the SGLang environment."""
    return longctx_harness.environment("sglang").python


@pytest.fixture(scope="session")
def vllm_server(longctx_harness: EngineHarness) -> Iterator[LocalServer]:
    """A running vLLM (CPU) server on the tiny model."""
    yield longctx_harness.server("vllm")


@pytest.fixture(scope="session")
def sglang_server(longctx_harness: EngineHarness) -> Iterator[LocalServer]:
    """A running SGLang (CPU) server on the tiny model."""
    yield longctx_harness.server("sglang")


@pytest.fixture(
    scope="session",
    params=[pytest.param("vllm", marks=pytest.mark.vllm), pytest.param("sglang", marks=pytest.mark.sglang)],
)
def engine_server(request: pytest.FixtureRequest, longctx_harness: EngineHarness) -> LocalServer:
    """Each engine's server in turn: the test runs once per engine."""
    engine: str = request.param
    return longctx_harness.server(engine)


@pytest.fixture(scope="session")
def vllm_fleet(longctx_harness: EngineHarness) -> Iterator[Fleet]:
    """Two vLLM (CPU) replicas on the tiny model, and routers on demand (:class:`Fleet`).

    Session-scoped, shared by every module: the second replica boots in the
    background once the session knows it is needed. A test that kills a
    replica restarts it before it ends (or the next test fails on a dead
    replica); a test stops the routers it started.
    """
    with Fleet(longctx_harness, replicas=2) as fleet:
        yield fleet


@pytest.fixture(scope="session")
def sglang_without_cache_report(longctx_harness: EngineHarness) -> LocalServer:
    """An SGLang (CPU) server without ``--enable-cache-report``, shared by every module that needs one.

    SGLang has no per-request switch for cached-token reporting: it is a
    server flag, so this is a server of its own, booted in the background.
    """
    return longctx_harness.extra_server(_NO_CACHE_REPORT, _start_sglang_without_cache_report)


@pytest.fixture(scope="session")
def vllm_vision_server(longctx_harness: EngineHarness) -> LocalServer:
    """vLLM (CPU) serving the tiny Qwen2-VL, images in chat requests; stopped after its last test."""
    name, start = _STOPPED_EXTRAS["vllm_vision_server"]
    return longctx_harness.extra_server(name, start)


@pytest.fixture(scope="session")
def sglang_vision_server(longctx_harness: EngineHarness) -> LocalServer:
    """SGLang (CPU) serving the tiny Qwen2-VL, images in chat requests; stopped after its last test."""
    name, start = _STOPPED_EXTRAS["sglang_vision_server"]
    return longctx_harness.extra_server(name, start)


@pytest.fixture(scope="session")
def real_model(longctx_harness: EngineHarness) -> TinyModel:
    """The trained instruct model's folder (:mod:`longctx.testing.real_model`), converted once."""
    return real_model_of(longctx_harness)


@pytest.fixture(scope="session")
def real_vllm_server(longctx_harness: EngineHarness) -> LocalServer:
    """vLLM (CPU, float32) serving the trained instruct model; stopped after its last test."""
    name, start = _STOPPED_EXTRAS["real_vllm_server"]
    return longctx_harness.extra_server(name, start)


@pytest.fixture(scope="session")
def real_sglang_server(longctx_harness: EngineHarness) -> LocalServer:
    """SGLang (CPU, float32) serving the trained instruct model; stopped after its last test."""
    name, start = _STOPPED_EXTRAS["real_sglang_server"]
    return longctx_harness.extra_server(name, start)


@pytest.fixture(
    scope="session",
    params=[pytest.param("vllm", marks=pytest.mark.vllm), pytest.param("sglang", marks=pytest.mark.sglang)],
)
def real_engine_server(request: pytest.FixtureRequest, longctx_harness: EngineHarness) -> LocalServer:
    """Each engine's real-model server in turn: the test runs once per engine."""
    name, start = _STOPPED_EXTRAS[f"real_{request.param}_server"]
    return longctx_harness.extra_server(name, start)
