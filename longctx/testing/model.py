"""The tiny test models: built locally, reused, never downloaded.

A model folder is produced by a builder script run with an engine's Python
(which has torch, tokenizers and safetensors): ``_model_builder.py`` for the
tiny Llama both engines serve, ``_vision_model_builder.py`` for the tiny
Qwen2-VL of the vision servers (:mod:`longctx.testing.vision`). It is built into a
temporary folder and renamed into place, so a folder under ``models/`` is
always complete. Its name carries a digest of the builder and the Python
version (the tokenizer is trained on that Python's standard library), so a
change to either builds a new model instead of reusing a stale one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from longctx.recordtypes import record_type
from longctx.testing._locks import file_lock
from longctx.testing._logs import log_tail
from longctx.testing.errors import ModelBuildError

__all__ = [
    "SERVED_MODEL_NAME",
    "VISION_MODEL_NAME",
    "TinyModel",
    "build_tiny_model",
    "build_tiny_vision_model",
    "model_digest",
    "vision_model_digest",
]

SERVED_MODEL_NAME = "tiny-llama"
VISION_MODEL_NAME = "tiny-qwen2-vl"
BUILDER = Path(__file__).with_name("_model_builder.py")
VISION_BUILDER = Path(__file__).with_name("_vision_model_builder.py")
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
VISION_FILES = (*REQUIRED_FILES, "preprocessor_config.json")


@record_type
class TinyModel:
    """A model folder ready to serve, and the name to serve it under."""

    path: Path
    served_name: str = SERVED_MODEL_NAME

    @property
    def config(self) -> dict[str, object]:
        loaded: dict[str, object] = json.loads((self.path / "config.json").read_text())
        return loaded

    def file_digests(self) -> dict[str, str]:
        """sha256 of every file in the folder, by name (for determinism checks)."""
        return {
            entry.name: hashlib.sha256(entry.read_bytes()).hexdigest()
            for entry in sorted(self.path.iterdir())
            if entry.is_file()
        }


def model_digest() -> str:
    """Identity of the model a build would produce on this Python."""
    payload = BUILDER.read_bytes() + f"{sys.version_info[:3]}".encode()
    return hashlib.sha256(payload).hexdigest()[:16]


def vision_model_digest() -> str:
    """Identity of the vision model a build would produce on this Python (its builder imports the other)."""
    payload = VISION_BUILDER.read_bytes() + BUILDER.read_bytes() + f"{sys.version_info[:3]}".encode()
    return hashlib.sha256(payload).hexdigest()[:16]


def build_tiny_model(python: Path, base_dir: Path, *, rebuild: bool = False) -> TinyModel:
    """Return the tiny model under ``base_dir/models``, building it with ``python`` if absent.

    ``python`` must be an interpreter with torch, tokenizers and safetensors
    (either engine's environment). Raises :class:`ModelBuildError` with the
    builder's output when the build fails; nothing half-built is left behind.
    """
    target = base_dir / "models" / f"{SERVED_MODEL_NAME}-{model_digest()}"
    _build(python, BUILDER, target, base_dir, required=REQUIRED_FILES, label="model", rebuild=rebuild)
    return TinyModel(target)


def build_tiny_vision_model(python: Path, base_dir: Path, *, rebuild: bool = False) -> TinyModel:
    """Return the tiny Qwen2-VL under ``base_dir/models``, building it with ``python`` if absent.

    ``python`` must also have transformers (the vLLM environment's): the
    weights are a randomly initialised ``Qwen2VLForConditionalGeneration``.
    Errors and atomicity as :func:`build_tiny_model`.
    """
    target = base_dir / "models" / f"{VISION_MODEL_NAME}-{vision_model_digest()}"
    _build(
        python, VISION_BUILDER, target, base_dir, required=VISION_FILES, label="vision-model", rebuild=rebuild
    )
    return TinyModel(target, VISION_MODEL_NAME)


def _build(
    python: Path,
    builder: Path,
    target: Path,
    base_dir: Path,
    *,
    required: tuple[str, ...],
    label: str,
    rebuild: bool,
) -> None:
    """Run ``builder`` into a staging folder and rename it to ``target``, under a file lock."""
    models = target.parent
    with file_lock(base_dir / "locks" / f"{label}.lock"):
        if rebuild and target.exists():
            shutil.rmtree(target)
        if all((target / name).is_file() for name in required):
            return
        models.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".building-", dir=models))
        log_path = base_dir / "logs" / f"{label}-build.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with log_path.open("w") as log:
                code = subprocess.call(
                    [str(python), str(builder), str(staging)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0"},
                )
            if code != 0:
                raise ModelBuildError(
                    f"building the tiny model {target.name} with {python} failed (exit code {code})",
                    log_tail=log_tail(log_path),
                )
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
