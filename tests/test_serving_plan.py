"""Capacity plans against hand-computed figures."""

from __future__ import annotations

import json

import pytest
from serving_configs import DEEPSEEK_MLA, GPT_OSS_SLIDING, KIMI_LINEAR_48B, LLAMA_GQA

from longctx.errors import InsufficientMemory, ServingConfigError
from longctx.serving import kv_layout_from_config, plan_capacity

GIB = 1 << 30


def test_gqa_plan_from_gpu_memory_and_weights() -> None:
    layout = kv_layout_from_config(LLAMA_GQA)  # 131,072 bytes (128 KiB) per token in bf16
    plan = plan_capacity(
        layout,
        gpus=1,
        gpu_memory_gib=80,
        weights_gib=15,
        utilization=0.75,
        reserve_gib=4,
        contexts=[8_192, 131_072],
        concurrencies=[1, 8, 32],
    )
    # 80 GiB x 0.75 = 60 GiB; - 15 GiB weights - 4 GiB reserve = 41 GiB.
    assert plan.kv_memory_per_gpu_bytes == 41 * GIB == 44_023_414_784
    assert plan.token_bytes_per_gpu == 131_072
    by_context = {a.context_tokens: a for a in plan.at_context}
    # 8,192 tokens x 128 KiB = 1 GiB per sequence: 41 fit.
    assert by_context[8_192].sequence_bytes_per_gpu == GIB
    assert by_context[8_192].max_concurrency == 41
    # 131,072 tokens x 128 KiB = 16 GiB per sequence: floor(41 / 16) = 2.
    assert by_context[131_072].max_concurrency == 2
    by_concurrency = {a.concurrency: a for a in plan.at_concurrency}
    # One sequence: 41 GiB / 128 KiB = 41 x 8,192 = 335,872 tokens, above the
    # model's 131,072, so the model's limit applies.
    assert by_concurrency[1].memory_max_context_tokens == 335_872
    assert by_concurrency[1].max_context_tokens == 131_072
    assert by_concurrency[1].limited_by == "model"
    # Eight: 41 GiB / 8 / 128 KiB = 41 x 1,024 = 41,984 tokens (2,624 whole blocks).
    assert by_concurrency[8].max_context_tokens == 41_984
    assert by_concurrency[8].limited_by == "memory"
    # Thirty-two: 41 x 256 = 10,496 tokens.
    assert by_concurrency[32].max_context_tokens == 10_496


def test_fp8_doubles_the_context() -> None:
    layout = kv_layout_from_config(LLAMA_GQA, kv_cache_dtype="fp8")  # 64 KiB per token
    plan = plan_capacity(layout, kv_memory_gib=41, concurrencies=[8], contexts=[131_072])
    # 41 GiB / 8 / 64 KiB = 83,968 tokens: twice the bf16 answer.
    assert plan.at_concurrency[0].max_context_tokens == 83_968
    # 131,072 x 64 KiB = 8 GiB per sequence: floor(41 / 8) = 5.
    assert plan.at_context[0].max_concurrency == 5
    assert plan.gpu_memory_bytes is None and plan.utilization is None


def test_gqa_tensor_parallel_plan() -> None:
    layout = kv_layout_from_config(LLAMA_GQA)
    plan = plan_capacity(
        layout, gpus=8, gpu_memory_gib=80, weights_gib=160, utilization=0.75, reserve_gib=0,
        contexts=[131_072], concurrencies=[16],
    )  # fmt: skip
    # Per GPU: 60 GiB - 160 / 8 = 20 GiB weights = 40 GiB of KV.
    assert plan.weights_per_gpu_bytes == 20 * GIB
    assert plan.kv_memory_per_gpu_bytes == 40 * GIB
    # One KV head per GPU: 16 KiB per token; 131,072 x 16 KiB = 2 GiB; 40 / 2 = 20.
    assert plan.token_bytes_per_gpu == 16_384
    assert plan.at_context[0].max_concurrency == 20
    # 16 sequences: 40 GiB / 16 / 16 KiB = 163,840 tokens > model's 131,072.
    assert plan.at_concurrency[0].memory_max_context_tokens == 163_840
    assert plan.at_concurrency[0].limited_by == "model"


