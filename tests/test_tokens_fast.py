"""bpe-openai counts exactly what tiktoken counts, for the same OpenAI vocabularies.

tiktoken is built here from the vocabulary files bpe-openai ships (their
sha256 is the one tiktoken's own registry expects for OpenAI's files) and
from tiktoken's own definitions of the split pattern and special tokens, so
both sides use OpenAI's vocabulary and only the implementations differ.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tiktoken
import tiktoken.load
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from longctx.tokens.tokenizers import TiktokenFileTokenizer, fast_openai_counter

ENCODINGS = ("cl100k_base", "o200k_base")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("bpe_openai") is None, reason="bpe-openai (optional) is not installed"
)


def _bundled_vocabulary(name: str) -> bytes:
    spec = importlib.util.find_spec("bpe_openai")
    assert spec is not None and spec.submodule_search_locations
    folder = Path(next(iter(spec.submodule_search_locations)))
    return gzip.decompress((folder / "data" / f"{name}.tiktoken.gz").read_bytes())


@pytest.fixture(scope="module")
def reference() -> Iterator[dict[str, tiktoken.Encoding]]:
    """tiktoken's own encodings, their files read from bpe-openai's copies after tiktoken's hash check."""
    from tiktoken_ext import openai_public  # type: ignore[import-untyped]

    original = tiktoken.load.load_tiktoken_bpe

    def load(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        name = url.rsplit("/", 1)[1].removesuffix(".tiktoken")
        data = _bundled_vocabulary(name)
        assert hashlib.sha256(data).hexdigest() == expected_hash  # OpenAI's file, byte for byte
        return {
            base64.b64decode(token): int(rank)
            for token, rank in (line.split() for line in data.splitlines() if line)
        }

    openai_public.load_tiktoken_bpe = load
    try:
        yield {name: tiktoken.Encoding(**getattr(openai_public, name)()) for name in ENCODINGS}
    finally:
        openai_public.load_tiktoken_bpe = original


def _tiktoken_count(encoding: tiktoken.Encoding, text: str) -> int:
    return len(encoding.encode(text, allowed_special="all"))


def _fast(name: str) -> Callable[[str], int]:
    counter = fast_openai_counter(name)
    assert counter is not None
    return counter


_SPECIAL = [
    "<|endoftext|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|endofprompt|>",
    "<|",
    "|>",
]
_PIECES = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=" \t\n\r\u00a0\u3000\x0b\x0c", max_size=30),
    st.text(alphabet="abcXYZ019_'sSdtmlrve", max_size=30),
    st.sampled_from(
        ["'s", "'LL", "'Re", "ǅ", "ᾈ", "Ⅻ", "²", "١٢٣", "中文字符", "😀👍🏽", "e\u0301", "\ufeff", "\ud800"]
    ),
    st.sampled_from(_SPECIAL),
    st.sampled_from(["def f(x):\n    return x  # ok\n", "\n\n\n", "    ", "}\n\n", "0x1F, 123456789"]),
)


@pytest.mark.parametrize("name", ENCODINGS)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(_PIECES, max_size=12))
def test_same_counts_as_tiktoken_on_mixed_text(
    name: str, pieces: list[str], reference: dict[str, tiktoken.Encoding]
) -> None:
    text = "".join(pieces)
    assert _fast(name)(text) == _tiktoken_count(reference[name], text)


@pytest.mark.parametrize("name", ENCODINGS)
@pytest.mark.parametrize(
    "text",
    [
        "",
        " " * 100_000,
        "\n" * 50_000 + "x",
        "x" * 200_000,
        ("word " * 30_000).strip(),
        "a" + " " * 5000 + "b\n",
        "<|endoftext|><|endoftext|>x<|endofprompt|>",
        "lone \ud83d surrogate",
        "日本語のテキスト" * 2000,
        "\t\t  \n \r\n\r\n  \t",
    ],
    ids=lambda text: repr(text[:12]) + f"..{len(text)}",
)
def test_same_counts_as_tiktoken_on_edge_cases(
    name: str, text: str, reference: dict[str, tiktoken.Encoding]
) -> None:
    assert _fast(name)(text) == _tiktoken_count(reference[name], text)


@pytest.mark.parametrize("name", ENCODINGS)
def test_same_counts_as_tiktoken_on_this_repository(
    name: str, reference: dict[str, tiktoken.Encoding]
) -> None:
    root = Path(__file__).resolve().parent.parent
    files = sorted([*root.glob("longctx/**/*.py"), *root.glob("docs/*.md"), *root.glob("tests/*.py")])
    assert files
    fast = _fast(name)
    for file in files:
        text = file.read_text(encoding="utf-8")
        assert fast(text) == _tiktoken_count(reference[name], text), file


def test_named_tokenizers_count_with_it_under_the_same_identity() -> None:
    tokenizer = TiktokenFileTokenizer.named("cl100k_base")
    assert tokenizer.identity == "tiktoken:cl100k_base"  # same counts, so the same cache entries
    assert tokenizer.count("hello world") == 2
    assert tokenizer.encoding_name == "cl100k_base"


def test_unknown_encodings_have_no_fast_counter() -> None:
    assert fast_openai_counter("gpt2") is None
    assert fast_openai_counter("no-such-encoding") is None
