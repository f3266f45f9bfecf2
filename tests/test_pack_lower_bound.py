"""A pack the characters alone prove too large is refused before any tokenize request.

The refusal is cheap as well as early: the costly passes over a text (special
tokens, credentials) are never run on a file whose decoded length already
proves the pack cannot fit, and no later file is read. How long the refusal
takes through the CLI is measured in benchmarks/ (docs/benchmarks.md,
"cli-budget-refusal"), not here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest
from click.testing import CliRunner
from fake_engine import FakeEngine
from pack_fixtures import corpus_of, document

from longctx.backends.base import connect
from longctx.cli import main
from longctx.cli.app import EXIT_TOO_LONG, Runtime
from longctx.errors import BudgetError
from longctx.options.groups import CorpusOptions, Limits
from longctx.packing import Budget, build_pack, build_shards, pack
from longctx.packing.budget import MAX_CHARS_PER_TOKEN, LowerBound
from longctx.sources import reading, secrets, special_tokens
from longctx.sources.corpus import load_corpus
from longctx.store import Store

URL = "http://fake-engine:8000/v1"


class RecordingVllm(FakeEngine):
    """The fake vLLM with a tokenize route (one token per 4 characters) that records every text sent."""

    def __init__(self) -> None:
        super().__init__(engine="vllm", block=1, context_length=32768)
        self.tokenized: list[str] = []

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/tokenize":
            body: dict[str, Any] = json.loads(request.content)
            prompt = body.get("prompt") or json.dumps(body.get("messages"))
            self.tokenized.append(prompt)
            return httpx2.Response(200, json={"tokens": [1] * max(1, len(prompt) // 4)})
        return super().handle(request)


def _record_passes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Record each costly pass the reader makes over a text: its name and the text's length."""
    passes: list[tuple[str, int]] = []

    def recorded(name: str, step: Callable[..., Any]) -> Callable[..., Any]:
        def run(text: str, *args: Any) -> Any:
            passes.append((name, len(text)))
            return step(text, *args)

        return run

    monkeypatch.setattr(reading, "neutralise", recorded("special tokens", special_tokens.neutralise))
    monkeypatch.setattr(reading, "find_secrets", recorded("credentials", secrets.find_secrets))
    return passes


def test_a_50_mb_file_against_a_32k_window_is_refused_at_once_with_the_budget_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = RecordingVllm()
    big = tmp_path / "big.txt"
    big.write_text("lorem ipsum dolor sit amet\n" * (50 * 1024 * 1024 // 27))
    (tmp_path / "small.md").write_text("a note\n")
    backend = connect(URL, transport=fake.transport(), async_transport=fake.transport())
    passes = _record_passes(monkeypatch)
    result = CliRunner().invoke(
        main,
        ["ask", str(big), str(tmp_path / "small.md"), "what is it?", "--max-file-bytes", "60000000"],
        obj=Runtime(backend=backend),
    )
    assert result.exit_code == EXIT_TOO_LONG, result.output
    assert "at least" in result.stderr and "nothing was tokenized" in result.stderr
    assert "big.txt 52,428," in result.stderr  # the largest file named first, with its size
    # Decoded and measured, then refused: neither costly pass ran over it, and small.md
    # (after it in corpus order) was not read at all.
    assert passes == [], passes
    assert "no further file was read" in result.stderr
    # The only tokenize requests are the tokenizer's own small probes (special tokens, identity):
    # no document text was sent, and no question.
    assert fake.tokenized and max(len(text) for text in fake.tokenized) < 2000
    assert fake.chat_bodies == []


def test_the_bound_refuses_only_what_counting_would_refuse() -> None:
    budget = Budget(32768, reserved_output_tokens=512)
    just_provable = "x" * ((budget.prompt_budget + 1) * MAX_CHARS_PER_TOKEN)
    with pytest.raises(BudgetError, match="nothing was tokenized") as raised:
        build_pack(corpus_of([document("a.txt", just_provable)]), budget=budget)
    assert raised.value.largest[0][0] == "a.txt"
    # Below the bound the pack is counted, and refused by its count instead.
    with pytest.raises(BudgetError) as counted:
        build_pack(corpus_of([document("a.txt", "word " * 200_000)]), budget=budget)
    assert "nothing was tokenized" not in str(counted.value)
    with pytest.raises(BudgetError, match="nothing was tokenized"):
        build_shards(corpus_of([document("a.txt", just_provable), document("b.txt", "b")]), budget=budget)


def test_pack_with_a_budget_is_refused_while_reading_and_before_counting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "big.txt").write_text("y\n" * (20 * MAX_CHARS_PER_TOKEN * 1024))
    (source / "later.txt").write_text("read only if the bound did not stop the load\n")
    options = CorpusOptions(limits=Limits(max_file_bytes=64 * 1024 * 1024))
    passes = _record_passes(monkeypatch)
    with pytest.raises(BudgetError, match="nothing was tokenized, and no further file was read") as raised:
        pack(source, options, store=Store.open(tmp_path / "home"), budget=Budget(32768), reuse=False)
    assert [path for path, _ in raised.value.largest] == ["big.txt"]
    assert passes == []


def test_the_bound_counts_each_text_as_read_and_stops_at_the_first_that_proves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = Budget(4096, reserved_output_tokens=0, reserved_question_tokens=0)
    room = (budget.prompt_budget + 1) * MAX_CHARS_PER_TOKEN  # the fewest characters the bound refuses
    for name, characters in (("a.txt", room // 2), ("b.txt", room // 2 + 1), ("c.txt", 10)):
        (tmp_path / name).write_text("z" * characters)
    passes = _record_passes(monkeypatch)
    bound = LowerBound(budget)
    with pytest.raises(BudgetError, match="the files read so far hold") as raised:
        load_corpus(tmp_path, CorpusOptions(ordering="path"), on_text=bound.add)
    # a.txt alone fits the bound: it went through every pass; b.txt proved it and went through none;
    # c.txt was never read.
    assert bound.sizes == [("a.txt", room // 2), ("b.txt", room // 2 + 1)]
    assert [length for _, length in passes] == [room // 2, room // 2]
    assert [path for path, _ in raised.value.largest] == ["b.txt", "a.txt"]


def test_a_file_the_total_size_limit_leaves_out_is_not_counted_by_the_bound(tmp_path: Path) -> None:
    budget = Budget(4096, reserved_output_tokens=0, reserved_question_tokens=0)
    room = (budget.prompt_budget + 1) * MAX_CHARS_PER_TOKEN
    (tmp_path / "a.txt").write_text("a" * 1000)
    (tmp_path / "b.txt").write_text("b" * room)  # past the corpus's total size: skipped, not packed
    bound = LowerBound(budget)
    options = CorpusOptions(ordering="path", limits=Limits(max_file_bytes=2 * room, max_total_bytes=room))
    corpus = load_corpus(tmp_path, options, on_text=bound.add)
    assert [document.path for document in corpus.documents] == ["a.txt"]
    assert bound.sizes == [("a.txt", 1000)]