def test_mla_with_decode_context_parallelism() -> None:
    layout = kv_layout_from_config(DEEPSEEK_MLA)  # 70,272 bytes per token, whole latent on every GPU
    without = plan_capacity(layout, gpus=8, kv_memory_gib=40, contexts=[131_072], concurrencies=[1])
    with_dcp = plan_capacity(layout, gpus=8, dcp=8, kv_memory_gib=40, contexts=[131_072], concurrencies=[1])
    # Without DCP: 131,072 x 70,272 = 9,210,691,584 bytes per sequence per GPU;
    # 40 GiB = 42,949,672,960; floor(42,949,672,960 / 9,210,691,584) = 4.
    assert without.at_context[0].sequence_bytes_per_gpu == 9_210_691_584
    assert without.at_context[0].max_concurrency == 4
    # DCP 8: 16,384 tokens per GPU x 70,272 = 1,151,336,448; floor(40 GiB / that) = 37.
    assert with_dcp.at_context[0].sequence_bytes_per_gpu == 1_151_336_448
    assert with_dcp.at_context[0].max_concurrency == 37
    # One sequence without DCP: 40 GiB / (16 x 70,272 = 1,124,352 bytes per block)
    # = 38,199 whole blocks = 611,184 tokens; the model stops at 163,840.
    assert without.at_concurrency[0].memory_max_context_tokens == 611_184
    assert without.at_concurrency[0].max_context_tokens == 163_840
    assert any("decode context parallelism" in note for note in without.notes)


def test_hybrid_plan_counts_fixed_state_per_sequence() -> None:
    layout = kv_layout_from_config(KIMI_LINEAR_48B)
    plan = plan_capacity(layout, kv_memory_gib=10, contexts=[131_072], concurrencies=[1, 2])
    # Per sequence: 131,072 x 8,064 + 43,417,600 (KDA state) = 1,100,382,208;
    # 10 GiB = 10,737,418,240; floor(10,737,418,240 / 1,100,382,208) = 9.
    assert plan.state_bytes_per_gpu == 43_417_600
    assert plan.at_context[0].max_concurrency == 9
    one, two = plan.at_concurrency
    # One sequence: (10,737,418,240 - 43,417,600) / (16 x 8,064) = 82,883 whole blocks
    # = 1,326,128 tokens: above the model's 1,048,576.
    assert one.memory_max_context_tokens == 1_326_128
    assert one.limited_by == "model"
    # Two: (5,368,709,120 - 43,417,600) / 129,024 = 41,273 blocks = 660,368 tokens.
    assert two.max_context_tokens == 660_368
    assert two.limited_by == "memory"


def test_sliding_only_model_never_runs_out_of_memory_for_length() -> None:
    config = {**GPT_OSS_SLIDING, "layer_types": ["sliding_attention"] * 24}
    del config["max_position_embeddings"]
    layout = kv_layout_from_config(config)
    plan = plan_capacity(layout, kv_memory_gib=1, concurrencies=[4], contexts=[1_000_000])
    answer = plan.at_concurrency[0]
    assert answer.max_context_tokens is None
    assert answer.memory_max_context_tokens is None
    assert answer.limited_by == "none"
    # Each sequence holds 128 tokens x 24 layers x 2 x 8 x 64 x 2 bytes = 6,291,456 bytes;
    # 1 GiB / 6,291,456 = 170.
    assert plan.at_context[0].sequence_bytes_per_gpu == 6_291_456
    assert plan.at_context[0].max_concurrency == 170


