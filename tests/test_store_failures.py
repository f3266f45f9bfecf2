"""A damaged, read-only, locked store or a full disk: one clear StoreError naming the file, nothing lost.

Each failure is made for real where this machine allows it: garbage and
truncated files; a read-only filesystem (a tmpfs remounted read-only: as
root, ``chmod 0400`` stops nobody) and ``chmod`` as another user; another
connection holding ``BEGIN EXCLUSIVE``; a full disk as a size-limited tmpfs
(as root) and, everywhere, as SQLite's own SQLITE_FULL from a tiny
``max_page_count``.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import longctx.store.db
from longctx.errors import StoreError
from longctx.store import DATABASE_NAME, RequestRecord, SessionRecord, Store, TurnRecord
from longctx.store.failures import store_failure
from longctx.usage import Usage

ENTRY_POINT = Path(sys.executable).parent / "longctx"


def add_turns(store: Store, session_id: str, count: int, *, answer_bytes: int = 2000, start: int = 0) -> None:
    """``count`` turns of about ``answer_bytes`` each in session ``session_id`` (created if new)."""
    if start == 0:
        store.sessions.create_session(SessionRecord(session_id, 0.0, "session", "t", None, None, None))
    for position in range(start, start + count):
        request = RequestRecord(
            f"{session_id}-{position}", session_id, None, "turn", 0.0, "http://x/v1", "vllm", "m",
            Usage(100, 0, None, 10, None, None), 1,
        )  # fmt: skip
        answer = f"answer {position} " + "x" * answer_bytes
        turn = TurnRecord(
            session_id, position, f"question {position}?", answer, answer, None, request.id, 0.0
        )
        store.sessions.commit_turn(turn, request)


def turn_count(home: Path, session_id: str) -> int:
    with Store.open(home) as store:
        return len(store.sessions.turns(session_id))


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted in ``tmp_path`` (root only): a disk that fills, and can be made read-only."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


# -- damaged -------------------------------------------------------------------------


def test_a_file_of_garbage_is_refused_naming_it_and_left_as_it_was(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    garbage = os.urandom(8192)
    (home / DATABASE_NAME).write_bytes(garbage)
    with pytest.raises(StoreError) as caught:
        Store.open(home)
    message = str(caught.value)
    assert str(home / DATABASE_NAME) in message and "damaged" in message
    assert f"mv {home / DATABASE_NAME}" in message and ".recover" in message
    assert (home / DATABASE_NAME).read_bytes() == garbage


def test_a_truncated_store_is_refused_when_read_and_not_changed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with Store.open(home) as store:
        add_turns(store, "s", 60)
    path = home / DATABASE_NAME
    assert not (home / f"{DATABASE_NAME}-wal").exists()  # checkpointed on close: every turn is in the file
    cut = path.read_bytes()[: path.stat().st_size // 2]
    path.write_bytes(cut)
    with pytest.raises(StoreError) as caught, Store.open(home) as store:
        store.sessions.turns("s")
    assert "damaged" in str(caught.value) and str(path) in str(caught.value)
    assert path.read_bytes() == cut


def test_the_cli_says_the_store_is_damaged_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / DATABASE_NAME).write_bytes(b"not a database, a note someone saved here" * 100)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LONGCTX_")}
    result = subprocess.run(
        [str(ENTRY_POINT), "sessions", "list"], capture_output=True, text=True, check=False,
        env=environment | {"LONGCTX_HOME": str(home)},
    )  # fmt: skip
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "damaged" in result.stderr and str(home / DATABASE_NAME) in result.stderr


# -- read-only -----------------------------------------------------------------------


def test_a_store_on_a_read_only_disk_is_refused_and_keeps_its_turns(small_disk: Path) -> None:
    home = small_disk / "home"
    with Store.open(home) as store:
        add_turns(store, "s", 3, answer_bytes=100)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    try:
        with pytest.raises(StoreError) as caught, Store.open(home) as store:
            add_turns(store, "s", 1, answer_bytes=100, start=3)
        message = str(caught.value)
        assert "read-only" in message and str(home / DATABASE_NAME) in message and "LONGCTX_HOME" in message
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    assert turn_count(home, "s") == 3


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="as root, chmod stops no write")
def test_a_store_file_without_write_permission_is_refused_and_keeps_its_turns(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with Store.open(home) as store:
        add_turns(store, "s", 2, answer_bytes=100)
    (home / DATABASE_NAME).chmod(0o400)
    home.chmod(0o500)
    try:
        with pytest.raises(StoreError, match="read-only") as caught, Store.open(home) as store:
            add_turns(store, "s", 1, answer_bytes=100, start=2)
        assert "chmod u+w" in str(caught.value)
    finally:
        home.chmod(0o700)
        (home / DATABASE_NAME).chmod(0o600)
    assert turn_count(home, "s") == 2


# -- locked --------------------------------------------------------------------------


def test_a_store_locked_past_the_busy_timeout_is_a_clear_error_and_the_write_goes_through_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(longctx.store.db, "LOCK_WAIT_SECONDS", 0.3)
    home = tmp_path / "home"
    with Store.open(home) as store:
        add_turns(store, "s", 2, answer_bytes=100)
    holder = sqlite3.connect(home / DATABASE_NAME, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with Store.open(home) as store:
            assert len(store.sessions.turns("s")) == 2  # reads go on (WAL)
            with pytest.raises(StoreError) as caught:
                add_turns(store, "s", 1, answer_bytes=100, start=2)
            message = str(caught.value)
            assert "write lock" in message and str(home / DATABASE_NAME) in message and "fuser" in message
            holder.execute("ROLLBACK")
            add_turns(store, "s", 1, answer_bytes=100, start=2)
    finally:
        holder.close()
    assert turn_count(home, "s") == 3


# -- a full disk ---------------------------------------------------------------------


def test_a_full_disk_is_a_clear_error_and_every_turn_stored_before_stays(small_disk: Path) -> None:
    home = small_disk / "home"
    stored = 0
    with Store.open(home) as store:
        add_turns(store, "s", 1)
        stored = 1
        with pytest.raises(StoreError) as caught:
            for position in range(1, 1000):
                add_turns(store, "s", 1, answer_bytes=4000, start=position)
                stored += 1
        message = str(caught.value)
        assert "full" in message and str(home / DATABASE_NAME) in message and "prune" in message
        assert len(store.sessions.turns("s")) == stored  # the store goes on reading
    assert 10 < stored < 1000 and turn_count(home, "s") == stored


def test_sqlite_full_from_a_page_limit_is_the_same_clear_error(tmp_path: Path) -> None:
    """The full disk wherever no filesystem can be mounted: SQLite's own SQLITE_FULL."""
    home = tmp_path / "home"
    with Store.open(home) as store:
        add_turns(store, "s", 2)
        pages = store.database.query("PRAGMA page_count")[0][0]
        store.database.query(f"PRAGMA max_page_count = {pages + 2}")
        with pytest.raises(StoreError) as caught:
            add_turns(store, "s", 20, answer_bytes=4000, start=2)
        assert "full" in str(caught.value) and "nothing already stored was lost" in str(caught.value).lower()
    assert turn_count(home, "s") >= 2


