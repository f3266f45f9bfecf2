"""Sessions: conversations over a pack, behind one interface.

- :mod:`~longctx.sessions.conversation`: :class:`Conversation`, the interface every kind implements;
- :mod:`~longctx.sessions.session`: :class:`Session` (a conversation over a pack: turns, siblings, forks);
- :mod:`~longctx.sessions.arguments`: what questions take, checked at the call (``AskOptions``);
- :mod:`~longctx.sessions.answers`: what questions return, :class:`Answer`, :class:`Batch`;
- :mod:`~longctx.sessions.requests`: request building, a question's chat request over the pack and history;
- :mod:`~longctx.sessions.records`: record mapping, an answered request as the store's records and back;
- :mod:`~longctx.sessions.streams`: an answer as it arrives, :class:`AnswerStream`,
  :class:`AsyncAnswerStream` (what is kept of one stopped midway);
- :mod:`~longctx.sessions.recording`: when a session reaches the store (with its first turn);
- :mod:`~longctx.sessions.resources`: the backend and store a session uses, and which it owns;
- :mod:`~longctx.sessions.batches`: a session's sibling batches, each question a branch;
- :mod:`~longctx.sessions.siblings`: how sibling questions go out (the dispatch
  strategies), and a batch's answer keys;
- :mod:`~longctx.sessions.changes`: living sessions, files changed since the pack
  appended to the next user message;
- :mod:`~longctx.sessions.warm`: the warm start, the pack prefilled while the first
  question is typed;
- :mod:`~longctx.sessions.reuse`: how much of the previous answer a turn read from the cache;
- :mod:`~longctx.sessions.reporting`: what a session's report reads from the store besides its
  requests (the cold rate measured before it, the siblings' questions, why nothing was cached);
- :mod:`~longctx.sessions.prompt_ids`: prompts as the exact token ids the server would make
  of them (the pack's once per pack and tokenizer), or why a request went as text;
- :mod:`~longctx.sessions.token_history`: earlier answers sent back as the token ids
  the model generated;
- :mod:`~longctx.sessions.corpus_sessions`: :class:`RepoSession` and :class:`DocSession`,
  sessions over the pack of paths;
- :mod:`~longctx.sessions.resuming`: :func:`resume`, a stored session of any kind by its id;
- :mod:`~longctx.sessions.sharded`: :class:`ShardedSession`, map-reduce over
  the shards of a corpus larger than the window.

The counter checks and canaries a session runs are :mod:`longctx.verification`'s;
jobs over many packs, a layer above, are :mod:`longctx.jobs`.
"""

from __future__ import annotations

from longctx.sessions.answers import Answer, Batch
from longctx.sessions.arguments import checked_ask, checked_ask_many
from longctx.sessions.conversation import Conversation
from longctx.sessions.corpus_sessions import CorpusSession, CorpusSessionOptions, DocSession, RepoSession
from longctx.sessions.records import stored_answers
from longctx.sessions.resuming import resume
from longctx.sessions.reuse import answer_reuse
from longctx.sessions.session import Session
from longctx.sessions.sharded import ShardedSession
from longctx.sessions.siblings import batch_keys
from longctx.sessions.streams import AnswerStream, AsyncAnswerStream

__all__ = [
    "Answer",
    "AnswerStream",
    "AsyncAnswerStream",
    "Batch",
    "Conversation",
    "CorpusSession",
    "CorpusSessionOptions",
    "DocSession",
    "RepoSession",
    "Session",
    "ShardedSession",
    "answer_reuse",
    "batch_keys",
    "checked_ask",
    "checked_ask_many",
    "resume",
    "stored_answers",
]