def test_default_questions_follow_the_model_limit() -> None:
    plan = plan_capacity(kv_layout_from_config(LLAMA_GQA), kv_memory_gib=41)
    assert [a.context_tokens for a in plan.at_context] == [8_192, 32_768, 131_072]
    assert [a.concurrency for a in plan.at_concurrency] == [1, 8, 32, 128]
    mla = plan_capacity(kv_layout_from_config(DEEPSEEK_MLA), kv_memory_gib=41)
    # 163,840 is not a power of two: it is added at the end.
    assert [a.context_tokens for a in mla.at_context] == [8_192, 32_768, 131_072, 163_840]


def test_weights_that_do_not_fit_raise_with_the_shortfall() -> None:
    layout = kv_layout_from_config(DEEPSEEK_MLA)
    with pytest.raises(InsufficientMemory) as info:
        plan_capacity(layout, gpus=8, gpu_memory_gib=24, weights_gib=400, utilization=0.75, reserve_gib=4)
    # Per GPU: 24 x 0.75 = 18 GiB usable; 400 / 8 = 50 GiB weights + 4 GiB reserve = 54 GiB;
    # short by 36 GiB.
    assert info.value.shortfall_bytes == 36 * GIB
    assert info.value.field == "gpu_memory"
    message = str(info.value)
    assert "36.00 GiB" in message and "50.00 GiB" in message and "18.00 GiB" in message


def test_a_context_that_does_not_fit_once_reports_its_shortfall() -> None:
    layout = kv_layout_from_config(LLAMA_GQA)
    plan = plan_capacity(layout, kv_memory_gib=10, contexts=[131_072], concurrencies=[1])
    # 131,072 x 128 KiB = 16 GiB per sequence against 10 GiB: 6 GiB short.
    answer = plan.at_context[0]
    assert answer.max_concurrency == 0
    assert answer.shortfall_bytes == 6 * GIB
    assert "6.00 GiB short" in plan.to_text()


def test_beyond_model_limit_is_flagged() -> None:
    plan = plan_capacity(kv_layout_from_config(LLAMA_GQA), kv_memory_gib=100, contexts=[262_144])
    assert plan.at_context[0].beyond_model_limit is True


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"weights_gib": 10}, "gpu_memory"),
        ({"gpu_memory_gib": 80}, "weights"),
        ({"gpu_memory_gib": 80, "weights_gib": 10, "utilization": 1.5}, "utilization"),
        ({"kv_memory_gib": 10, "gpus": 2, "dcp": 3}, "dcp"),
        ({"kv_memory_gib": 10, "gpus": 3}, "num_key_value_heads"),
        ({"kv_memory_gib": 10, "gpus": 0}, "gpus"),
        ({"kv_memory_gib": 10, "contexts": [0]}, "context"),
        ({"kv_memory_gib": -1}, "kv_memory"),
    ],
)
def test_bad_inputs_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ServingConfigError) as info:
        plan_capacity(kv_layout_from_config(LLAMA_GQA), **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_render_text_and_json() -> None:
    layout = kv_layout_from_config(KIMI_LINEAR_48B, kv_cache_dtype="fp8")
    plan = plan_capacity(
        layout,
        gpus=4,
        gpu_memory_gib=80,
        weights_gib=92,
        utilization=0.75,
        contexts=[131_072],
        concurrencies=[2],
    )
    text = plan.to_text()
    # 60 GiB - 92 / 4 = 23 GiB weights - 4 GiB reserve = 33 GiB.
    assert "KV memory           : 33.00 GiB" in text
    assert "7 x MLA (latent 512 + rope 64): 4,032 bytes per token" in text
    assert "20 x KDA" in text
    assert "per sequence, fixed : 10.35 MiB" in text  # 10,854,400 bytes at TP 4
    assert "Longest context at a given concurrency" in text
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["kv_memory_per_gpu_bytes"] == 33 * GIB
    assert data["layout"]["groups"][0]["kind"] == "mla"
