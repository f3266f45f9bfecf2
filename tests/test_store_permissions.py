"""Only the user may read the store: folder 0700, files 0600 (the WAL files and snapshot texts too)."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from corpus_fixtures import committed_repo

import longctx.store.permissions
from longctx.packing import pack
from longctx.store import Store
from longctx.store.permissions import (
    LooseEntry,
    create_private_file,
    make_private_folder,
    readable_by_others,
    warn_if_readable_by_others,
)

ENTRY_POINT = Path(sys.executable).parent / "longctx"
pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> object:
    """The common umask (0022), which makes files 0644 and folders 0755 unless the maker says otherwise."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_a_new_store_is_private_with_its_wal_files_and_snapshot_texts(
    tmp_path: Path, open_umask: object, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "data" / "longctx"
    repository = committed_repo(tmp_path / "repo", {"a.py": "print('a')\n" * 50, "b.md": "# b\n"})
    with caplog.at_level(logging.WARNING, logger="longctx.store"), Store.open(home) as store:
        # A repository's pack is kept as a snapshot text file beside the database.
        pack(repository, store=store)
        files = sorted(path.name for path in home.iterdir())
        assert {"longctx.db", "longctx.db-wal", "longctx.db-shm", "pack-snapshots"} <= set(files), files
        assert mode(home) == 0o700
        for name in ("longctx.db", "longctx.db-wal", "longctx.db-shm"):
            assert mode(home / name) == 0o600, name
        snapshots = home / "pack-snapshots"
        assert mode(snapshots) == 0o700
        texts = list(snapshots.iterdir())
        assert texts and all(mode(text) == 0o600 for text in texts), [(t.name, oct(mode(t))) for t in texts]
    assert readable_by_others(home) == []
    assert not caplog.records, caplog.text
    # The folder above the store's is not the store's: it keeps the umask's mode.
    assert mode(home.parent) == 0o755


def test_an_existing_looser_store_gets_one_warning_with_the_fix_and_is_left_alone(
    tmp_path: Path, open_umask: object
) -> None:
    home = tmp_path / "home"
    Store.open(home).close()
    os.chmod(home, 0o755)
    os.chmod(home / "longctx.db", 0o644)
    # Through the CLI, as a user sees it: the warning on stderr, one line, with the command.
    environment = {key: value for key, value in os.environ.items() if not key.startswith("LONGCTX_")}
    listed = subprocess.run(
        [str(ENTRY_POINT), "sessions", "list"],
        capture_output=True,
        text=True,
        env={**environment, "LONGCTX_HOME": str(home)},
        check=False,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    warnings = [line for line in listed.stderr.splitlines() if "other users" in line]
    assert warnings == [
        f"the longctx store {home} can be read by other users (folder 755, longctx.db 644, "
        "longctx.db-shm 644, longctx.db-wal 644); "
        f"to fix: chmod -R go-rwx {home}"
    ], listed.stderr
    # SQLite made the -wal and -shm files with the database file's mode: the 644 above.
    # Not changed behind the user's back.
    assert mode(home) == 0o755 and mode(home / "longctx.db") == 0o644
    # The command it gives fixes it: no warning after.
    subprocess.run(["chmod", "-R", "go-rwx", str(home)], check=True)
    again = subprocess.run(
        [str(ENTRY_POINT), "sessions", "list"],
        capture_output=True,
        text=True,
        env={**environment, "LONGCTX_HOME": str(home)},
        check=False,
        timeout=120,
    )
    assert again.returncode == 0 and "other users" not in again.stderr, again.stderr
    assert readable_by_others(home) == []


def test_a_store_folder_deep_in_new_folders_is_made_private_and_its_parents_are_not(
    tmp_path: Path, open_umask: object
) -> None:
    home = tmp_path / "a" / "b" / "c" / "longctx"
    make_private_folder(home)
    assert mode(home) == 0o700
    assert [mode(folder) for folder in home.parents[:3]] == [0o755] * 3
    # An existing folder is left as it is.
    os.chmod(home, 0o750)
    make_private_folder(home)
    assert mode(home) == 0o750


def test_a_private_file_is_created_empty_and_an_existing_one_kept_unless_truncated(
    tmp_path: Path, open_umask: object
) -> None:
    path = tmp_path / "text.partial"
    create_private_file(path)
    assert mode(path) == 0o600 and path.read_bytes() == b""
    path.write_bytes(b"kept")
    os.chmod(path, 0o640)
    create_private_file(path)
    assert path.read_bytes() == b"kept" and mode(path) == 0o640
    create_private_file(path, truncate=True)
    assert path.read_bytes() == b"" and mode(path) == 0o640


def test_the_loose_entries_are_listed_with_their_modes_and_links_skipped(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    os.chmod(home, 0o700)
    for name, bits in [("b.db", 0o640), ("a.db", 0o600), ("c.txt", 0o604)]:
        (home / name).write_text(name)
        os.chmod(home / name, bits)
    (home / "link").symlink_to(home / "b.db")  # a link's own mode is 777 and means nothing
    assert readable_by_others(home) == [LooseEntry(home / "b.db", 0o640), LooseEntry(home / "c.txt", 0o604)]
    os.chmod(home, 0o711)
    assert readable_by_others(home)[0] == LooseEntry(home, 0o711)


def test_an_entry_that_vanishes_while_it_is_looked_at_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o700)
    (home / "z.db").write_text("z")
    os.chmod(home / "z.db", 0o644)
    listed = [home / "gone.db", home / "z.db"]  # gone.db removed between the listing and its lstat
    monkeypatch.setattr(longctx.store.permissions, "_entries", lambda folder: listed)
    assert readable_by_others(home) == [LooseEntry(home / "z.db", 0o644)]


def test_the_warning_names_four_entries_and_counts_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "my store"
    home.mkdir()
    os.chmod(home, 0o755)
    for number in range(4):
        (home / f"{number}.txt").write_text("x")
        os.chmod(home / f"{number}.txt", 0o644)

    def warned() -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="longctx.store"):
            assert warn_if_readable_by_others(home) is bool(readable_by_others(home))
        return [record.getMessage() for record in caplog.records]

    fix = f"to fix: chmod -R go-rwx '{home}'"
    assert warned() == [
        f"the longctx store {home} can be read by other users (folder 755, 0.txt 644, 1.txt 644, "
        f"2.txt 644 and 1 more); {fix}"
    ]
    os.chmod(home / "3.txt", 0o600)
    assert warned() == [
        f"the longctx store {home} can be read by other users (folder 755, 0.txt 644, 1.txt 644, "
        f"2.txt 644); {fix}"
    ]
    os.chmod(home, 0o700)
    for number in (1, 2):
        os.chmod(home / f"{number}.txt", 0o600)
    assert warned() == [f"the longctx store {home} can be read by other users (0.txt 644); {fix}"]
    os.chmod(home / "0.txt", 0o600)
    assert warned() == []
