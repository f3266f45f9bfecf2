"""Resuming a stored session of any kind by its id.

:func:`resume` reads the session's record and restores it as the kind it
was stored as (:class:`~longctx.sessions.sharded.ShardedSession` or
:class:`~longctx.sessions.session.Session` and its corpus kinds).
"""

from __future__ import annotations

from longctx.backends.base import Backend
from longctx.sessions.conversation import Conversation
from longctx.sessions.resources import Resources
from longctx.sessions.session import Session
from longctx.sessions.sharded import KIND as SHARDED_KIND
from longctx.sessions.sharded import ShardedSession
from longctx.store import Store

__all__ = ["resume"]


def resume(session_id: str, backend: Backend | None = None, *, store: Store | None = None) -> Conversation:
    """The stored session ``session_id``, sharded or not, with every committed turn.

    Raises :class:`~longctx.errors.SessionNotFound` for an unknown id.
    """
    # One store for the lookup and the session: the one given, else the default one, owned by the session.
    with Resources.for_resume(backend, store) as resources:
        record = resources.store.sessions.session(session_id)
        resumed = ShardedSession if record.kind == SHARDED_KIND else Session
        return resumed.restore(record, resources)
