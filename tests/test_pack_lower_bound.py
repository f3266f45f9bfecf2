"""A pack the characters alone prove too large is refused before any tokenize request (issue 22)."""

from __future__ import annotations

import json
import time
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
from longctx.config import CorpusOptions, Limits
from longctx.corpus import load_corpus
from longctx.errors import BudgetError
from longctx.packing import Budget, build_pack, build_shards, pack
from longctx.packing.budget import MAX_CHARS_PER_TOKEN
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


def test_a_50_mb_file_against_a_32k_window_is_refused_at_once_with_the_budget_code(tmp_path: Path) -> None:
    fake = RecordingVllm()
    big = tmp_path / "big.txt"
    big.write_text("lorem ipsum dolor sit amet\n" * (50 * 1024 * 1024 // 27))
    (tmp_path / "small.md").write_text("a note\n")
    backend = connect(URL, transport=fake.transport(), async_transport=fake.transport())
    # Reading 50 MB (decoding, the secrets scan, special tokens) is most of the time, and on a
    # loaded machine alone takes more than 2 s: the refusal may take that plus little else.
    started = time.monotonic()
    load_corpus([big, tmp_path / "small.md"], CorpusOptions(limits=Limits(max_file_bytes=60_000_000)))
    reading = time.monotonic() - started
    started = time.monotonic()
    result = CliRunner().invoke(
        main,
        ["ask", str(big), str(tmp_path / "small.md"), "what is it?", "--max-file-bytes", "60000000"],
        obj=Runtime(backend=backend),
    )
    elapsed = time.monotonic() - started
    assert result.exit_code == EXIT_TOO_LONG, result.output
    assert elapsed < max(2.0, 1.5 * reading + 0.5), (elapsed, reading)
    assert "at least" in result.stderr and "nothing was tokenized" in result.stderr
    assert "big.txt 52,428," in result.stderr  # the largest file named first, with its size
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


def test_pack_with_a_budget_is_refused_after_reading_and_before_counting(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "big.txt").write_text("y\n" * (20 * MAX_CHARS_PER_TOKEN * 1024))
    options = CorpusOptions(limits=Limits(max_file_bytes=64 * 1024 * 1024))
    with pytest.raises(BudgetError, match="nothing was tokenized"):
        pack(source, options, store=Store.open(tmp_path / "home"), budget=Budget(32768), reuse=False)
