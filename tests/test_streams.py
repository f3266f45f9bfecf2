"""Streamed answers against a fake server that streams slowly: pieces, the stored answer, leaving early."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import pytest
from fake_engine import FakeEngine

from longctx.backends.base import Backend, connect
from longctx.drivers import Done, Fanout, Io, Plan, stream
from longctx.errors import BackendError, StreamIncomplete
from longctx.retry import instant_retries
from longctx.sessions import AnswerStream, Session
from longctx.sessions.answers import Answer
from longctx.store import Store, StoredPack
from longctx.usage import Usage

# A session whose turn lock a stopped stream kept would hang its next turn: fail instead.
pytestmark = pytest.mark.timeout(60)

URL = "http://fake:8000/v1"
WORDS = [f"word{index} " for index in range(12)]
PACK = StoredPack(
    fingerprint="e" * 64,
    format_version=1,
    system="You answer questions about the documents.",
    prefix="<documents>\n" + "lorem ipsum dolor sit amet\n" * 200 + "</documents>\n\n",
    summary={"title": "fixture"},
)


class Trickle(httpx2.SyncByteStream, httpx2.AsyncByteStream):
    """An event stream body sent an event at a time, ``delay`` apart; notes whether it was closed early."""

    def __init__(self, events: list[bytes], delay: float, drop_after: int | None) -> None:
        self.events = events
        self.delay = delay
        self.drop_after = drop_after
        self.sent = 0
        self.closed_early = False

    def _next_event(self) -> bytes:
        if self.drop_after is not None and self.sent == self.drop_after:
            raise httpx2.ReadError("the fake server dropped the stream")
        event = self.events[self.sent]
        self.sent += 1
        return event

    def __iter__(self) -> Iterator[bytes]:
        while self.sent < len(self.events):
            if self.sent:
                time.sleep(self.delay)
            yield self._next_event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.sent < len(self.events):
            if self.sent:
                await asyncio.sleep(self.delay)
            yield self._next_event()

    def close(self) -> None:
        self.closed_early = self.sent < len(self.events)

    async def aclose(self) -> None:
        self.close()


@dataclass
class SlowServer:
    """The fake engine, its chat answers re-sent as one event per word, ``delay`` apart."""

    fake: FakeEngine = field(default_factory=lambda: FakeEngine(block=1, answer="".join(WORDS)))
    delay: float = 0.02
    drops: list[int] = field(default_factory=list)  # per chat request, in order: drop after this many events
    bodies: list[Trickle] = field(default_factory=list)

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        response = self.fake.handle(request)
        if not request.url.path.endswith("/chat/completions") or response.status_code != 200:
            return response
        events = _split_words(response.read().decode())
        body = Trickle(events, self.delay, self.drops.pop(0) if self.drops else None)
        self.bodies.append(body)
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=body)

    def backend(self) -> Backend:
        transport = httpx2.MockTransport(self.handle)
        return connect(URL, transport=transport, async_transport=transport)


def _split_words(text: str) -> list[bytes]:
    """The fake's events, its one content delta split into one delta per word."""
    events: list[bytes] = []
    for line in text.split("\n\n"):
        if not line.startswith("data: {"):
            if line:
                events.append(f"{line}\n\n".encode())
            continue
        chunk = json.loads(line[len("data: ") :])
        choices = chunk.get("choices") or [{}]
        content = (choices[0].get("delta") or {}).get("content")
        pieces = [word for word in content.split(" ") if word] if content else [None]
        for index, piece in enumerate(pieces):
            if piece is not None:
                spaced = piece + (" " if index < len(pieces) - 1 or content.endswith(" ") else "")
                chunk = {**chunk, "choices": [{**choices[0], "delta": {"content": spaced}}]}
            events.append(f"data: {json.dumps(chunk)}\n\n".encode())
    return events


@pytest.fixture
def server() -> SlowServer:
    return SlowServer()


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "home")


def test_pieces_arrive_one_by_one_and_make_up_the_stored_answer(server: SlowServer, store: Store) -> None:
    session = Session(server.backend(), PACK, store=store)
    arrivals: list[tuple[float, str]] = []
    with session.stream("what is here?") as answer_stream:
        for text in answer_stream:
            arrivals.append((time.perf_counter(), text))
    pieces = [text for _, text in arrivals]
    assert pieces == WORDS
    answer = answer_stream.answer
    assert "".join(pieces) == answer.text == answer_stream.text
    assert arrivals[-1][0] - arrivals[0][0] > 5 * server.delay  # the first came well before the last
    assert answer.usage.ttft_seconds is not None and answer.usage.total_seconds is not None
    assert answer.usage.ttft_seconds < answer.usage.total_seconds
    assert [turn.answer for turn in session.turns] == [answer.text]  # stored as ask() stores it
    assert store.sessions.turns(session.id)[0].answer == answer.text
    assert answer_stream.finished


