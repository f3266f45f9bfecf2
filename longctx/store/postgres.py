"""The store on a PostgreSQL server, shared by many client machines: one connection, through psycopg 3.

:class:`PostgresDatabase` is :class:`~longctx.store.db.Database`'s twin for
a ``postgresql://`` store (:mod:`longctx.options.store_location`): the parts run
the same SQL on either (translated in :mod:`longctx.store.dialect`), and the
migrations are the same list with the same numbering, recorded in the
table ``longctx_schema``; a database written by a newer longctx is refused.
psycopg is imported here and nowhere else.

What differs, and why:

- every write is one server transaction; a client killed or cut off in the
  middle of one leaves nothing of it (the server rolls it back);
- the clock of leases is the server's (:meth:`clock`), so clients whose
  clocks differ agree on when a lease lapses; and a lease is never given up
  because a process of the same name is not running here: on a shared
  store the holder may be another machine (:attr:`local` is False);
- writes that must not interleave across clients (taking leases, storing a
  leased item's answer) take one advisory lock for their transaction
  (:meth:`serialize`), as SQLite's one writer does on one host;
- a failure of the server (down, restarting, unreachable, a password
  refused) is one :class:`~longctx.errors.StoreError` naming the store by
  its URL without the password; the next use connects again, so a run
  started again once the server is back goes on from what was committed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import psycopg
from psycopg import errors as pg_errors

from longctx.errors import StoreError
from longctx.options.store_location import redacted_url, url_secrets
from longctx.store.dialect import postgres_migration, postgres_statement

__all__ = ["SCHEMA_TABLE", "PostgresDatabase"]

SCHEMA_TABLE: Final = "longctx_schema"
"""The table holding the schema version (SQLite's ``PRAGMA user_version``)."""

# Advisory lock keys (any two 64-bit numbers no other application of the database uses).
_SCHEMA_LOCK: Final = 0x6C6F6E67637478_01
_LEASE_LOCK: Final = 0x6C6F6E67637478_02
_CONNECT_SECONDS: Final = 10


class Row(dict[str, Any]):
    """A row by column name (a dict) and by position, as ``sqlite3.Row`` reads."""

    def __init__(self, names: Sequence[str], values: Sequence[Any]) -> None:
        super().__init__(zip(names, values, strict=True))
        self._values = tuple(values)

    def __getitem__(self, key: str | int) -> Any:
        return self._values[key] if isinstance(key, int) else dict.__getitem__(self, key)


def _rows(cursor: Any) -> Any:
    names = [column.name for column in cursor.description or ()]
    return lambda values: Row(names, values)


class _Connection:
    """A transaction's connection as the parts use SQLite's: ``execute`` and ``executemany`` of SQLite SQL."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self._connection = connection

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Any:
        return self._connection.execute(postgres_statement(sql), list(parameters))

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> Any:
        cursor = self._connection.cursor()
        cursor.executemany(postgres_statement(sql), [list(row) for row in rows])
        return cursor


class PostgresDatabase:
    """One connection to a longctx database on a PostgreSQL server, shared between threads under one lock.

    ``url`` is a ``postgresql://`` URL; ``home`` the local folder that still
    holds what is this machine's own (pack snapshot texts, the chat
    history). Constructing one does no I/O; :meth:`connect` (or the first
    read or write) connects and brings the schema up to date.
    """

    local: Final = False
    conflicts: Final[tuple[type[BaseException], ...]] = (pg_errors.IntegrityError,)

    def __init__(self, url: str, home: Path) -> None:
        self._url = url
        self.location = redacted_url(url)
        """The store as messages name it: its URL without the password."""
        self.path = home / "longctx.db"
        """The local place beside which this machine keeps its own files (no database file is there)."""
        self._secrets = url_secrets(url)
        self._lock = threading.RLock()
        self._opened: psycopg.Connection[Any] | None = None
        self._closed = False

    def connect(self) -> None:
        """Connect now (and update the schema) rather than on first use; a connection lost is made again."""
        with self._lock:
            if self._closed:
                raise StoreError(f"the longctx store {self.location} is closed")
            if self._opened is not None and not self._opened.closed and not self._opened.broken:
                return
            self._forget()
            try:
                connection = psycopg.connect(
                    self._url, autocommit=True, connect_timeout=_CONNECT_SECONDS, application_name="longctx"
                )
            except psycopg.Error as error:
                raise self._failure(error, "connecting to") from error
            connection.row_factory = _rows
            try:
                _migrate(connection, self.location)
            except BaseException as error:
                connection.close()
                if isinstance(error, psycopg.Error):
                    raise self._failure(error, "migrating") from error
                raise
            self._opened = connection

    def close(self) -> None:
        """Close the connection; closing it again does nothing."""
        with self._lock:
            self._closed = True
            self._forget()

    def _forget(self) -> None:
        if self._opened is not None:
            self._opened.close()
            self._opened = None

    @property
    def _connection(self) -> psycopg.Connection[Any]:
        self.connect()
        assert self._opened is not None
        return self._opened

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """One atomic unit of writes: all of it is committed, or none (the server rolls back the rest).

        A failure of the server is a :class:`StoreError` naming the store;
        a broken constraint (:attr:`conflicts`) is the caller's to explain.
        """
        with self._lock:
            try:
                with self._begun() as connection:
                    yield _Connection(connection)
            except psycopg.Error as error:
                if isinstance(error, self.conflicts):
                    raise
                raise self._failure(error, "writing to") from error

    @contextmanager
    def _begun(self) -> Iterator[psycopg.Connection[Any]]:
        """A transaction begun; a connection found dead at BEGIN (the server restarted) is made again, once.

        Nothing but BEGIN was sent on the dead one, so beginning again on a new one repeats nothing.
        """
        connection = self._connection
        transaction = connection.transaction()
        try:
            transaction.__enter__()
        except psycopg.OperationalError:
            if not (connection.closed or connection.broken):
                raise
            self._forget()
            connection = self._connection
            transaction = connection.transaction()
            transaction.__enter__()
        try:
            yield connection
        except BaseException as error:
            if not transaction.__exit__(type(error), error, error.__traceback__):
                raise
        else:
            transaction.__exit__(None, None, None)

    def query(self, sql: str, parameters: Sequence[Any] = ()) -> list[Row]:
        """The rows ``sql`` (SQLite's SQL) selects; a failure is a :class:`StoreError` naming the store."""
        with self._lock:
            for attempt in (1, 2):  # a read repeats safely: once more on a new connection if the old one died
                try:
                    return self._connection.execute(postgres_statement(sql), list(parameters)).fetchall()
                except psycopg.OperationalError as error:
                    if (
                        attempt == 2
                        or self._opened is None
                        or not (self._opened.closed or self._opened.broken)
                    ):
                        raise self._failure(error, "reading") from error
                    self._forget()
                except psycopg.Error as error:
                    raise self._failure(error, "reading") from error
            raise AssertionError("unreachable")

    def vacuum(self) -> None:
        """Let the server reuse the space of deleted rows (VACUUM of the store's tables; needs no lock)."""
        with self._lock:
            try:
                self._connection.execute("VACUUM")
            except psycopg.Error as error:
                raise self._failure(error, "compacting") from error

    def size_bytes(self) -> int:
        """What the store's tables (their indexes and large values included) take on the server."""
        rows = self.query(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint AS size FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind = 'r' AND n.nspname = current_schema()"
        )
        return int(rows[0]["size"])

    def clock(self, connection: Any) -> float:
        """The server's time now, in seconds since the epoch: every client's leases by one clock."""
        row = connection.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        return float(row[0])

    def serialize(self, connection: Any) -> None:
        """Make the transaction of ``connection`` wait for every other client's that calls this too."""
        connection.execute(f"SELECT pg_advisory_xact_lock({_LEASE_LOCK})")

    def _failure(self, error: psycopg.Error, doing: str) -> StoreError:
        """The :class:`StoreError` for ``error``: what failed, in words, and what to do; no password."""
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        for secret in self._secrets:
            text = text.replace(secret, "[redacted]")
        if isinstance(error, psycopg.OperationalError) and (
            self._opened is None or self._opened.closed or self._opened.broken
        ):
            self._forget()
            advice = (
                f"the database server cannot be reached or went away ({text}). Nothing of this write was "
                "kept and nothing stored is lost; longctx connects again on the next use, and a job run "
                "again once the server is back asks only what has no stored answer"
            )
        elif isinstance(error, pg_errors.InsufficientPrivilege):
            advice = f"the database role lacks a privilege the store needs ({text}); see docs/store.md"
        else:
            advice = text
        return StoreError(f"{doing} the longctx store {self.location} failed: {advice}")


def _migrate(connection: psycopg.Connection[Any], location: str) -> None:
    """Apply the migrations the database lacks, once, however many clients open it at once.

    The version is read and the migrations applied in one transaction under
    an advisory lock: every other opener waits, then finds them applied.
    """
    from longctx.store.db import MIGRATIONS, split_statements  # the one list, on both stores

    if _version(connection) == len(MIGRATIONS):
        return  # the common case: up to date, no lock taken
    with connection.transaction():
        connection.execute(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})")
        connection.execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} (version INTEGER NOT NULL)")
        version = _version(connection)
        if version is None:
            connection.execute(f"INSERT INTO {SCHEMA_TABLE} (version) VALUES (0)")
            version = 0
        if version > len(MIGRATIONS):
            raise StoreError(
                f"the database {location} has schema version {version}, newer than this "
                f"longctx understands ({len(MIGRATIONS)}); upgrade longctx"
            )
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            for statement in split_statements(script):
                connection.execute(postgres_migration(statement).replace("%%", "%"))
            connection.execute(f"UPDATE {SCHEMA_TABLE} SET version = {number}")


def _version(connection: psycopg.Connection[Any]) -> int | None:
    """The schema version recorded, or None before the first migration."""
    exists = connection.execute("SELECT to_regclass(%s) IS NOT NULL", [SCHEMA_TABLE]).fetchone()
    if not exists or not exists[0]:
        return None
    row = connection.execute(f"SELECT version FROM {SCHEMA_TABLE}").fetchone()
    return None if row is None else int(row[0])
