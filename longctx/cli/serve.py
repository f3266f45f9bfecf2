"""``longctx serve --cpu-demo``: a local server to try longctx on, without writing any Python."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from longctx.cli.app import EXIT_INTERRUPTED, main, note
from longctx.errors import ConfigError

if TYPE_CHECKING:
    from longctx.testing import EngineHarness, LocalServer

_POLL_SECONDS = 0.5


def _harness_base() -> Path:
    """Where the engine's environment and the tiny model are built (``LONGCTX_HARNESS_DIR`` wins).

    A checkout's ``.cache/harness``, the folder ``scripts/demo`` and the tests
    share; for an installed longctx, the user's cache folder.
    """
    from longctx.testing import harness_dir

    checkout = Path(__file__).resolve().parent.parent.parent
    if (checkout / "pyproject.toml").is_file():
        return harness_dir(checkout)
    import platformdirs

    return harness_dir(Path(platformdirs.user_cache_dir("longctx")))


class _Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP (a closed terminal): the server is stopped as Ctrl-C stops it."""


@contextmanager
def _signals_stop() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise as Ctrl-C does, so the server is stopped, never orphaned.

    The engine runs in a session of its own (a terminal's Ctrl-C or hang-up
    never reaches it): only this process can stop it.
    """

    def stop(number: int, frame: object) -> None:
        raise _Stopped(signal.Signals(number).name)

    previous = {number: signal.signal(number, stop) for number in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _start(harness: EngineHarness, *, port: int | None, vision: bool, tiny: bool) -> LocalServer:
    """vLLM (CPU build) on the real model (``tiny``: the random-weight one; ``vision``: the tiny
    Qwen2-VL), on ``port`` (None: a free one).

    Built and booted on the harness's worker thread, so a Ctrl-C (or a
    signal) while it starts is seen at once (see :func:`_interrupted_while_starting`).
    """
    from longctx.testing import port_is_free, start_vllm

    if port is not None and not port_is_free(port):
        raise ConfigError(f"--port {port} is taken: stop what listens there, or give another port")

    from longctx.testing import SERVED_REAL_SERVER, start_real_server

    # The server's name, and its log file's.
    name = "vllm-vision" if vision else "vllm" if tiny else SERVED_REAL_SERVER

    def start(harness: EngineHarness) -> LocalServer:
        if not vision and not tiny:
            return start_real_server(harness, "vllm", port=port)
        if vision:
            from longctx.testing import vision_environment, vision_model

            env, model = vision_environment(harness, "vllm"), vision_model(harness)
            return start_vllm(env, model, harness.base_dir, port=port, name=name)
        return start_vllm(harness.environment("vllm"), harness.model(), harness.base_dir, port=port)

    server = harness.extra_server(name, start)  # stopped with the harness
    if port is not None and server.port != port:  # it lost a race for the port: another one was taken
        harness.close()
        raise ConfigError(f"--port {port} was taken while the server started: give another port")
    return server


@main.command()
@click.option(
    "--cpu-demo",
    is_flag=True,
    help="vLLM's CPU build with a small trained instruct model, Qwen2.5-Coder-0.5B-Instruct, converted"
    " from the package registry's GGUF parts (no GPU, no model hub): real answers, slowly.",
)
@click.option(
    "--tiny",
    is_flag=True,
    help="With --cpu-demo: the random-weight tiny model instead (no download, quick to build): its answers"
    " are noise, for trying the mechanics only.",
)
@click.option(
    "--vision",
    is_flag=True,
    help="With --cpu-demo: serve a tiny vision model (Qwen2-VL) that takes images, to try scanned PDFs"
    " on (their pages sent as images).",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    help="Listen on this port (default: a free one). The same port across restarts keeps the URL,"
    " and the resume commands printed with it, right.",
)
def serve(cpu_demo: bool, tiny: bool, vision: bool, port: int | None) -> None:
    """Start a local server to try longctx on; Ctrl-C stops it.

    With --cpu-demo: vLLM (CPU build) serving Qwen2.5-Coder-0.5B-Instruct
    in float32, the environment built and the model downloaded and
    converted on the first run (about 3.5 GB and 0.5 GB, a few minutes)
    under .cache/harness of this checkout, the user's cache folder, or
    LONGCTX_HARNESS_DIR when set; LONGCTX_REAL_MODEL names another model
    (docs/testing.md). --tiny: the random-weight tiny model instead (its
    answers are noise); --vision: a tiny Qwen2-VL that takes images. The URL and the model
    served go to stdout with the line that points longctx at it; every
    other line to stderr. Ctrl-C, SIGTERM and SIGHUP (a closed terminal)
    each stop the server before longctx exits.
    """
    if not cpu_demo:
        raise ConfigError("say which server: longctx serve --cpu-demo (the only one for now)")
    from longctx.testing import EngineHarness

    base = _harness_base()
    if vision:
        what = "the tiny vision model (Qwen2-VL, random weights: its answers are noise)"
    elif tiny:
        what = "the random-weight tiny model (its answers are noise)"
    else:
        from longctx.testing import RealModelSpec, real_model_spec

        chosen = real_model_spec()  # LONGCTX_REAL_MODEL, else the default; a bad name fails here
        what = chosen.upstream if isinstance(chosen, RealModelSpec) else f"the model in {chosen}"
    note(f"starting vLLM (CPU build) with {what} from {base}; a first run builds both there")
    harness = EngineHarness(base, on_progress=lambda message: note(f"  {message}"))
    with _signals_stop():
        _serve(harness, port=port, vision=vision, tiny=tiny, what=what)


def _serve(harness: EngineHarness, *, port: int | None, vision: bool, tiny: bool, what: str) -> None:
    try:
        server = _start(harness, port=port, vision=vision, tiny=tiny)
    except KeyboardInterrupt:
        _interrupted_while_starting(harness)
    except BaseException:
        harness.close()
        raise
    try:
        from longctx.testing import SERVED_MODEL_NAME, VISION_MODEL_NAME

        model = VISION_MODEL_NAME if vision else SERVED_MODEL_NAME if tiny else _real_model_name()
        click.echo(f"serving {what} at {server.api_base}")
        click.echo(f"export LONGCTX_BASE_URL={server.api_base}")
        takes = "text and images" if vision else "text only"
        note(f"the model served: {model} ({takes}); Ctrl-C stops it")
        while server.alive():
            time.sleep(_POLL_SECONDS)
        note(f"longctx: the server exited; its log: {server.log_path}")
        raise SystemExit(1)
    except KeyboardInterrupt:
        note("stopping the server")
    finally:
        harness.close()
    note("server stopped")


def _real_model_name() -> str:
    """The name the real model is served under (``LONGCTX_REAL_MODEL``'s choice, else the default)."""
    from longctx.testing import RealModelSpec, real_model_spec

    spec = real_model_spec()
    return spec.served_name if isinstance(spec, RealModelSpec) else spec.name


def _interrupted_while_starting(harness: EngineHarness) -> NoReturn:
    """Ctrl-C before the server was ready: stop what was started and leave now.

    The build or boot goes on in the harness's worker thread, which a normal
    exit would wait for (minutes); the exit handlers stop any server process
    already started, then the process ends without waiting for the thread.
    """
    note("longctx: interrupted while the server was starting")
    harness.close()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    os._exit(EXIT_INTERRUPTED)
