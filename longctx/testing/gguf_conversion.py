"""Convert a GGUF file into a Hugging Face model folder with numpy alone: the ``gguf`` package's home.

An engine serves a folder (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json`` with the chat template,
``generation_config.json``); llama.cpp ships one GGUF file. This module reads
the file's metadata and tensor table directly (the layout is small; ``gguf``'s
``GGUFReader`` took 17-30 s to open the 0.5B on the loaded 2-core machine,
building a numpy view for each of its 300k token and merge strings), maps its
tensors (memory-mapped), dequantizes each tensor with ``gguf.quants.dequantize`` (numpy: the same
routine transformers' GGUF loader calls, so the values are the same bits),
renames llama.cpp's tensors to the Hugging Face names, undoes the row
permutation llama.cpp applies to a llama model's query and key projections,
and streams the tensors into one safetensors file, one at a time. The
configuration and the byte-level BPE tokenizer are written from the file's
metadata. No torch, no transformers: the real model of the tests is built in
longctx's own environment, before any engine's environment exists.

Only what has been checked against transformers' conversion is accepted
(:data:`ARCHITECTURES`, :data:`QUANT_TYPES`, :data:`PRE_TOKENIZERS`);
anything else is refused with a :class:`~longctx.testing.errors.ModelBuildError`
naming it.

Run as a script (on a GPU machine, for instance)::

    python -m longctx.testing.gguf_conversion MODEL.gguf OUT_DIR [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import mmap
import struct
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from longctx.recordtypes import record_type
from longctx.testing.errors import ModelBuildError

__all__ = [
    "ARCHITECTURES",
    "DTYPES",
    "PRE_TOKENIZERS",
    "QUANT_TYPES",
    "ConversionReport",
    "bfloat16_bits",
    "convert_gguf",
    "main",
]

ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
"""llama.cpp's architecture name, and the Hugging Face class a folder of it names."""

QUANT_TYPES = frozenset(
    GGMLQuantizationType[name]
    for name in (
        "F32",
        "F16",
        "BF16",
        "Q4_0",
        "Q4_1",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
    )
)
"""The tensor types dequantized here: the plain and k-quant blocks (gguf's numpy code for the i-quants,
ternary and fp4 types is left out, untried against a model)."""

DTYPES = {"float32": "F32", "bfloat16": "BF16"}
"""The weights' type in the folder, and its safetensors name. float32 holds the dequantized values
exactly (the CPU engines serve it: bfloat16 prefilled 4-6x slower there); bfloat16 halves a GPU's copy."""

# The splits are the regular expressions llama.cpp applies for each ``tokenizer.ggml.pre`` (and the
# tokenizer.json files of the upstream models): Qwen2's keeps digits single, llama 3's groups up to three.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_BYTE_LEVEL_GPT2 = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
_BYTE_LEVEL_BARE = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}


def _split_then_bytes(pattern: str) -> dict[str, Any]:
    split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}
    return {"type": "Sequence", "pretokenizers": [split, _BYTE_LEVEL_BARE]}


# StarCoder's family (SmolLM's among them) cuts every digit apart, then splits as GPT-2 does.
_DIGITS_THEN_GPT2 = {
    "type": "Sequence",
    "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTE_LEVEL_GPT2],
}
PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    "qwen2": _split_then_bytes(_QWEN2_SPLIT),
    "deepseek-r1-qwen": _split_then_bytes(_QWEN2_SPLIT),
    "llama3": _split_then_bytes(_LLAMA3_SPLIT),
    "llama-bpe": _split_then_bytes(_LLAMA3_SPLIT),
    "smollm": _DIGITS_THEN_GPT2,
    "starcoder": _DIGITS_THEN_GPT2,
    "gpt2": _BYTE_LEVEL_GPT2,
    "default": _BYTE_LEVEL_GPT2,
}
"""``tokenizer.ggml.pre`` values understood, and the tokenizers pre-tokenizer each stands for."""

# llama.cpp's token types (gguf.TokenType): CONTROL tokens are special, USER_DEFINED ones are matched
# whole in any text but are not special (Qwen's <tool_call>).
_CONTROL, _USER_DEFINED = 3, 4

_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_MODEL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


@record_type
class ConversionReport:
    """What one conversion wrote: the architecture, the tensors and values, and the seconds it took."""

    architecture: str
    tensors: int
    parameters: int
    dtype: str
    seconds: float


@record_type
class _RawTensor:
    """A tensor as the file holds it: llama.cpp's name, type, and its bytes (mapped), one row per line."""

    name: str
    kind: GGMLQuantizationType
    data: np.ndarray


