"""The served model's own tokenizer, through the server's tokenize route.

It satisfies :class:`longctx.tokens.Tokenizer` like the offline tokenizers;
it lives here, with the HTTP it speaks, so that :mod:`longctx.tokens` needs
no server code.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final

from longctx.backends.engines import find_profile
from longctx.backends.http import HttpEndpoint
from longctx.backends.profiles import EngineProfile
from longctx.errors import BackendError, BudgetError, TokenizerError
from longctx.recordtypes import record_type

__all__ = ["CHUNK_CHARS", "COUNT_TIMEOUT_SECONDS", "CountWatch", "ServerTokenizer", "watched_counts"]

# A probe covering scripts, digits, whitespace runs and punctuation: two
# tokenizers that split it the same way are, for counting, the same.
_IDENTITY_PROBE: Final = (
    "def f(x):\n    return x  # ok\n\n\tTabs\u00a0and  spaces; 12345 67.8e-9 \u00e9\u00e8 \u00df\n"
    "\u4e2d\u6587\u5b57\u7b26 \u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4 "
    "\u0440\u0443\u0441\u0441\u043a\u0438\u0439 "
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \U0001f600\n<|im_end|> </s> [INST] ```python\n'll 're"
)
_BATCH_CHARS: Final = 1_000_000
_PARALLEL_REQUESTS: Final = 8

CHUNK_CHARS: Final = 256 * 1024
"""Longest text one count request carries; a longer one is counted in pieces cut after a newline.

About 64k tokens: a server tokenizes it in well under a second, so no count
request runs near :data:`COUNT_TIMEOUT_SECONDS`, and a request the client
gives up on leaves the server at most one piece of work (a 50 MB text in
one request kept vLLM busy for minutes after the client's timeout, and the
next request waited behind it). The pieces' counts are summed: exact but
for the tokens a cut splits, at most a token or two per piece.
"""

COUNT_TIMEOUT_SECONDS: Final = 60.0
"""Longest wait for one count request (a piece of at most :data:`CHUNK_CHARS`)."""


@record_type
class CountWatch:
    """What a long count reports and where it stops (:func:`watched_counts`).

    ``on_progress`` hears (characters counted, characters to count) after each
    piece; ``limit`` (tokens; None: none) stops the counting once the pieces
    counted already prove more: their counts less two a piece (what a cut
    may have split), a bound never above the true count, so a text that fits
    is never refused. ``budget`` describes the limit in the error, ``advice``
    what to do (the largest files, the flags); without it, the generic advice.
    """

    limit: int | None = None
    on_progress: Callable[[int, int], None] | None = None
    budget: str = ""
    advice: str = ""


_WATCH: ContextVar[CountWatch | None] = ContextVar("longctx_count_watch", default=None)


@contextmanager
def watched_counts(watch: CountWatch) -> Iterator[None]:
    """Within the block, a server tokenizer's counts in this context report to and stop at ``watch``."""
    token = _WATCH.set(watch)
    try:
        yield
    finally:
        _WATCH.reset(token)


class _CountStopped(Exception):
    """A piece not sent, after one that failed or where the count stopped: the caller never reads it."""


class _StopAt:
    """The first piece of a parallel count that failed or stopped it; the pieces after it are not sent."""

    def __init__(self, pieces: int) -> None:
        self._first = pieces
        self._lock = threading.Lock()

    def at(self, index: int) -> None:
        with self._lock:
            self._first = min(self._first, index)

    def passed(self, index: int) -> bool:
        return index > self._first


class _Tally:
    """The pieces counted so far of one ``count_many``, against the watch in effect."""

    def __init__(self, pieces: Sequence[str]) -> None:
        self.watch = _WATCH.get()
        self.total_chars = sum(len(piece) for piece in pieces)
        self.chars = self.tokens = self.pieces = 0

    def add(self, piece: str, count: int) -> None:
        if self.watch is None:
            return
        self.chars += len(piece)
        self.tokens += count
        self.pieces += 1
        if self.watch.on_progress is not None and self.total_chars > CHUNK_CHARS:
            self.watch.on_progress(self.chars, self.total_chars)
        least = self.tokens - 2 * self.pieces
        if self.watch.limit is not None and least > self.watch.limit:
            budget = self.watch.budget or f"{self.watch.limit:,}"
            raise BudgetError(
                f"the pack cannot fit: {self.chars:,} of its {self.total_chars:,} characters to count already"
                f" hold at least {least:,} tokens, over the budget of {budget};"
                " the rest was not tokenized. "
                + (
                    self.watch.advice
                    or "Exclude the largest files (--exclude, --max-file-bytes;"
                    " `longctx pack PATHS --json` lists them), or use a larger context."
                ),
                total_tokens=least,
                budget_tokens=self.watch.limit,
            )


