"""Launch recipes: the Kimi-K3-NVFP4 catalogue entry and generic recipes from configs."""

from __future__ import annotations

import shlex

import pytest
from serving_configs import DEEPSEEK_MLA, LLAMA_GQA, with_kv_scales

from longctx import serving
from longctx.errors import ServingConfigError
from longctx.serving import KIMI_K3_NVFP4, catalogue_models, recipe_for


def _option(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_kimi_k3_vllm_recipe_has_the_validated_switches() -> None:
    recipe = recipe_for(KIMI_K3_NVFP4, "vllm")
    argv = recipe.argv
    assert argv[:3] == ("vllm", "serve", KIMI_K3_NVFP4)
    assert _option(argv, "--tensor-parallel-size") == "8"
    assert _option(argv, "--quantization") == "modelopt_mixed"
    assert _option(argv, "--load-format") == "fastsafetensors"
    assert _option(argv, "--max-model-len") == "196608"
    assert _option(argv, "--kv-cache-dtype") == "fp8"
    assert _option(argv, "--max-num-batched-tokens") == "8192"
    for switch in ("--enable-prefix-caching", "--enable-chunked-prefill", "--enable-prompt-tokens-details"):
        assert switch in argv
    assert recipe.env["KIMI_K3_FP8_PB"] == "1"
    assert recipe.env["KIMI_K3_NVFP4_SITU_G1_SCALE"] == "1"
    assert recipe.env["KIMI_K3_FIX_MM_PROMPT_UPDATES"] == "1"
    assert recipe.env["PYTHONPATH"] == "/k3-runtime-patches"
    assert recipe.required_env == ("HF_TOKEN",)
    assert "HF_TOKEN" not in recipe.env  # a secret is passed through, never written down
    assert recipe.image == "vllm/vllm-openai:kimi-k3"
    assert any(m.target == "/k3-runtime-patches" and m.read_only for m in recipe.mounts)
    assert any("runtime_patches/sitecustomize.py" in step for step in recipe.setup)
    notes = " ".join(recipe.notes)
    for fact in ("B200/B300", "1.6 TB", "18 minutes", "196,608", "1,048,576"):
        assert fact in notes
    assert recipe.from_catalogue


def test_kimi_k3_vllm_overrides_are_noted() -> None:
    recipe = recipe_for("NVIDIA/kimi-k3-nvfp4", "vllm", max_model_len=262_144, gpus=4)
    assert _option(recipe.argv, "--max-model-len") == "262144"
    assert _option(recipe.argv, "--tensor-parallel-size") == "4"
    notes = " ".join(recipe.notes)
    assert "above the validated 196,608" in notes
    # 1.6 TB / 4 = 400 GB per GPU, more than a B300's 288 GB.
    assert "400 GB each" in notes


def test_kimi_k3_context_beyond_the_architecture_is_refused() -> None:
    with pytest.raises(ServingConfigError) as info:
        recipe_for(KIMI_K3_NVFP4, "vllm", max_model_len=2_000_000)
    assert info.value.field == "max_model_len"
    assert "1,048,576" in str(info.value)


def test_kimi_k3_sglang_recipe() -> None:
    recipe = recipe_for(KIMI_K3_NVFP4, "sglang")
    argv = recipe.argv
    assert recipe.image == "lmsysorg/sglang:dev-dev-kimi-k3-nvfp4"
    assert _option(argv, "--tp-size") == "8"
    assert _option(argv, "--dcp-size") == "8"
    assert _option(argv, "--moe-runner-backend") == "flashinfer_trtllm"
    assert _option(argv, "--speculative-algorithm") == "DSPARK"
    assert _option(argv, "--speculative-draft-model-path") == "RadixArk/Kimi-K3-DSpark"
    assert _option(argv, "--speculative-dspark-block-size") == "7"
    assert "--enable-cache-report" in argv and "--enable-metrics" in argv
    assert "--context-length" not in argv  # the checkpoint's own, unless narrowed
    assert not recipe.env  # no runtime patch
    assert "required" in " ".join(recipe.notes)

    narrowed = recipe_for(KIMI_K3_NVFP4, "sglang", max_model_len=131_072, speculative=False)
    assert _option(narrowed.argv, "--context-length") == "131072"
    assert not any(arg.startswith("--speculative") for arg in narrowed.argv)


def test_render_shell_for_an_image() -> None:
    text = recipe_for(KIMI_K3_NVFP4, "vllm").to_text()
    assert "docker run --rm --gpus all --ipc=host --network=host --shm-size=64g" in text
    assert "  -e HF_TOKEN \\" in text
    assert '-v "$PWD/kimi-k3-runtime/runtime_patches:/k3-runtime-patches:ro"' in text
    # The image's entrypoint is `vllm serve`: only the model and flags follow it.
    assert "vllm/vllm-openai:kimi-k3 \\\n  nvidia/Kimi-K3-NVFP4 \\\n    --served-model-name" in text
    assert "vllm serve" not in text
    # The JSON value survives the shell as one word.
    joined = text.split("vllm/vllm-openai:kimi-k3", 1)[1].replace("\\\n", " ")
    words = shlex.split(joined)
    assert _option(tuple(words), "--attention-config") == (
        '{"mla_prefill_backend":"TRTLLM_RAGGED","use_prefill_query_quantization":true}'
    )
    sglang = recipe_for(KIMI_K3_NVFP4, "sglang").to_text()
    assert "lmsysorg/sglang:dev-dev-kimi-k3-nvfp4 \\\n  sglang serve \\\n    --trust-remote-code" in sglang


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_generic_recipe_round_trips_through_the_shell(engine: str) -> None:
    recipe = recipe_for("meta-llama/Llama-3.1-8B-Instruct", engine, gpus=2, config=LLAMA_GQA)
    assert not recipe.from_catalogue
    assert recipe.image is None
    assert shlex.split(recipe.to_text().replace("\\\n", " ")) == list(recipe.argv)


def test_generic_vllm_recipe_has_the_long_context_switches() -> None:
    recipe = recipe_for("meta-llama/Llama-3.1-8B-Instruct", "vllm", gpus=2, config=with_kv_scales(LLAMA_GQA))
    argv = recipe.argv
    assert argv[:3] == ("vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct")
    assert _option(argv, "--tensor-parallel-size") == "2"
    assert _option(argv, "--max-model-len") == "131072"  # from max_position_embeddings
    assert _option(argv, "--kv-cache-dtype") == "fp8"  # the config declares calibrated KV scales
    assert recipe.kv_cache_dtype == "fp8" and not recipe.warnings
    assert any("kv_cache_scheme" in note for note in recipe.notes)
    assert _option(argv, "--max-num-batched-tokens") == "8192"
    assert "--enable-prefix-caching" in argv and "--enable-chunked-prefill" in argv
    assert "--enable-prompt-tokens-details" in argv
    assert "--trust-remote-code" not in argv
    assert any("longctx plan" in note for note in recipe.notes)


def test_generic_sglang_recipe_uses_sglang_names() -> None:
    recipe = recipe_for("deepseek-ai/DeepSeek-V3", "sglang", gpus=8, max_model_len=65_536,
                        config=with_kv_scales({**DEEPSEEK_MLA, "auto_map": {"AutoConfig": "x"}}))  # fmt: skip
    argv = recipe.argv
    assert _option(argv, "--tp-size") == "8"
    assert _option(argv, "--context-length") == "65536"
    # SGLang names fp8 by its format.
    assert _option(argv, "--kv-cache-dtype") == "fp8_e4m3"
    assert _option(argv, "--chunked-prefill-size") == "8192"
    assert "--trust-remote-code" in argv
    assert any("--dcp-size" in note for note in recipe.notes)


def test_unknown_model_without_config_says_what_to_pass() -> None:
    with pytest.raises(ServingConfigError) as info:
        recipe_for("some/model", "vllm")
    assert info.value.field == "config"
    assert KIMI_K3_NVFP4 in str(info.value)
    assert catalogue_models() == (KIMI_K3_NVFP4,)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"engine": "tgi"}, "engine"),
        ({"engine": "vllm", "gpus": 0}, "gpus"),
        ({"engine": "vllm", "max_model_len": -5}, "max_model_len"),
        ({"engine": "vllm", "gpus": 3}, "num_key_value_heads"),
    ],
)
def test_bad_recipe_arguments_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ServingConfigError) as info:
        recipe_for("meta-llama/Llama-3.1-8B-Instruct", config=LLAMA_GQA, **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_flags_lists_option_names_only() -> None:
    recipe = recipe_for("meta-llama/Llama-3.1-8B-Instruct", "vllm", config=LLAMA_GQA)
    assert recipe.flags()[:2] == ("--tensor-parallel-size", "--max-model-len")
    assert "1" not in recipe.flags()


def test_serving_package_exports_resolve() -> None:
    assert sorted(serving.__all__) == sorted(set(serving.__all__))
    for name in serving.__all__:
        assert getattr(serving, name) is not None


def test_a_measured_follow_up_switch_enters_the_generic_recipe_with_its_source() -> None:
    """The slot the follow-up probe's results fill: empty (nothing claimed) until a run shows a gain."""
    import dataclasses

    from longctx.backends.engines import VLLM, registered

    assert VLLM.recipe is not None and VLLM.recipe.followup_switches == ()
    measured = dataclasses.replace(
        VLLM.recipe, followup_switches=("--prefix-caching-hash-algo", "xxhash"), followup_source="probe X"
    )
    with registered(dataclasses.replace(VLLM, recipe=measured)):
        recipe = recipe_for("meta-llama/Llama-3.1-8B-Instruct", "vllm", gpus=2, config=LLAMA_GQA)
    assert recipe.argv[-2:] == ("--prefix-caching-hash-algo", "xxhash")
    assert any(note.endswith("probe X") for note in recipe.notes)


@pytest.mark.parametrize(
    ("engine", "measured"), [("vllm", "1/10 with fp8"), ("sglang", "5/10 with fp8_e4m3")]
)
def test_without_kv_scales_the_recipe_keeps_the_model_type_and_says_why(engine: str, measured: str) -> None:
    recipe = recipe_for("meta-llama/Llama-3.1-8B-Instruct", engine, config=LLAMA_GQA)
    assert "--kv-cache-dtype" not in recipe.argv
    assert recipe.kv_cache_dtype == "auto" and not recipe.warnings
    why = next(note for note in recipe.notes if "model's own type" in note)
    # The run is named by date, GPU and engine version, with its figures.
    assert "2026-12-06, H100" in why and "9/10 facts with bf16 KV" in why and measured in why
    assert "declares no KV-cache quantization" in why


def test_fp8_asked_without_kv_scales_is_launched_with_a_warning() -> None:
    recipe = recipe_for("meta-llama/Llama-3.1-8B-Instruct", "vllm", config=LLAMA_GQA, kv_cache_dtype="fp8")
    assert _option(recipe.argv, "--kv-cache-dtype") == "fp8"
    assert recipe.kv_cache_dtype == "fp8"
    assert len(recipe.warnings) == 1 and "vLLM 0.24.0" in recipe.warnings[0]
    scaled = recipe_for("m", "sglang", config=with_kv_scales(LLAMA_GQA), kv_cache_dtype="fp8")
    assert _option(scaled.argv, "--kv-cache-dtype") == "fp8_e4m3" and not scaled.warnings


def test_auto_asked_with_kv_scales_keeps_the_model_type() -> None:
    recipe = recipe_for("m", "vllm", config=with_kv_scales(LLAMA_GQA), kv_cache_dtype="auto")
    assert "--kv-cache-dtype" not in recipe.argv and recipe.kv_cache_dtype == "auto"


def test_a_model_known_by_name_has_no_checkpoint_to_read_scales_from() -> None:
    recipe = recipe_for("meta-llama/Llama-3.1-8B-Instruct", "vllm")
    assert "--kv-cache-dtype" not in recipe.argv
    assert any("known by name only" in note for note in recipe.notes)


def test_given_kv_scales_decide_over_the_config() -> None:
    found = serving.KVScales(True, "64 k/v scale tensors in model.safetensors.index.json")
    recipe = recipe_for("m", "vllm", config=LLAMA_GQA, kv_scales=found)
    assert _option(recipe.argv, "--kv-cache-dtype") == "fp8"
    assert any("64 k/v scale tensors" in note for note in recipe.notes)


def test_kv_cache_choice_is_checked() -> None:
    with pytest.raises(ServingConfigError) as info:
        recipe_for("m", "vllm", config=LLAMA_GQA, kv_cache_dtype="int4")
    assert info.value.field == "kv_cache_dtype"
    with pytest.raises(ServingConfigError) as catalogue:
        recipe_for(KIMI_K3_NVFP4, "vllm", kv_cache_dtype="auto")
    assert catalogue.value.field == "kv_cache_dtype"