# -- each kind from its error code, as the message names it ---------------------------


def sqlite_error(name: str) -> sqlite3.OperationalError:
    """An error as SQLite raises it, with its extended result code's name."""
    error = sqlite3.OperationalError(f"an error named {name}")
    error.sqlite_errorname = name
    return error


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "the disk holding"),
        (OSError(errno.EROFS, "Read-only file system"), "the store is read-only"),
        (OSError(errno.EACCES, "Permission denied"), "the store is read-only"),
        (sqlite_error("SQLITE_FULL"), "the disk holding"),
        (sqlite_error("SQLITE_READONLY"), "the store is read-only"),
        (sqlite_error("SQLITE_READONLY_DBMOVED"), "the store is read-only"),
        (sqlite_error("SQLITE_BUSY"), "write lock"),
        (sqlite_error("SQLITE_LOCKED_SHAREDCACHE"), "write lock"),
        (sqlite_error("SQLITE_CORRUPT"), "damaged"),
        (sqlite_error("SQLITE_NOTADB"), "damaged"),
    ],
)
def test_each_failure_is_told_by_its_code(tmp_path: Path, error: Exception, words: str) -> None:
    path = tmp_path / DATABASE_NAME
    message = str(store_failure(error, path, "writing to"))
    assert message.startswith(f"writing to the longctx store {path} failed: ")
    assert words in message
    kinds = ("the disk holding", "the store is read-only", "write lock", "damaged")
    assert [kind for kind in kinds if kind in message] == [words]


