"""KV-cache scales found in checkpoints: config declarations, the safetensors index, the headers.

Files are written as the quantizers write them (config.json, hf_quant_config.json, the index) and
safetensors by the real library (in the vLLM environment) or byte for byte by its format.
"""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest
from fake_engine import FakeEngine
from serving_configs import LLAMA_GQA, with_kv_scales

from longctx import connect
from longctx.serving import Diagnosis, KVScales, diagnose, find_kv_scales
from longctx.testing import LocalServer, TinyModel

# An fp8 checkpoint's weight scales: *_scale names that are not the KV cache's and must not count.
_WEIGHT_SCALES = ["model.layers.0.self_attn.q_proj.weight_scale", "model.layers.0.mlp.down_proj.input_scale"]
_KV_SCALES = [f"model.layers.{i}.self_attn.{kv}_scale" for i in range(2) for kv in "kv"]


def _write_safetensors(path: Path, names: list[str]) -> None:
    """A safetensors file by its format: 8-byte little-endian header length, the JSON header, the data."""
    header = {
        name: {"dtype": "F32", "shape": [], "data_offsets": [4 * i, 4 * i + 4]}
        for i, name in enumerate(names)
    }
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + bytes(4 * len(names)))


def _folder(tmp_path: Path, config: dict[str, object], name: str = "ckpt") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_declared_kv_cache_scheme_is_found_from_the_config_alone() -> None:
    scales = find_kv_scales(with_kv_scales(LLAMA_GQA))
    assert scales.found is True
    assert "kv_cache_scheme" in scales.source and '"num_bits": 8' in scales.source


@pytest.mark.parametrize("value", [None, "none", {}, ""])
def test_a_null_scheme_declares_nothing(value: object) -> None:
    # compressed-tensors writes "kv_cache_scheme": null for weight-only and W8A8 checkpoints.
    config = {
        **LLAMA_GQA,
        "quantization_config": {"quant_method": "compressed-tensors", "kv_cache_scheme": value},
    }
    scales = find_kv_scales(config)
    assert scales == KVScales(False, "config.json declares no KV-cache quantization (no weights were read)")


def test_modelopt_declares_its_fp8_kv_in_hf_quant_config(tmp_path: Path) -> None:
    folder = _folder(tmp_path, LLAMA_GQA)
    quant = {
        "producer": {"name": "modelopt"},
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"},
    }
    (folder / "hf_quant_config.json").write_text(json.dumps(quant))
    scales = find_kv_scales(None, folder)
    assert scales.found is True and scales.source == "hf_quant_config.json declares kv_cache_quant_algo FP8"
    # The same key inside config.json's quantization_config (newer exports) counts too.
    inline = {**LLAMA_GQA, "quantization_config": {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}}
    assert find_kv_scales(inline).found is True


def test_scale_tensors_in_the_index_of_a_quantized_checkpoint(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {**LLAMA_GQA, "quantization_config": {"quant_method": "fp8"}})
    weight_map = dict.fromkeys(
        ["model.embed_tokens.weight", *_WEIGHT_SCALES, *_KV_SCALES], "model-00001-of-00002.safetensors"
    )
    weight_map["model.layers.1.self_attn.kv_scale"] = (
        "model-00002-of-00002.safetensors"  # the older single name
    )
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    scales = find_kv_scales(None, folder / "config.json")
    assert scales == KVScales(True, "5 k/v scale tensors in model.safetensors.index.json, loaded by fp8")


def test_weight_scales_alone_are_not_kv_scales(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {**LLAMA_GQA, "quantization_config": {"quant_method": "fp8"}})
    _write_safetensors(folder / "model.safetensors", ["model.embed_tokens.weight", *_WEIGHT_SCALES])
    scales = find_kv_scales(None, folder)
    assert scales.found is False and "no k_scale/v_scale tensor in model.safetensors" in scales.source


def test_scale_tensors_without_a_quantization_method_are_not_loaded(tmp_path: Path) -> None:
    # vLLM registers k_scale/v_scale parameters only through a quantization method: scale 1.0 otherwise.
    folder = _folder(tmp_path, LLAMA_GQA)
    _write_safetensors(folder / "model.safetensors", _KV_SCALES)
    scales = find_kv_scales(None, folder)
    assert (
        scales.found is False and "no quantization_config" in scales.source and "4 k/v scale" in scales.source
    )


def test_every_shard_header_is_read_without_an_index(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {**LLAMA_GQA, "quantization_config": {"quant_method": "fp8"}})
    _write_safetensors(folder / "model-00001-of-00002.safetensors", ["model.embed_tokens.weight"])
    _write_safetensors(folder / "model-00002-of-00002.safetensors", _KV_SCALES)
    scales = find_kv_scales(None, folder)
    assert scales == KVScales(True, "4 k/v scale tensors in 2 safetensors headers, loaded by fp8")


