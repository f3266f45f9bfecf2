"""The store's lifecycle: :class:`Store`, the database file and its parts over one connection.

``Store(path)`` does no I/O; it opens on first use, and whoever opens it
closes it. Its parts are :mod:`longctx.store.sessions`,
:mod:`longctx.store.caches`, :mod:`longctx.store.blobs` and
:mod:`longctx.store.leases`, sharing :mod:`longctx.store.db`'s connection.
"""

from __future__ import annotations

import os
from pathlib import Path

from longctx.options.groups import default_home
from longctx.store.blobs import SnapshotTexts
from longctx.store.caches import ContentCaches
from longctx.store.db import DATABASE_NAME, Database
from longctx.store.leases import ItemLeases
from longctx.store.sessions import SessionLog

__all__ = ["Store"]


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
