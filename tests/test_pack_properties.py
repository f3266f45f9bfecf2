"""Property tests: documents round-trip, edits elsewhere leave a section alone, counts add up."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pack_fixtures import (
    CL100K_PAT_STR,
    GPT2_PAT_STR,
    O200K_PAT_STR,
    bpe_vocabulary,
    corpus_of,
    document,
    parse_prefix,
)

from longctx.packing import build_pack, compare_packs
from longctx.sources import SkipReason
from longctx.sources.corpus import Corpus, Manifest
from longctx.tokens.tokenizers import KIMI_PAT_STR, TiktokenFileTokenizer, Tokenizer, TokenizerJsonTokenizer

pytest.importorskip("tokenizers")

# Text that stresses fences, boundaries and whitespace: delimiters are common, not rare.
_PIECES = st.sampled_from(
    ["`", "```", "````", "\n", "\n\n", " ", "   ", "\t", "Question:", "</documents>", "<listing>",
     "``` a.py", "[no final newline]", "\"", "\\", "é", "中文", "\U0001f600", "x", "def f():", "\r"]
)  # fmt: skip
TEXTS = st.one_of(st.text(max_size=60), st.lists(_PIECES, max_size=20).map("".join))
PATH_PART = st.text(
    alphabet=st.characters(exclude_characters="/", exclude_categories=["Cs"]), min_size=1, max_size=12
)
PATHS = st.one_of(
    st.lists(PATH_PART, min_size=1, max_size=3).map("/".join),
    st.sampled_from(["latin\udce9.txt", "a\nb", '"q"', "[x] y", " lead", "trail "]),
)
DOCUMENTS = st.lists(st.tuples(PATHS, TEXTS), max_size=8, unique_by=lambda item: item[0])


@given(DOCUMENTS)
@settings(max_examples=300, deadline=None)
def test_any_documents_read_back_exactly(items: list[tuple[str, str]]) -> None:
    pack = build_pack(corpus_of([document(path, text) for path, text in items]))
    parsed = parse_prefix(pack.prefix)
    cleaned = [
        (path, "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)) for path, text in items
    ]
    assert parsed.documents == cleaned
    pack.prefix.encode("utf-8")


@given(DOCUMENTS, st.randoms(use_true_random=False))
@settings(max_examples=100, deadline=None)
def test_manifest_order_does_not_matter(items: list[tuple[str, str]], shuffler: random.Random) -> None:
    corpus = corpus_of(
        [document(path, text) for path, text in items],
        {f"skipped/{index}.bin": SkipReason.BINARY for index in range(3)},
    )
    entries = list(corpus.manifest.entries)
    shuffler.shuffle(entries)
    shuffled = Corpus(
        Manifest(tuple(entries)), corpus.ordering, corpus.root, corpus.head_sha, documents=corpus.documents
    )
    assert build_pack(shuffled).prefix == build_pack(corpus).prefix


@given(DOCUMENTS.filter(lambda items: len(items) >= 2), st.data())
@settings(max_examples=150, deadline=None)
def test_an_edit_changes_only_its_own_section(items: list[tuple[str, str]], data: st.DataObject) -> None:
    index = data.draw(st.integers(0, len(items) - 1))
    new_text = data.draw(TEXTS.filter(lambda text: text != items[index][1]))
    before = build_pack(corpus_of([document(path, text) for path, text in items]))
    edited = list(items)
    edited[index] = (items[index][0], new_text)
    after = build_pack(corpus_of([document(path, text) for path, text in edited]))
    changed = [
        old.name
        for old, new in zip(before.sections, after.sections, strict=True)
        if old.fingerprint != new.fingerprint
    ]
    cleaned_old = before.section(f"document:{items[index][0]}").text
    cleaned_new = after.section(f"document:{items[index][0]}").text
    assert changed == ([] if cleaned_old == cleaned_new else [f"document:{items[index][0]}"])
    comparison = compare_packs(before, after)
    assert comparison.first_difference == (changed[0] if changed else None)
    assert comparison.surviving_sections == (2 + index if changed else len(before.sections))


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return bpe_vocabulary(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module")
def tokenizers_under_test(vocabulary: tuple[Path, Path]) -> dict[str, Tokenizer]:
    tokenizer_json, bpe_file = vocabulary
    return {
        "tokenizer.json (GPT-2 byte level)": TokenizerJsonTokenizer(tokenizer_json),
        "tiktoken gpt2 pattern": TiktokenFileTokenizer.from_file(bpe_file, pat_str=GPT2_PAT_STR),
        "tiktoken cl100k pattern": TiktokenFileTokenizer.from_file(bpe_file, pat_str=CL100K_PAT_STR),
        "tiktoken o200k pattern": TiktokenFileTokenizer.from_file(bpe_file, pat_str=O200K_PAT_STR),
        "tiktoken kimi pattern": TiktokenFileTokenizer.from_file(bpe_file, pat_str=KIMI_PAT_STR),
    }


QUESTIONS = st.one_of(
    st.from_regex(r"[A-Za-z0-9(\"'¿][^\n\r]{0,40}", fullmatch=True),
    st.from_regex(r" [A-Za-z][^\n\r]{0,40}", fullmatch=True),
)


@given(items=DOCUMENTS, question=QUESTIONS)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_section_counts_add_up_to_the_whole(
    tokenizers_under_test: dict[str, Tokenizer], items: list[tuple[str, str]], question: str
) -> None:
    corpus = corpus_of([document(path, text) for path, text in items])
    for name, tokenizer in tokenizers_under_test.items():
        pack = build_pack(corpus, tokenizer=tokenizer)
        whole = tokenizer.count(pack.prefix)
        assert sum(section.tokens or 0 for section in pack.sections[1:]) == whole, name
        assert pack.prefix_tokens == whole + tokenizer.count(pack.system), name
        assert tokenizer.count(pack.user_content(question)) == whole + tokenizer.count(question), (
            name,
            question,
        )


def test_adversarial_ends_still_add_up(tokenizers_under_test: dict[str, Tokenizer]) -> None:
    texts = {
        "spaces.txt": "trailing spaces   ",
        "blank.txt": "text\n\n\n\n",
        "space-lines.txt": "a\n   \n  \n",
        "only-spaces.txt": "     ",
        "tab-end.txt": "x\t",
        "newline-start.txt": "\n\nstart",
        "slash.txt": "}\n/",
        "cr.txt": "a\r",
    }
    corpus = corpus_of([document(path, text) for path, text in texts.items()])
    for name, tokenizer in tokenizers_under_test.items():
        pack = build_pack(corpus, tokenizer=tokenizer)
        assert sum(section.tokens or 0 for section in pack.sections[1:]) == tokenizer.count(pack.prefix), name
