"""``plan`` and ``recipe`` from the command line: bytes without memory, flags in errors, models by name.

No server is involved: both commands read a config (or the table of
popular long-context models) only.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from serving_configs import DEEPSEEK_MLA, LLAMA_GQA

from longctx.cli import EXIT_OK, EXIT_USAGE, main
from longctx.serving import kv_layout_from_config, plan_capacity
from longctx.serving.families import KNOWN_MODELS, known_model

GIB = 1 << 30


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_GQA))
    return path


def test_plan_without_memory_prints_bytes_per_token_and_per_sequence(config: Path) -> None:
    result = invoke("plan", "--config", str(config), "--context", "8192", "--context", "32768")
    assert result.exit_code == EXIT_OK, result.output
    # What `recipe` launches for a checkpoint without KV scales: the model's own type.
    layout = kv_layout_from_config(LLAMA_GQA, kv_cache_dtype="auto")
    assert f"per token held      : {layout.token_bytes(1):,} bytes (full attention)\n" in result.stdout
    assert "Bytes per sequence at a given context:" in result.stdout
    assert "KV memory           : not given" in result.stdout
    data = json.loads(invoke("plan", "--config", str(config), "--context", "8192", "--json").stdout)
    assert data["kv_memory_per_gpu_bytes"] is None and data["at_concurrency"] == []
    assert data["at_context"][0]["sequence_bytes_per_gpu"] == layout.sequence_bytes(
        8192, tp=1, dcp=1, block_size=16
    )
    assert data["at_context"][0]["max_concurrency"] is None


@pytest.mark.parametrize(
    ("args", "flags", "python_names"),
    [
        (
            ["--gpu-memory", "80"],
            ["--weights", "--gpu-memory", "--kv-memory"],
            ["weights_gib", "gpu_memory_gib"],
        ),
        (["--weights", "16"], ["--gpu-memory", "--weights"], ["gpu_memory_gib", "weights_gib"]),
        (["--gpu-memory", "80", "--weights", "-2"], ["--weights must be"], ["weights must"]),
        (
            ["--gpu-memory", "80", "--weights", "16", "--gpu-memory-utilization", "1.5"],
            ["--gpu-memory-utilization"],
            ["utilization must"],
        ),
    ],
)
def test_plan_errors_name_flags_not_python_fields(
    config: Path, args: list[str], flags: list[str], python_names: list[str]
) -> None:
    result = invoke("plan", "--config", str(config), *args)
    assert result.exit_code == EXIT_USAGE
    for flag in flags:
        assert flag in result.stderr
    for name in python_names:
        assert name not in result.stderr.replace(flags[0], "")


def test_gpu_memory_utilization_sets_the_usable_share(config: Path) -> None:
    common = ["plan", "--config", str(config), "--gpu-memory", "140", "--weights", "16", "--json"]
    default = json.loads(invoke(*common).stdout)
    lower = json.loads(invoke(*common, "--gpu-memory-utilization", "0.85").stdout)
    assert default["utilization"] == 0.92 and lower["utilization"] == 0.85
    # KV memory = 140 GiB x u - 16 GiB weights - 4 GiB reserve.
    assert lower["kv_memory_per_gpu_bytes"] == int(140 * GIB * 0.85) - 16 * GIB - 4 * GIB
    assert default["kv_memory_per_gpu_bytes"] - lower["kv_memory_per_gpu_bytes"] == int(
        140 * GIB * 0.92
    ) - int(140 * GIB * 0.85)


def test_the_library_plans_bytes_without_memory() -> None:
    plan = plan_capacity(kv_layout_from_config(LLAMA_GQA), contexts=[4096])
    assert plan.kv_memory_per_gpu_bytes is None and plan.at_concurrency == ()
    assert plan.at_context[0].sequence_bytes_per_gpu > 0 and plan.at_context[0].max_concurrency is None
    assert "bytes per token and per sequence only" in plan.to_text()


@pytest.mark.parametrize("name", sorted(KNOWN_MODELS))
def test_every_known_model_plans_and_has_a_recipe_on_both_engines(name: str) -> None:
    short = name.split("/", 1)[1].lower()
    known = known_model(short)
    assert known is not None and known.name == name
    for engine in ("vllm", "sglang"):
        result = invoke("recipe", short, "--engine", engine)
        assert result.exit_code == EXIT_OK, result.output
        assert name in result.stdout  # served under its full name
        assert "table of popular long-context models" in result.stderr
    planned = invoke("plan", "--model", short, "--kv-cache-dtype", "fp8", "--json")
    assert planned.exit_code == EXIT_OK, planned.output
    assert json.loads(planned.stdout)["token_bytes_per_gpu"] > 0


def test_recipe_takes_any_config_and_names_the_known_models_for_an_unknown_one(config: Path) -> None:
    result = invoke("recipe", "someone/custom-llama", "--engine", "vllm", "--config", str(config))
    assert result.exit_code == EXIT_OK, result.output
    assert "someone/custom-llama" in result.stdout and "--enable-prefix-caching" in result.stdout
    unknown = invoke("recipe", "someone/custom-llama", "--engine", "vllm")
    assert unknown.exit_code == EXIT_USAGE
    assert "Qwen/Qwen2.5-7B-Instruct-1M" in unknown.stderr and "config.json" in unknown.stderr


def test_plan_needs_exactly_one_of_config_and_model(config: Path) -> None:
    neither = invoke("plan")
    both = invoke("plan", "--config", str(config), "--model", "Qwen3-8B")
    unknown = invoke("plan", "--model", "no-such-model")
    for result in (neither, both, unknown):
        assert result.exit_code == EXIT_USAGE
    assert "--config" in neither.stderr and "--model" in neither.stderr
    assert "no-such-model" in unknown.stderr and "Qwen/Qwen3-8B" in unknown.stderr


def _write_safetensors(path: Path, names: list[str]) -> None:
    """A real safetensors file: its 8-byte header length, the JSON header, one float32 per tensor."""
    header = {
        name: {"dtype": "F32", "shape": [], "data_offsets": [4 * i, 4 * i + 4]}
        for i, name in enumerate(names)
    }
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + bytes(4 * len(names)))


@pytest.fixture
def scaled(tmp_path: Path) -> Path:
    """An fp8 checkpoint whose weights carry k_scale/v_scale for each of its 32 layers."""
    folder = tmp_path / "scaled"
    folder.mkdir()
    config = {**LLAMA_GQA, "quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}}
    (folder / "config.json").write_text(json.dumps(config))
    names = [f"model.layers.{i}.self_attn.{kv}_scale" for i in range(32) for kv in "kv"]
    _write_safetensors(folder / "model.safetensors", ["model.embed_tokens.weight", *names])
    return folder


def test_plan_assumes_the_kv_cache_recipe_launches_and_says_so(config: Path, scaled: Path) -> None:
    # No KV scales beside the config: the recipe and the plan keep the model's own type (bf16).
    recipe = invoke("recipe", "someone/custom-llama", "--engine", "vllm", "--config", str(config))
    assert "--kv-cache-dtype" not in recipe.stdout
    assert "9/10 facts with bf16 KV, 1/10 with fp8 KV without scales" in recipe.stderr
    planned = invoke("plan", "--config", str(config))
    assert "KV cache bf16, model limit" in planned.stdout
    assert (
        "KV cache auto (the model's own type), as `longctx recipe` launches it: no calibrated KV scales"
        in planned.stderr
    )
    own = invoke("plan", "--config", str(config), "--kv-cache-dtype", "auto")
    assert "KV cache bf16" in own.stdout and own.stderr == ""
    fp8, bf16 = (kv_layout_from_config(LLAMA_GQA, kv_cache_dtype=t).token_bytes(1) for t in ("fp8", "bf16"))
    assert f"per token held      : {bf16:,} bytes" in planned.stdout
    # The scales in the safetensors header: fp8 in the recipe, and the plan sizes fp8.
    scaled_recipe = invoke("recipe", "someone/custom-llama", "--engine", "vllm", "--config", str(scaled))
    assert "--kv-cache-dtype fp8" in scaled_recipe.stdout
    assert "64 k/v scale tensors in model.safetensors" in scaled_recipe.stderr
    scaled_plan = invoke("plan", "--config", str(scaled / "config.json"))
    assert "KV cache fp8, model limit" in scaled_plan.stdout
    assert "KV cache fp8, as `longctx recipe` launches it: calibrated KV scales" in scaled_plan.stderr
    assert f"per token held      : {fp8:,} bytes" in scaled_plan.stdout


def test_recipe_gives_fp8_when_asked_with_a_warning_where_no_scales_are_found(
    config: Path, scaled: Path
) -> None:
    asked = invoke("recipe", "m", "--engine", "sglang", "--config", str(config), "--kv-cache-dtype", "fp8")
    assert asked.exit_code == EXIT_OK, asked.output
    assert "--kv-cache-dtype fp8_e4m3" in asked.stdout
    assert "warning: fp8 KV cache as asked, with no calibrated KV scales" in asked.stderr
    assert "SGLang 0.5.17" in asked.stderr
    with_scales = invoke(
        "recipe", "m", "--engine", "sglang", "--config", str(scaled), "--kv-cache-dtype", "fp8"
    )
    assert "--kv-cache-dtype fp8_e4m3" in with_scales.stdout and "warning:" not in with_scales.stderr
    kept = invoke("recipe", "m", "--engine", "vllm", "--config", str(scaled), "--kv-cache-dtype", "auto")
    assert "--kv-cache-dtype" not in kept.stdout


def test_plan_names_only_the_growing_layer_kinds_the_model_has(config: Path, tmp_path: Path) -> None:
    planned = invoke("plan", "--config", str(config))
    assert "bytes (full attention)\n" in planned.stdout and "MLA" not in planned.stdout
    mla = tmp_path / "mla.json"
    mla.write_text(json.dumps(DEEPSEEK_MLA))
    assert "bytes (MLA)\n" in invoke("plan", "--config", str(mla)).stdout


def test_plan_for_a_pack_plans_its_whole_context_images_included(config: Path, tmp_path: Path) -> None:
    summary = {
        "pack": {
            "fingerprint": "f" * 64,
            "total_tokens": 3_000,
            "prefix_tokens": 2_400,
            "image_tokens": 560,
            "image_counter": "estimated: Qwen2-VL formula, default processor",
            "images": [{"sha256": "a" * 64}, {"sha256": "b" * 64}],
            "estimated": True,
        },
        "manifest": {},
    }
    path = tmp_path / "pack.json"
    path.write_text(json.dumps(summary))
    result = invoke("plan", "--config", str(config), "--pack", str(path), "--context", "8192")
    assert result.exit_code == EXIT_OK, result.output
    assert (
        "pack ffffffffffffffff: 3,000 tokens, of which 560 for 2 images"
        " (estimated: Qwen2-VL formula, default processor) (estimated)"
    ) in result.stderr
    data = json.loads(invoke("plan", "--config", str(config), "--pack", str(path), "--json").stdout)
    assert [answer["context_tokens"] for answer in data["at_context"]] == [3_000]
    assert data["pack"]["image_tokens"] == 560 and data["pack"]["images"] == 2
    uncounted = tmp_path / "uncounted.json"
    uncounted.write_text(json.dumps({"fingerprint": "f" * 64, "total_tokens": None}))
    refused = invoke("plan", "--config", str(config), "--pack", str(uncounted))
    assert refused.exit_code == EXIT_USAGE and "were not counted" in refused.output
