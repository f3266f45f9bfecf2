"""The shapes of popular long-context models, so ``recipe`` and ``plan`` take them by name.

Each entry holds the ``config.json`` keys the KV planner reads (layers,
heads, head size, window, dtype), as the models' published configs state
them; a model outside this table, or a fine-tune whose shape differs, is
planned from its own ``config.json``. Names match case-insensitively, with
or without the organisation (``Qwen2.5-7B-Instruct-1M`` finds
``Qwen/Qwen2.5-7B-Instruct-1M``, which the recipe then serves).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from longctx.recordtypes import record_type

__all__ = ["KNOWN_MODELS", "KnownModel", "known_model", "known_models"]


@record_type
class KnownModel:
    """A model of the table: its full name (for the server's command line) and its config keys."""

    name: str
    config: Mapping[str, Any]


def _llama(layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": intermediate,
        "max_position_embeddings": 131_072,
        "torch_dtype": "bfloat16",
    }


def _qwen2(layers: int, hidden: int, heads: int, kv_heads: int, context: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": context,
        "torch_dtype": "bfloat16",
    }


KNOWN_MODELS: Final[Mapping[str, Mapping[str, Any]]] = {
    "meta-llama/Llama-3.1-8B-Instruct": _llama(32, 4096, 32, 8, 14_336),
    "meta-llama/Llama-3.1-70B-Instruct": _llama(80, 8192, 64, 8, 28_672),
    "meta-llama/Llama-3.3-70B-Instruct": _llama(80, 8192, 64, 8, 28_672),
    "Qwen/Qwen2.5-7B-Instruct-1M": _qwen2(28, 3584, 28, 4, 1_010_000),
    "Qwen/Qwen2.5-14B-Instruct-1M": _qwen2(48, 5120, 40, 8, 1_010_000),
    "Qwen/Qwen3-8B": {
        **_qwen2(36, 4096, 32, 8, 40_960),
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "head_dim": 128,
    },
    "mistralai/Mistral-Nemo-Instruct-2407": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "num_hidden_layers": 40,
        "hidden_size": 5120,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 1_024_000,
        "torch_dtype": "bfloat16",
    },
}
"""Model name -> the config keys that decide its KV cache."""


def known_models() -> tuple[str, ...]:
    """The names :func:`known_model` knows, sorted."""
    return tuple(sorted(KNOWN_MODELS, key=str.lower))


def known_model(model: str) -> KnownModel | None:
    """``model`` from :data:`KNOWN_MODELS` (named with or without its organisation), else None."""
    wanted = model.strip().lower()
    for name, config in KNOWN_MODELS.items():
        if wanted in (name.lower(), name.lower().split("/", 1)[1]):
            return KnownModel(name, config)
    return None
