"""The embedded SQLite store: sessions, turns, requests, packs, token counts.

One database file, ``longctx.db`` under the longctx home folder
(``$LONGCTX_HOME``, else the user data folder). Every write is one
transaction: a turn and the request that produced it are committed
together after the response arrived, so after a crash a session holds every
completed turn and no half turn.

Schema changes are migrations, applied in order and recorded in
``PRAGMA user_version``; a database written by a newer longctx is refused
rather than misread.

:class:`Store` is one connection (:mod:`longctx.store.db`) with the reads
and writes of each concern over it: the content caches
(:mod:`longctx.store.caches`) and sessions (:mod:`longctx.store.sessions`).
The values it returns are in :mod:`longctx.store.records`; the files beside
the database in :mod:`longctx.store.blobs`. The store knows no source type:
what it keeps for the sources is plain data.
"""

from __future__ import annotations

from pathlib import Path

from longctx.config import default_home
from longctx.store.blobs import StoredText
from longctx.store.caches import ContentCaches
from longctx.store.db import DATABASE_NAME
from longctx.store.records import (
    CounterCheckRecord,
    Opening,
    RequestRecord,
    SessionRecord,
    StoredPack,
    StoredPackSnapshot,
    TurnRecord,
)
from longctx.store.sessions import SessionLog

__all__ = [
    "DATABASE_NAME",
    "CounterCheckRecord",
    "Opening",
    "RequestRecord",
    "SessionRecord",
    "Store",
    "StoredPack",
    "StoredPackSnapshot",
    "StoredText",
    "TurnRecord",
    "default_home",
]


class Store(ContentCaches, SessionLog):
    """A connection to the longctx database; safe to share between threads.

    ``Store(path)`` opens (creating if needed) the database file ``path``;
    whoever opens a store closes it, or uses it as a context manager.
    """

    @classmethod
    def open(cls, home: Path | None = None) -> Store:
        """Open (creating if needed) the database in ``home`` or :func:`default_home`, now.

        ``Store(path)`` does no I/O and opens the database on first use;
        this opens it at once, so a database that cannot be used is reported
        here (:class:`~longctx.errors.StoreError`).
        """
        store = cls((home or default_home()) / DATABASE_NAME)
        store.connect()
        return store

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
