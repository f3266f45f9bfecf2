"""Questions over a corpus larger than the window: map over shards, then reduce.

Opt-in: :class:`ShardedSession` splits the corpus into shards that each fit
the window (:func:`longctx.packing.build_shards`), each a stable prefix of
its own. A question goes to every shard as a turn of that shard's own
session (map), so a follow-up question to the same shard reuses the shard's
cached prefix and history; then one request combines the shard answers
(reduce). The report shows the caching of each shard's requests.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from longctx.backends.base import Backend, connect
from longctx.corpus import load_corpus
from longctx.pack import Pack, ShardedPack
from longctx.session import DEFAULT_MAX_TOKENS, Answer, Session, pack_for_server
from longctx.config import CorpusOptions
from longctx.store import Store
from longctx.usage import SavingsReport, build_report

__all__ = ["REDUCE_SYSTEM", "MapReduceAnswer", "ShardedSession"]

REDUCE_SYSTEM = (
    "You combine partial answers. Each partial answer below was written from one part of a "
    "larger set of documents. Answer the question from all of them: keep what they agree on, "
    "say where they differ, and do not invent what none of them says."
)


@dataclass(frozen=True)
class MapReduceAnswer:
    """The combined answer and the per-shard answers it was made from."""

    answer: Answer
    shard_answers: tuple[Answer, ...]

    @property
    def text(self) -> str:
        return self.answer.text

    def __str__(self) -> str:
        return self.answer.text


class ShardedSession:
    """Sessions over every shard of an oversized corpus, and a reducer.

    Takes :class:`~longctx.session.RepoSession`'s arguments, plus
    ``sharded`` (shards already built, instead of loading ``paths``).
    Shards leave out the earlier copies of a layered pack, so
    ``max_stale_share`` only chooses the order of the documents.
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        backend: Backend | None = None,
        base_url: str | Sequence[str] | None = None,
        model: str | None = None,
        api_key: str | None = None,
        store: Store | None = None,
        corpus: CorpusOptions | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        reserved_question_tokens: int = 1024,
        sharded: ShardedPack | Pack | None = None,
        **options: Any,
    ) -> None:
        self.store = store or Store.open()
        self.backend = backend or connect(base_url, model=model, api_key=api_key)
        if sharded is None:
            corpus = load_corpus(
                paths,
                corpus,
                store=self.store,
            )
            sharded = pack_for_server(
                corpus,
                self.backend,
                store=self.store,
                max_tokens=max_tokens,
                reserved_question_tokens=reserved_question_tokens,
                shard=True,
            )
        shards = sharded.shards if isinstance(sharded, ShardedPack) else (sharded,)
        count = len(shards)
        self.shards: tuple[Session, ...] = tuple(
            Session(
                self.backend,
                shard,
                store=self.store,
                title=f"shard {index}/{count}",
                max_tokens=max_tokens,
                **options,
            )
            for index, shard in enumerate(shards, start=1)
        )
        self.reducer = Session(
            self.backend, None, store=self.store, title="reduce", max_tokens=max_tokens, **options
        )

    def ask(self, question: str, *, max_tokens: int | None = None) -> MapReduceAnswer:
        """Ask every shard (map), then combine their answers (reduce)."""
        count = len(self.shards)
        partial = tuple(
            shard.ask(question, max_tokens=max_tokens, purpose=f"map {index}/{count}")
            for index, shard in enumerate(self.shards, start=1)
        )
        if count == 1:
            return MapReduceAnswer(partial[0], partial)
        parts = "\n\n".join(
            f'<partial-answer part="{index}">\n{answer.text}\n</partial-answer>'
            for index, answer in enumerate(partial, start=1)
        )
        combined = self.reducer.fork(at=0).ask(
            f"{REDUCE_SYSTEM}\n\nQuestion: {question}\n\n{parts}", max_tokens=max_tokens, purpose="reduce"
        )
        return MapReduceAnswer(combined, partial)

    def report(self) -> SavingsReport:
        """Every map and reduce request, shard by shard."""
        ids: list[str] = []
        for session in (*self.shards, self.reducer):
            ids.append(session.id)
            ids.extend(session.branch_ids())
        records = self.store.requests(session_ids=ids)
        return build_report(records, title=f"map-reduce over {len(self.shards)} shards")
