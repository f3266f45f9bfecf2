"""Counting a pack's sections while the corpus is still being read, with a second process.

:class:`SectionCounter` takes texts one at a time (with their sha256, the
count cache's key) and returns one count per text, in order, from
:meth:`SectionCounter.counts`. Counts already in the
:class:`~longctx.store.Store` are looked up as texts arrive; the others are
counted, and saved when the counts are handed over. The numbers are exactly
:func:`~longctx.tokens.cached_counts`'s: only where the work happens
differs.

Where: BPE counting holds the GIL (tiktoken and bpe-openai both), so
threads cannot share it. For a tokenizer another process can rebuild (a
named tiktoken encoding) and enough text to be worth it (more than
:data:`WORKER_THRESHOLD_BYTES` not yet counted), one worker process is
started. A feeding thread sends it texts from the front of the queue (in
batches, one write and one GIL hand-over each) while this process reads
the next files; when the caller asks for the counts, this process counts
from the back of the queue until the two meet, then counts the texts the
worker was sent and has not answered yet, last sent first, rather than
wait for it (a text counted by both keeps one of two equal counts). On
two cores a cold pack then costs about the reading plus half the
counting.
Other tokenizers (the server's, a tokenizer.json, the estimate) count in
:meth:`counts` through their own ``count_many``, as before.

Why a fresh interpreter and not ``fork``: longctx is a library, and the
process that calls it may hold threads and locks (a web server, a
notebook's event loop); a forked child inherits them in whatever state they
were in. ``subprocess`` starts ``sys.executable`` with exec, which inherits
nothing but the pipes. The worker imports only :mod:`longctx.tokens` and the
tokenizer (about 0.1 s, hidden behind this process's reading). If it cannot
be started, or dies, the texts it did not answer for are counted here: a
worker is an accelerator, never a requirement.

Wire format (pipes, native byte order, both ends are this machine): each
request is an 8-byte length and that many bytes of UTF-8 (lone surrogates as
``surrogatepass``); each answer is an 8-byte count, in request order. The
worker stops at the end of its input.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Final

from longctx.tokens.tokenizers import EstimateTokenizer, TiktokenFileTokenizer, Tokenizer

if TYPE_CHECKING:
    from longctx.store import Store

__all__ = ["WORKER_THRESHOLD_BYTES", "SectionCounter", "count_texts", "serve"]

logger = logging.getLogger("longctx.counting")

WORKER_THRESHOLD_BYTES: Final = 2 * 1024 * 1024
"""Characters not yet counted (UTF-8 bytes, for texts given as UTF-8) above which a worker process is started.

