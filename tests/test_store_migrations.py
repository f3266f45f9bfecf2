"""A database left by an earlier longctx is upgraded in place; one from a later longctx is refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from longctx.errors import StoreError
from longctx.store import DATABASE_NAME, Store
from longctx.store.db import MIGRATIONS

# The schema of the release before pack snapshots kept their manifest apart.
_EARLIER_VERSION = 2


def _earlier_database(home: Path) -> Path:
    home.mkdir()
    path = home / DATABASE_NAME
    connection = sqlite3.connect(path)
    for number, script in enumerate(MIGRATIONS[:_EARLIER_VERSION], start=1):
        connection.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {number};\nCOMMIT;")
    connection.execute(
        "INSERT INTO token_counts (tokenizer, content_sha256, tokens) VALUES (?, ?, ?)", ("t", "a" * 64, 7)
    )
    # A snapshot as that release saved it: the manifest inside the summary.
    (home / "pack-snapshots").mkdir()
    (home / "pack-snapshots" / "old.txt").write_text("header")
    connection.execute(
        "INSERT INTO pack_snapshots (slot, state, fingerprint, summary_json, section_sizes_json, text_file,"
        " created_at) VALUES ('slot', 'state', 'f', '{\"manifest\": {}}', '[6]', 'old.txt', 0)"
    )
    connection.commit()
    connection.close()
    return path


def test_an_earlier_database_is_upgraded_and_keeps_its_counts(tmp_path: Path) -> None:
    path = _earlier_database(tmp_path / "home")

    with Store.open(tmp_path / "home") as store:
        assert store.token_counts("t", ["a" * 64]) == {"a" * 64: 7}
        # The old snapshot has no manifest of its own: it is not read back (the pack is rebuilt).
        assert store.pack_snapshot("slot", "state") is None
        store.save_commit_times("key", {"a.py": 1})
        assert store.commit_times("key") == {"a.py": 1}
        assert store._query("SELECT COUNT(*) AS n FROM pdf_texts")[0]["n"] == 0

    version = sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0]
    assert version == len(MIGRATIONS)


def test_a_database_of_version_5_gains_the_special_tokens_table_and_keeps_its_data(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    path = home / DATABASE_NAME
    connection = sqlite3.connect(path)
    for number, script in enumerate(MIGRATIONS[:5], start=1):
        connection.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {number};\nCOMMIT;")
    connection.execute("INSERT INTO commit_times (key, times_json, created_at) VALUES ('k', '{\"a\": 1}', 0)")
    connection.commit()
    connection.close()

    with Store.open(home) as store:
        assert store.commit_times("k") == {"a": 1}
        assert store.special_tokens("server:vllm:tiny:0") is None
        store.save_special_tokens("server:vllm:tiny:0", ["<|im_end|>"])
        assert store.special_tokens("server:vllm:tiny:0") == ("<|im_end|>",)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 6 == len(MIGRATIONS)


def test_a_database_from_a_later_longctx_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    connection = sqlite3.connect(home / DATABASE_NAME)
    connection.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    connection.commit()
    connection.close()

    with pytest.raises(StoreError, match="newer than this longctx understands"):
        Store.open(home)
