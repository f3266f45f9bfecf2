"""The host tier in `longctx plan`: its tokens from the model's shape, and the packs each tier holds."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from serving_configs import DEEPSEEK_MLA, KIMI_K3_SHAPED

from longctx.cli import main
from longctx.errors import ServingConfigError
from longctx.serving import kv_layout_from_config, plan_capacity, recipe_for
from longctx.serving.families import known_model
from longctx.serving.kv import KVLayout
from longctx.serving.tiers import host_token_bytes, plan_host_tier


def _llama_8b_fp8() -> KVLayout:
    known = known_model("meta-llama/Llama-3.1-8B-Instruct")
    assert known is not None
    return kv_layout_from_config(known.config, kv_cache_dtype="fp8")


def test_the_benchmark_model_host_tier_in_tokens() -> None:
    """8B Llama in fp8: 32 layers x 8 KV heads x 128 x 2 = 65,536 bytes per token; 24 GiB = 393,216 tokens.

    vLLM's CPUOffloadingSpec: 24 GiB // one 16-token block of 1 MiB (page aligned) = 24,576 chunks.
    """
    layout = _llama_8b_fp8()
    plan = plan_capacity(layout, kv_memory_gib=16.45, host_memory_gib=24, contexts=[31_000, 66_000])
    tier = plan.host_tier
    assert tier is not None
    assert tier.token_bytes == 65_536 and tier.tokens == 393_216
    # The GPU's tokens as vLLM counts them (269,552 measured at 16.45 GiB; whole blocks here).
    assert tier.gpu_tokens is not None and abs(tier.gpu_tokens - 269_552) / 269_552 < 0.01
    rows = {row.context_tokens: row for row in tier.at_context}
    assert (rows[31_000].gpu_packs, rows[31_000].host_packs, rows[31_000].together) == (8, 12, 12)
    assert "393,216" in plan.to_text()


def test_the_plan_matches_what_vllm_024_moved_per_token_on_the_h200() -> None:
    """vLLM 0.24.0's own counters on the H200 (docs/benchmarks.md gpu-canary, 16 GiB native tier).

    It loaded 5,048,893,440 bytes CPU -> GPU for 77,040 tokens (prompt_tokens_by_source
    external_kv_transfer): 65,536 bytes a token; it stored 13,442,744,320 bytes GPU -> CPU, whole
    blocks of 16 tokens at that cost (12,820 blocks; it computed 205,172 tokens). The plan's bytes
    per token and the tier's tokens are those the engine's bytes imply (the goal: within 2%).
    """
    loaded_bytes, host_tokens, stored_bytes = 5_048_893_440, 77_040, 13_442_744_320
    engine_bytes_per_token = loaded_bytes / host_tokens
    plan = plan_capacity(_llama_8b_fp8(), kv_memory_gib=1.0, host_memory_gib=16)
    tier = plan.host_tier
    assert tier is not None and tier.token_bytes == engine_bytes_per_token == 65_536
    assert stored_bytes % (tier.token_bytes * tier.block_size) == 0  # whole blocks, as the plan counts
    implied = 16 * (1 << 30) / engine_bytes_per_token
    assert abs(tier.tokens - implied) / implied <= 0.02 and tier.tokens == 262_144


def test_tensor_parallel_ranks_each_offload_their_heads_and_mla_once() -> None:
    llama = _llama_8b_fp8()
    # TP 2 splits the heads; the host holds both halves: the same bytes per token in all.
    assert host_token_bytes(llama, 2) == host_token_bytes(llama, 1) == 65_536
    mla = kv_layout_from_config(DEEPSEEK_MLA, kv_cache_dtype="fp8")
    # MLA's latent is on every rank, offloaded once (vLLM's replicated layout).
    assert host_token_bytes(mla, 8) == host_token_bytes(mla, 1) == mla.token_bytes(1)


def test_kimi_k3_shaped_packs_of_a_million_tokens_per_8_gpu_replica() -> None:
    """16 MLA layers x 576 bytes (fp8) = 9,216 bytes per token; 48 KDA layers of fixed state per pack.

    KDA per layer: 64 heads x 128 x 128 x 4 bytes + conv 3 x 64 x 128 x 3 x 2 = 4,341,760;
    x 48 = 208,404,480 bytes per pack (split over the 8 GPUs, all of it on the host).
    8 x B300-sized GPUs (268 GiB) with 1,490 GiB of weights at 0.90: 46.6 GiB of KV per GPU.
    """
    layout = kv_layout_from_config(KIMI_K3_SHAPED, kv_cache_dtype="fp8")
    assert layout.token_bytes(8) == 9_216 and layout.state_bytes() == 208_404_480
    plan = plan_capacity(
        layout, gpus=8, gpu_memory_gib=268, weights_gib=1490, utilization=0.9,
        contexts=[1_048_576], host_memory_gib=1024,
    )  # fmt: skip
    tier = plan.host_tier
    assert tier is not None
    (row,) = tier.at_context
    # GPU: every GPU holds the whole latent: 1,048,576 x 9,216 + 26,050,560 = 9.69 GB per pack.
    assert row.gpu_packs == 5
    # Host: 1 TiB / (1,048,576 x 9,216 + 208,404,480) = 111.
    assert row.host_packs == 111 and row.together == 111
    assert tier.state_bytes == 208_404_480


def test_an_exclusive_tier_adds_to_the_gpu() -> None:
    layout = _llama_8b_fp8()
    tier = plan_host_tier(
        layout, gpus=1, host_memory_gib=24, block_size=16, contexts=[31_000],
        gpu_kv_bytes_per_gpu=16 << 30, inclusive=False,
    )  # fmt: skip
    (row,) = tier.at_context
    assert row.together == (row.gpu_packs or 0) + row.host_packs


def test_plan_cli_host_memory() -> None:
    result = CliRunner().invoke(
        main,
        ["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--kv-cache-dtype", "fp8",
         "--kv-memory", "16.45", "--host-memory", "24", "--context", "44444", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["host_tier"]["tokens"] == 393_216
    assert data["host_tier"]["at_context"][0]["host_packs"] == 8
    bad = CliRunner().invoke(
        main,
        ["plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--host-memory", "-1", "--kv-memory", "1"],
    )
    assert bad.exit_code != 0 and "--host-memory" in bad.output


def test_recipes_add_each_engines_host_tier_and_refuse_another() -> None:
    native = recipe_for("meta-llama/Llama-3.1-8B-Instruct", "vllm", host_tier="native", host_memory_gib=24)
    assert native.argv[-4:] == ("--kv-offloading-backend", "native", "--kv-offloading-size", "24")
    assert any("#31210" in note for note in native.notes)
    lmcache = recipe_for("meta-llama/Llama-3.1-8B-Instruct", "vllm", host_tier="lmcache", host_memory_gib=24)
    assert "pip install lmcache==0.5.3" in lmcache.setup
    assert any(step.startswith("lmcache server --l1-size-gb 24 ") for step in lmcache.setup)
    hicache = recipe_for(
        "meta-llama/Llama-3.1-8B-Instruct", "sglang", host_tier="hicache", host_memory_gib=24
    )
    assert "--enable-hierarchical-cache" in hicache.argv and "--hicache-size" in hicache.argv
    with pytest.raises(ServingConfigError) as wrong:
        recipe_for("meta-llama/Llama-3.1-8B-Instruct", "vllm", host_tier="hicache", host_memory_gib=24)
    assert wrong.value.field == "host_tier" and "native or lmcache" in str(wrong.value)
    with pytest.raises(ServingConfigError) as sizeless:
        recipe_for("meta-llama/Llama-3.1-8B-Instruct", "sglang", host_tier="hicache")
    assert sizeless.value.field == "host_memory_gib"
    cli = CliRunner().invoke(
        main,
        [
            "recipe",
            "nvidia/Kimi-K3-NVFP4",
            "--engine",
            "vllm",
            "--host-tier",
            "native",
            "--host-memory",
            "1024",
        ],
    )
    assert cli.exit_code == 0, cli.output
    assert "--kv-offloading-size 1024" in cli.stdout