def test_a_streamed_turn_is_the_turn_ask_would_have_made(server: SlowServer, store: Store) -> None:
    asked = Session(server.backend(), PACK, store=store)
    plain = asked.ask("first?")
    streamed = Session(server.backend(), PACK, store=store)
    with streamed.stream("first?") as answer_stream:
        list(answer_stream)
    answer = answer_stream.answer
    assert (answer.text, answer.turn, answer.question) == (plain.text, plain.turn, plain.question)
    assert answer.usage.prompt_tokens == plain.usage.prompt_tokens
    # The same prefix, sent a second time: read from the (fake's) cache like any turn.
    assert answer.usage.cached_tokens == plain.usage.prompt_tokens


def test_the_answer_before_the_end_is_a_clear_error(server: SlowServer, store: Store) -> None:
    session = Session(server.backend(), PACK, store=store)
    with session.stream("what?") as answer_stream:
        with pytest.raises(StreamIncomplete, match="not finished"):
            _ = answer_stream.answer
        first = next(answer_stream)
        with pytest.raises(StreamIncomplete, match="not finished") as raised:
            _ = answer_stream.answer
        assert raised.value.text == first


def _check_nothing_kept(session: Session, server: SlowServer, store: Store) -> None:
    """After a stream stopped midway: the request was cut, no turn stored, the session free for the next."""
    assert server.bodies[-1].closed_early, "the HTTP stream was not closed"
    assert session.turns == ()
    assert store.sessions.turns(session.id) == []
    answer = session.ask("next?")  # would block forever if the turn lock were still held
    assert answer.turn == 0
    last = server.fake.chat_bodies[-1]["messages"]
    assert [message["role"] for message in last] == ["system", "user"]  # no partial answer in the history


def test_ctrl_c_in_the_consumer_stops_the_request_and_keeps_nothing(server: SlowServer, store: Store) -> None:
    session = Session(server.backend(), PACK, store=store)
    seen: list[str] = []
    with pytest.raises(KeyboardInterrupt), session.stream("what?") as answer_stream:
        for text in answer_stream:
            seen.append(text)
            if len(seen) == 3:
                raise KeyboardInterrupt
    assert seen == WORDS[:3] and answer_stream.text == "".join(WORDS[:3])
    with pytest.raises(StreamIncomplete, match="interrupted") as raised:
        _ = answer_stream.answer
    assert raised.value.text == "".join(WORDS[:3])
    _check_nothing_kept(session, server, store)


def test_close_midway_stops_the_request_and_keeps_nothing(server: SlowServer, store: Store) -> None:
    session = Session(server.backend(), PACK, store=store)
    answer_stream = session.stream("what?")
    assert next(answer_stream) == WORDS[0]
    answer_stream.close()
    answer_stream.close()  # idempotent
    assert list(answer_stream) == []
    with pytest.raises(StreamIncomplete, match="closed before its end"):
        _ = answer_stream.answer
    _check_nothing_kept(session, server, store)


def test_a_loop_that_breaks_and_drops_the_stream_frees_the_session(server: SlowServer, store: Store) -> None:
    session = Session(server.backend(), PACK, store=store)
    for _ in session.stream("what?"):
        break  # the stream is dropped with the loop: garbage, closed
    _check_nothing_kept(session, server, store)


def test_nothing_is_sent_until_the_stream_is_iterated(server: SlowServer, store: Store) -> None:
    session = Session(server.backend(), PACK, store=store)
    answer_stream = session.stream("what?")
    assert server.fake.chat_bodies == []
    answer_stream.close()
    assert server.fake.chat_bodies == [] and session.turns == ()


def test_stream_takes_asks_keywords_and_refuses_others(server: SlowServer, store: Store) -> None:
    session = Session(server.backend(), PACK, store=store)
    with session.stream("what?", max_tokens=7, cite=True) as answer_stream:
        list(answer_stream)
    assert server.fake.chat_bodies[-1]["max_tokens"] == 7
    assert answer_stream.answer.citations is not None  # asked for: read (none found in the fake's text)
    with pytest.raises(TypeError):
        session.stream("what?", colour="red")  # type: ignore[call-arg]