# GGUF's value types (gguf.GGUFValueType): the fixed-width ones by struct format.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_MAGIC = b"GGUF"


class _GGUFFile:
    """A GGUF file's metadata (key to value) and tensors, read from its header (versions 2 and 3)."""

    def __init__(self, path: Path) -> None:
        with path.open("rb") as file:
            self._buffer = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        if self._buffer[:4] != _MAGIC:
            raise ModelBuildError(f"{path.name} is not a GGUF file (no GGUF magic)")
        version, tensor_count, kv_count = struct.unpack_from("<IQQ", self._buffer, 4)
        if version not in (2, 3):
            raise ModelBuildError(f"{path.name}: GGUF version {version} is not supported (2 and 3 are)")
        self._offset = 24
        self.metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = self._string()
            (kind,) = self._unpack("<I")
            self.metadata[key] = self._value(kind)
        table = [self._tensor_entry() for _ in range(tensor_count)]
        alignment = int(self.metadata.get("general.alignment", 32))
        start = self._offset + (-self._offset % alignment)
        data = np.frombuffer(self._buffer, dtype=np.uint8)
        self.tensors = [
            _RawTensor(name, kind, self._rows(data, start + offset, kind, dims, path.name))
            for name, kind, dims, offset in table
        ]

    def _unpack(self, layout: str) -> tuple[Any, ...]:
        values = struct.unpack_from(layout, self._buffer, self._offset)
        self._offset += struct.calcsize(layout)
        return values

    def _string(self) -> str:
        (length,) = self._unpack("<Q")
        text = self._buffer[self._offset : self._offset + length].decode("utf-8", errors="replace")
        self._offset += length
        return text

    def _value(self, kind: int) -> Any:
        if kind == _STRING:
            return self._string()
        if kind in _SCALARS:
            return self._unpack("<" + _SCALARS[kind])[0]
        if kind != _ARRAY:
            raise ModelBuildError(f"unknown GGUF value type {kind}")
        element, count = self._unpack("<IQ")
        if element == _STRING:
            return [self._string() for _ in range(count)]
        if element in _SCALARS:
            layout = "<" + _SCALARS[element]
            values = np.frombuffer(self._buffer, dtype=np.dtype(layout), count=count, offset=self._offset)
            self._offset += values.nbytes
            return values.tolist()
        return [self._value(element) for _ in range(count)]

    def _tensor_entry(self) -> tuple[str, GGMLQuantizationType, tuple[int, ...], int]:
        name = self._string()
        (dimensions,) = self._unpack("<I")
        dims = self._unpack(f"<{dimensions}Q")
        kind, offset = self._unpack("<IQ")
        try:
            quant = GGMLQuantizationType(kind)
        except ValueError:
            raise ModelBuildError(f"tensor {name} has the unknown GGML type {kind}") from None
        return name, quant, dims, offset

    @staticmethod
    def _rows(
        data: np.ndarray, start: int, kind: GGMLQuantizationType, dims: tuple[int, ...], file: str
    ) -> np.ndarray:
        """The tensor's bytes shaped (outer dimensions..., a row's bytes), as gguf's dequantize takes them."""
        block, block_bytes = GGML_QUANT_SIZES[kind]
        if dims[0] % block:
            raise ModelBuildError(f"{file}: a row of {dims[0]} values is not whole {kind.name} blocks")
        row_bytes = dims[0] // block * block_bytes
        outer = tuple(reversed(dims[1:]))
        size = row_bytes * int(np.prod(outer, dtype=np.int64))
        return data[start : start + size].reshape(*outer, row_bytes)


@record_type
class _Tensor:
    """One GGUF tensor and where it goes: its Hugging Face name, its shape, and the heads to un-permute."""

    source: _RawTensor
    name: str
    shape: tuple[int, ...]
    unpermute_heads: int | None