def test_unknown_where_nothing_can_be_read(tmp_path: Path) -> None:
    assert find_kv_scales(None, "Qwen/Qwen2.5-Coder-1.5B-Instruct").found is None  # a hub name
    assert find_kv_scales(None, tmp_path).found is None  # a folder without config.json
    no_weights = _folder(tmp_path, LLAMA_GQA, "no-weights")
    assert find_kv_scales(None, no_weights).found is None
    broken = _folder(tmp_path, {**LLAMA_GQA, "quantization_config": {"quant_method": "fp8"}}, "broken")
    (broken / "model.safetensors").write_bytes(struct.pack("<Q", 2**62) + b"{}")
    scales = find_kv_scales(None, broken)
    assert scales.found is None and "no readable safetensors header" in scales.source
    # A declaration in the config needs no weights.
    declared = _folder(tmp_path, with_kv_scales(LLAMA_GQA), "declared")
    assert find_kv_scales(None, declared).found is True


@pytest.mark.vllm  # the vLLM environment has safetensors and torch
def test_the_libraries_own_safetensors_files(
    tiny_model: TinyModel, vllm_python: Path, tmp_path: Path
) -> None:
    # The tiny model, saved by safetensors itself: a bf16 checkpoint with no KV scales.
    plain = find_kv_scales(None, tiny_model.path)
    assert plain.found is False and "no k_scale/v_scale tensor in model.safetensors" in plain.source
    # The same library writes a checkpoint with scales; the header reader finds each one.
    folder = _folder(tmp_path, {**LLAMA_GQA, "quantization_config": {"quant_method": "fp8"}})
    names = ["model.embed_tokens.weight", *_WEIGHT_SCALES, *_KV_SCALES]
    script = (
        "import json, sys, torch\n"
        "from safetensors.torch import save_file\n"
        "save_file({n: torch.ones(()) for n in json.loads(sys.argv[1])}, sys.argv[2])\n"
    )
    subprocess.run(
        [str(vllm_python), "-c", script, json.dumps(names), str(folder / "model.safetensors")], check=True
    )
    assert find_kv_scales(None, folder) == KVScales(
        True, "4 k/v scale tensors in model.safetensors, loaded by fp8"
    )


def _scaled_folder(tmp_path: Path) -> Path:
    folder = _folder(tmp_path, with_kv_scales(LLAMA_GQA), "scaled")
    _write_safetensors(folder / "model.safetensors", ["model.embed_tokens.weight", *_KV_SCALES])
    return folder


@pytest.mark.parametrize(("engine", "fp8"), [("vllm", "fp8"), ("sglang", "fp8_e4m3")])
def test_doctor_reads_the_served_checkpoint_before_it_advises_fp8(
    tmp_path: Path, engine: str, fp8: str
) -> None:
    def diagnosis(checkpoint: Path, kv_cache_dtype: str = "auto") -> Diagnosis:
        fake = FakeEngine(engine=engine, checkpoint=str(checkpoint), kv_cache_dtype=kv_cache_dtype)
        return diagnose(connect("http://fake:8000/v1", transport=fake.transport()), probe=False)

    unscaled = _folder(tmp_path, LLAMA_GQA, "unscaled")
    _write_safetensors(unscaled / "model.safetensors", ["model.embed_tokens.weight"])
    scaled = diagnosis(_scaled_folder(tmp_path))
    assert f"--kv-cache-dtype {fp8}" in {finding.flag for finding in scaled.findings}
    assert (
        "checkpoint KV scales: found (config.json quantization_config declares kv_cache_scheme"
        in scaled.to_text()
    )
    assert scaled.to_dict()["servers"][0]["kv_scales"]["found"] is True
    plain = diagnosis(unscaled)
    assert not any("fp8" in finding.flag for finding in plain.findings) and plain.ok
    assert "checkpoint KV scales: none (" in plain.to_text()
    # A server already on fp8 without scales: a warning that names the measured loss.
    served = diagnosis(unscaled, kv_cache_dtype=fp8)
    warning = next(f for f in served.findings if f.flag == "--kv-cache-dtype auto")
    assert warning.severity == "warning" and "9/10 facts with bf16 KV" in warning.reason
    assert not served.ok
    # A hub name (not a folder here): unknown, and fp8 neither advised nor warned of.
    hub = diagnosis(Path("Qwen/Qwen2.5-Coder-1.5B-Instruct"))
    assert not any("kv-cache-dtype" in finding.flag for finding in hub.findings)
    assert "checkpoint KV scales: unknown (" in hub.to_text()


def test_doctor_on_the_real_engines_reads_the_tiny_models_folder(
    engine_server: LocalServer, tiny_model: TinyModel
) -> None:
    backend = connect(engine_server.api_base)
    try:
        found = diagnose(backend, probe=False)
    finally:
        backend.close()
    info = found.servers[0]
    # vLLM names the folder in /v1/models' root, SGLang in /server_info's model_path.
    assert info.checkpoint is not None and Path(info.checkpoint).resolve() == tiny_model.path.resolve()
    scales = found.kv_scales[info.api_url]
    assert scales.found is False and "no k_scale/v_scale tensor in model.safetensors" in scales.source
    # The CPU builds take no fp8 KV cache, and this checkpoint has no scales: no fp8 advice either way.
    assert not any("fp8" in finding.flag for finding in found.findings)
