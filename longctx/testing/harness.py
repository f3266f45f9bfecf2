"""Everything a test session needs from the real engines, prepared in the background.

:class:`EngineHarness` builds an engine's environment, the tiny model and the
server on a worker thread as soon as it is told which engines a session will
use, so unit tests run while the servers boot. Asking for a server waits for
that work and re-raises its error, log tail included.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from longctx.testing.environments import ENGINE_SPECS, MARKER_NAME, EngineEnvironment, ensure_environment
from longctx.testing.errors import HarnessError
from longctx.testing.model import TinyModel, build_tiny_model
from longctx.testing.servers import LocalServer, start_sglang, start_vllm

__all__ = ["ENGINES", "EngineHarness", "harness_dir"]

ENGINES = ("vllm", "sglang")
_STARTERS: dict[str, Callable[..., LocalServer]] = {"vllm": start_vllm, "sglang": start_sglang}


def harness_dir(project_root: Path) -> Path:
    """Where the engines' environments, the tiny model and the servers' logs are built.

    ``LONGCTX_HARNESS_DIR`` when set (one build shared by several clones or
    worktrees), else ``.cache/harness`` under ``project_root``. The test
    suite's plugin and the demo both ask here.
    """
    configured = os.environ.get("LONGCTX_HARNESS_DIR")
    return Path(configured).expanduser() if configured else project_root / ".cache" / "harness"


class EngineHarness:
    """Environments, the tiny model and servers under one base folder.

    Thread-safe; every artefact is built at most once per base folder, also
    across processes (file locks).
    """

    def __init__(
        self,
        base_dir: Path,
        *,
        on_progress: Callable[[str], None] | None = None,
        bounded_extras: int = 3,
    ) -> None:
        self.base_dir = base_dir
        self._on_progress = on_progress
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=len(ENGINES), thread_name_prefix="longctx-harness")
        self._environments: dict[str, EngineEnvironment] = {}
        self._environment_locks = {engine: threading.Lock() for engine in ENGINES}
        self._servers: dict[str, Future[LocalServer]] = {}
        # Servers other than the two shared ones (a fleet's second replica, a
        # server started with other flags), by name: booted in the background
        # like them, once per harness, so every module that needs one shares it.
        self._extras: dict[str, Future[LocalServer]] = {}
        # Extras prepared ``bounded``: at most ``bounded_extras`` of them booting or up at once, each
        # slot freed by stop_extra. A real model's server holds 5-7 GB; a fresh clone's run with every
        # extra up at once left later servers under 2 GiB (2026-12-06).
        self._slots = threading.BoundedSemaphore(bounded_extras)
        self._bounded: dict[str, threading.Event] = {}  # by name: set once a caller waits for it
        self._holding: set[str] = set()
        self._memory: dict[str, float] = {}  # by name: GiB a bounded extra waits to find available
        # Bounded extras in the order they were prepared (their tests' order), and those whose boot
        # has begun: each waits for the ones before it, so a later one never takes the memory an
        # earlier one waits for (a fresh clone's run booted SGLang without cache reporting, needed
        # later, while the real model's SGLang waited for room, and its first test waited 95 s).
        self._order: list[str] = []
        self._begun: set[str] = set()
        self._turn = threading.Condition()
        self._closing = threading.Event()
        self._created = time.monotonic()
        self.timings: dict[str, str] = {}

    def prepare(self, engine: str) -> None:
        """Start building and booting ``engine`` in the background (idempotent)."""
        self._check_engine(engine)
        with self._lock:
            if engine not in self._servers:
                self._servers[engine] = self._executor.submit(self._boot, engine)

    def adopt(self, engine: str, server: LocalServer) -> None:
        """Use an already running ``server`` for ``engine`` instead of starting one."""
        self._check_engine(engine)
        future: Future[LocalServer] = Future()
        future.set_result(server)
        with self._lock:
            self._servers[engine] = future

    def environment(self, engine: str) -> EngineEnvironment:
        """The engine's complete virtual environment (built if needed)."""
        self._check_engine(engine)
        # Built in the calling thread: the boot workers call this too, and
        # waiting on the pool from inside the pool would deadlock it.
        with self._environment_locks[engine]:
            if engine not in self._environments:
                started, wall = time.monotonic(), time.time()
                env = ensure_environment(ENGINE_SPECS[engine], self.base_dir, on_progress=self._on_progress)
                took = time.monotonic() - started
                built = (env.root / MARKER_NAME).stat().st_mtime >= wall
                ready = f" (ready at {time.monotonic() - self._created:.0f} s)"
                self.timings[f"{engine} environment"] = f"built in {took:.0f} s{ready}" if built else "reused"
                self._environments[engine] = env
            return self._environments[engine]

    def model(self) -> TinyModel:
        """The tiny model, built with the vLLM environment's Python if absent."""
        return self._model(self.environment("vllm"))

    def _model(self, env: EngineEnvironment) -> TinyModel:
        started = time.monotonic()
        model = build_tiny_model(env.python, self.base_dir)
        self.timings.setdefault("tiny model", _took(started))
        return model

    def server(self, engine: str) -> LocalServer:
        """The running server for ``engine``, waiting for it to be ready."""
        self.prepare(engine)
        return self._servers[engine].result()

    def started_servers(self) -> list[LocalServer]:
        """The shared servers that finished starting, alive or not."""
        with self._lock:
            futures = list(self._servers.values())
        return [f.result() for f in futures if f.done() and f.exception() is None]

    def prepare_extra(
        self,
        name: str,
        start: Callable[[EngineHarness], LocalServer],
        *,
        bounded: bool = False,
        memory_gib: float = 0.0,
    ) -> None:
        """Start booting the extra server ``name`` with ``start(self)`` in the background (idempotent).

        The boot waits its turn behind the shared servers' (one worker per
        engine): on a small machine they come first, extras are booted while
        the tests run. A ``bounded`` extra also waits for one of the
        ``bounded_extras`` slots (freed by :meth:`stop_extra`) and, then, for
        ``memory_gib`` of memory available (Linux's MemAvailable), unless a
        caller of :meth:`extra_server` is already waiting for it.
        """
        with self._lock:
            if name not in self._extras:
                if bounded:
                    self._bounded[name] = threading.Event()
                    self._memory[name] = memory_gib
                    self._order.append(name)
                self._extras[name] = self._executor.submit(self._boot_extra, name, start)

    def extra_server(self, name: str, start: Callable[[EngineHarness], LocalServer]) -> LocalServer:
        """The extra server ``name``, started by ``start`` if not prepared yet; waits until it is ready.

        The harness stops it on :meth:`close`; a caller that stops it itself
        (a test killing a replica) owns what it starts instead.
        """
        self.prepare_extra(name, start)
        demanded = self._bounded.get(name)
        if demanded is not None:
            demanded.set()  # a test needs it now: its boot no longer waits for a slot
        return self._extras[name].result()

    def stop_extra(self, name: str) -> None:
        """Stop the extra server ``name`` now, if it was started (it holds a core and memory)."""
        with self._lock:
            future = self._extras.get(name)
        if future is not None and future.done() and future.exception() is None:
            future.result().stop()
        self._free_slot(name)

    def close(self) -> None:
        """Stop every server this harness started (an extra still waiting for a slot never starts)."""
        self._closing.set()
        with self._lock:
            extras = list(self._extras.values())
        for future in extras:
            if future.done() and future.exception() is None:
                future.result().stop()
        for server in self.started_servers():
            server.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _boot_extra(self, name: str, start: Callable[[EngineHarness], LocalServer]) -> LocalServer:
        demanded = self._bounded.get(name)
        if demanded is not None:
            try:
                self._wait_for_room(name, demanded)
            finally:
                with self._turn:
                    self._begun.add(name)
                    self._turn.notify_all()
        if self._on_progress:
            self._on_progress(f"starting the extra server {name}")
        try:
            server = start(self)
        except BaseException:
            self._free_slot(name)
            raise
        self.timings[f"{name} start"] = self._start_timing(server)
        if self._on_progress:
            self._on_progress(f"{name} ready at {server.api_base} after {server.startup_seconds:.0f} s")
        return server

    def _wait_for_room(self, name: str, demanded: threading.Event) -> None:
        """A bounded extra's wait: its turn, a slot, then its memory (each cut short once a test needs it)."""
        with self._turn:
            earlier = self._order[: self._order.index(name)]
            while not (demanded.is_set() or self._closing.is_set() or self._begun.issuperset(earlier)):
                self._turn.wait(timeout=0.5)
        while not self._slots.acquire(timeout=0.5):
            if self._closing.is_set():
                raise HarnessError(f"the harness closed before the extra server {name} could start")
            if demanded.is_set():
                break
        else:
            with self._lock:
                self._holding.add(name)
        # A booting server has not taken its memory yet: one that waits for room counts the
        # servers already up, not those starting beside it (the slots bound those).
        while _available_gib() < self._memory.get(name, 0.0):
            if self._closing.is_set():
                self._free_slot(name)
                raise HarnessError(f"the harness closed before the extra server {name} could start")
            if demanded.is_set():
                break
            time.sleep(0.5)

    def _free_slot(self, name: str) -> None:
        with self._lock:
            held = name in self._holding
            self._holding.discard(name)
        if held:
            self._slots.release()

    def _boot(self, engine: str) -> LocalServer:
        env = self.environment(engine)
        model = self._model(env)
        if self._on_progress:
            self._on_progress(f"starting the {engine} server")
        server = _STARTERS[engine](env, model, self.base_dir)
        self.timings[f"{engine} server start"] = self._start_timing(server)
        if self._on_progress:
            self._on_progress(
                f"{engine} server ready at {server.api_base} after {server.startup_seconds:.0f} s"
            )
        return server

    def _start_timing(self, server: LocalServer) -> str:
        """A server's start, and when it was ready from this harness's creation (did tests wait for it?)."""
        return f"{server.startup_seconds:.0f} s (ready at {time.monotonic() - self._created:.0f} s)"

    @staticmethod
    def _check_engine(engine: str) -> None:
        if engine not in ENGINES:
            raise HarnessError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")


def _available_gib() -> float:
    """The memory Linux says is available (MemAvailable), in GiB; infinite where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return float("inf")


def _took(started: float) -> str:
    seconds = time.monotonic() - started
    # Under a second means it was already there.
    return f"{seconds:.0f} s" if seconds >= 1 else "reused"
