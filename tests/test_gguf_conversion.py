"""The GGUF converter (longctx.testing.gguf_conversion) against transformers' conversion of the same files.

The real models' folders are built by the converter from the registry's GGUF
files (``build_real_model``, cached under the harness folder). They are held
to what transformers 5.19's GGUF loader made of the same files on 2026-12-06:

- where that conversion is at hand (``references/<model>/`` under the harness
  folder: on the machine that made it), tensor by tensor, bit for bit; the
  tokenizer's ids over a corpus (code, unicode, whitespace runs, the chat
  template's special tokens rendered by its own template); config.json key by
  key;
- everywhere else (a fresh clone's CI), by the digests of that conversion's
  tensors and ids, pinned below and checked against the reference itself
  wherever the reference is at hand.

A synthetic llama GGUF, written with gguf's own writer, checks the
un-permutation of the query and key rows and the tied head without a download.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import jinja2
import numpy as np
import pytest
from tokenizers import Tokenizer

from longctx.testing.errors import ModelBuildError
from longctx.testing.gguf_conversion import _GGUFFile, bfloat16_bits, convert_gguf, main
from longctx.testing.harness import EngineHarness
from longctx.testing.model import TinyModel
from longctx.testing.real_model import CANDIDATES, DEFAULT_MODEL, build_real_model

SMOLLM = "smollm2-135m-instruct"

# Digests of transformers 5.19's conversions (2026-12-06, the folders in references/ of the harness
# that made them): sha256 over every tensor in name order (name, dtype, shape, raw bytes), and over
# the token ids of CORPUS as JSON. test_the_pinned_digests_are_the_reference_s re-derives them.
REFERENCE_TENSORS = {
    DEFAULT_MODEL: "acbcdf6d0387f0061624e3235b3e0019656dc868533868be22ebc098597e0224",
    SMOLLM: "e4a03c3418142a07f768a67b1573904ec83ceacdb1e6007d3b66a330edbda0b3",
}
REFERENCE_IDS = {
    DEFAULT_MODEL: "2976b007a6a5e3b89056de417a306d4bbfb82d7a80f53e8e635bf8680e503208",
    SMOLLM: "62438fd30b205feb5988f63a90c604b6aed7d14dd4db6a29543d5eb28a045fbd",
}

CORPUS = (
    "def main(argv: list[str]) -> int:\n    return 0\n",
    "    if (a && b || !c) { return a->b[0] >> 2; }  // comment\n\tx = {'k': [1, 2]}\r\n",
    "x = 3.14159e-10; y = 0xFFEE; z = 1_000_000; 1234567890 12 345 6789",
    "naïve café 日本語のテキスト 🚀🔥 Привет мир — “quotes” \u2018x\u2019 ½ ∑ \u00a0nbsp \u200bzero-width",
    "I'm sure you'll see they've done it. DON'T SHOUT, it's THEIR'S",
    "   leading   \n\n\n   trailing   \n \t \n",
    '<tool_call>{"name": "f"}</tool_call> <|fim_prefix|>a<|fim_suffix|>b<|fim_middle|> <|file_sep|>',
    "<|endoftext|> <|im_start|>x<|im_end|> [PAD151665] <s> </s> <unk> <repo_name> <jupyter_code>",
)
CHAT = [
    {"role": "system", "content": "You answer questions about code."},
    {"role": "user", "content": "What does `retry(3)` do?\nAnswer in one line."},
    {"role": "assistant", "content": "It retries the call three times."},
    {"role": "user", "content": "And 日本語?"},
]
# config.json keys an engine reads to build the model and to stop generating.
CONFIG_KEYS = (
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_parameters",
    "vocab_size",
    "tie_word_embeddings",
    "hidden_act",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "unk_token_id",
    "head_dim",
    "attention_bias",
    "mlp_bias",
    "sliding_window",
    "use_sliding_window",
)


@pytest.fixture(scope="module")
def folders(longctx_harness: EngineHarness) -> dict[str, TinyModel]:
    """Both models as the harness builds them (the 0.5B is the real model's; the 135M downloads 98 MB).

    Not through the ``real_model`` fixture: that would mark these tests as the real engines' and
    their comparisons with transformers' folders, skipped where those are not at hand (a fresh
    clone), would then fail the run as skipped real-engine tests.
    """
    return {
        key: build_real_model(longctx_harness.base_dir, CANDIDATES[key]) for key in (DEFAULT_MODEL, SMOLLM)
    }


def _reference(harness: EngineHarness, key: str) -> Path:
    folder = harness.base_dir / "references" / key
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"transformers' conversion of {key} is not at hand here ({folder})")
    return folder


def _tensors(path: Path) -> Iterator[tuple[str, dict[str, Any], np.ndarray]]:
    """Each tensor of a safetensors file in name order: its name, header entry and raw bytes (mapped)."""
    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    header.pop("__metadata__", None)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + length)
    for name in sorted(header):
        start, end = header[name]["data_offsets"]
        yield name, header[name], data[start:end]


def _tensors_digest(path: Path) -> str:
    digest = hashlib.sha256()
    for name, entry, data in _tensors(path):
        digest.update(f"{name}|{entry['dtype']}|{entry['shape']}|".encode())
        digest.update(data)
    return digest.hexdigest()


def _texts(folder: Path) -> list[str]:
    """CORPUS, and a conversation rendered by the folder's own chat template (its special tokens)."""
    template = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
    template = template or (folder / "chat_template.jinja").read_text()
    rendered = jinja2.Environment().from_string(template).render(messages=CHAT, add_generation_prompt=True)
    return [*CORPUS, rendered]


