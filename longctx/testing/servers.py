"""Start, watch and stop real inference servers on this machine.

A :class:`LocalServer` is one server process (and its children, in their own
process group) listening on a loopback port, with its output in a log file.
Starting waits for readiness with a timeout; any failure to become ready, and
any later death, raises an error carrying the tail of the server's log.

The engine launchers pin what makes the servers trustworthy for longctx's
tests: prefix caching and cached-token reporting on, Hugging Face hub access
off (``HF_HUB_OFFLINE=1`` and a private ``HF_HOME``), loopback only.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from types import TracebackType

from longctx.testing._logs import log_tail
from longctx.testing.environments import EngineEnvironment
from longctx.testing.errors import ServerDiedError, ServerStartError
from longctx.testing.model import TinyModel

__all__ = [
    "CONTEXT_LENGTH",
    "LocalServer",
    "find_free_port",
    "port_is_free",
    "server_environment",
    "sglang_command",
    "start_server",
    "start_sglang",
    "start_vllm",
    "vllm_command",
]

HOST = "127.0.0.1"
CONTEXT_LENGTH = 32768
_ADDRESS_IN_USE = ("address already in use", "errno 98")
_RUNNING: weakref.WeakSet[LocalServer] = weakref.WeakSet()


def port_is_free(port: int, host: str = HOST) -> bool:
    """True when nothing listens on ``host:port`` and a server can bind it now.

    With ``SO_REUSEADDR``, as vLLM and uvicorn bind: a port whose last
    connections linger in TIME_WAIT (a server just stopped) is free to them,
    so a restarted server gets its port, and so its URL, back.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def find_free_port(preferred: int | None = None, host: str = HOST) -> int:
    """``preferred`` if it is free, else a port the kernel reports free."""
    if preferred is not None and port_is_free(preferred, host):
        return preferred
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