def convert_gguf(gguf_path: Path, out_dir: Path, *, dtype: str = "float32") -> ConversionReport:
    """Write the model folder of ``gguf_path`` into ``out_dir`` (created if absent), weights in ``dtype``.

    Raises :class:`ModelBuildError` for an architecture, a tensor type, a
    tokenizer or a tensor this converter does not know (naming it), and for a
    file with no chat template (an instruct model is what the tests serve).
    """
    if dtype not in DTYPES:
        raise ModelBuildError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    started = time.monotonic()
    gguf_file = _GGUFFile(gguf_path)
    metadata = _Metadata(gguf_file.metadata)
    architecture = metadata.string("general.architecture")
    if architecture not in ARCHITECTURES:
        raise ModelBuildError(
            f"{gguf_path.name}: architecture {architecture!r} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )
    scaling = [key for key in metadata if key.startswith(f"{architecture}.rope.scaling.")]
    if scaling:
        raise ModelBuildError(f"{gguf_path.name}: rope scaling ({', '.join(scaling)}) is not supported")
    template = metadata.optional("tokenizer.chat_template")
    if not isinstance(template, str) or not template:
        raise ModelBuildError(f"{gguf_path.name} carries no chat template (tokenizer.chat_template)")
    tensors = _plan_tensors(gguf_file.tensors, metadata, architecture, gguf_path.name)
    config = _config(metadata, architecture, tensors, dtype)
    tokenizer = _tokenizer_json(metadata, gguf_path.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_safetensors(out_dir / "model.safetensors", tensors, DTYPES[dtype])
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", _generation_config(config))
    _write_json(out_dir / "tokenizer.json", tokenizer, indent=None)
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config(metadata, architecture, template))
    # transformers 4.48+ also reads the template from this file; the same text in both places.
    (out_dir / "chat_template.jinja").write_text(template, encoding="utf-8")
    return ConversionReport(
        architecture=architecture,
        tensors=len(tensors),
        parameters=sum(int(np.prod(tensor.shape)) for tensor in tensors),
        dtype=dtype,
        seconds=round(time.monotonic() - started, 1),
    )


class _Metadata:
    """The GGUF's key-value metadata, with the errors that name a missing key."""

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def optional(self, key: str) -> Any:
        return self._values.get(key)

    def require(self, key: str) -> Any:
        value = self.optional(key)
        if value is None:
            raise ModelBuildError(f"the GGUF lacks the metadata key {key}")
        return value

    def string(self, key: str) -> str:
        return str(self.require(key))

    def integer(self, key: str) -> int:
        return int(self.require(key))


def _plan_tensors(
    raw: Sequence[_RawTensor], metadata: _Metadata, architecture: str, file_name: str
) -> list[_Tensor]:
    """Every tensor of the file with its Hugging Face name and shape; refuses a type or a name not known."""
    heads = metadata.integer(f"{architecture}.attention.head_count")
    kv_heads = metadata.integer(f"{architecture}.attention.head_count_kv")
    planned: list[_Tensor] = []
    for tensor in raw:
        if tensor.kind not in QUANT_TYPES:
            raise ModelBuildError(
                f"{file_name}: tensor {tensor.name} is of type {tensor.kind.name}, not supported "
                f"(supported: {', '.join(sorted(kind.name for kind in QUANT_TYPES))})"
            )
        name = _hf_name(tensor.name)
        if name is None:
            raise ModelBuildError(f"{file_name}: tensor {tensor.name} has no Hugging Face name here")
        # The rows' bytes dequantize to this shape: numpy's (and safetensors') order, outermost first.
        block, block_bytes = GGML_QUANT_SIZES[tensor.kind]
        shape = (*tensor.data.shape[:-1], tensor.data.shape[-1] // block_bytes * block)
        unpermute = None
        if architecture == "llama" and ".attn_q." in tensor.name:
            unpermute = heads
        elif architecture == "llama" and ".attn_k." in tensor.name:
            unpermute = kv_heads
        planned.append(_Tensor(tensor, name, shape, unpermute))
    planned.sort(key=lambda tensor: tensor.name)
    names = {tensor.name for tensor in planned}
    if "model.embed_tokens.weight" not in names:
        raise ModelBuildError(f"{file_name} has no token_embd.weight")
    return planned


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _MODEL_TENSORS:
        return _MODEL_TENSORS[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[3] in ("weight", "bias"):
        inner = _LAYER_TENSORS.get(parts[2])
        if inner is not None:
            return f"model.layers.{parts[1]}.{inner}.{parts[3]}"
    return None


def _values(tensor: _Tensor) -> np.ndarray:
    """The tensor dequantized to float32 in its Hugging Face layout."""
    values = dequantize(tensor.source.data, tensor.source.kind).astype(np.float32, copy=False)
    values = values.reshape(tensor.shape)
    if tensor.unpermute_heads is not None:
        # llama.cpp's converter interleaves each head's rotary halves (its permute()); this undoes it.
        rows = values.shape[0]
        half = rows // tensor.unpermute_heads // 2
        values = (
            values.reshape(tensor.unpermute_heads, half, 2, *values.shape[1:])
            .swapaxes(1, 2)
            .reshape(values.shape)
        )
    return np.ascontiguousarray(values)


def bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (to nearest, ties to even), as the uint16 bit patterns."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (
        (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    ).astype(np.uint16)
    rounded[np.isnan(values)] = 0x7FC0
    return rounded


def _write_safetensors(path: Path, tensors: Sequence[_Tensor], dtype: str) -> None:
    """One safetensors file, each tensor dequantized and written in turn (never all held at once).

    The format: an 8-byte little-endian header length, a JSON header of
    each tensor's dtype, shape and byte range, then the raw little-endian bytes.
    """
    width = 4 if dtype == "F32" else 2
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for tensor in tensors:
        size = int(np.prod(tensor.shape)) * width
        header[tensor.name] = {
            "dtype": dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with path.open("wb") as out:
        out.write(len(encoded).to_bytes(8, "little"))
        out.write(encoded)
        for tensor in tensors:
            values = _values(tensor)
            stored = (
                values.astype("<f4", copy=False) if dtype == "F32" else bfloat16_bits(values).astype("<u2")
            )
            out.write(stored.tobytes())


def _config(metadata: _Metadata, architecture: str, tensors: Sequence[_Tensor], dtype: str) -> dict[str, Any]:
    """config.json from the GGUF's hyperparameters, with the keys transformers' own conversion writes."""
    prefix = f"{architecture}."
    names = {tensor.name for tensor in tensors}
    embedding = next(tensor for tensor in tensors if tensor.name == "model.embed_tokens.weight")
    hidden = metadata.integer(prefix + "embedding_length")
    heads = metadata.integer(prefix + "attention.head_count")
    rope_theta = float(metadata.optional(prefix + "rope.freq_base") or 10000.0)
    vocab_size = metadata.optional(prefix + "vocab_size") or len(metadata.require("tokenizer.ggml.tokens"))
    if int(vocab_size) != embedding.shape[0]:
        raise ModelBuildError(
            f"the vocabulary has {vocab_size} tokens, the embedding {embedding.shape[0]} rows"
        )
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[architecture]],
        "model_type": architecture,
        "hidden_size": hidden,
        "intermediate_size": metadata.integer(prefix + "feed_forward_length"),
        "num_hidden_layers": metadata.integer(prefix + "block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": metadata.integer(prefix + "attention.head_count_kv"),
        "max_position_embeddings": metadata.integer(prefix + "context_length"),
        "rms_norm_eps": float(metadata.require(prefix + "attention.layer_norm_rms_epsilon")),
        # Both spellings: transformers 5 reads rope_parameters, transformers 4 rope_theta.
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_theta": rope_theta, "rope_type": "default"},
        "vocab_size": int(vocab_size),
        # No output.weight: the head is the embedding (llama.cpp drops a tied head).
        "tie_word_embeddings": "lm_head.weight" not in names,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        # transformers 5 takes a local folder whose config names no version for an old Mistral one and
        # warns of a "wrong regex"; the keys here follow 5's format (rope_parameters, dtype).
        "transformers_version": "5.0.0",
        "dtype": dtype,
        "torch_dtype": dtype,
    }
    for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        value = metadata.optional(f"tokenizer.ggml.{name}_token_id")
        if value is not None:
            config[key] = int(value)
    if architecture == "qwen2":
        config |= {
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": config["num_hidden_layers"],
        }
    if architecture == "llama":
        config |= {
            "head_dim": int(metadata.optional(prefix + "rope.dimension_count") or hidden // heads),
            "attention_bias": "model.layers.0.self_attn.q_proj.bias" in names,
            "mlp_bias": False,
            "pretraining_tp": 1,
        }
        unknown = metadata.optional("tokenizer.ggml.unknown_token_id")
        if unknown is not None:
            config["unk_token_id"] = int(unknown)
    return config


def _generation_config(config: dict[str, Any]) -> dict[str, Any]:
    generation: dict[str, Any] = {"_from_model_config": True}
    generation.update(
        (key, config[key]) for key in ("bos_token_id", "eos_token_id", "pad_token_id") if key in config
    )
    return generation


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte alphabet: each byte's printable stand-in, as byte-level BPE vocabularies spell tokens."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(256 + extra)
            extra += 1
    return mapping


def _tokenizer_json(metadata: _Metadata, file_name: str) -> dict[str, Any]:
    """tokenizer.json of a byte-level BPE vocabulary: the file's tokens, merges and special tokens."""
    model = metadata.string("tokenizer.ggml.model")
    if model != "gpt2":
        raise ModelBuildError(
            f"{file_name}: tokenizer {model!r} is not supported (supported: gpt2, byte-level BPE)"
        )
    pre = str(metadata.optional("tokenizer.ggml.pre") or "default")
    if pre not in PRE_TOKENIZERS:
        raise ModelBuildError(
            f"{file_name}: pre-tokenizer {pre!r} is not supported (supported: {', '.join(PRE_TOKENIZERS)})"
        )
    tokens: list[str] = list(metadata.require("tokenizer.ggml.tokens"))
    kinds: list[int] = list(metadata.optional("tokenizer.ggml.token_type") or [1] * len(tokens))
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {
        token if set(token) <= alphabet else "".join(spelling[byte] for byte in token.encode()): index
        for index, token in enumerate(tokens)
    }
    merges = []
    for merge in metadata.require("tokenizer.ggml.merges"):
        pair = merge.split(" ")
        if len(pair) != 2:
            raise ModelBuildError(f"{file_name}: the merge {merge!r} is not two tokens")
        merges.append(pair)
    added = [
        _added_token(index, token, special=kind == _CONTROL)
        for index, (token, kind) in enumerate(zip(tokens, kinds, strict=True))
        # A control token spelled outside the byte alphabet is a llama.cpp mislabel (transformers skips it).
        if kind in (_CONTROL, _USER_DEFINED) and vocab.get(token) == index
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": _post_processor(metadata, tokens),
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def _added_token(index: int, content: str, *, special: bool) -> dict[str, Any]:
    return {
        "id": index,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": special,
    }


def _post_processor(metadata: _Metadata, tokens: Sequence[str]) -> dict[str, Any]:
    """The text as it is, or the BOS token before it where the file says to add one (llama 3's)."""
    single: list[dict[str, Any]] = [{"Sequence": {"id": "A", "type_id": 0}}]
    pair: list[dict[str, Any]] = [*single, {"Sequence": {"id": "B", "type_id": 1}}]
    specials: dict[str, Any] = {}
    bos = metadata.optional("tokenizer.ggml.bos_token_id")
    if metadata.optional("tokenizer.ggml.add_bos_token") and bos is not None:
        token = tokens[int(bos)]
        lead = {"SpecialToken": {"id": token, "type_id": 0}}
        single, pair = [lead, *single], [lead, *pair]
        specials = {token: {"id": token, "ids": [int(bos)], "tokens": [token]}}
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials}


def _tokenizer_config(metadata: _Metadata, architecture: str, template: str) -> dict[str, Any]:
    tokens: list[str] = metadata.require("tokenizer.ggml.tokens")

    def token(name: str) -> str | None:
        index = metadata.optional(f"tokenizer.ggml.{name}_token_id")
        return None if index is None else tokens[int(index)]

    return {
        # Qwen2Tokenizer as transformers' conversion names it; the generic class reads tokenizer.json as is.
        "tokenizer_class": "Qwen2Tokenizer" if architecture == "qwen2" else "PreTrainedTokenizerFast",
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "pad_token": token("padding"),
        "unk_token": token("unknown"),
        "add_bos_token": bool(metadata.optional("tokenizer.ggml.add_bos_token")),
        "clean_up_tokenization_spaces": False,
        "model_max_length": metadata.integer(f"{architecture}.context_length"),
        "chat_template": template,
    }


def _write_json(path: Path, value: dict[str, Any], *, indent: int | None = 2) -> None:
    path.write_text(json.dumps(value, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m longctx.testing.gguf_conversion",
        description="Convert a GGUF (qwen2 or llama, byte-level BPE) into a safetensors model folder.",
    )
    parser.add_argument("gguf", type=Path, help="the GGUF file")
    parser.add_argument("out_dir", type=Path, help="the folder to write (created if absent)")
    parser.add_argument(
        "--dtype", choices=sorted(DTYPES), default="float32", help="the weights' type (bfloat16 for a GPU)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """The script: convert, print one line of what was written; exit 2 with the reason when refused."""
    arguments = _arguments(argv)
    try:
        report = convert_gguf(arguments.gguf, arguments.out_dir, dtype=arguments.dtype)
    except ModelBuildError as error:
        print(f"gguf_conversion: {error}", file=sys.stderr)
        return 2
    print(
        f"converted {arguments.gguf.name} in {report.seconds} s: {report.architecture}, "
        f"{report.tensors} tensors, {report.parameters:,} values in {report.dtype} -> {arguments.out_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
