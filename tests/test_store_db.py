"""The store's database (longctx.store.db): transactions all or nothing, failures named, the schema
brought up to date once or not at all."""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import longctx.store.db
from longctx.errors import StoreError
from longctx.store.db import DATABASE_NAME, MIGRATIONS, Database, _roll_back, _statements


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    opened = Database(tmp_path / "home" / DATABASE_NAME)
    yield opened
    opened.close()


def test_a_new_database_is_private_in_wal_mode_with_every_migration_and_foreign_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "deep" / "home" / DATABASE_NAME
    database = Database(path)
    assert not path.parent.exists()  # constructing does no I/O
    with caplog.at_level(logging.WARNING, logger="longctx.store"):
        database.connect()
        database.connect()  # opening again does nothing
    try:
        assert (
            stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        )
        assert database.query("PRAGMA journal_mode")[0][0] == "wal"
        assert database.query("PRAGMA synchronous")[0][0] == 1  # NORMAL
        assert database.query("PRAGMA foreign_keys")[0][0] == 1
        assert database.query("PRAGMA user_version")[0][0] == len(MIGRATIONS)
        row = database.query("SELECT 1 AS one")[0]
        assert row["one"] == 1 and row[0] == 1  # rows by name and by position
        assert not caplog.records
    finally:
        database.close()


def test_an_existing_looser_store_is_warned_about_when_opened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "home"
    Database(home / DATABASE_NAME).connect()
    os.chmod(home, 0o755)
    database = Database(home / DATABASE_NAME)
    with caplog.at_level(logging.WARNING, logger="longctx.store"):
        database.connect()
    database.close()
    assert [record.getMessage().split(" (")[0] for record in caplog.records] == [
        f"the longctx store {home} can be read by other users"
    ]


def test_a_transaction_is_all_or_nothing_and_its_errors_keep_their_kind(database: Database) -> None:
    with database.transaction() as connection:
        connection.execute("INSERT INTO commit_times (key, times_json, created_at) VALUES ('a', '{}', 1)")
    with pytest.raises(ValueError, match="the caller's"), database.transaction() as connection:
        connection.execute("INSERT INTO commit_times (key, times_json, created_at) VALUES ('b', '{}', 1)")
        raise ValueError("the caller's own error")
    with pytest.raises(sqlite3.IntegrityError), database.transaction() as connection:
        connection.execute("INSERT INTO commit_times (key, times_json, created_at) VALUES ('c', '{}', 1)")
        connection.execute("INSERT INTO commit_times (key, times_json, created_at) VALUES ('a', '{}', 1)")
    writing = f"writing to the longctx store {database.path} failed"
    with pytest.raises(StoreError, match=writing), database.transaction() as connection:
        connection.execute("INSERT INTO commit_times (key, times_json, created_at) VALUES ('d', '{}', 1)")
        connection.execute("INSERT INTO no_such_table VALUES (1)")
    assert [row["key"] for row in database.query("SELECT key FROM commit_times")] == ["a"]
    with database.transaction() as connection:  # the connection is usable after each failure
        connection.execute("INSERT INTO commit_times (key, times_json, created_at) VALUES ('e', '{}', 1)")
    assert len(database.query("SELECT key FROM commit_times")) == 2


def test_a_failed_read_or_compaction_names_the_file(database: Database) -> None:
    with pytest.raises(StoreError, match=f"reading the longctx store {database.path} failed"):
        database.query("SELECT * FROM no_such_table")
    compacting = (
        f"compacting the longctx store {database.path} failed: cannot VACUUM from within a transaction"
    )
    with pytest.raises(StoreError, match=compacting), database.transaction():
        database.vacuum()  # VACUUM cannot run inside a transaction
    database.vacuum()
    wal = database.path.with_name(DATABASE_NAME + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0  # the checkpoint emptied the log


def test_a_closed_database_refuses_to_open_and_closing_again_does_nothing(database: Database) -> None:
    database.query("SELECT 1")
    database.close()
    database.close()
    with pytest.raises(StoreError, match="is closed"):
        database.query("SELECT 1")
    never = Database(database.path.with_name("never.db"))
    never.close()
    with pytest.raises(StoreError, match="is closed"):
        never.connect()
    assert not database.path.with_name("never.db").exists()


def test_a_store_that_cannot_be_created_is_a_store_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "home").write_text("a file where the folder goes")
    path = tmp_path / "home" / DATABASE_NAME
    with pytest.raises(StoreError, match=f"opening the longctx store {path} failed: .*Not a directory"):
        Database(path).connect()


def test_a_file_that_is_no_database_is_refused_when_opened_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "home" / DATABASE_NAME
    path.parent.mkdir()
    path.write_bytes(b"not a database" * 500)
    with pytest.raises(StoreError) as caught:
        Database(path).connect()
    assert str(caught.value).startswith(f"opening the longctx store {path} failed: the file is damaged")


