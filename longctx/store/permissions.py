"""Who may read the store: its folder is the user's alone (0700), its files too (0600).

The store holds the packs of private repositories and every question and
answer, so it is kept like ``~/.ssh`` or git's credentials: a folder the
store creates is made ``0700`` and a file ``0600`` whatever the umask.
SQLite creates the ``-wal`` and ``-shm`` files with the mode of the
database file, so a database file created private keeps them private.

A store made by an earlier longctx (or a folder the user chose) may be
looser: it is left as it is, and :func:`warn_if_readable_by_others` says so
in one line with the command that fixes it. Changing a user's modes behind
their back is not this module's call. On a system without POSIX modes
(Windows) nothing is checked.
"""

from __future__ import annotations

import logging
import os
import shlex
import stat
from pathlib import Path
from typing import Final

from longctx.recordtypes import record_type

__all__ = [
    "PRIVATE_FILE_MODE",
    "PRIVATE_FOLDER_MODE",
    "LooseEntry",
    "create_private_file",
    "make_private_folder",
    "readable_by_others",
    "warn_if_readable_by_others",
]

logger = logging.getLogger("longctx.store")

PRIVATE_FOLDER_MODE: Final = 0o700
PRIVATE_FILE_MODE: Final = 0o600
_OTHERS: Final = stat.S_IRWXG | stat.S_IRWXO
_POSIX: Final = os.name == "posix"


def make_private_folder(folder: Path) -> None:
    """Create ``folder`` (and its parents) if needed; a folder made here is ``0700``.

    Parents made on the way get the umask's usual mode: only the store's
    own folder is the store's to restrict. An existing folder is left alone.
    Raises :class:`OSError` as :meth:`Path.mkdir` does.
    """
    if folder.is_dir():
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir(mode=PRIVATE_FOLDER_MODE)
    except FileExistsError:
        return  # another process made it meanwhile: its mode is its maker's
    if _POSIX:
        os.chmod(folder, PRIVATE_FOLDER_MODE)  # mkdir's mode passes through the umask


def create_private_file(path: Path, *, truncate: bool = False) -> None:
    """Create ``path`` as an empty ``0600`` file if it does not exist (``truncate``: empty it if it does).

    An existing file keeps its mode (see :func:`warn_if_readable_by_others`)
    and is not opened unless ``truncate`` is given, so a read-only store
    still opens. Raises :class:`OSError` when the file cannot be created.
    """
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    flags |= os.O_TRUNC if truncate else os.O_EXCL
    try:
        descriptor = os.open(path, flags, PRIVATE_FILE_MODE)
    except FileExistsError:
        return
    os.close(descriptor)


@record_type
class LooseEntry:
    """A path of the store that its group or other users may use, and its permission bits."""

    path: Path
    mode: int


def readable_by_others(folder: Path) -> list[LooseEntry]:
    """``folder`` and the entries directly in it that its group or other users may use, in name order.

    Symbolic links (their own mode means nothing) and entries that vanish
    while they are looked at are skipped; nothing is reported off POSIX.
    """
    if not _POSIX:
        return []
    found: list[LooseEntry] = []
    for path in [folder, *_entries(folder)]:
        try:
            status = path.lstat()
        except OSError:
            continue
        if status.st_mode & _OTHERS and not stat.S_ISLNK(status.st_mode):
            found.append(LooseEntry(path, stat.S_IMODE(status.st_mode)))
    return found


def _entries(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


def warn_if_readable_by_others(folder: Path) -> bool:
    """Log one warning line, with the command that fixes it, if other users may read the store's folder.

    Returns whether it warned. The modes are not changed.
    """
    loose = readable_by_others(folder)
    if not loose:
        return False
    modes = ", ".join(
        f"{'folder' if mode.path == folder else mode.path.name} {mode.mode:o}" for mode in loose[:4]
    )
    more = f" and {len(loose) - 4} more" if len(loose) > 4 else ""
    logger.warning(
        "the longctx store %s can be read by other users (%s%s); to fix: chmod -R go-rwx %s",
        folder,
        modes,
        more,
        shlex.quote(str(folder)),
    )
    return True