class ServerTokenizer:
    """The served model's own tokenizer, through the tokenize route of the engine's profile.

    vLLM: ``POST {root}/tokenize``; SGLang: ``POST {root}/v1/tokenize``. Text
    is encoded without the special tokens a tokenizer adds by itself.
    ``count_many`` sends several texts per request where the route takes a
    list (SGLang) and parallel requests where it takes one text (vLLM).
    ``profile`` may be given by its registered name.

    ``identity`` (asked once, lazily) is engine, model name and a digest of
    the tokens of a fixed probe text, so two servers that serve different
    tokenizers under one name never share cached counts.
    """

    def __init__(self, endpoint: HttpEndpoint, profile: EngineProfile | str, model: str) -> None:
        found = find_profile(profile) if isinstance(profile, str) else profile
        if found is None or found.tokenize_path is None:
            name = profile if isinstance(profile, str) else profile.name
            raise TokenizerError(f"the engine {name!r} has no tokenize route known to longctx")
        self.endpoint = endpoint
        self.profile = found
        self.engine = found.name
        self.model = model
        self._path = found.tokenize_path
        self._identity: str | None = None

    @property
    def identity(self) -> str:
        if self._identity is None:
            digest = hashlib.sha256(json.dumps(self.encode(_IDENTITY_PROBE)).encode()).hexdigest()[:16]
            self._identity = f"server:{self.engine}:{self.model}:{digest}"
        return self._identity

    @property
    def estimated(self) -> bool:
        return False

    def _post(self, body: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        try:
            answer = self.endpoint.post_json(self._path, {"model": self.model, **body}, timeout=timeout)
        except BackendError as error:
            raise TokenizerError(f"the {self.engine} server could not tokenize: {error}") from error
        if not isinstance(answer, dict) or "tokens" not in answer:
            raise TokenizerError(
                f"the {self.engine} tokenize route answered without tokens: {str(answer)[:200]}"
            )
        return answer

    def encode(self, text: str) -> list[int]:
        """The server's token ids for ``text`` alone (no BOS/EOS added), in one request."""
        return [int(token) for token in self._tokens(text)]

    def count(self, text: str) -> int:
        return self.count_many([text])[0]

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """Each text's count; every request bounded (:data:`CHUNK_CHARS`, :data:`COUNT_TIMEOUT_SECONDS`)."""
        if not texts:
            return []
        pieces: list[str] = []
        owners: list[int] = []
        for index, text in enumerate(texts):
            for piece in _pieces(text):
                pieces.append(piece)
                owners.append(index)
        tally = _Tally(pieces)
        if self.profile.tokenize_batches:
            piece_counts = self._count_batched(pieces, tally)
        elif len(pieces) == 1:
            piece_counts = [self._count_one(pieces[0])]
        else:
            piece_counts = self._count_parallel(pieces, tally)
        counts = [0] * len(texts)
        for owner, count in zip(owners, piece_counts, strict=True):
            counts[owner] += count
        return counts

    def _tokens(self, prompt: str | list[str], timeout: float | None = None) -> list[Any]:
        """The tokenize route's ``tokens`` for ``prompt``, without the special tokens it would add."""
        tokens = self._post({"prompt": prompt, "add_special_tokens": False}, timeout=timeout)["tokens"]
        if not isinstance(tokens, list):
            raise TokenizerError(
                f"the {self.engine} tokenize route answered tokens that are no list: {tokens!r}"
            )
        return tokens

    def _count_one(self, text: str) -> int:
        return len(self._tokens(text, COUNT_TIMEOUT_SECONDS))

    def _count_parallel(self, pieces: Sequence[str], tally: _Tally) -> list[int]:
        # Nothing after a piece that failed (or where the count was stopped) is sent: the server is
        # not left tokenizing pieces whose answers nobody reads. The workers check it themselves, so
        # it holds however late the calling thread runs; pieces before it are still sent, so the
        # first error the caller meets, reading in order, is the real one.
        stop = _StopAt(len(pieces))

        def count(index: int, piece: str) -> int:
            if stop.passed(index):
                raise _CountStopped
            try:
                return self._count_one(piece)
            except BaseException:
                stop.at(index)
                raise

        with ThreadPoolExecutor(max_workers=_PARALLEL_REQUESTS) as pool:
            futures = [pool.submit(count, index, piece) for index, piece in enumerate(pieces)]
            counts: list[int] = []
            try:
                for piece, future in zip(pieces, futures, strict=True):
                    counts.append(future.result())
                    tally.add(piece, counts[-1])  # may stop the count: the pack cannot fit
                return counts
            except BaseException:
                stop.at(len(counts) - 1)  # the last piece read: none after it is needed
                for future in futures:
                    future.cancel()
                raise

    def _count_batched(self, texts: Sequence[str], tally: _Tally) -> list[int]:
        counts: list[int] = []
        batch: list[str] = []
        size = 0

        def send() -> None:
            counted = self._count_list(batch)
            counts.extend(counted)
            for text, count in zip(batch, counted, strict=True):
                tally.add(text, count)

        for text in texts:
            if batch and size + len(text) > _BATCH_CHARS:
                send()
                batch, size = [], 0
            batch.append(text)
            size += len(text)
        send()
        return counts

    def _count_list(self, texts: list[str]) -> list[int]:
        tokens = self._tokens(texts, COUNT_TIMEOUT_SECONDS)
        if len(tokens) != len(texts):
            raise TokenizerError(
                f"the {self.engine} tokenize route answered {len(tokens)} results for {len(texts)} texts"
            )
        return [len(ids) for ids in tokens]

    def special_spellings(self, candidates: Sequence[str]) -> tuple[str, ...]:
        """Those of ``candidates`` that this server reads as one special token, in their order.

        The servers have no route that lists a tokenizer's special tokens,
        so each candidate is tokenized: one that comes back as a single id
        is a token of its own (an added or special token; an ordinary
        vocabulary entry that long is rare, and breaking it is harmless).
        Llama 3's 256 reserved spellings are tried only when the first of
        them is special. Raises :class:`~longctx.errors.TokenizerError` when
        the server cannot tokenize.
        """

        def single(spellings: list[str]) -> list[str]:
            counts = self.count_many(spellings)
            return [spelling for spelling, count in zip(spellings, counts, strict=True) if count == 1]

        reserved = [spelling for spelling in candidates if spelling.startswith("<|reserved_special_token_")]
        found = single([spelling for spelling in candidates if spelling not in reserved[1:]])
        if reserved and reserved[0] in found:
            found += single(reserved[1:])
        order = {spelling: index for index, spelling in enumerate(candidates)}
        return tuple(sorted(found, key=order.__getitem__))

    def tokenize_messages(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """The token ids of ``messages`` through the server's chat template, as a chat request sends them."""
        body: dict[str, Any] = {"messages": [dict(message) for message in messages]}
        if self.profile.tokenize_generation_flag or not add_generation_prompt:
            body["add_generation_prompt"] = add_generation_prompt
        return [int(token) for token in self._post(body)["tokens"]]


def _pieces(text: str) -> list[str]:
    """``text`` cut into pieces of at most :data:`CHUNK_CHARS`, after a newline where one is near the end."""
    if len(text) <= CHUNK_CHARS:
        return [text]
    pieces: list[str] = []
    start = 0
    while start < len(text):
        stop = min(start + CHUNK_CHARS, len(text))
        if stop < len(text):
            cut = text.rfind("\n", start + CHUNK_CHARS // 2, stop)
            stop = cut + 1 if cut != -1 else stop
        pieces.append(text[start:stop])
        start = stop
    return pieces
