"""The embedded SQLite store: sessions, turns, requests, packs, token counts.

One database file, ``longctx.db`` under the longctx home folder
(``$LONGCTX_HOME``, else the user data folder). Every write is one
transaction: a turn and the request that produced it are committed
together after the response arrived, so after a crash a session holds every
completed turn and no half turn.

Schema changes are migrations, applied in order and recorded in
``PRAGMA user_version``; a database written by a newer longctx is refused
rather than misread.

:class:`Store` is composed of parts, each with its own small interface,
sharing one connection (:mod:`longctx.store.db`):

- ``store.sessions`` (:class:`~longctx.store.sessions.SessionLog`): sessions,
  turns, requests, counter checks, answer keys, and the packs they were asked over;
  old ones pruned by :mod:`~longctx.store.pruning` (by age, count or size, never one in use);
- ``store.caches`` (:class:`~longctx.store.caches.ContentCaches`): token counts,
  PDF texts, last-commit times, special tokens, pack snapshot rows;
- ``store.blobs`` (:class:`~longctx.store.blobs.SnapshotTexts`): the pack
  snapshot texts, files beside the database, mapped when read;
- ``store.leases`` (:class:`~longctx.store.leases.ItemLeases`): the job items
  runs are asking now, one owner each;
- ``store.database`` (:class:`~longctx.store.db.Database`): the connection
  the parts share (transactions, migrations).

Every failure of the database (a full disk, a read-only, locked or damaged
file) is one :class:`~longctx.errors.StoreError` naming the file and what to
do (:mod:`longctx.store.failures`).

Only the user may read the store: :mod:`longctx.store.permissions` creates
its folders ``0700`` and its files ``0600``, and warns (one line, with the
``chmod`` that fixes it) about an existing store that is looser.

The values the parts return are in :mod:`longctx.store.records`. The store
knows no source type: what it keeps for the sources is plain data.
"""

from __future__ import annotations

import os
from pathlib import Path

from longctx.options.groups import default_home
from longctx.store.blobs import SnapshotTexts, StoredText
from longctx.store.caches import ContentCaches
from longctx.store.db import DATABASE_NAME, Database
from longctx.store.leases import ItemLeases, LeaseClaim, LeaseHolder
from longctx.store.pruning import PrunedTree, PruneResult, PruneRule
from longctx.store.records import (
    CounterCheckRecord,
    CounterSkip,
    Opening,
    RequestRecord,
    SessionRecord,
    StoredImage,
    StoredPack,
    StoredPackIds,
    StoredPackSnapshot,
    TurnRecord,
)
from longctx.store.sessions import SessionLog

__all__ = [
    "DATABASE_NAME",
    "ContentCaches",
    "CounterCheckRecord",
    "CounterSkip",
    "Database",
    "ItemLeases",
    "LeaseClaim",
    "LeaseHolder",
    "Opening",
    "PruneResult",
    "PruneRule",
    "PrunedTree",
    "RequestRecord",
    "SessionLog",
    "SessionRecord",
    "SnapshotTexts",
    "Store",
    "StoredImage",
    "StoredPack",
    "StoredPackIds",
    "StoredPackSnapshot",
    "StoredText",
    "TurnRecord",
    "default_home",
]


class Store:
    """The longctx database and the files beside it, as parts sharing one connection; thread-safe.

    ``Store(path)`` names the database file ``path`` and does no I/O: the
    database is opened (created if needed) on first use. Whoever opens a
    store closes it, or uses it as a context manager. What it keeps is in
    its parts: :attr:`sessions`, :attr:`caches`, :attr:`blobs`, :attr:`leases` (see the
    module's docstring), all over :attr:`database`.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        # A str is as good as a Path: it names the file; anything else fails here, not at first use.
        path = Path(path)
        self.database = Database(path)
        """The one connection the parts share (transactions, schema versions)."""
        self.blobs = SnapshotTexts(path.parent / "pack-snapshots")
        """The pack snapshot texts: files beside the database, mapped when read."""
        self.caches = ContentCaches(self.database, self.blobs)
        """Token counts, PDF texts, last-commit times, special tokens, pack snapshot rows."""
        self.sessions = SessionLog(self.database)
        """Sessions, turns, requests, counter checks, answer keys, and the packs they were asked over."""
        self.leases = ItemLeases(self.database)
        """The job items runs are asking now: one owner each."""

    @property
    def path(self) -> Path:
        """The database file."""
        return self.database.path

    @classmethod
    def open(cls, home: str | os.PathLike[str] | None = None) -> Store:
        """Open (creating if needed) the database in the folder ``home`` or :func:`default_home`, now.

        ``Store(path)`` does no I/O and opens the database on first use;
        this opens it at once, so a database that cannot be used is reported
        here (:class:`~longctx.errors.StoreError`).
        """
        store = cls((default_home() if home is None else Path(home)) / DATABASE_NAME)
        store.connect()
        return store

    def connect(self) -> None:
        """Open the database now (creating it and updating its schema) rather than on first use."""
        self.database.connect()

    def close(self) -> None:
        """Close the connection; closing it again does nothing."""
        self.database.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
