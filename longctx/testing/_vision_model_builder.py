"""Build the tiny vision-language test model. Run as a script by an engine's Python.

Like ``_model_builder.py`` (whose tokenizer trainer it reuses, imported from
the same folder), it is executed with the interpreter of a server's virtual
environment and must not import longctx:

    python _vision_model_builder.py OUT_DIR

It writes a complete Hugging Face folder of a Qwen2-VL model
(``Qwen2VLForConditionalGeneration``, served by vLLM's CPU build):

- the tiny Llama's byte-level BPE tokenizer (4,096 entries, trained on the
  running Python's standard library) with Qwen2-VL's special tokens
  (``<|vision_start|>``, ``<|image_pad|>``, ``<|vision_end|>``, ``<|video_pad|>``);
- a ChatML chat template that renders OpenAI content parts in place: a text
  part as its text, an image part as ``<|vision_start|><|image_pad|><|vision_end|>``
  (the engine expands the pad to the image's tokens);
- an image processor config with small pixel bounds: an image is resized to
  multiples of 28 pixels within ``MIN_PIXELS``..``MAX_PIXELS`` and costs
  ``(height / 28) * (width / 28)`` tokens, 4 to 256;
- random weights (seeded): a 2-layer language model (hidden 128, 2 heads of
  64, M-RoPE sections 16/8/8) and a 2-block vision tower (width 64, 2 heads),
  saved as bf16 safetensors under the published checkpoints' tensor names.

Two builds with the same Python and transformers produce byte-identical files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from _model_builder import MAX_POSITIONS, VOCAB_SIZE, output_folder, train_tokenizer  # type: ignore[import-not-found,unused-ignore]

SEED = 20261206
HIDDEN = 128
INTERMEDIATE = 512
LAYERS = 2
HEADS = 2
HEAD_DIM = 64
VISION_WIDTH = 64
VISION_DEPTH = 2
VISION_HEADS = 2
PATCH = 14
MERGE = 2
# One token per 28 x 28 pixels: from 2 x 2 tokens to 16 x 16 (a 448 x 448 page).
MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 256 * 28 * 28
# OpenAI CLIP's normalisation, as Qwen2-VL's processor uses.
IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# ChatML over content that is a string or a list of OpenAI parts. vLLM sees
# the loop over message['content'] and passes the parts through in order
# (its "openai" content format), an image part as {'type': 'image'}. The text
# is emitted by expressions, never by template text next to a "{%-".
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}"
    "{{- message['content'] }}"
    "{%- else %}"
    "{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' or part['type'] == 'image_url' or 'image' in part %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif 'text' in part %}"
    "{{- part['text'] }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def write_json(path: Path, payload: object) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def build_tokenizer(out: Path) -> dict[str, int]:
    """The tokenizer files; returns the special tokens' ids."""
    train_tokenizer(out, SPECIAL_TOKENS)
    vocab: dict[str, int] = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "model_max_length": MAX_POSITIONS,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
            "extra_special_tokens": {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"},
        },
    )
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    write_json(out / "special_tokens_map.json", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    return {token: vocab[token] for token in SPECIAL_TOKENS}


def build_processor_config(out: Path) -> None:
    write_json(
        out / "preprocessor_config.json",
        {
            "image_processor_type": "Qwen2VLImageProcessor",
            "processor_class": "Qwen2VLProcessor",
            "do_resize": True,
            "do_rescale": True,
            "do_normalize": True,
            "do_convert_rgb": True,
            "resample": 3,
            "rescale_factor": 1 / 255,
            "image_mean": IMAGE_MEAN,
            "image_std": IMAGE_STD,
            "min_pixels": MIN_PIXELS,
            "max_pixels": MAX_PIXELS,
            "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
            "patch_size": PATCH,
            "temporal_patch_size": 2,
            "merge_size": MERGE,
        },
    )


def model_config(ids: dict[str, int]) -> dict[str, object]:
    eos, pad = ids["<|im_end|>"], ids["<|endoftext|>"]
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "qwen2_vl_text",
            "vocab_size": VOCAB_SIZE,
            "hidden_size": HIDDEN,
            "intermediate_size": INTERMEDIATE,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS,
            "num_key_value_heads": HEADS,
            "hidden_act": "silu",
            "max_position_embeddings": MAX_POSITIONS,
            "rms_norm_eps": 1e-6,
            # M-RoPE: the sections (temporal, height, width) add up to head_dim / 2.
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [16, 8, 8]},
            "tie_word_embeddings": False,
            "bos_token_id": pad,
            "eos_token_id": eos,
            "pad_token_id": pad,
            "torch_dtype": "bfloat16",
        },
        "vision_config": {
            "model_type": "qwen2_vl_vision",
            "depth": VISION_DEPTH,
            "embed_dim": VISION_WIDTH,
            "hidden_size": HIDDEN,
            "hidden_act": "quick_gelu",
            "mlp_ratio": 2,
            "num_heads": VISION_HEADS,
            "in_channels": 3,
            # SGLang 0.5.23's Qwen2-VL reads the field by its name before transformers 5.
            "in_chans": 3,
            "patch_size": PATCH,
            "spatial_merge_size": MERGE,
            "temporal_patch_size": 2,
        },
        "bos_token_id": pad,
        "eos_token_id": eos,
        "pad_token_id": pad,
    }


def build_weights(out: Path, config: dict[str, object]) -> None:
    import torch  # type: ignore[import-not-found]
    from safetensors.torch import save_file  # type: ignore[import-not-found]
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration  # type: ignore[import-not-found]

    torch.manual_seed(SEED)
    hf_config = Qwen2VLConfig(**{key: value for key, value in config.items() if key != "model_type"})
    model = Qwen2VLForConditionalGeneration(hf_config).to(torch.bfloat16)
    # Saved under the names of the published Qwen2-VL checkpoints: vLLM reads those and
    # transformers 5's own, SGLang 0.5.23 only those.
    tensors = {
        _published_name(name): tensor.detach().contiguous() for name, tensor in model.state_dict().items()
    }
    tensors = dict(sorted(tensors.items()))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def _published_name(name: str) -> str:
    for prefix, published in (("model.language_model.", "model."), ("model.visual.", "visual.")):
        if name.startswith(prefix):
            return published + name.removeprefix(prefix)
    return name


def main(argv: list[str]) -> int:
    if (out := output_folder(argv)) is None:
        return 2
    ids = build_tokenizer(out)
    build_processor_config(out)
    config = model_config(ids)
    build_weights(out, config)
    write_json(out / "config.json", config)
    write_json(
        out / "generation_config.json",
        {"eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
