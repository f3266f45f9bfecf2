"""Model configs shared by the serving tests: real published values, or shapes named after them."""

from __future__ import annotations

from typing import Any

# A Llama-3-8B-shaped GQA model: 32 layers, 32 query heads, 8 KV heads,
# hidden 4096 (so head_dim = 4096 / 32 = 128, not stated in the config).
LLAMA_GQA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}

# A calibrated fp8 KV cache declared the way llm-compressor writes it into config.json
# (compressed-tensors; e.g. RedHatAI's FP8-KV checkpoints): the engines load k_scale/v_scale.
KV_CACHE_SCHEME: dict[str, Any] = {
    "dynamic": False,
    "num_bits": 8,
    "observer": "minmax",
    "strategy": "tensor",
    "symmetric": True,
    "type": "float",
}


def with_kv_scales(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` as a checkpoint with calibrated KV-cache scales declares itself."""
    quantization = {"quant_method": "compressed-tensors", "kv_cache_scheme": KV_CACHE_SCHEME}
    return {**config, "quantization_config": quantization}


# A DeepSeek-V3-shaped MLA model: 61 layers, latent rank 512, rope dim 64.
DEEPSEEK_MLA: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "torch_dtype": "bfloat16",
}

# The attention fields of moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json
# (Hugging Face; the same values appear verbatim in several public
# reimplementations: 27 layers, MLA on layers 4, 8, 12, 16, 20, 24, 27
# (1-based), KDA on the other 20, 32 KDA heads of 128, short conv kernel 4).
KIMI_LINEAR_48B: dict[str, Any] = {
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "hidden_size": 2304,
    "num_hidden_layers": 27,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 72,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "mla_use_nope": True,
    "model_max_length": 1048576,
    "torch_dtype": "bfloat16",
    "linear_attn_config": {
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
        "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
        "head_dim": 128,
        "num_heads": 32,
        "short_conv_kernel_size": 4,
    },
}

# Qwen3-Next-80B-A3B's attention fields (the defaults of transformers'
# Qwen3NextConfig): 48 layers, every 4th full attention (2 KV heads of 256),
# the rest Gated DeltaNet (16 key heads, 32 value heads, 128 x 128, conv 4).
QWEN3_NEXT: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "full_attention_interval": 4,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
}

# gpt-oss-20b-shaped: 24 layers alternating sliding (window 128) and full,
# 8 KV heads of 64.
GPT_OSS_SLIDING: dict[str, Any] = {
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "num_hidden_layers": 24,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}

# A Kimi-K3-shaped language model (the seed's description: MLA full-attention layers among
# Kimi Delta Attention layers, one MLA layer in four, a 1M-token architecture). The sizes are
# Kimi K2's attention (64 heads, latent 512 + rope 64) on 64 layers, 16 MLA and 48 KDA of
# 64 heads x 128: a shape to plan with, not the checkpoint's own config.
KIMI_K3_SHAPED: dict[str, Any] = {
    "architectures": ["KimiK3ForCausalLM"],
    "model_type": "kimi_k3",
    "text_config": {
        "model_type": "kimi_linear",
        "hidden_size": 7168,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "head_dim": 112,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "mla_use_nope": True,
        "model_max_length": 1048576,
        "torch_dtype": "bfloat16",
        "linear_attn_config": {
            "full_attn_layers": list(range(4, 65, 4)),
            "kda_layers": [layer for layer in range(1, 65) if layer % 4],
            "head_dim": 128,
            "num_heads": 64,
            "short_conv_kernel_size": 4,
        },
    },
}