Two MB take 0.1 s to 0.2 s to count; starting a worker costs about as much
CPU on the other core, so below this it would not pay.
"""

_HEADER: Final = struct.Struct("=Q")
_LOOKUP_BATCH: Final = 128  # texts per count-cache query while reading
# Linux lets a pipe hold up to 1 MiB (pipe-max-size) without privileges: the
# worker then has work queued while the feeding thread waits for the GIL.
_PIPE_BYTES: Final = 1 << 20
_F_SETPIPE_SZ: Final = 1031
# Bytes of texts sent in one write: about ten milliseconds of counting, so the
# worker is never far ahead of this process when it counts from the back.
_BATCH_BYTES: Final = 1 << 18
_ANSWERS_READ_BYTES: Final = 1 << 16


class SectionCounter:
    """Counts texts handed over one by one; see the module docstring for where the work happens.

    Use it as a context manager (or call :meth:`close`): a worker process
    it started is stopped there.
    """

    def __init__(self, tokenizer: Tokenizer, store: Store | None = None) -> None:
        self.tokenizer = tokenizer
        self.store = store
        # Each text as given, or its UTF-8 (see add); "" once counted.
        self._texts: list[str | bytes] = []
        self._digests: list[str] = []
        self._counts: list[int | None] = []
        self._unlooked: list[int] = []  # indexes not yet looked up in the store
        self._fresh: dict[str, int] = {}  # digest -> count, to save
        self._first_index: dict[str, int] = {}  # digest -> first index counted for it
        self._worker_name = tokenizer.encoding_name if isinstance(tokenizer, TiktokenFileTokenizer) else None
        self._worker: _Worker | None = None
        self._pending_chars = 0
        # Indexes waiting to be counted: the worker takes from the left,
        # this process from the right.
        self._queue: collections.deque[int] = collections.deque()
        self._lock = threading.Lock()

    def __enter__(self) -> SectionCounter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def add(self, text: str, digest: str, utf8: bytes | None = None) -> None:
        """Count ``text`` (whose :func:`~longctx.tokens.text_sha256` is ``digest``), now or later.

        ``utf8``, when the caller has it, is ``text`` encoded as UTF-8: it
        is kept instead of ``text`` (the same size for most texts) and sent
        to the worker as it is, where ``text`` would be encoded again.
        """
        self._texts.append(text if utf8 is None else utf8)
        self._digests.append(digest)
        self._counts.append(None)
        self._unlooked.append(len(self._texts) - 1)
        if len(self._unlooked) >= _LOOKUP_BATCH:
            self._look_up()

    def _look_up(self) -> None:
        """Take the counts the store knows for the texts added since the last lookup; queue the others."""
        indexes, self._unlooked = self._unlooked, []
        if not indexes:
            return
        known: dict[str, int] = {}
        if self.store is not None:
            known = self.store.caches.token_counts(
                self.tokenizer.identity, [self._digests[i] for i in indexes]
            )
        queued: list[int] = []
        for index in indexes:
            digest = self._digests[index]
            if digest in known:
                self._record(index, known[digest])
            elif digest in self._first_index:
                self._texts[index] = ""  # the same text again: it takes the first one's count
            else:
                self._first_index[digest] = index
                queued.append(index)
                self._pending_chars += len(self._texts[index])
        if not queued:
            return
        with self._lock:
            self._queue.extend(queued)
        if self._worker is not None:
            self._worker.wake()
        elif self._worker_name is not None and self._pending_chars > WORKER_THRESHOLD_BYTES:
            self._start_worker(self._worker_name)

    def start_worker(self) -> None:
        """Start the worker process now, not once enough uncounted text is waiting.

        For a caller that expects much text to count (the first pack of a
        large repository): the worker's start-up then overlaps the listing
        and the first reads. Does nothing for a tokenizer no worker can
        rebuild, or when a worker runs. A worker that is never sent a text
        is stopped without waiting for it.
        """
        if self._worker is None and self._worker_name is not None:
            self._start_worker(self._worker_name)

    def _start_worker(self, encoding_name: str) -> None:
        self._worker = _Worker.start(encoding_name, self)
        if self._worker is not None and isinstance(self.tokenizer, TiktokenFileTokenizer):
            # This process counts from the back at the end: its own counter
            # is built meanwhile, off the GIL, rather than then.
            self.tokenizer.prepare_in_background()

    def _take(self) -> int | None:
        """The next index for this process to count: from the back of the queue."""
        with self._lock:
            return self._queue.pop() if self._queue else None

    def _take_front(self, size: int) -> list[int]:
        """Indexes for the worker from the front of the queue: texts of about ``size`` bytes, at least one."""
        taken: list[int] = []
        total = 0
        with self._lock:
            while self._queue and total < size:
                index = self._queue.popleft()
                taken.append(index)
                total += len(self._texts[index])
        return taken

    def _record(self, index: int, count: int) -> None:
        self._counts[index] = count
        self._texts[index] = ""  # counted: the text is not needed any more

    def counts(self) -> list[int]:
        """One count per added text, in order; new counts are saved to the store."""
        self._look_up()
        if self._worker is None:
            self._count_here_in_batch()
        else:
            while (index := self._take()) is not None:
                self._record(index, self.tokenizer.count(self._text(index)))
            # What the worker was sent and has not answered yet is counted
            # here too, from the last one sent, rather than waited for.
            for index in reversed(self._worker.stop_sending()):
                self._count_if_unanswered(index)
            self._worker.stop(wait=False)
            # Whatever a failed worker did not answer is counted here.
            for index in self._first_index.values():
                if self._counts[index] is None:
                    self._record(index, self.tokenizer.count(self._text(index)))
        counts: list[int] = []
        for index, digest in enumerate(self._digests):
            count = self._counts[index]
            if count is None:  # a repeat of an earlier text
                count = self._counts[self._first_index[digest]]
                assert count is not None
            counts.append(count)
        for digest, index in self._first_index.items():
            value = self._counts[index]
            assert value is not None
            self._fresh[digest] = value
        if self.store is not None and self._fresh:
            self.store.caches.save_token_counts(self.tokenizer.identity, self._fresh)
        self._fresh = {}
        self._first_index = {}
        return counts

    def _count_if_unanswered(self, index: int) -> None:
        # The text is read before the check: the reader thread records a
        # count before it empties the text. If both count it, the counts
        # are the same.
        text = self._texts[index]
        if self._counts[index] is None:
            if isinstance(text, bytes):
                text = text.decode("utf-8", "surrogatepass")
            self._record(index, self.tokenizer.count(text))

    def _text(self, index: int) -> str:
        text = self._texts[index]
        return text if isinstance(text, str) else text.decode("utf-8", "surrogatepass")

    def _utf8(self, index: int) -> bytes:
        text = self._texts[index]
        return text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")

    def _count_here_in_batch(self) -> None:
        with self._lock:
            indexes = list(self._queue)
            self._queue.clear()
        if indexes and isinstance(self.tokenizer, EstimateTokenizer):
            # The estimate is a function of the UTF-8 length: texts kept as
            # UTF-8 are not decoded for it (37 MB take 0.1 s to decode and
            # encode again).
            for index in indexes:
                self._record(index, self.tokenizer.count_utf8(self._utf8(index)))
        elif indexes:
            # count_many: a server tokenizer sends these in parallel requests.
            for index, count in zip(
                indexes, self.tokenizer.count_many([self._text(i) for i in indexes]), strict=True
            ):
                self._record(index, count)

    def close(self) -> None:
        """Stop the worker process, if one was started."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None


