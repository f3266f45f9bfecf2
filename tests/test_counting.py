"""SectionCounter: the same counts as in one process, with or without a worker, whatever the worker does."""

from __future__ import annotations

import io
import struct
import sys
from pathlib import Path

import pytest

from longctx.packing import counting
from longctx.packing.counting import SectionCounter, serve
from longctx.store import Store
from longctx.tokens.tokenizers import (
    EstimateTokenizer,
    TiktokenFileTokenizer,
    fast_openai_counter,
    text_sha256,
)

needs_cl100k = pytest.mark.skipif(
    fast_openai_counter("cl100k_base") is None, reason="cl100k offline needs bpe-openai (optional) here"
)

TEXTS = [
    "def f(x):\n    return x\n" * 50,
    "Les élèves étudient. 日本語 😀\n" * 30,
    "",
    "<|endoftext|> special spelling\n",
    "def f(x):\n    return x\n" * 50,  # a repeat
    "x" * 5000,
] * 20


def _count(counter: SectionCounter, texts: list[str]) -> list[int]:
    for text in texts:
        counter.add(text, text_sha256(text))
    return counter.counts()


@needs_cl100k
def test_a_worker_gives_the_same_counts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(counting, "WORKER_THRESHOLD_BYTES", 0)
    tokenizer = TiktokenFileTokenizer.named("cl100k_base")
    with Store.open(tmp_path) as store, SectionCounter(tokenizer, store) as counter:
        counts = _count(counter, TEXTS)
        assert counter._worker is not None  # it did start
        assert counts == [tokenizer.count(text) for text in TEXTS]
        saved = store.caches.token_counts(tokenizer.identity, [text_sha256(text) for text in TEXTS])
        assert saved == {text_sha256(text): tokenizer.count(text) for text in TEXTS}


@needs_cl100k
def test_a_worker_started_early_gives_the_same_counts_from_utf8() -> None:
    tokenizer = TiktokenFileTokenizer.named("cl100k_base")
    with SectionCounter(tokenizer) as counter:
        counter.start_worker()
        assert counter._worker is not None
        for text in TEXTS:  # as the pack builder hands them over: with their UTF-8
            counter.add(text, text_sha256(text), text.encode("utf-8"))
        assert counter.counts() == [tokenizer.count(text) for text in TEXTS]


@needs_cl100k
def test_a_worker_started_early_and_never_used_is_stopped_without_waiting(tmp_path: Path) -> None:
    tokenizer = TiktokenFileTokenizer.named("cl100k_base")
    with Store.open(tmp_path) as store:
        store.caches.save_token_counts(tokenizer.identity, {text_sha256(text): 7 for text in TEXTS})
        with SectionCounter(tokenizer, store) as counter:
            counter.start_worker()
            worker = counter._worker
            assert worker is not None
            assert _count(counter, TEXTS) == [7] * len(TEXTS)
        assert worker.process.poll() is not None  # stopped by close
        assert not worker._ever_sent


@needs_cl100k
def test_counts_already_stored_are_not_counted_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tokenizer = TiktokenFileTokenizer.named("cl100k_base")
    with Store.open(tmp_path) as store:
        store.caches.save_token_counts(tokenizer.identity, {text_sha256(text): 7 for text in TEXTS})
        with SectionCounter(tokenizer, store) as counter:
            assert _count(counter, TEXTS) == [7] * len(TEXTS)


@needs_cl100k
def test_a_worker_that_cannot_start_leaves_the_counting_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(counting, "WORKER_THRESHOLD_BYTES", 0)
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    tokenizer = TiktokenFileTokenizer.named("cl100k_base")
    with SectionCounter(tokenizer) as counter:
        assert _count(counter, TEXTS) == [tokenizer.count(text) for text in TEXTS]
        assert counter._worker is None


@needs_cl100k
def test_a_worker_that_dies_leaves_the_rest_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(counting, "WORKER_THRESHOLD_BYTES", 0)
    tokenizer = TiktokenFileTokenizer.named("cl100k_base")
    tokenizer.count("this process's counter is ready")
    tokenizer.encoding_name = "no_such_encoding"  # the worker fails on its first text
    with SectionCounter(tokenizer) as counter:
        assert _count(counter, TEXTS) == [
            TiktokenFileTokenizer.named("cl100k_base").count(text) for text in TEXTS
        ]


def test_other_tokenizers_count_here_in_one_batch() -> None:
    tokenizer = EstimateTokenizer()
    with SectionCounter(tokenizer) as counter:
        assert _count(counter, TEXTS) == [tokenizer.count(text) for text in TEXTS]
        assert counter._worker is None


def test_the_estimate_counts_texts_given_as_utf8_without_decoding_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tokenizer = EstimateTokenizer()
    expected = [tokenizer.count(text) for text in TEXTS]
    monkeypatch.setattr(
        EstimateTokenizer, "count", lambda self, text: pytest.fail("a text given as UTF-8 was decoded")
    )
    with SectionCounter(tokenizer) as counter:
        for text in TEXTS:
            counter.add(text, text_sha256(text), text.encode("utf-8"))
        assert counter.counts() == expected


@needs_cl100k
def test_serve_answers_one_count_per_text_in_order() -> None:
    texts = ["hello world", "", "lone \ud800 surrogate", "日本語"]
    request = b"".join(
        struct.pack("=Q", len(data)) + data
        for data in (text.encode("utf-8", "surrogatepass") for text in texts)
    )
    answers = io.BytesIO()
    serve("cl100k_base", io.BytesIO(request), answers)
    tokenizer = TiktokenFileTokenizer.named("cl100k_base")
    assert list(struct.iter_unpack("=Q", answers.getvalue())) == [(tokenizer.count(text),) for text in texts]
