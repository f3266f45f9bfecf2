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

from longctx.packing import pack
from longctx.store import Store
from longctx.store.permissions import readable_by_others

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