class _Worker:
    """The worker process and this process's two threads that talk to it."""

    def __init__(self, process: subprocess.Popen[bytes], counter: SectionCounter) -> None:
        self.process = process
        self.counter = counter
        self._wakeup = threading.Condition()
        self._closing = False
        self._sent: collections.deque[int] = collections.deque()
        self._ever_sent = False
        self._sent_lock = threading.Lock()
        self._feeder = threading.Thread(target=self._feed, name="longctx-count-feeder", daemon=True)
        self._reader = threading.Thread(target=self._read, name="longctx-count-reader", daemon=True)
        self._feeder.start()
        self._reader.start()

    @classmethod
    def start(cls, encoding_name: str, counter: SectionCounter) -> _Worker | None:
        """Start a worker for the named encoding; None (counting stays here) when it cannot start."""
        # The folder that holds the longctx package: this file is longctx/packing/counting.py.
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        code = (
            f"import sys; sys.path.insert(0, {package_root!r}); "
            f"from longctx.packing.counting import serve; serve({encoding_name!r})"
        )
        if not sys.executable:
            return None
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True
            )
        except OSError as error:
            logger.debug("cannot start a counting worker: %s", error)
            return None
        assert process.stdin is not None
        if sys.platform == "linux":
            import fcntl  # POSIX only

            with contextlib.suppress(OSError):  # a smaller pipe only means more waiting
                fcntl.fcntl(process.stdin.fileno(), _F_SETPIPE_SZ, _PIPE_BYTES)
        logger.debug("counting worker %d started for %s", process.pid, encoding_name)
        return cls(process, counter)

    def wake(self) -> None:
        with self._wakeup:
            self._wakeup.notify()

    def _feed(self) -> None:
        # Texts go in batches, one write each: this thread needs the GIL
        # once per batch, not once per text, so the worker stays fed while
        # this process counts from the back and rarely lets the GIL go.
        stdin = self.process.stdin
        assert stdin is not None
        try:
            while True:
                indexes = self.counter._take_front(_BATCH_BYTES)
                if not indexes:
                    with self._wakeup:
                        if self._closing:
                            break
                        self._wakeup.wait(0.05)
                    continue
                parts: list[bytes] = []
                for index in indexes:
                    data = self.counter._utf8(index)
                    parts += (_HEADER.pack(len(data)), data)
                with self._sent_lock:
                    self._sent.extend(indexes)
                self._ever_sent = True
                stdin.write(b"".join(parts))
                stdin.flush()
        except (OSError, ValueError) as error:
            logger.debug("counting worker stopped taking texts: %s", error)
        finally:
            with contextlib.suppress(OSError):
                stdin.close()

    def _read(self) -> None:
        # Every answer already there is taken at once (one GIL hand-over
        # for many answers).
        stdout = self.process.stdout
        assert stdout is not None
        descriptor = stdout.fileno()
        pending = b""
        try:
            while chunk := os.read(descriptor, _ANSWERS_READ_BYTES):
                pending += chunk
                whole = len(pending) - len(pending) % _HEADER.size
                if not whole:
                    continue
                counts = [count for (count,) in _HEADER.iter_unpack(pending[:whole])]
                pending = pending[whole:]
                with self._sent_lock:
                    indexes = [self._sent.popleft() for _ in counts]
                for index, count in zip(indexes, counts, strict=True):
                    self.counter._record(index, count)
        except (OSError, IndexError) as error:
            logger.debug("counting worker answers stopped: %s", error)

    def stop_sending(self) -> list[int]:
        """Send no more texts; return those sent so far and not answered yet, in the order sent."""
        with self._wakeup:
            self._closing = True
            self._wakeup.notify()
        with self._sent_lock:
            return list(self._sent)

    def stop(self, *, wait: bool = True) -> None:
        """Stop the worker: let it answer for what it was sent, or with ``wait`` False end it now."""
        with self._wakeup:
            self._closing = True
            self._wakeup.notify()
        if self.process.poll() is None and (not wait or not self._ever_sent):
            # Its answers are not needed (or it was started early and never
            # sent a text, and may still be importing).
            self.process.kill()
        if not wait:
            self._feeder.join()
            self._reader.join()
        if self.process.poll() is None:
            if self.process.stdin is not None and not self._feeder.is_alive():
                with contextlib.suppress(OSError):
                    self.process.stdin.close()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def _read_exactly(stream: IO[bytes], size: int) -> bytes | None:
    """``size`` bytes from ``stream``, or None at its end."""
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def serve(encoding_name: str, source: IO[bytes] | None = None, sink: IO[bytes] | None = None) -> None:
    """The worker's loop: read texts from ``source`` (stdin), write their counts to ``sink`` (stdout).

    Counts with :meth:`TiktokenFileTokenizer.named` ``(encoding_name)``, so
    with the same engine as the process that started it.
    """
    source = source or sys.stdin.buffer
    sink = sink or sys.stdout.buffer
    tokenizer = TiktokenFileTokenizer.named(encoding_name)
    while True:
        header = _read_exactly(source, _HEADER.size)
        if header is None:
            break
        (length,) = _HEADER.unpack(header)
        data = _read_exactly(source, length) if length else b""
        if data is None:
            break
        sink.write(_HEADER.pack(tokenizer.count(data.decode("utf-8", "surrogatepass"))))
        sink.flush()


def count_texts(
    tokenizer: Tokenizer, texts: Sequence[str], digests: Sequence[str], store: Store | None
) -> list[int]:
    """Count ``texts`` (with their digests) through a :class:`SectionCounter`, in one call."""
    with SectionCounter(tokenizer, store) as counter:
        for text, digest in zip(texts, digests, strict=True):
            counter.add(text, digest)
        return counter.counts()