def test_the_connection_is_shared_between_threads_and_waits_out_a_lock_only_as_long_as_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(longctx.store.db, "LOCK_WAIT_SECONDS", 0.2)
    database = Database(tmp_path / "home" / DATABASE_NAME)
    try:
        database.connect()
        found: list[object] = []
        reader = threading.Thread(target=lambda: found.append(database.query("SELECT 1")[0][0]))
        reader.start()
        reader.join()
        assert found == [1]
        holder = sqlite3.connect(database.path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        try:
            with pytest.raises(StoreError, match="write lock"), database.transaction() as connection:
                connection.execute(
                    "INSERT INTO commit_times (key, times_json, created_at) VALUES ('a', '{}', 1)"
                )
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert time.monotonic() - started < 2.0  # the 0.2 s asked for, not SQLite's default 5 s
    finally:
        database.close()


def test_a_migration_that_fails_leaves_the_schema_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "home" / DATABASE_NAME
    Database(path).connect()
    broken = (*MIGRATIONS, "CREATE TABLE added (x INTEGER);\nINSERT INTO nowhere VALUES (1);")
    monkeypatch.setattr(longctx.store.db, "MIGRATIONS", broken)
    with pytest.raises(
        StoreError, match=f"migrating to schema {len(broken)} .* failed: no such table: nowhere"
    ):
        Database(path).connect()
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert (
            connection.execute("SELECT count(*) FROM sqlite_master WHERE name = 'added'").fetchone()[0] == 0
        )
    finally:
        connection.close()
    fixed = (*MIGRATIONS, "CREATE TABLE added (x INTEGER);\nINSERT INTO added VALUES (1);")
    monkeypatch.setattr(longctx.store.db, "MIGRATIONS", fixed)
    database = Database(path)
    try:
        assert database.query("SELECT x FROM added")[0][0] == 1
        assert database.query("PRAGMA user_version")[0][0] == len(fixed)
    finally:
        database.close()


def test_a_migration_interrupted_is_rolled_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "home" / DATABASE_NAME
    Database(path).connect()
    real = longctx.store.db._statements

    def interrupted(script: str) -> Iterator[str]:
        yield from real(script)
        raise KeyboardInterrupt

    monkeypatch.setattr(longctx.store.db, "MIGRATIONS", (*MIGRATIONS, "CREATE TABLE added (x INTEGER);"))
    monkeypatch.setattr(longctx.store.db, "_statements", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Database(path).connect()
    monkeypatch.undo()
    database = Database(path)
    try:
        assert database.query("PRAGMA user_version")[0][0] == len(MIGRATIONS)
        assert database.query("SELECT count(*) FROM sqlite_master WHERE name = 'added'")[0][0] == 0
    finally:
        database.close()


def test_a_fresh_store_held_by_another_opener_waits_for_wal_then_gives_up_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "home" / DATABASE_NAME
    path.parent.mkdir()
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    monkeypatch.setattr(longctx.store.db, "_WAL_SWITCH_SECONDS", 0.3)
    monkeypatch.setattr(longctx.store.db, "LOCK_WAIT_SECONDS", 0.05)
    try:
        started = time.monotonic()
        with pytest.raises(StoreError, match=f"cannot switch {path} to WAL mode: database is locked"):
            Database(path).connect()
        assert 0.3 <= time.monotonic() - started < 0.9  # tried again and again until the deadline
        # Let go meanwhile: the opener that waits gets through.
        threading.Timer(0.1, holder.execute, args=("ROLLBACK",)).start()
        database = Database(path)
        database.connect()
    finally:
        time.sleep(0.15)
        holder.close()
    try:
        assert database.query("PRAGMA journal_mode")[0][0] == "wal"
    finally:
        database.close()


def test_a_migration_script_is_split_into_its_statements() -> None:
    script = """
    CREATE TABLE a (x TEXT DEFAULT ';');
    -- a comment; with a semicolon
    CREATE TABLE b (y);

    ALTER TABLE b ADD COLUMN z"""
    assert list(_statements(script)) == [
        "CREATE TABLE a (x TEXT DEFAULT ';');",
        "-- a comment; with a semicolon\n    CREATE TABLE b (y);",
        "ALTER TABLE b ADD COLUMN z",
    ]
    assert list(_statements("\n  \n")) == []


def test_a_rollback_that_fails_is_left_to_sqlite_and_none_is_tried_outside_a_transaction() -> None:
    class Gone:
        """A connection whose disk went away mid-transaction."""

        def __init__(self, in_transaction: bool) -> None:
            self.in_transaction = in_transaction
            self.executed: list[str] = []

        def execute(self, sql: str) -> None:
            self.executed.append(sql)
            raise sqlite3.OperationalError("disk I/O error")

    failing = Gone(in_transaction=True)
    _roll_back(failing)  # type: ignore[arg-type]  # no error: the journal undoes it when the file opens next
    assert failing.executed == ["ROLLBACK"]
    idle = Gone(in_transaction=False)
    _roll_back(idle)  # type: ignore[arg-type]
    assert idle.executed == []


def test_a_schema_update_blocked_by_another_writer_past_the_wait_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "home" / DATABASE_NAME
    Database(path).connect()
    older = sqlite3.connect(path)
    older.execute(f"PRAGMA user_version = {len(MIGRATIONS) - 1}")  # one migration behind
    older.commit()
    older.close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    monkeypatch.setattr(longctx.store.db, "LOCK_WAIT_SECONDS", 0.05)
    try:
        with pytest.raises(StoreError) as caught:
            Database(path).connect()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    message = str(caught.value)
    assert message.startswith(
        f"locking to update the schema of the longctx store {path} failed: another process"
    )
    assert "write lock" in message
