"""Streamed answers: a question's text handed out as it arrives, then the stored :class:`Answer`.

:meth:`Conversation.stream <longctx.sessions.conversation.Conversation.stream>` gives an
:class:`AnswerStream`, :meth:`~longctx.sessions.conversation.Conversation.astream` an
:class:`AsyncAnswerStream`. Both carry out the same plan :meth:`ask` does (the
turn's request marked ``streamed``), through :func:`longctx.drivers.stream` or
:func:`longctx.drivers.astream`: one body, the pieces of the request step passed
on as they come. Nothing is sent until the stream is iterated.

What is kept of an answer stopped midway (``close()``, leaving a ``with`` block,
a ``break`` that drops the stream, Ctrl-C, a task cancelled): nothing. The request
is stopped (its connection closed, so the server aborts it), no turn is stored
and the history stays as it was before the question, as if it had not been asked.
A session's turns are whole answers (a crash leaves no half turn); an answer cut
off is no reliable ground for the next question, and the next turn's prefix (the
pack and the earlier turns, which the stopped request prefilled) is cached all
the same. :attr:`AnswerStream.text` keeps what arrived, for the caller to show.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncGenerator, Generator
from types import TracebackType
from typing import Self

from longctx.drivers import Done, Plan, astream, stream
from longctx.errors import StreamIncomplete
from longctx.sessions.answers import Answer

__all__ = ["AnswerStream", "AsyncAnswerStream"]


class _Course:
    """Where a stream stands, the same for both kinds: the text so far, then the answer or why it stopped."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.answer: Answer | None = None
        self.stopped: str | None = None  # why it ended before its answer
        self.whole: str | None = None  # an answer no piece of which was handed out, handed out at once

    @property
    def over(self) -> bool:
        return self.answer is not None or self.stopped is not None

    def took(self, event: str | Done[Answer]) -> str | None:
        """The piece to hand out for ``event`` (None: the stream is at its end)."""
        if isinstance(event, Done):
            self.answer = event.value
            if not self.pieces and event.value.text:
                # A plan that streamed nothing (one shard's answer asked as a map step) hands its
                # whole text out as one piece, so the pieces always make up the answer's text.
                self.pieces.append(event.value.text)
                return event.value.text
            return None
        self.pieces.append(event)
        return event

    def failed(self, error: BaseException) -> None:
        if not self.over:
            # asyncio's cancellation only where asyncio is loaded: a sync stream's process never imports it.
            asyncio = sys.modules.get("asyncio")
            cancelled = asyncio is not None and isinstance(error, asyncio.CancelledError)
            interrupted = cancelled or isinstance(error, (KeyboardInterrupt, GeneratorExit))
            self.stopped = "it was interrupted" if interrupted else f"its request failed ({error})"

    def closed(self) -> None:
        if not self.over:
            self.stopped = "it was closed before its end"

    def result(self) -> Answer:
        if self.answer is not None:
            return self.answer
        text = "".join(self.pieces)
        if self.stopped is not None:
            raise StreamIncomplete(
                f"the streamed answer stopped before its end ({self.stopped}): no turn was stored", text=text
            )
        raise StreamIncomplete(
            "the streamed answer is not finished: iterate it to its end before reading .answer", text=text
        )


class _Streamed:
    """What both streams show of their course: the text so far, the stored answer, whether it is done."""

    _course: _Course

    @property
    def text(self) -> str:
        """The answer's text that arrived so far (all of it once the stream ended)."""
        return "".join(self._course.pieces)

    @property
    def answer(self) -> Answer:
        """The stored answer once the last piece is out; before, :class:`~longctx.errors.StreamIncomplete`."""
        return self._course.result()

    @property
    def finished(self) -> bool:
        """True once the whole answer arrived and was stored."""
        return self._course.answer is not None


class AnswerStream(_Streamed):
    """One question's answer as it arrives: ``for text in stream:`` yields its text, piece by piece.

    After the last piece, :attr:`answer` is the stored :class:`Answer`,
    exactly what ``ask()`` returns (usage, time to first token, the counter
    check); before, or after the stream stopped early, it raises
    :class:`~longctx.errors.StreamIncomplete`. Iterate it once, in one thread.
    Use it as a context manager (or call :meth:`close`) so that leaving early,
    Ctrl-C included, stops the request at once and frees the session for its
    next turn; what is kept then is described in :mod:`longctx.sessions.streams`.
    """

    def __init__(self, plan: Plan[Answer]) -> None:
        self._events: Generator[str | Done[Answer], None, None] = stream(plan)
        self._course = _Course()

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> str:
        course = self._course
        if course.over:
            raise StopIteration
        try:
            event = next(self._events)
        except StopIteration:
            course.closed()
            raise
        except BaseException as error:
            course.failed(error)
            raise
        piece = course.took(event)
        if piece is None:
            raise StopIteration
        return piece

    def close(self) -> None:
        """Stop the request if it is still going (nothing is stored then); idempotent."""
        self._course.closed()
        self._events.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if error is not None:
            self._course.failed(error)
        self.close()


class AsyncAnswerStream(_Streamed):
    """:class:`AnswerStream` for async code: ``async for text in stream:``, ``async with``, :meth:`aclose`."""

    def __init__(self, plan: Plan[Answer]) -> None:
        self._events: AsyncGenerator[str | Done[Answer], None] = astream(plan)
        self._course = _Course()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> str:
        course = self._course
        if course.over:
            raise StopAsyncIteration
        try:
            event = await anext(self._events)
        except StopAsyncIteration:
            course.closed()
            raise
        except BaseException as error:
            course.failed(error)
            raise
        piece = course.took(event)
        if piece is None:
            raise StopAsyncIteration
        return piece

    async def aclose(self) -> None:
        """Stop the request if it is still going (nothing is stored then); idempotent."""
        self._course.closed()
        await self._events.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if error is not None:
            self._course.failed(error)
        await self.aclose()
