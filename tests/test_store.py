"""The store package: its surface, its closing, and that it knows no source type."""

from __future__ import annotations

import ast
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import longctx.store
from longctx.errors import StoreError
from longctx.store import Store, StoredPackIds

STORE_PACKAGE = Path(longctx.store.__file__).parent

EXPORTED = {
    "DATABASE_NAME",
    "ContentCaches",  # the parts of a Store: store.caches, store.sessions, store.blobs, store.database
    "CounterCheckRecord",
    "CounterSkip",  # why a call got no counter check, kept for the report of a resumed session
    "Database",
    "ItemLeases",  # store.leases: one owner per job item
    "LeaseClaim",
    "LeaseHolder",
    "SessionLog",
    "SnapshotTexts",
    "StoredImage",  # a stored pack's image as read back, its bytes checked (sessions/recording.py places it)
    "Opening",  # a new session with what it did before its first turn (sessions/recording.py)
    "PruneResult",  # store.sessions.prune: `longctx sessions prune`
    "PruneRule",
    "PrunedTree",
    "RequestRecord",
    "SessionRecord",
    "Store",
    "StoredPack",
    "StoredPackIds",
    "StoredPackSnapshot",
    "StoredText",
    "TurnRecord",
    "default_home",
}


def test_the_package_exports_what_store_py_exported() -> None:
    assert set(longctx.store.__all__) == EXPORTED
    for name in EXPORTED:
        assert getattr(longctx.store, name) is not None, name


def test_closing_twice_does_nothing_and_a_closed_store_refuses_reads(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "home")
    store.caches.save_token_counts("t", {"a" * 64: 3})
    store.close()
    store.close()
    with pytest.raises(StoreError):
        store.caches.token_counts("t", ["a" * 64])
    with Store.open(tmp_path / "home") as again:
        assert again.caches.token_counts("t", ["a" * 64]) == {"a" * 64: 3}
    again.close()


def test_a_refused_database_is_not_left_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    connection = sqlite3.connect(home / "longctx.db")
    connection.execute("PRAGMA user_version = 999")
    connection.commit()
    connection.close()
    opened: list[sqlite3.Connection] = []
    real_connect = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        opened.append(real_connect(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(sqlite3, "connect", connect)
    with pytest.raises(StoreError, match="newer than this longctx understands"):
        Store.open(home)
    assert len(opened) == 1
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        opened[0].execute("SELECT 1")


def _longctx_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name == "longctx" or name.startswith("longctx.")}


def test_the_store_imports_only_config_errors_usage_and_itself() -> None:
    # The store keeps plain data for the sources, tokenizers and snapshots: it imports none of them
    # (a request record carries its Usage, the one definition of the usage fields; which store a
    # setting names is an option's rule; its records are made as every longctx value class is).
    allowed = {
        "longctx.options.groups",
        "longctx.options.store_location",
        "longctx.errors",
        "longctx.usage",
        "longctx.recordtypes",
    }
    for module in sorted(STORE_PACKAGE.glob("*.py")):
        for name in _longctx_imports(module):
            assert name in allowed or name.startswith("longctx.store."), f"{module.name} imports {name}"


def test_constructing_a_store_does_no_io_and_open_opens(tmp_path: Path) -> None:
    path = tmp_path / "home" / "longctx.db"
    store = Store(path)
    assert not path.parent.exists()  # nothing made until the store is used
    assert store.sessions.sessions() == []
    assert path.exists()
    store.close()
    opened = Store.open(tmp_path / "other")
    assert (tmp_path / "other" / "longctx.db").exists()  # open() opens at once
    opened.close()


def test_a_store_takes_its_folder_as_a_string_and_refuses_other_types_at_once(tmp_path: Path) -> None:
    with Store.open(str(tmp_path / "text")) as store:  # a str names the folder as a Path does
        assert store.path == tmp_path / "text" / "longctx.db" and store.path.exists()
    assert Store(str(tmp_path / "x.db")).path == tmp_path / "x.db"
    with pytest.raises(TypeError):
        Store(42)  # type: ignore[arg-type]  # refused when made, not at first use


def test_a_closed_store_refuses_reads_and_writes_with_a_store_error(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "home")
    store.close()
    with pytest.raises(StoreError, match="is closed"):
        store.caches.save_pack_ids("tokenizer", "f" * 64, StoredPackIds((1, 2), (3,)))
    with pytest.raises(StoreError, match="is closed"):
        store.sessions.sessions()


def test_the_store_is_lifecycle_and_parts_over_one_connection(tmp_path: Path) -> None:
    from longctx.store import ContentCaches, Database, SessionLog, SnapshotTexts

    public = {name for name in dir(Store) if not name.startswith("_")}
    assert public == {"open", "connect", "close", "path", "location"}
    store = Store(tmp_path / "home" / "longctx.db")
    assert not (tmp_path / "home").exists()  # constructing does no I/O
    assert isinstance(store.sessions, SessionLog) and isinstance(store.caches, ContentCaches)
    assert isinstance(store.blobs, SnapshotTexts) and isinstance(store.database, Database)
    for part in (SessionLog, ContentCaches, SnapshotTexts, Database):
        assert part.__doc__ and len([n for n in dir(part) if not n.startswith("_")]) <= 16, part
    with store:
        store.caches.save_token_counts("tok", {"a" * 64: 3})
        store.sessions.sessions()
        # One connection: what one part writes, the database shows the others.
        assert store.database.query("SELECT tokens FROM token_counts")[0]["tokens"] == 3
