"""Sessions: every way of asking questions over a pack, behind one interface.

- :mod:`~longctx.sessions.session`: :class:`Conversation` (the interface),
  :class:`Session` (a conversation over a pack);
- :mod:`~longctx.sessions.answers`: what questions return, :class:`Answer`, :class:`Batch`;
- :mod:`~longctx.sessions.recording`: when a session reaches the store (with its first turn);
- :mod:`~longctx.sessions.siblings`: how sibling questions go out;
- :mod:`~longctx.sessions.corpus`: :class:`RepoSession` and :class:`DocSession`,
  sessions over the pack of paths;
- :mod:`~longctx.sessions.sharded`: :class:`ShardedSession`, map-reduce over
  the shards of a corpus larger than the window.
"""

from __future__ import annotations

from longctx.backends.base import Backend
from longctx.sessions.answers import Answer, Batch
from longctx.sessions.corpus import CorpusSession, DocSession, RepoSession
from longctx.sessions.resources import Resources
from longctx.sessions.session import Conversation, Session
from longctx.sessions.sharded import KIND as SHARDED_KIND
from longctx.sessions.sharded import ShardedSession
from longctx.store import Store

__all__ = [
    "Answer",
    "Batch",
    "Conversation",
    "CorpusSession",
    "DocSession",
    "RepoSession",
    "Session",
    "ShardedSession",
    "resume",
]


def resume(session_id: str, backend: Backend | None = None, *, store: Store | None = None) -> Conversation:
    """The stored session ``session_id``, sharded or not, with every committed turn.

    Raises :class:`~longctx.errors.SessionNotFound` for an unknown id.
    """
    # One store for the lookup and the session: the one given, else the default one, owned by the session.
    with Resources.for_resume(backend, store) as resources:
        record = resources.store.sessions.session(session_id)
        resumed = ShardedSession if record.kind == SHARDED_KIND else Session
        return resumed.restore(record, resources)