# transformers 5.19 knows no "smollm" pre-tokenizer in a GGUF and falls back to GPT-2's split, which
# keeps a space with a numeral ("Ġ½" is cut "ĠÂ" + "½"); llama.cpp's smollm rule (and the upstream
# SmolLM2 tokenizer.json) cut every numeral apart first, as the converter does. The reference is read
# with that one rule changed: everything else (vocabulary, merges, added tokens) is transformers'.
_UPSTREAM_PRE_TOKENIZERS = {
    SMOLLM: {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ],
    }
}


def _ids(folder: Path, texts: list[str], *, reference_of: str | None = None) -> list[list[int]]:
    spec = json.loads((folder / "tokenizer.json").read_text())
    if reference_of in _UPSTREAM_PRE_TOKENIZERS:
        spec["pre_tokenizer"] = _UPSTREAM_PRE_TOKENIZERS[reference_of]
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    return [tokenizer.encode(text).ids for text in texts]


def _ids_digest(ids: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


@pytest.mark.parametrize("key", [DEFAULT_MODEL, SMOLLM])
def test_every_tensor_is_bit_for_bit_transformers_conversion(
    key: str, folders: dict[str, TinyModel], longctx_harness: EngineHarness
) -> None:
    reference = _reference(longctx_harness, key)
    ours = dict(
        (name, (entry, data)) for name, entry, data in _tensors(folders[key].path / "model.safetensors")
    )
    theirs = dict((name, (entry, data)) for name, entry, data in _tensors(reference / "model.safetensors"))
    assert sorted(ours) == sorted(theirs)
    differing = [
        name
        for name, (entry, data) in ours.items()
        if (entry["dtype"], entry["shape"]) != (theirs[name][0]["dtype"], theirs[name][0]["shape"])
        or not np.array_equal(data, theirs[name][1])
    ]
    assert differing == [], f"{len(differing)} of {len(ours)} tensors differ from transformers' conversion"


@pytest.mark.parametrize("key", [DEFAULT_MODEL, SMOLLM])
def test_the_tokenizer_gives_transformers_ids_and_the_config_its_values(
    key: str, folders: dict[str, TinyModel], longctx_harness: EngineHarness
) -> None:
    reference = _reference(longctx_harness, key)
    ours, theirs = folders[key].path, reference
    texts = _texts(theirs)
    assert _texts(ours) == texts  # the same chat template
    assert _ids(ours, texts) == _ids(theirs, texts, reference_of=key)
    ours_config = json.loads((ours / "config.json").read_text())
    theirs_config = json.loads((theirs / "config.json").read_text())
    for name in CONFIG_KEYS:
        assert ours_config.get(name) == theirs_config.get(name), name
    ours_tokens = json.loads((ours / "tokenizer_config.json").read_text())
    theirs_tokens = json.loads((theirs / "tokenizer_config.json").read_text())
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert ours_tokens.get(name) == theirs_tokens.get(name), name
    ours_generation = json.loads((ours / "generation_config.json").read_text())
    theirs_generation = json.loads((theirs / "generation_config.json").read_text())
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert ours_generation.get(name) == theirs_generation.get(name), name
    ours_added = json.loads((ours / "tokenizer.json").read_text())["added_tokens"]
    theirs_added = json.loads((theirs / "tokenizer.json").read_text())["added_tokens"]
    assert sorted(ours_added, key=lambda token: token["id"]) == sorted(
        theirs_added, key=lambda token: token["id"]
    )


@pytest.mark.parametrize("key", [DEFAULT_MODEL, SMOLLM])
def test_the_pinned_digests_are_the_reference_s(key: str, longctx_harness: EngineHarness) -> None:
    reference = _reference(longctx_harness, key)
    assert _tensors_digest(reference / "model.safetensors") == REFERENCE_TENSORS[key]
    assert _ids_digest(_ids(reference, _texts(reference), reference_of=key)) == REFERENCE_IDS[key]


@pytest.mark.parametrize("key", [DEFAULT_MODEL, SMOLLM])
def test_the_built_folder_has_the_reference_digests(key: str, folders: dict[str, TinyModel]) -> None:
    folder = folders[key].path
    assert _tensors_digest(folder / "model.safetensors") == REFERENCE_TENSORS[key]
    assert _ids_digest(_ids(folder, _texts(folder))) == REFERENCE_IDS[key]
    assert "gguf_conversion" in (folder / "PROVENANCE.md").read_text()


def _llama_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py permute(): each head's rotary halves interleaved."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _write_llama_gguf(path: Path, weights: dict[str, np.ndarray], *, tokens: list[str]) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(256)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3, *([1] * (len(tokens) - 1))])
    writer.add_token_merges(["a b"])
    writer.add_eos_token_id(0)
    writer.add_chat_template("{% for m in messages %}<|end|>{{ m['content'] }}{% endfor %}")
    for name, values in weights.items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    return {name: data.view(np.float32).reshape(entry["shape"]) for name, entry, data in _tensors(path)}


def test_a_llama_model_s_query_and_key_rows_are_unpermuted_and_its_head_stays_tied(tmp_path: Path) -> None:
    random = np.random.default_rng(7)
    hf = {
        "q": random.standard_normal((8, 8)).astype(np.float32),
        "k": random.standard_normal((4, 8)).astype(np.float32),  # one KV head of 4 rows
        "v": random.standard_normal((4, 8)).astype(np.float32),
    }
    tokens = ["<|end|>", "a", "b", "ab", "Ġ", "Ċ"]
    weights = {
        "token_embd.weight": random.standard_normal((len(tokens), 8)).astype(np.float32),
        "output_norm.weight": np.ones(8, dtype=np.float32),
        "blk.0.attn_norm.weight": np.ones(8, dtype=np.float32),
        "blk.0.ffn_norm.weight": np.ones(8, dtype=np.float32),
        "blk.0.attn_q.weight": _llama_permute(hf["q"], 2),
        "blk.0.attn_k.weight": _llama_permute(hf["k"], 1),
        "blk.0.attn_v.weight": hf["v"],
        "blk.0.attn_output.weight": random.standard_normal((8, 8)).astype(np.float32),
        "blk.0.ffn_gate.weight": random.standard_normal((16, 8)).astype(np.float32),
        "blk.0.ffn_up.weight": random.standard_normal((16, 8)).astype(np.float32),
        "blk.0.ffn_down.weight": random.standard_normal((8, 16)).astype(np.float32),
    }
    _write_llama_gguf(tmp_path / "tiny.gguf", weights, tokens=tokens)
    report = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out")
    assert (report.architecture, report.tensors) == ("llama", 11)
    tensors = _read_safetensors(tmp_path / "out" / "model.safetensors")
    np.testing.assert_array_equal(tensors["model.layers.0.self_attn.q_proj.weight"], hf["q"])
    np.testing.assert_array_equal(tensors["model.layers.0.self_attn.k_proj.weight"], hf["k"])
    np.testing.assert_array_equal(tensors["model.layers.0.self_attn.v_proj.weight"], hf["v"])
    np.testing.assert_array_equal(tensors["model.embed_tokens.weight"], weights["token_embd.weight"])
    assert "lm_head.weight" not in tensors
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["tie_word_embeddings"], config["head_dim"], config["num_key_value_heads"]) == (True, 4, 1)
    tokenizer = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert tokenizer.encode("<|end|>ab").ids == [0, 3]  # the control token whole, the merge applied


