"""Build the tiny test model. Run as a script by an engine's Python.

This file is executed with the interpreter of a server's virtual environment
(which has torch, tokenizers and safetensors); it must not import longctx.

    python _model_builder.py OUT_DIR

It writes a complete Hugging Face model folder:

- a byte-level BPE tokenizer (4,096 entries) trained with ``tokenizers`` on
  the running Python's standard-library sources, text every machine with
  this Python has, so nothing is downloaded;
- a ChatML chat template that, like the templates of reasoning models
  (Qwen3, DeepSeek-R1, Kimi K2-Thinking), drops ``<think>...</think>`` from
  earlier assistant turns;
- a 2-layer Llama (hidden 128, 2 heads of 64) with random weights, seeded,
  saved as bf16 safetensors.

Two builds with the same Python produce byte-identical files.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

SEED = 20261130
VOCAB_SIZE = 4096
HIDDEN = 128
INTERMEDIATE = 512
LAYERS = 2
HEADS = 2
HEAD_DIM = 64
MAX_POSITIONS = 32768
# Enough text for a useful vocabulary, small enough to train in seconds.
TRAINING_BYTES = 8 * 1024 * 1024

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

# ChatML, rendered the way real ChatML templates (Qwen2, Qwen3) render it:
# the generation prompt is "<|im_start|>assistant\n", exactly the start of
# an assistant turn in history, so an answer's tokens can be served from the
# cache in the next turn. The text is emitted by expressions, never by
# template text next to a "{%-": whitespace control would eat the newlines.
# Earlier assistant turns lose their reasoning the way Qwen3's template
# does, so longctx's "store what the template will render" rule can be
# tested against a real server.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- set content = message['content'] %}"
    "{%- if message['role'] == 'assistant' and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def training_files() -> list[Path]:
    """The standard-library sources, in byte order of their relative paths."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [
        path
        for path in stdlib.rglob("*.py")
        if "site-packages" not in path.parts and "test" not in path.parts
    ]
    files.sort(key=lambda path: path.relative_to(stdlib).as_posix().encode())
    chosen: list[Path] = []
    total = 0
    for path in files:
        if total >= TRAINING_BYTES:
            break
        chosen.append(path)
        total += path.stat().st_size
    return chosen


def train_tokenizer(out: Path, special_tokens: list[str]) -> None:
    """Train the byte-level BPE on the standard library and save ``out/tokenizer.json``.

    The special tokens take the first ids, in the order given. The tiny
    vision model's builder trains its tokenizer here too, with its own list.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # type: ignore[import-not-found,unused-ignore]

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def texts() -> Iterator[str]:
        for path in training_files():
            yield path.read_text(encoding="utf-8", errors="replace")

    tokenizer.train_from_iterator(texts(), trainer)
    tokenizer.save(str(out / "tokenizer.json"))


def build_tokenizer(out: Path) -> None:
    train_tokenizer(out, SPECIAL_TOKENS)

    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "model_max_length": MAX_POSITIONS,
                "clean_up_tokenization_spaces": False,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (out / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=2, sort_keys=True) + "\n"
    )


def build_weights(out: Path, eos_id: int, pad_id: int) -> None:
    import torch  # type: ignore[import-not-found]
    from safetensors.torch import save_file  # type: ignore[import-not-found]

    generator = torch.Generator().manual_seed(SEED)

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)

    def ones(size: int) -> torch.Tensor:
        return torch.ones(size, dtype=torch.bfloat16)

    tensors: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(VOCAB_SIZE, HIDDEN)}
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}"
        tensors[f"{prefix}.input_layernorm.weight"] = ones(HIDDEN)
        tensors[f"{prefix}.self_attn.q_proj.weight"] = normal(HEADS * HEAD_DIM, HIDDEN)
        tensors[f"{prefix}.self_attn.k_proj.weight"] = normal(HEADS * HEAD_DIM, HIDDEN)
        tensors[f"{prefix}.self_attn.v_proj.weight"] = normal(HEADS * HEAD_DIM, HIDDEN)
        tensors[f"{prefix}.self_attn.o_proj.weight"] = normal(HIDDEN, HEADS * HEAD_DIM)
        tensors[f"{prefix}.post_attention_layernorm.weight"] = ones(HIDDEN)
        tensors[f"{prefix}.mlp.gate_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[f"{prefix}.mlp.up_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[f"{prefix}.mlp.down_proj.weight"] = normal(HIDDEN, INTERMEDIATE)
    tensors["model.norm.weight"] = ones(HIDDEN)
    tensors["lm_head.weight"] = normal(VOCAB_SIZE, HIDDEN)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": VOCAB_SIZE,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": pad_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": "bfloat16",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": eos_id, "pad_token_id": pad_id}, indent=2, sort_keys=True) + "\n"
    )


def output_folder(argv: list[str]) -> Path | None:
    """The ``OUT_DIR`` argument, made, with the tokenizer library held to one thread (None: bad usage).

    Rayon threads make token counting order-dependent; one thread keeps the
    merges, and so the files, identical between builds.
    """
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUT_DIR", file=sys.stderr)
        return None
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    return out


def main(argv: list[str]) -> int:
    if (out := output_folder(argv)) is None:
        return 2
    build_tokenizer(out)
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    build_weights(out, eos_id=vocab["<|im_end|>"], pad_id=vocab["<|endoftext|>"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