def test_the_full_disk_names_the_folder_and_the_read_only_file_its_chmod(tmp_path: Path) -> None:
    path = tmp_path / "home" / DATABASE_NAME
    full = str(store_failure(OSError(errno.ENOSPC, "No space left on device"), path, "writing to"))
    assert f"the disk holding {path.parent} is full" in full
    read_only = str(store_failure(sqlite_error("SQLITE_READONLY"), path, "writing to"))
    assert f"`chmod u+w {path} {path.parent}`" in read_only


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.EIO, "Input/output error"),
        OSError("no code"),
        sqlite_error("SQLITE_ERROR"),
        sqlite3.Error("plain"),
    ],
)
def test_a_failure_of_no_known_kind_is_told_in_its_own_words(tmp_path: Path, error: Exception) -> None:
    path = tmp_path / DATABASE_NAME
    assert str(store_failure(error, path, "reading")) == f"reading the longctx store {path} failed: {error}"


@pytest.mark.parametrize("name", ["SQLITE_IOERR_WRITE", "SQLITE_CANTOPEN"])
def test_an_io_error_is_read_only_or_full_only_when_the_folder_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A disk I/O error is what a tmpfs or an overlay may answer for a full or read-only disk."""
    path = tmp_path / DATABASE_NAME
    error = sqlite_error(name)
    # A writable folder on a disk with room: the error as it came.
    assert str(store_failure(error, path, "writing to")).endswith(f"failed: {error}")
    # A folder the user may not write: read-only.
    with monkeypatch.context() as patched:
        patched.setattr(os, "access", lambda folder, mode: False)
        assert "the store is read-only" in str(store_failure(error, path, "writing to"))
    # A folder on a filesystem mounted read-only, though its modes allow writing.
    real_statvfs = os.statvfs
    with monkeypatch.context() as patched:
        patched.setattr(os, "statvfs", lambda folder: _statvfs_with_flag(real_statvfs(folder), os.ST_RDONLY))
        assert "the store is read-only" in str(store_failure(error, path, "writing to"))
    # A disk with less than 64 KiB free: full. With exactly 64 KiB, not yet.
    for free, words in [((64 << 10) - 1, "the disk holding"), (64 << 10, str(error))]:
        with monkeypatch.context() as patched:
            patched.setattr(shutil, "disk_usage", lambda folder, free=free: _usage(free))
            assert words in str(store_failure(error, path, "writing to")), free


def test_an_io_error_where_the_folder_cannot_be_looked_at_is_told_as_it_came(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreadable(folder: object) -> object:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "statvfs", unreadable)
    monkeypatch.setattr(shutil, "disk_usage", unreadable)
    error = sqlite_error("SQLITE_IOERR")
    assert str(store_failure(error, tmp_path / DATABASE_NAME, "reading")).endswith(f"failed: {error}")


def _statvfs_with_flag(real: os.statvfs_result, flag: int) -> os.statvfs_result:
    values = list(real)
    values[8] |= flag  # f_flag
    return os.statvfs_result(values)


def _usage(free: int) -> object:
    return shutil._ntuple_diskusage(1 << 30, (1 << 30) - free, free)  # type: ignore[attr-defined]