class LocalServer:
    """A running server process group with a log file.

    Use it as a context manager, or call :meth:`stop`. ``base_url`` is the
    server's root (``http://127.0.0.1:PORT``); ``api_base`` adds ``/v1``.
    """

    def __init__(self, name: str, process: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
        self.name = name
        self.process = process
        self.port = port
        self.log_path = log_path
        self.started_at = time.monotonic()
        self.startup_seconds: float | None = None
        _RUNNING.add(self)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def api_base(self) -> str:
        return f"{self.base_url}/v1"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)

    def check_alive(self) -> None:
        """Raise :class:`ServerDiedError` with the log tail if the server has exited."""
        code = self.process.poll()
        if code is not None:
            raise ServerDiedError(
                f"the {self.name} server (pid {self.pid}, port {self.port}) exited with code {code}",
                returncode=code,
                log_tail=self.log_tail(),
            )

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after ``timeout`` seconds."""
        _RUNNING.discard(self)
        _signal_group(self.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout)
        # Engines leave worker processes behind the leader; the group outlives it.
        _signal_group(self.pid, signal.SIGKILL)
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout)

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive() else f"exited {self.process.returncode}"
        return f"<LocalServer {self.name} pid={self.pid} {self.base_url} {state}>"


def _signal_group(pid: int, signum: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_RUNNING):
        server.stop(timeout=10)


ReadyCheck = Callable[[LocalServer], bool]


def http_ok(url: str, timeout: float = 5.0) -> bool:
    """True when GET ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def start_server(
    name: str,
    argv: Sequence[str],
    *,
    log_dir: Path,
    ready: ReadyCheck,
    env: Mapping[str, str] | None = None,
    port: int | None = None,
    ready_timeout: float = 600.0,
    attempts: int = 3,
) -> LocalServer:
    """Start ``argv`` (``{port}`` is replaced) and wait until ``ready`` says so.

    A busy ``port`` is avoided: another free port is taken, and if the
    server still loses a race for its port it is started again on a new one
    (up to ``attempts`` times). Raises :class:`ServerStartError` with the log
    tail if the server exits or is not ready within ``ready_timeout`` seconds;
    a server that failed to start is always stopped.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    last_error: ServerStartError | None = None
    for _ in range(attempts):
        chosen = find_free_port(port)
        log_path = log_dir / f"{name}-{chosen}.log"
        command = [part.replace("{port}", str(chosen)) for part in argv]
        with log_path.open("wb") as log:
            log.write(f"$ {' '.join(command)}\n".encode())
            log.flush()
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )
        server = LocalServer(name, process, chosen, log_path)
        try:
            _wait_ready(server, ready, ready_timeout)
            server.startup_seconds = time.monotonic() - server.started_at
            return server
        except ServerStartError as error:
            server.stop(timeout=10)
            if not any(marker in error.log_tail.lower() for marker in _ADDRESS_IN_USE):
                raise
            last_error = error
            port = None
    assert last_error is not None
    raise last_error


def _wait_ready(server: LocalServer, ready: ReadyCheck, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        code = server.process.poll()
        if code is not None:
            raise ServerStartError(
                f"the {server.name} server exited with code {code} before it was ready "
                f"(port {server.port}, log {server.log_path})",
                log_tail=server.log_tail(),
            )
        if ready(server):
            return
        if time.monotonic() > deadline:
            raise ServerStartError(
                f"the {server.name} server was not ready after {timeout:.0f} s "
                f"(port {server.port}, log {server.log_path})",
                log_tail=server.log_tail(),
            )
        time.sleep(1.0)


def _chat_answers(server: LocalServer, model: TinyModel) -> bool:
    """One real one-token completion: the engine is loaded, not only listening."""
    body = json.dumps(
        {"model": model.served_name, "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 1}
    ).encode()
    request = urllib.request.Request(
        f"{server.api_base}/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _engine_ready(health_path: str, model: TinyModel) -> ReadyCheck:
    def ready(server: LocalServer) -> bool:
        return http_ok(server.base_url + health_path) and _chat_answers(server, model)

    return ready


def server_environment(base_dir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for an engine: offline, private hub cache, no telemetry."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("LONGCTX_")}
    environment.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            # A private, initially empty hub cache: tests check nothing lands in it.
            "HF_HOME": str(base_dir / "hf-home"),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    environment.update(extra or {})
    return environment


def vllm_command(env: EngineEnvironment, model: TinyModel, extra_args: Sequence[str] = ()) -> list[str]:
    """The vLLM launch command, with ``{port}`` left for :func:`start_server`."""
    return [
        str(env.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model.path),
        "--served-model-name",
        model.served_name,
        "--host",
        HOST,
        "--port",
        "{port}",
        "--max-model-len",
        str(CONTEXT_LENGTH),
        "--dtype",
        "bfloat16",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        # No torch.compile: on this 2-core CPU it took 88 s at a machine's first start and 12 s of
        # every later one (loading the compiled graph), and the 2-layer tiny model answers as fast
        # in eager mode (a 1,000-token answer in 4-7 s either way; docs/testing.md).
        "--enforce-eager",
        *extra_args,
    ]


def sglang_command(
    env: EngineEnvironment, model: TinyModel, extra_args: Sequence[str] = (), *, cache_report: bool = True
) -> list[str]:
    """The SGLang launch command, with ``{port}`` left for :func:`start_server`.

    ``cache_report=False`` leaves out ``--enable-cache-report``, to test what
    longctx says about a server that does not report cached tokens.
    """
    command = [
        str(env.python),
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model.path),
        "--served-model-name",
        model.served_name,
        "--device",
        "cpu",
        "--attention-backend",
        "torch_native",
        "--host",
        HOST,
        "--port",
        "{port}",
        "--enable-cache-report",
        "--enable-metrics",
        "--disable-overlap-schedule",
        # Idle, SGLang's scheduler polls its sockets in a busy loop: a whole core of a 2-core
        # machine, for the whole session. Asleep on a zmq poll it wakes on the next request.
        "--sleep-on-idle",
        "--mem-fraction-static",
        "0.3",
        "--max-total-tokens",
        "40000",
        "--context-length",
        str(CONTEXT_LENGTH),
        *extra_args,
    ]
    return command if cache_report else [part for part in command if part != "--enable-cache-report"]


def start_vllm(
    env: EngineEnvironment,
    model: TinyModel,
    base_dir: Path,
    *,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    ready_timeout: float = 600.0,
    name: str = "vllm",
    kv_cache_gib: int = 2,
) -> LocalServer:
    """Start vLLM (CPU build) on ``model``, ready when a chat completion succeeds.

    ``name`` names the server and its log file (``{name}-{port}.log``).
    ``kv_cache_gib``: its KV cache's memory (the CPU build takes it from
    ``VLLM_CPU_KVCACHE_SPACE`` alone, whatever ``--kv-cache-memory-bytes`` says).
    """
    return start_server(
        name,
        vllm_command(env, model, extra_args),
        log_dir=base_dir / "logs",
        ready=_engine_ready("/health", model),
        # The model runs in the engine core's process, not in a worker process of its own: each
        # process of vLLM imports torch and vLLM again, and the worker's import was 14 s of a 44 s
        # start on this 2-core machine (29-31 s without it; docs/testing.md). Requests, metrics and
        # the prefix cache are the same either way.
        env=server_environment(
            base_dir, {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        ),
        port=port,
        ready_timeout=ready_timeout,
    )


def start_sglang(
    env: EngineEnvironment,
    model: TinyModel,
    base_dir: Path,
    *,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    ready_timeout: float = 600.0,
    cache_report: bool = True,
    name: str = "sglang",
) -> LocalServer:
    """Start SGLang's CPU engine on ``model``, ready when a chat completion succeeds.

    ``name`` names the server and its log file (``{name}-{port}.log``).
    """
    return start_server(
        name,
        sglang_command(env, model, extra_args, cache_report=cache_report),
        log_dir=base_dir / "logs",
        ready=_engine_ready("/health", model),
        env=server_environment(base_dir, {"SGLANG_USE_CPU_ENGINE": "1"}),
        port=port,
        ready_timeout=ready_timeout,
    )
