"""The vision servers: each engine's CPU build serving the tiny Qwen2-VL.

A vision server is one of the harness's extra servers (booted in the
background once a session asks for it, stopped after its last test): the
engine runs from its vision overlay environment (:data:`~longctx.testing.environments.VISION_SPECS`:
the engine's own packages and the few the multimodal path needs), on the tiny
vision model built here (:func:`~longctx.testing.model.build_tiny_vision_model`),
with the flags of the shared servers (prefix caching, cached-token reports,
eager mode, metrics). Measured on the 2-core CPU machine of the test suite
(2026-12-06, vLLM 0.32.0, SGLang 0.5.23): ready in 36 s and 23 s; a first
image request answered in 0.2 s and 14 s (SGLang loads its image processing
then).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from longctx.testing.environments import VISION_SPECS, EngineEnvironment, ensure_environment
from longctx.testing.errors import HarnessError
from longctx.testing.harness import EngineHarness
from longctx.testing.model import TinyModel, build_tiny_vision_model
from longctx.testing.servers import LocalServer, start_sglang, start_vllm

__all__ = [
    "VISION_SERVERS",
    "prepare_vision_assets",
    "start_vision_server",
    "vision_environment",
    "vision_model",
]

VISION_SERVERS = {"vllm": "vllm-vision", "sglang": "sglang-vision"}
"""The harness's name of each engine's vision server (its extra server's name and log file's)."""
_STARTERS: dict[str, Callable[..., LocalServer]] = {"vllm": start_vllm, "sglang": start_sglang}


def vision_environment(harness: EngineHarness, engine: str) -> EngineEnvironment:
    """The engine's vision overlay, built on the engine's environment (both built if needed)."""
    harness.environment(engine)
    started = time.monotonic()
    env = ensure_environment(VISION_SPECS[engine], harness.base_dir)
    harness.timings.setdefault(f"{engine} vision environment", f"{time.monotonic() - started:.0f} s")
    return env


def vision_model(harness: EngineHarness) -> TinyModel:
    """The tiny Qwen2-VL, built with the vLLM environment's Python (it has transformers) if absent."""
    started = time.monotonic()
    model = build_tiny_vision_model(harness.environment("vllm").python, harness.base_dir)
    harness.timings.setdefault("tiny vision model", f"{time.monotonic() - started:.0f} s")
    return model


def prepare_vision_assets(harness: EngineHarness, engines: Sequence[str]) -> threading.Thread:
    """Build the vision model and ``engines``' overlays on a thread of their own, now; returns it.

    Each waits only for its engine's environment, not for the shared servers' boots the extras
    queue behind: on the 2-core CI machine, building them in that queue put 80-95 s of downloads
    and a model build in front of the vision servers' boots. The builds hold file locks, so the
    vision server's own start waits for (or finds) them; a failure here is the start's to report.
    """

    def build() -> None:
        try:
            vision_model(harness)
            for engine in engines:
                vision_environment(harness, engine)
        except Exception:  # noqa: BLE001  # the server's start builds again and raises it there
            return

    thread = threading.Thread(target=build, name="longctx-vision-assets", daemon=True)
    thread.start()
    return thread


def start_vision_server(harness: EngineHarness, engine: str) -> LocalServer:
    """Start ``engine``'s vision server (``"vllm"`` or ``"sglang"``) and wait until it answers."""
    if engine not in VISION_SERVERS:
        raise HarnessError(f"no vision server for {engine!r}; expected one of {', '.join(VISION_SERVERS)}")
    env = vision_environment(harness, engine)
    model = vision_model(harness)
    return _STARTERS[engine](env, model, harness.base_dir, name=VISION_SERVERS[engine])