def test_the_header_reader_agrees_with_gguf_s_own(tmp_path: Path) -> None:
    random = np.random.default_rng(5)
    weights = {
        "token_embd.weight": random.standard_normal((6, 64)).astype(np.float32),
        "blk.0.ffn_up.weight": gguf.quants.quantize(
            random.standard_normal((3, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0
        ),
    }
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_context_length(256)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_token_list(["a", "ü", "<|x|>"])
    writer.add_token_types([1, 1, 3])
    writer.add_add_bos_token(False)
    writer.add_tensor("token_embd.weight", weights["token_embd.weight"])
    writer.add_tensor(
        "blk.0.ffn_up.weight",
        weights["blk.0.ffn_up.weight"],
        raw_shape=(3, 68),
        raw_dtype=gguf.GGMLQuantizationType.Q8_0,
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    theirs = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    ours = _GGUFFile(tmp_path / "m.gguf")
    assert ours.metadata == {
        key: field.contents() for key, field in theirs.fields.items() if not key.startswith("GGUF.")
    }
    assert [(tensor.name, tensor.kind) for tensor in ours.tensors] == [
        (tensor.name, tensor.tensor_type) for tensor in theirs.tensors
    ]
    for mine, their in zip(ours.tensors, theirs.tensors, strict=True):
        np.testing.assert_array_equal(
            gguf.quants.dequantize(mine.data, mine.kind),
            gguf.quants.dequantize(their.data, their.tensor_type),
        )


def test_bfloat16_output_rounds_to_nearest_even(tmp_path: Path) -> None:
    values = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, 0.0, np.inf, np.nan], dtype=np.float32)
    # 1 + 2^-8 is halfway between two bfloat16 values: ties go to the even one (1.0); 1 + 3*2^-8 up.
    assert bfloat16_bits(values).tolist()[:6] == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x0000, 0x7F80]
    assert np.isnan((bfloat16_bits(values)[6:].astype(np.uint32) << 16).view(np.float32)).all()
    random = np.random.default_rng(3)
    weights = random.standard_normal((64,)).astype(np.float32)
    widened = (bfloat16_bits(weights).astype(np.uint32) << 16).view(np.float32)
    assert np.all(np.abs(widened - weights) <= np.abs(weights) * 2**-8)


def test_an_unsupported_architecture_or_type_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    writer = gguf.GGUFWriter(str(tmp_path / "phi.gguf"), "phi3")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelBuildError, match="architecture 'phi3' is not supported"):
        convert_gguf(tmp_path / "phi.gguf", tmp_path / "out")
    assert main([str(tmp_path / "phi.gguf"), str(tmp_path / "out")]) == 2
    assert "phi3" in capsys.readouterr().err
    with pytest.raises(ModelBuildError, match="dtype 'float16'"):
        convert_gguf(tmp_path / "phi.gguf", tmp_path / "out", dtype="float16")
    writer = gguf.GGUFWriter(str(tmp_path / "iq.gguf"), "qwen2")
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_chat_template("{{ messages }}")
    # Two rows of one IQ4_NL block (32 values in 18 bytes): gguf has numpy code for it, untried here.
    writer.add_tensor(
        "token_embd.weight",
        np.zeros((2, 18), dtype=np.uint8),
        raw_shape=(2, 18),
        raw_dtype=gguf.GGMLQuantizationType.IQ4_NL,
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelBuildError, match=r"token_embd\.weight is of type IQ4_NL, not supported"):
        convert_gguf(tmp_path / "iq.gguf", tmp_path / "out")
