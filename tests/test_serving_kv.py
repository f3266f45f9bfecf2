"""KV-cache layouts read from Hugging Face configs, against hand-computed figures."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from serving_configs import DEEPSEEK_MLA, GPT_OSS_SLIDING, KIMI_LINEAR_48B, LLAMA_GQA, QWEN3_NEXT

from longctx.errors import InputError, ServingConfigError, UnsupportedArchitecture
from longctx.serving import LayerKind, kv_layout_from_config, load_model_config


def test_gqa_bytes_per_token_bf16_and_fp8() -> None:
    layout = kv_layout_from_config(LLAMA_GQA, kv_cache_dtype="bf16")
    # 2 (K, V) x 8 KV heads x 128 x 2 bytes x 32 layers = 131,072 = 128 KiB.
    assert layout.token_bytes() == 131_072 == 128 * 1024
    assert layout.state_bytes() == 0
    assert [g.kind for g in layout.groups] == [LayerKind.ATTENTION]
    assert layout.groups[0].head_dim == 128  # hidden_size / num_attention_heads
    assert layout.max_context == 131072
    # fp8: one byte per element, half of bf16.
    assert kv_layout_from_config(LLAMA_GQA, kv_cache_dtype="fp8").token_bytes() == 65_536
    # "auto" takes the model dtype (bfloat16).
    assert kv_layout_from_config(LLAMA_GQA).kv_cache_dtype == "bf16"


def test_gqa_tensor_parallel_splits_then_replicates_kv_heads() -> None:
    layout = kv_layout_from_config(LLAMA_GQA)
    # TP 2: 4 KV heads per GPU: 2 x 4 x 128 x 2 x 32 = 65,536.
    assert layout.token_bytes(2) == 65_536
    # TP 8: 1 head per GPU: 2 x 1 x 128 x 2 x 32 = 16,384.
    assert layout.token_bytes(8) == 16_384
    # TP 16 > 8 KV heads: each head is replicated, still 1 per GPU.
    assert layout.token_bytes(16) == 16_384


@pytest.mark.parametrize("tp", [3, 12])
def test_gqa_tensor_parallel_that_cannot_split_heads_names_the_field(tp: int) -> None:
    layout = kv_layout_from_config(LLAMA_GQA)
    with pytest.raises(ServingConfigError) as info:
        layout.token_bytes(tp)
    assert info.value.field == "num_key_value_heads"
    assert "8" in str(info.value) and str(tp) in str(info.value)


def test_gqa_sequence_bytes_round_up_to_blocks() -> None:
    layout = kv_layout_from_config(LLAMA_GQA)
    # 1,000 tokens in blocks of 16: ceil(1000 / 16) = 63 blocks = 1,008 tokens;
    # 1,008 x 131,072 = 132,120,576 bytes.
    assert layout.sequence_bytes(1000, block_size=16) == 132_120_576
    assert layout.sequence_bytes(1000) == 131_072_000
    assert layout.sequence_bytes(0, block_size=16) == 0


def test_head_dim_absent_and_kv_heads_absent_default_to_multi_head() -> None:
    config = {k: v for k, v in LLAMA_GQA.items() if k != "num_key_value_heads"}
    layout = kv_layout_from_config(config)
    # 2 x 32 heads x 128 x 2 bytes x 32 layers = 524,288.
    assert layout.token_bytes() == 524_288
    assert any("num_key_value_heads absent" in note for note in layout.notes)


def test_mla_bytes_per_token() -> None:
    layout = kv_layout_from_config(DEEPSEEK_MLA, kv_cache_dtype="bf16")
    # (512 + 64) x 2 bytes x 61 layers = 576 x 2 x 61 = 70,272; no K/V pair.
    assert layout.token_bytes() == 70_272
    assert [g.kind for g in layout.groups] == [LayerKind.MLA]
    # fp8: 576 x 1 x 61 = 35,136.
    assert kv_layout_from_config(DEEPSEEK_MLA, kv_cache_dtype="fp8").token_bytes() == 35_136


def test_mla_latent_is_not_split_by_tensor_parallel_but_by_dcp() -> None:
    layout = kv_layout_from_config(DEEPSEEK_MLA)
    # Every TP rank holds the whole latent: still 70,272 bytes per token.
    assert layout.token_bytes(8) == 70_272
    # DCP 8 splits the sequence: 196,608 / 8 = 24,576 tokens per GPU (a whole
    # number of 16-token blocks); 24,576 x 70,272 = 1,727,004,672 bytes.
    assert layout.sequence_bytes(196_608, tp=8, dcp=8, block_size=16) == 1_727_004_672
    # Without DCP each GPU holds all 196,608: 8 times as much.
    assert layout.sequence_bytes(196_608, tp=8, block_size=16) == 8 * 1_727_004_672


def test_mla_without_rope_dim_names_the_field() -> None:
    config = {k: v for k, v in DEEPSEEK_MLA.items() if k != "qk_rope_head_dim"}
    with pytest.raises(ServingConfigError) as info:
        kv_layout_from_config(config)
    assert info.value.field == "qk_rope_head_dim"
    assert "qk_rope_head_dim" in str(info.value)


def test_kimi_linear_hybrid_of_kda_and_mla() -> None:
    layout = kv_layout_from_config(KIMI_LINEAR_48B, kv_cache_dtype="bf16")
    kinds = {g.kind: g for g in layout.groups}
    assert kinds[LayerKind.MLA].count == 7
    assert kinds[LayerKind.LINEAR].count == 20
    # Layers are 1-based in the config: layer 4 is index 3.
    assert kinds[LayerKind.MLA].layers[0] == 3
    # Kimi Linear states its window as model_max_length, not max_position_embeddings.
    assert layout.max_context == 1_048_576
    # MLA: 7 layers x (512 + 64) x 2 bytes = 8,064 bytes per token.
    assert layout.token_bytes() == 8_064
    # KDA, per layer: recurrent 32 heads x 128 x 128 x 4 bytes (fp32) = 2,097,152;
    # conv (q, k, v) 3 x 32 x 128 = 12,288 channels x (4 - 1) steps x 2 bytes = 73,728;
    # 2,170,880 per layer x 20 layers = 43,417,600 bytes per sequence.
    assert layout.state_bytes() == 43_417_600
    # 131,072 tokens: 131,072 x 8,064 + 43,417,600 = 1,100,382,208.
    assert layout.sequence_bytes(131_072, block_size=16) == 1_100_382_208
    # fp8 halves the MLA part only: the KDA state keeps its dtypes.
    fp8 = kv_layout_from_config(KIMI_LINEAR_48B, kv_cache_dtype="fp8")
    assert fp8.token_bytes() == 4_032
    assert fp8.state_bytes() == 43_417_600


def test_kimi_linear_tensor_parallel_splits_state_not_latent() -> None:
    layout = kv_layout_from_config(KIMI_LINEAR_48B)
    # TP 4: 8 KDA heads per GPU: 8 x 128 x 128 x 4 = 524,288; conv 3,072 x 3 x 2 = 18,432;
    # (524,288 + 18,432) x 20 = 10,854,400 = 43,417,600 / 4.
    assert layout.state_bytes(4) == 10_854_400
    assert layout.token_bytes(4) == 8_064
    with pytest.raises(ServingConfigError) as info:
        layout.state_bytes(3)
    assert info.value.field == "linear_attn_config.num_heads"


def test_kimi_config_nested_in_text_config_names_nested_fields() -> None:
    # Kimi K3 and other multimodal configs keep the language model in text_config.
    text = copy.deepcopy(KIMI_LINEAR_48B)
    nested = {"model_type": "kimi_k3", "text_config": text}
    assert kv_layout_from_config(nested).state_bytes() == 43_417_600
    del text["linear_attn_config"]["num_heads"]
    with pytest.raises(ServingConfigError) as info:
        kv_layout_from_config(nested)
    assert info.value.field == "text_config.linear_attn_config.num_heads"


def test_kimi_layer_lists_must_cover_every_layer_once() -> None:
    config = copy.deepcopy(KIMI_LINEAR_48B)
    config["linear_attn_config"]["kda_layers"].remove(13)
    with pytest.raises(ServingConfigError) as info:
        kv_layout_from_config(config)
    assert info.value.field == "linear_attn_config.kda_layers"
    assert "missing [13]" in str(info.value)


def test_qwen3_next_hybrid_of_gated_deltanet_and_gqa() -> None:
    layout = kv_layout_from_config(QWEN3_NEXT)
    kinds = {g.kind: g for g in layout.groups}
    # full_attention_interval 4: layers 3, 7, ..., 47 are full (12), 36 linear.
    assert kinds[LayerKind.ATTENTION].layers == tuple(range(3, 48, 4))
    assert kinds[LayerKind.LINEAR].count == 36
    # Full: 2 x 2 KV heads x 256 x 2 bytes x 12 layers = 24,576 bytes per token.
    assert layout.token_bytes() == 24_576
    # Gated DeltaNet, per layer: recurrent 32 value heads x 128 x 128 x 2 bytes = 1,048,576;
    # conv (2 x 16 x 128 + 32 x 128) = 8,192 channels x 3 steps x 2 bytes = 49,152;
    # 1,097,728 x 36 layers = 39,518,208 bytes per sequence.
    assert layout.state_bytes() == 39_518_208


def test_qwen35_layer_types_and_fp32_recurrent_state() -> None:
    # Qwen3.5 states layer_types and pins mamba_ssm_dtype float32, which vLLM adopts.
    config = {k: v for k, v in QWEN3_NEXT.items() if k != "full_attention_interval"}
    config.update(
        num_hidden_layers=8,
        layer_types=["linear_attention"] * 3
        + ["full_attention"]
        + ["linear_attention"] * 3
        + ["full_attention"],
        mamba_ssm_dtype="float32",
    )
    layout = kv_layout_from_config(config)
    # Per linear layer: 32 x 128 x 128 x 4 = 2,097,152 + conv 49,152 = 2,146,304; x 6 = 12,877,824.
    assert layout.state_bytes() == 12_877_824
    # Full: 2 x 2 x 256 x 2 x 2 layers = 4,096.
    assert layout.token_bytes() == 4_096


def test_sliding_window_layers_are_capped_at_the_window() -> None:
    layout = kv_layout_from_config(GPT_OSS_SLIDING)
    # 12 full layers: 2 x 8 x 64 x 2 bytes x 12 = 24,576 per token; the 12 sliding ones the same.
    assert layout.token_bytes() == 24_576
    assert layout.window_token_bytes() == 24_576
    # 8,192 tokens: full 8,192 x 24,576 = 201,326,592; sliding min(8,192, 128) x 24,576 = 3,145,728.
    assert layout.sequence_bytes(8_192, block_size=16) == 201_326_592 + 3_145_728
    # 100 tokens (under the window): both hold 112 tokens (7 blocks): 112 x 49,152 = 5,505,024.
    assert layout.sequence_bytes(100, block_size=16) == 5_505_024


def test_sliding_pattern_derivations() -> None:
    gemma3 = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 12,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
    }
    layout = kv_layout_from_config(gemma3)
    kinds = {g.kind: g.layers for g in layout.groups}
    # Every 6th layer is global: indices 5 and 11.
    assert kinds[LayerKind.ATTENTION] == (5, 11)
    assert len(kinds[LayerKind.SLIDING]) == 10

    gemma2 = {**gemma3, "model_type": "gemma2"}
    del gemma2["sliding_window_pattern"]
    kinds = {g.kind: g.layers for g in kv_layout_from_config(gemma2).groups}
    assert kinds[LayerKind.SLIDING] == (0, 2, 4, 6, 8, 10)

    mistral = {**LLAMA_GQA, "model_type": "mistral", "sliding_window": 4096}
    assert [g.kind for g in kv_layout_from_config(mistral).groups] == [LayerKind.SLIDING]

    # Qwen2/Qwen3 ship a sliding_window that is off unless use_sliding_window.
    qwen = {**LLAMA_GQA, "model_type": "qwen3", "sliding_window": 131072, "use_sliding_window": False}
    assert [g.kind for g in kv_layout_from_config(qwen).groups] == [LayerKind.ATTENTION]


def test_missing_layer_count_names_the_field() -> None:
    config = {k: v for k, v in LLAMA_GQA.items() if k != "num_hidden_layers"}
    with pytest.raises(ServingConfigError) as info:
        kv_layout_from_config(config)
    assert info.value.field == "num_hidden_layers"
    assert "num_hidden_layers" in str(info.value)


def test_head_dim_that_cannot_be_derived_names_the_field() -> None:
    config = {**LLAMA_GQA, "hidden_size": 4000, "num_attention_heads": 48}
    with pytest.raises(ServingConfigError) as info:
        kv_layout_from_config(config)
    assert info.value.field == "head_dim"


def test_layer_types_of_wrong_length_is_refused() -> None:
    config = {**GPT_OSS_SLIDING, "layer_types": ["full_attention"] * 3}
    with pytest.raises(ServingConfigError) as info:
        kv_layout_from_config(config)
    assert info.value.field == "layer_types"


def test_unknown_layer_type_is_an_unsupported_architecture() -> None:
    types = ["full_attention"] * 24
    types[3] = "chunked_attention"
    with pytest.raises(UnsupportedArchitecture) as info:
        kv_layout_from_config({**GPT_OSS_SLIDING, "layer_types": types})
    assert info.value.field == "layer_types[3]"
    assert "chunked_attention" in str(info.value)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (
            {**LLAMA_GQA, "model_type": "nemotron_h", "hybrid_override_pattern": "M-M*"},
            "hybrid_override_pattern",
        ),
        ({**LLAMA_GQA, "model_type": "mamba2"}, "model_type"),
    ],
)
def test_state_space_layouts_are_refused_by_name(config: dict[str, Any], field: str) -> None:
    with pytest.raises(UnsupportedArchitecture) as info:
        kv_layout_from_config(config)
    assert info.value.field == field
    assert info.value.architecture == config["model_type"]


def test_unknown_kv_cache_dtype_names_the_argument() -> None:
    with pytest.raises(ServingConfigError) as info:
        kv_layout_from_config(LLAMA_GQA, kv_cache_dtype="int3")
    assert info.value.field == "kv_cache_dtype"


def test_load_model_config_reads_file_or_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_GQA))
    assert load_model_config(tmp_path) == LLAMA_GQA
    assert load_model_config(tmp_path / "config.json") == LLAMA_GQA


def test_load_model_config_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        load_model_config(tmp_path / "missing.json")
    assert info.value.path == tmp_path / "missing.json"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_model_config(bad)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(InputError, match="not a JSON object"):
        load_model_config(listed)
