"""Budgets, shards and pack comparison."""

from __future__ import annotations

import pytest
from pack_fixtures import corpus_of, document

from longctx.errors import BudgetError, ConfigError
from longctx.packing import Budget, build_pack, build_shards, compare_packs
from longctx.sources import SkipReason
from longctx.tokens.tokenizers import EstimateTokenizer

ESTIMATE = EstimateTokenizer()


def _repository(files: int = 30, lines: int = 40) -> list:  # type: ignore[type-arg]
    documents = []
    for index in range(files):
        folder = ("src/core", "src/extra", "tests", "docs")[index % 4]
        documents.append(
            document(f"{folder}/f{index:02d}.py", f"value_{index} = {index}  # padding\n" * lines)
        )
    return documents


def test_budget_arithmetic_and_validation() -> None:
    budget = Budget(32_768, reserved_output_tokens=1000, reserved_question_tokens=500)
    assert budget.prompt_budget == 31_268
    with pytest.raises(ConfigError):
        Budget(1000, reserved_output_tokens=900, reserved_question_tokens=100)
    with pytest.raises(ConfigError):
        Budget(-1)


def test_a_pack_that_fits_passes_and_one_that_does_not_names_files_and_folders() -> None:
    corpus = corpus_of(_repository())
    pack = build_pack(corpus, budget=Budget(1_000_000))
    assert pack.estimated and pack.prefix_tokens is not None
    total = pack.prefix_tokens
    small = Budget(total // 2, reserved_output_tokens=0, reserved_question_tokens=0)
    with pytest.raises(BudgetError) as caught:
        build_pack(corpus, tokenizer=ESTIMATE, budget=small)
    error = caught.value
    assert error.total_tokens == total
    assert error.budget_tokens == total // 2
    message = str(error)
    assert f"{total:,} tokens (estimated)" in message
    assert f"{total - total // 2:,} tokens must go" in message
    assert "Largest folders: src/ " in message
    assert "Largest files: " in message
    names = [path for path, _ in error.largest]
    assert "src/" in names and "src/core/" in names and "tests/" in names
    assert any(name.endswith(".py") for name in names)
    folder_tokens = dict(error.largest)
    assert folder_tokens["src/"] == folder_tokens["src/core/"] + folder_tokens["src/extra/"]


def test_shards_each_fit_cover_the_corpus_in_order_and_stand_alone() -> None:
    corpus = corpus_of(_repository(), {"data.bin": SkipReason.BINARY})
    whole = build_pack(corpus, tokenizer=ESTIMATE)
    assert whole.prefix_tokens is not None
    budget = Budget(whole.prefix_tokens // 3, reserved_output_tokens=0, reserved_question_tokens=0)
    sharded = build_shards(corpus, budget=budget, tokenizer=ESTIMATE)
    assert len(sharded.shards) >= 3
    covered = [section.path for shard in sharded.shards for section in shard.documents]
    assert covered == [doc.path for doc in corpus.documents]
    for number, shard in enumerate(sharded.shards, start=1):
        assert shard.total_tokens is not None and shard.total_tokens <= budget.prompt_budget
        assert shard.part == number
        assert shard.system == whole.system
        assert f'<listing part="{number}">' in shard.prefix
        listing = shard.section("listing").text
        assert ("[skipped: binary] data.bin" in listing) == (number == len(sharded.shards))
        assert shard.prefix.endswith("Question:\n")
    assert sharded.to_dict()["shards"][0]["part"] == 1


def test_adding_a_file_at_the_end_leaves_earlier_shards_alone() -> None:
    documents = _repository()
    budget = Budget(4000, reserved_output_tokens=0, reserved_question_tokens=0)
    before = build_shards(corpus_of(documents), budget=budget, tokenizer=ESTIMATE)
    after = build_shards(
        corpus_of([*documents, document("new.py", "NEW = 1\n")]), budget=budget, tokenizer=ESTIMATE
    )
    assert len(before.shards) > 2
    for old, new in zip(before.shards[:-1], after.shards, strict=False):
        assert old.fingerprint == new.fingerprint
    assert compare_packs(before.shards[-1], after.shards[len(before.shards) - 1]).first_difference in (
        "listing",
        "document:new.py",
    )


def test_a_corpus_that_fits_is_one_shard_equal_to_the_pack() -> None:
    corpus = corpus_of(_repository(files=3))
    sharded = build_shards(corpus, budget=Budget(100_000), tokenizer=ESTIMATE)
    assert len(sharded.shards) == 1
    assert sharded.shards[0] == build_pack(corpus, tokenizer=ESTIMATE)


def test_a_document_larger_than_any_shard_is_named() -> None:
    corpus = corpus_of([document("small.py", "x = 1\n"), document("huge/dump.sql", "INSERT 1;\n" * 5000)])
    with pytest.raises(BudgetError, match=r"huge/dump\.sql alone needs") as caught:
        build_shards(corpus, budget=Budget(3000, reserved_output_tokens=0, reserved_question_tokens=0))
    assert caught.value.largest[0][0] == "huge/dump.sql"


def test_compare_names_the_first_changed_section_and_what_survives() -> None:
    documents = [document(f"f{index}.py", f"x = {index}\n" * 10) for index in range(5)]
    old = build_pack(corpus_of(documents), tokenizer=ESTIMATE)
    same = compare_packs(old, build_pack(corpus_of(documents), tokenizer=ESTIMATE))
    assert same.identical and same.first_difference is None and same.surviving_share == 1.0

    edited = list(documents)
    edited[3] = document("f3.py", "x = 3\n" * 9 + "y = 3\n")
    new = build_pack(corpus_of(edited), tokenizer=ESTIMATE)
    comparison = compare_packs(old, new)
    assert comparison.first_difference == "document:f3.py"
    assert comparison.detail == "document:f3.py changed"
    assert comparison.surviving_sections == 5  # header, opening, f0, f1, f2
    assert comparison.surviving_tokens == sum(section.tokens or 0 for section in old.sections[:5])
    unchanged = old.section("document:f3.py").text.rsplit("x = 3\n", 1)[0]
    expected_bytes = sum(section.size_bytes for section in old.sections[:5]) + len(unchanged.encode())
    assert comparison.surviving_bytes == expected_bytes
    assert comparison.surviving_share is not None and 0 < comparison.surviving_share < 1
    finer = compare_packs(old, new, tokenizer=ESTIMATE)
    assert finer.partial_tokens == ESTIMATE.count(unchanged)
    assert finer.surviving_share is not None and finer.surviving_share > comparison.surviving_share

    added = compare_packs(
        old, build_pack(corpus_of([*documents, document("g.py", "g\n")]), tokenizer=ESTIMATE)
    )
    assert added.first_difference == "document:g.py"
    assert "new" in added.detail
    removed = compare_packs(old, build_pack(corpus_of(documents[:1] + documents[2:]), tokenizer=ESTIMATE))
    assert removed.first_difference == "document:f2.py"
    assert "document:f1.py was removed" in removed.detail
    uncounted = compare_packs(build_pack(corpus_of(documents)), new)
    assert uncounted.surviving_tokens is None and uncounted.surviving_share is None
