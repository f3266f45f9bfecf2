"""The store's lifecycle: :class:`Store`, the database file and its parts over one connection.

``Store(path)`` does no I/O; it opens on first use, and whoever opens it
closes it. Its parts are :mod:`longctx.store.sessions`,
:mod:`longctx.store.caches`, :mod:`longctx.store.blobs` and
:mod:`longctx.store.leases`, sharing :mod:`longctx.store.db`'s connection.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import cast

from longctx.errors import StoreError
from longctx.options.groups import configured_store, default_home
from longctx.options.store_location import checked_store
from longctx.store.blobs import SnapshotTexts
from longctx.store.caches import ContentCaches
from longctx.store.db import DATABASE_NAME, Database
from longctx.store.leases import ItemLeases
from longctx.store.sessions import SessionLog

__all__ = ["Store"]


class Store:
    """The longctx database and the files beside it, as parts sharing one connection; thread-safe.

    ``Store(path)`` names the database file ``path`` and does no I/O: the
    database is opened (created if needed) on first use. ``database_url``
    (a ``postgresql://`` URL) puts the database on that server instead;
    ``path``'s folder still holds this machine's own files. Whoever opens a
    store closes it, or uses it as a context manager. What it keeps is in
    its parts: :attr:`sessions`, :attr:`caches`, :attr:`blobs`, :attr:`leases` (see the
    module's docstring), all over :attr:`database`.
    """

    def __init__(self, path: str | os.PathLike[str], *, database_url: str | None = None) -> None:
        # A str is as good as a Path: it names the file; anything else fails here, not at first use.
        path = Path(path)
        self.database = (
            Database(path) if database_url is None else _server_database(database_url, path.parent)
        )
        """The one connection the parts share (transactions, schema versions)."""
        self.blobs = SnapshotTexts(path.parent / "pack-snapshots")
        """The pack snapshot texts: files beside the database, mapped when read."""
        self.caches = ContentCaches(self.database, self.blobs)
        """Token counts, PDF texts, last-commit times, special tokens, pack snapshot rows."""
        self.leases = ItemLeases(self.database)
        """The job items runs are asking now: one owner each."""
        self.sessions = SessionLog(self.database, check_key=self.leases.check_held)
        """Sessions, turns, requests, counter checks, answer keys, and the packs they were asked over."""

    @property
    def path(self) -> Path:
        """The database file (on a server's store: the place in the home folder its own files are beside)."""
        return self.database.path

    @property
    def location(self) -> str:
        """The store as messages name it: the database file, or the server's URL without its password."""
        return self.database.location

    @classmethod
    def open(cls, home: str | os.PathLike[str] | None = None, *, database_url: str | None = None) -> Store:
        """Open (creating if needed) the store, now: in the folder ``home`` or :func:`default_home`.

        The database is the server ``database_url`` names, else the one the
        ``store`` setting names (``LONGCTX_STORE``, ``.longctx.toml``: see
        :mod:`longctx.options.store_location`), else the file in ``home``.
        ``Store(path)`` does no I/O and opens the database on first use;
        this opens it at once, so a database that cannot be used is reported
        here (:class:`~longctx.errors.StoreError`).
        """
        url = checked_store(database_url) if database_url is not None else configured_store()
        store = cls((default_home() if home is None else Path(home)) / DATABASE_NAME, database_url=url)
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


def _server_database(url: str, home: Path) -> Database:
    """The database on the server ``url`` (psycopg is imported only for a store that needs it)."""
    try:
        from longctx.store.postgres import PostgresDatabase
    except ImportError as error:
        raise StoreError(
            "a PostgreSQL store needs psycopg 3: pip install 'longctx-sdk[postgresql]'"
        ) from error
    # The parts use either database through the same calls (transaction, query, clock, serialize).
    return cast(Database, PostgresDatabase(url, home))