def test_a_drop_before_the_first_piece_is_retried_and_after_it_is_not(
    server: SlowServer, store: Store
) -> None:
    session = Session(server.backend(), PACK, store=store)
    server.drops[:] = [1]  # the role-only first event, then the connection drops: nothing was handed out
    with instant_retries(), session.stream("what?") as answer_stream:
        assert list(answer_stream) == WORDS
    assert answer_stream.answer.attempts == 2
    server.drops[:] = [4]  # three words went out: another attempt would hand them out again
    with (
        instant_retries(),
        session.stream("again?") as broken,
        pytest.raises(BackendError, match="not retried"),
    ):
        list(broken)
    assert broken.text == "".join(WORDS[:3])
    assert len(server.fake.chat_bodies) == 3  # one attempt for the broken stream
    assert len(session.turns) == 1


def test_the_async_stream_is_the_same_plan(server: SlowServer, store: Store) -> None:
    session = Session(server.backend(), PACK, store=store)

    async def main() -> tuple[list[str], Answer, str]:
        async with session.astream("what?") as answer_stream:
            pieces = [text async for text in answer_stream]
        left = session.astream("then?")
        first = await anext(left)
        await left.aclose()
        with pytest.raises(StreamIncomplete):
            _ = left.answer
        await session.aclose()
        return pieces, answer_stream.answer, first

    pieces, answer, first = asyncio.run(main())
    assert pieces == WORDS and "".join(pieces) == answer.text
    assert first == WORDS[0]
    assert server.bodies[-1].closed_early
    assert [turn.question for turn in session.turns] == ["what?"]


def test_a_cancelled_task_stops_the_async_stream_and_keeps_nothing(server: SlowServer, store: Store) -> None:
    session = Session(server.backend(), PACK, store=store)
    started = threading.Event()

    async def consume() -> None:
        async with session.astream("what?") as answer_stream:
            async for _ in answer_stream:
                started.set()

    async def main() -> None:
        task = asyncio.create_task(consume())
        while not started.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await session.aask("next?")
        await session.aclose()

    asyncio.run(main())
    assert server.bodies[0].closed_early
    assert [turn.question for turn in session.turns] == ["next?"]


# -- the driver --------------------------------------------------------------


@dataclass
class _Letters:
    """A :class:`~longctx.drivers.Pieces` handing out a word's letters, its value the word."""

    word: str
    done: bool = False

    def each(self) -> Iterator[str]:
        yield from self.word
        self.done = True

    async def aeach(self) -> AsyncIterator[str]:
        for letter in self.word:
            yield letter
        self.done = True

    @property
    def value(self) -> str:
        return self.word


def _spelled(word: str) -> Io[str]:
    source = _Letters(word)
    return Io(lambda: word, None, lambda: source)


def test_the_driver_hands_out_only_the_plans_own_streamed_steps() -> None:
    cleaned: list[str] = []

    def inner() -> Plan[str]:
        return (yield _spelled("no"))

    def plan() -> Plan[str]:
        try:
            first = yield _spelled("abc")
            side = yield Fanout([inner], 1)  # a fanout's plans run plainly: nothing handed out
            plain = yield Io(lambda: "x")
            return first + side[0].value + plain
        finally:
            cleaned.append("done")

    assert list(stream(plan())) == ["a", "b", "c", Done("abcnox")]
    assert cleaned == ["done"]
    events = stream(plan())
    assert next(events) == "a"
    events.close()  # the plan hears of it: its finally runs
    assert cleaned == ["done", "done"]


def test_a_plan_that_streamed_nothing_hands_its_answer_out_whole() -> None:
    answer = Answer("q", "the whole text", None, "stop", Usage(1, 0, None, 1, 0.1, 0.2), "s", 0, "r", 1)

    def plan() -> Plan[Answer]:
        return (yield Io(lambda: answer))

    answer_stream = AnswerStream(plan())
    assert list(answer_stream) == ["the whole text"]
    assert answer_stream.answer is answer


def test_an_answer_printed_whole_is_the_stored_text_byte_for_byte(capsys: pytest.CaptureFixture[str]) -> None:
    """Not a terminal, not streamed: click would strip what looks like ANSI; printed as stored."""
    from types import SimpleNamespace

    from longctx.cli.streaming import Printing, print_answer

    text = "red \x1b[31mtext\x1b[0m and a bell \x07"
    session = SimpleNamespace(ask=lambda question, **options: SimpleNamespace(text=text))
    printed = print_answer(session, "q?", Printing(stream=False, spinner=False))  # type: ignore[arg-type]
    assert printed.answer.text == text and capsys.readouterr().out == text + "\n"
