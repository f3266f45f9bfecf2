"""Real inference servers for tests: longctx's harness, reusable in yours.

Build the tiny locally-made model, build each engine's virtual environment,
start a server on a free loopback port and stop it again::

    from longctx.testing import EngineHarness

    harness = EngineHarness(Path(".cache/harness"))
    server = harness.server("vllm")        # builds what is missing, waits until ready
    print(server.api_base)                 # http://127.0.0.1:PORT/v1
    server.stop()

For pytest, add ``pytest_plugins = ["longctx.testing.pytest_plugin"]`` to a
``conftest.py``: see :mod:`longctx.testing.pytest_plugin`.

The SGLang environment carries two test-harness stand-ins, installed by
:mod:`longctx.testing.environments` and nowhere else: a one-function
``sgl_kernel`` (no CPU build exists on PyPI) and a guard that lets PyPI's
torchvision import beside a CPU torch. They exist only to run SGLang's CPU
engine on a Llama model in tests.

Modules: :mod:`~longctx.testing.harness` (``EngineHarness``),
:mod:`~longctx.testing.environments` (the engines' virtual environments, installed by
:mod:`~longctx.testing.installer`: uv, from pip's configured sources),
:mod:`~longctx.testing.model` and ``_model_builder`` (the tiny model),
:mod:`~longctx.testing.servers` (a server process), :mod:`~longctx.testing.fleet`
(replicas behind a real router), :mod:`~longctx.testing.vision` (each engine
serving the tiny vision model, built by ``_vision_model_builder``),
:mod:`~longctx.testing.pdfs` (real PDFs made on the spot),
:mod:`~longctx.testing.real_model` (a trained instruct model from the registry's GGUF parts, converted
once and served by both engines) and :mod:`~longctx.testing.gguf_conversion` (a GGUF into a safetensors
folder with numpy, no engine), :mod:`~longctx.testing.answer_set`
(a repository with known answers, planted sentences, and the rule that scores answers),
:mod:`~longctx.testing.postgres` (a real PostgreSQL server for a shared store),
:mod:`~longctx.testing.pytest_plugin`, :mod:`~longctx.testing.errors`,
``_locks`` (a file lock for parallel builds), ``_logs`` (a server log's tail) and
``standins`` (the SGLang stand-ins).

Its errors (:class:`HarnessError` and the four below it) are in
:mod:`longctx.testing.errors`, exported here: they are the harness's, not
the product's tree of :mod:`longctx.errors`.
"""

from __future__ import annotations

from longctx.testing.environments import (
    ENGINE_SPECS,
    EngineEnvironment,
    EnvironmentSpec,
    ensure_environment,
    environment_is_complete,
)
from longctx.testing.errors import (
    EnvironmentBuildError,
    HarnessError,
    ModelBuildError,
    ServerDiedError,
    ServerStartError,
)
from longctx.testing.harness import ENGINES, EngineHarness, harness_dir
from longctx.testing.model import SERVED_MODEL_NAME, VISION_MODEL_NAME, TinyModel, build_tiny_model
from longctx.testing.real_model import (
    REAL_SERVERS,
    SERVED_REAL_SERVER,
    RealModelSpec,
    real_model_spec,
    start_real_server,
)
from longctx.testing.servers import (
    LocalServer,
    find_free_port,
    port_is_free,
    start_server,
    start_sglang,
    start_vllm,
)
from longctx.testing.vision import vision_environment, vision_model

__all__ = [
    "ENGINES",
    "ENGINE_SPECS",
    "REAL_SERVERS",
    "SERVED_MODEL_NAME",
    "SERVED_REAL_SERVER",
    "VISION_MODEL_NAME",
    "EngineEnvironment",
    "EngineHarness",
    "EnvironmentBuildError",
    "EnvironmentSpec",
    "HarnessError",
    "LocalServer",
    "ModelBuildError",
    "RealModelSpec",
    "ServerDiedError",
    "ServerStartError",
    "TinyModel",
    "build_tiny_model",
    "ensure_environment",
    "environment_is_complete",
    "find_free_port",
    "harness_dir",
    "port_is_free",
    "real_model_spec",
    "start_real_server",
    "start_server",
    "start_sglang",
    "start_vllm",
    "vision_environment",
    "vision_model",
]
