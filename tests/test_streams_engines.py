"""Streamed answers against the real vLLM and SGLang servers: pieces as they come, the cache as ask reads it.

The leaving-early rules are held with a fake server in tests/test_streams.py; here the real
engines show that the first piece comes well before the last, that a streamed turn reads as much
of the cache as a plain sibling over the same prefix, and that after a stream stopped midway the
next turn still reads the pack from the cache.
"""

from __future__ import annotations

import asyncio
import sysconfig
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_helpers import common_prefix_length, tokenize_messages

from longctx.backends.base import Backend, connect
from longctx.options.groups import RequestOptions
from longctx.sessions import Session
from longctx.sessions.answers import Answer
from longctx.store import Store, StoredPack
from longctx.testing import LocalServer, TinyModel

STDLIB = Path(sysconfig.get_paths()["stdlib"])
# ignore_eos: the random model may end an answer at once, and these need many pieces.
STREAMED = RequestOptions(max_tokens=64, temperature=0.0, extra_body={"ignore_eos": True})


def small_pack() -> StoredPack:
    """About 2,500 tokens of standard-library text, new to the server (a nonce)."""
    nonce = uuid.uuid4().hex
    body = (STDLIB / "textwrap.py").read_text()[:10_000]
    return StoredPack(
        fingerprint=nonce + nonce,
        format_version="test/1",
        system=f"Answer questions about the documents. [{nonce}]",
        prefix=f"<documents>\n{body}\n</documents>\n\n",
        summary={"title": "streamed"},
    )


@pytest.fixture
def backend(engine_server: LocalServer) -> Iterator[Backend]:
    backend = connect(engine_server.api_base)
    yield backend
    backend.close()


def _block_round(tokens: int, block: int | None) -> int:
    return tokens - tokens % (block or 1)


def test_a_streamed_turn_comes_piece_by_piece_and_reads_the_cache_as_a_plain_one(
    backend: Backend, tmp_path: Path
) -> None:
    store = Store.open(tmp_path / "home")
    pack = small_pack()
    Session(backend, pack, store=store, request=STREAMED).ask("Question 0: what is this?")  # the cold prefill
    plain = Session(backend, pack, store=store, request=STREAMED).ask("Question 1: what is this?")
    session = Session(backend, pack, store=store, request=STREAMED)
    pieces: list[str] = []
    finished_at: list[bool] = []  # whether the answer had ended when each piece was handed out
    with session.stream("Question 2: what is this?") as answer_stream:
        for text in answer_stream:
            finished_at.append(answer_stream.finished)
            pieces.append(text)
    answer = answer_stream.answer
    assert "".join(pieces) == answer.text and answer.usage.completion_tokens == 64
    assert len(pieces) > 10, pieces
    # Each piece is handed out as it is read, before the answer's end (not all at once after it); a
    # check of the seconds between them would fail on a loaded machine whose reads come in bursts.
    assert not any(finished_at) and answer_stream.finished, finished_at
    usage = answer.usage
    assert usage.ttft_seconds is not None and usage.total_seconds is not None
    assert usage.ttft_seconds <= usage.total_seconds, usage
    # Both siblings share the warm prefix to the same token: the streamed one reads as much of it.
    assert answer.usage.cached_tokens == plain.usage.cached_tokens, (answer.usage, plain.usage)
    assert plain.usage.cached_tokens is not None and plain.usage.cached_tokens > 0
    assert [turn.answer for turn in session.turns] == [answer.text]


def test_after_a_stream_stopped_midway_the_next_turn_reads_the_pack_from_the_cache(
    engine_server: LocalServer, tiny_model: TinyModel, backend: Backend, tmp_path: Path
) -> None:
    store = Store.open(tmp_path / "home")
    session = Session(backend, small_pack(), store=store, request=STREAMED)
    first = "Question 1: what is this?"
    with pytest.raises(KeyboardInterrupt), session.stream(first) as answer_stream:
        for _ in answer_stream:
            if len(answer_stream.text) > 10:
                raise KeyboardInterrupt  # Ctrl-C while the answer streams
    assert session.turns == ()  # nothing kept of the partial answer
    second = "Question 2: and what else?"
    shared = common_prefix_length(
        tokenize_messages(engine_server, tiny_model, session.messages(first)),
        tokenize_messages(engine_server, tiny_model, session.messages(second)),
    )
    answer = session.ask(second)
    block = backend.info.cache_block_tokens
    assert answer.usage.cached_tokens is not None
    assert answer.usage.cached_tokens >= _block_round(shared, block), (answer.usage, shared, block)
    assert shared > 2000  # the pack, prefilled by the stopped request, is what the next turn reads
    assert [turn.question for turn in session.turns] == [second]


def test_the_async_stream_comes_piece_by_piece_and_reads_the_cache(
    engine_server: LocalServer, tiny_model: TinyModel, backend: Backend, tmp_path: Path
) -> None:
    store = Store.open(tmp_path / "home")
    pack = small_pack()
    probe = Session(backend, pack, store=store)
    shared = common_prefix_length(
        tokenize_messages(engine_server, tiny_model, probe.messages("Question 0: what is this?")),
        tokenize_messages(engine_server, tiny_model, probe.messages("Question 1: what is this?")),
    )

    async def conversation() -> tuple[Answer, list[str]]:
        # The cold prefill, then the streamed sibling.
        await Session(backend, pack, store=store, request=STREAMED).aask("Question 0: what is this?")
        session = Session(backend, pack, store=store, request=STREAMED)
        pieces, finished_at = [], []
        async with session.astream("Question 1: what is this?") as answer_stream:
            async for text in answer_stream:
                finished_at.append(answer_stream.finished)
                pieces.append(text)
        assert not any(finished_at) and answer_stream.finished, finished_at  # handed out as read
        return answer_stream.answer, pieces

    answer, pieces = asyncio.run(conversation())
    assert "".join(pieces) == answer.text and len(pieces) > 10
    usage = answer.usage
    assert usage.ttft_seconds is not None and usage.total_seconds is not None
    assert usage.ttft_seconds <= usage.total_seconds, usage
    assert usage.cached_tokens is not None
    assert usage.cached_tokens >= _block_round(shared, backend.info.cache_block_tokens), (usage, shared)
