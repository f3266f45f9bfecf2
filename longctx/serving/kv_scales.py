"""Whether a checkpoint carries calibrated KV-cache scales: the one thing that makes an fp8 KV cache safe.

An fp8 KV cache stores each key and value in one byte, divided by a per-layer scale. vLLM and
SGLang take those scales from the checkpoint, and only through a quantization method: a
``quantization_config`` whose KV-cache scheme is declared (compressed-tensors
``kv_cache_scheme``, ModelOpt ``kv_cache_quant_algo``, also in ``hf_quant_config.json``, Quark
``kv_cache_group``), or a quantized checkpoint whose weights hold ``k_scale`` / ``v_scale``
tensors (``kv_scale``, the older single name). Anything else runs at scale 1.0: vLLM 0.24's
``--calculate-kv-scales`` is deprecated and computes nothing; without a quantization method vLLM
sets 1.0 and loads no scale tensor. What 1.0 did to answers is measured in the engine registry
(:mod:`longctx.backends.engines`, ``RecipeSwitches.fp8_kv_unscaled``).

:func:`find_kv_scales` only reads: the config, ``hf_quant_config.json``, the safetensors index's
tensor names, else each safetensors file's header (never the tensors).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from longctx.recordtypes import record_type

__all__ = ["KVScales", "find_kv_scales"]

# Where each quantizer declares its KV cache: compressed-tensors, ModelOpt, Quark.
_SCHEME_KEYS = ("kv_cache_scheme", "kv_cache_quant_algo", "kv_cache_group")
# k_scale / v_scale (vLLM's and SGLang's names) and the deprecated single kv_scale, as the last part
# of a tensor name (model.layers.0.self_attn.k_scale, ...self_attn.attn.k_scale).
_SCALE_TENSOR = re.compile(r"(?:^|\.)(?:k|v|kv)_scale$")
# A safetensors header is a JSON object after its 8-byte length; a real one is kilobytes to a few
# MB. A larger length is not a safetensors file.
_MAX_HEADER_BYTES = 100 * 2**20


@record_type
class KVScales:
    """What a checkpoint says of its KV-cache scales.

    ``found`` is True where the engines load calibrated scales, False where
    the checkpoint was read and they run at 1.0, None where nothing could be
    read (no folder, a hub name); ``source`` says where they were found, or
    what was read and why it does not count.
    """

    found: bool | None
    source: str


def find_kv_scales(config: Mapping[str, Any] | None, folder: str | Path | None = None) -> KVScales:
    """The KV-cache scales of the checkpoint ``config`` (a parsed ``config.json``) and ``folder`` describe.

    ``folder`` is the checkpoint's folder (or its ``config.json``); its
    config is read when ``config`` is None. Without a folder only
    ``config`` is judged. Never raises for what it reads: an unreadable
    file makes the answer None (unknown), with the reason in ``source``.
    """
    directory = _directory(folder)
    if folder is not None and directory is None:
        return KVScales(None, f"{folder} is not a model folder on this machine: its KV scales are unknown")
    if config is None:
        if directory is None:
            return KVScales(None, "no config.json and no checkpoint folder: KV scales unknown")
        loaded = _json_file(directory / "config.json")
        if not isinstance(loaded, dict):
            return KVScales(None, f"{directory / 'config.json'} is missing or unreadable: KV scales unknown")
        config = loaded
    quantization = config.get("quantization_config")
    quantization = quantization if isinstance(quantization, Mapping) else None
    declared = _declared_scheme(quantization, "config.json quantization_config")
    if declared is None and directory is not None:
        modelopt = _json_file(directory / "hf_quant_config.json")
        if isinstance(modelopt, dict) and isinstance(modelopt.get("quantization"), Mapping):
            declared = _declared_scheme(modelopt["quantization"], "hf_quant_config.json")
    if declared is not None:
        return KVScales(True, declared)
    if directory is None:
        return KVScales(False, "config.json declares no KV-cache quantization (no weights were read)")
    tensors = _scale_tensors(directory)
    if tensors.count is None:
        return KVScales(None, f"config.json declares no KV-cache quantization; {tensors.where}")
    if tensors.count == 0:
        return KVScales(
            False,
            f"config.json declares no KV-cache quantization; no k_scale/v_scale tensor in {tensors.where}",
        )
    if quantization is None:
        # vLLM creates scale parameters only for a quantization method; without one they are skipped.
        return KVScales(
            False,
            f"{tensors.count} k/v scale tensors in {tensors.where}, but config.json has no "
            "quantization_config, so the engines load none of them",
        )
    method = quantization.get("quant_method", "a quantization method")
    return KVScales(True, f"{tensors.count} k/v scale tensors in {tensors.where}, loaded by {method}")


@record_type
class _ScaleTensors:
    count: int | None  # None: no weights could be read
    where: str


def _directory(folder: str | Path | None) -> Path | None:
    if folder is None:
        return None
    path = Path(folder)
    if path.is_file():
        path = path.parent
    return path if path.is_dir() else None


def _declared_scheme(quantization: Mapping[str, Any] | None, where: str) -> str | None:
    """Where ``quantization`` declares a KV-cache scheme (null, "none" and empty mean none), else None."""
    if quantization is None:
        return None
    for key in _SCHEME_KEYS:
        value = quantization.get(key)
        if value and not (isinstance(value, str) and value.strip().lower() in ("none", "null")):
            shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True)[:80]
            return f"{where} declares {key} {shown}"
    return None


def _scale_tensors(directory: Path) -> _ScaleTensors:
    """The k/v scale tensors the checkpoint's weights name: from the index, else each file's header."""
    indexes = sorted(directory.glob("*.safetensors.index.json"))
    for index in indexes:
        loaded = _json_file(index)
        if isinstance(loaded, dict) and isinstance(loaded.get("weight_map"), Mapping):
            return _ScaleTensors(_count(loaded["weight_map"]), index.name)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return _ScaleTensors(None, f"{directory} holds no safetensors weights: KV scales unknown")
    count = 0
    for file in files:
        header = _safetensors_header(file)
        if header is None:
            return _ScaleTensors(None, f"{file.name} has no readable safetensors header: KV scales unknown")
        count += _count(header)
    return _ScaleTensors(count, files[0].name if len(files) == 1 else f"{len(files)} safetensors headers")


def _count(names: Mapping[str, Any]) -> int:
    return sum(1 for name in names if _SCALE_TENSOR.search(name))


def _safetensors_header(path: Path) -> dict[str, Any] | None:
    """The JSON header of a safetensors file (tensor name to dtype, shape, offsets), or None."""
    try:
        with path.open("rb") as file:
            prefix = file.read(8)
            if len(prefix) < 8:
                return None
            (length,) = struct.unpack("<Q", prefix)
            if length > _MAX_HEADER_BYTES:
                return None
            header = json.loads(file.read(length))
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) else None


def _json_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
