"""What a store failure means, in one line naming the file and what to do: a full disk, a read-only,
locked or damaged file.

Every failure of the database becomes a :class:`~longctx.errors.StoreError`
through :func:`store_failure`. None of these loses what is stored: a write
is one transaction, so a write that fails leaves the database as it was
before it; a damaged or read-only file is never written (longctx does not
repair, truncate or replace a store), so its rows stay for ``.recover`` or
for a writable disk.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Final

from longctx.errors import StoreError

__all__ = ["LOCK_WAIT_SECONDS", "store_failure"]

LOCK_WAIT_SECONDS: Final = 30.0
"""How long a connection waits for another one's write lock before it fails (SQLite's busy timeout)."""

# Below this much free space, a disk I/O error is taken for a full disk (a
# tmpfs or an overlay may answer ENOSPC as an I/O error, not SQLITE_FULL).
_NEARLY_FULL_BYTES: Final = 64 << 10


def store_failure(error: sqlite3.Error | OSError, path: Path, doing: str) -> StoreError:
    """The :class:`StoreError` for ``error``, met ``doing`` (``opening``, ``reading``, ...) ``path``.

    The message names the file, what went wrong in words, that nothing
    already stored was lost, and the command or setting that fixes it.
    """
    kind = _kind(error, path)
    folder = path.parent
    if kind == "full":
        advice = (
            f"the disk holding {folder} is full. Nothing already stored was lost (this write was not "
            f"made). Free space there (`longctx sessions prune --older-than 30d` frees old sessions), "
            f"or move the store to another disk with LONGCTX_HOME"
        )
    elif kind == "read-only":
        advice = (
            f"the store is read-only ({error}). Nothing was written and nothing stored is lost. Make it "
            f"writable (`chmod u+w {path} {folder}`, or remount its disk read-write), or point "
            f"LONGCTX_HOME at a writable folder"
        )
    elif kind == "locked":
        advice = (
            f"another process has held the store's write lock for over {LOCK_WAIT_SECONDS:.0f} s ({error}). "
            f"Nothing was written and nothing stored is lost. Let that process finish (another longctx, "
            f"or a sqlite3 shell with a transaction open: `fuser {path}` names it) and run again"
        )
    elif kind == "damaged":
        advice = (
            f"the file is damaged or not a longctx database ({error}); longctx did not change it. Move it "
            f"aside (`mv {path} {path}.damaged`, and its -wal and -shm files), and longctx starts a new "
            f"store; `sqlite3 {path}.damaged .recover` may save its rows"
        )
    else:
        advice = str(error)
    return StoreError(f"{doing} the longctx store {path} failed: {advice}")


def _kind(error: sqlite3.Error | OSError, path: Path) -> str:
    """``full``, ``read-only``, ``locked``, ``damaged`` or ``other``, from the error's code."""
    if isinstance(error, OSError):
        return {errno.ENOSPC: "full", errno.EROFS: "read-only", errno.EACCES: "read-only"}.get(
            error.errno or 0, "other"
        )
    name = getattr(error, "sqlite_errorname", "") or ""
    if name == "SQLITE_FULL":
        return "full"
    if name.startswith("SQLITE_READONLY"):
        return "read-only"
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return "locked"
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return "damaged"
    if name.startswith(("SQLITE_IOERR", "SQLITE_CANTOPEN")):
        if not _writable(path.parent):
            return "read-only"
        if _nearly_full(path.parent):
            return "full"
    return "other"


def _nearly_full(folder: Path) -> bool:
    try:
        return shutil.disk_usage(folder).free < _NEARLY_FULL_BYTES
    except OSError:
        return False


def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK) and not _read_only_mount(folder)


def _read_only_mount(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False
