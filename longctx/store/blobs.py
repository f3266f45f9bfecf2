"""The store's files beside the database: pack snapshot texts, and :class:`StoredText` to read one.

A snapshot's text is a file rather than a value in the database: SQLite
writes a 37 MB value twice, through its journal, about ten times slower than
a plain file. The rows that point to these files are kept by
:mod:`longctx.store.caches`; this module names, moves, opens and removes
the files, and knows no SQL.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import time
import weakref
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import BinaryIO

from longctx.errors import StoreError
from longctx.store.permissions import create_private_file, make_private_folder

__all__ = ["SnapshotTexts", "StoredText"]


class StoredText:
    """A text file of the store, open and mapped: read in place, or copied to a stream by the kernel.

    ``view`` is the file's bytes, mapped (read on demand, never copied
    whole). The file stays open as long as this object lives: renaming or
    removing its name does not change what it reads.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Open and map ``path`` (raises OSError); the file must not be empty."""
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
        # Closed when this object is collected (or at exit), whoever holds it.
        self._closer = weakref.finalize(self, os.close, descriptor)
        self._descriptor = descriptor
        self.view = memoryview(mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ))

    @property
    def size(self) -> int:
        """The file's length in bytes."""
        return self.view.nbytes

    def read_chunks(self, size: int) -> Iterator[bytearray | memoryview]:
        """The text in order, ``size`` bytes at a time, read from the file rather than the mapping.

        Every piece is the same buffer, refilled: use it before asking for
        the next. Reading costs a copy; the mapping, or a new object per
        piece, would cost a page fault per page.
        """
        preadv = getattr(os, "preadv", None)
        if preadv is None:  # Windows: the mapping it is
            for offset in range(0, self.size, size):
                yield self.view[offset : offset + size]
            return
        buffer = bytearray(size)
        offset = 0
        while offset < self.size:
            count = preadv(self._descriptor, [buffer], offset)
            if count <= 0:
                raise OSError(f"the stored pack text ended at byte {offset} of {self.size}")
            yield buffer if count == size else memoryview(buffer)[:count]
            offset += count

    def copy_to(self, stream: BinaryIO) -> int:
        """Write the whole text to ``stream``; return the byte count.

        A file opened with :func:`open` (or its ``.buffer``, or a raw
        ``FileIO``) gets the bytes straight from the page cache
        (``sendfile``), without the page faults of reading the mapping; any
        other stream, or a platform or file that refuses, gets the mapped
        bytes written. (Only those types: a compressing stream such as
        ``GzipFile`` has a ``fileno()`` too, that of the file under it.)
        """
        size = self.view.nbytes
        sent = 0
        sendfile = getattr(os, "sendfile", None)
        raw = stream.raw if isinstance(stream, (io.BufferedWriter, io.BufferedRandom)) else stream
        target = raw.fileno() if isinstance(raw, io.FileIO) and not raw.closed else None
        if sendfile is not None and target is not None:
            stream.flush()
            try:
                while sent < size:
                    count = sendfile(target, self._descriptor, sent, size - sent)
                    if count == 0:
                        break
                    sent += count
            except OSError:
                pass  # e.g. macOS sends to sockets only: write the rest below
        if sent < size:
            stream.write(self.view[sent:])
        return size


class SnapshotTexts:
    """``store.blobs``: the pack snapshot texts, one file per kept snapshot, named for its slot and state.

    A snapshot's text is written to :meth:`new_file`, then handed to
    ``store.caches.save_pack_snapshot``, which moves it into place
    (:meth:`keep`) before committing the row that points to it; it is read
    back mapped (:meth:`open`).

    Constructing one touches no file; the folder is created by
    :meth:`new_file`, the first step of every save.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def new_file(self, slot: str, state: str) -> Path:
        """A fresh, empty file to write a snapshot's text to, then hand to :meth:`keep`.

        It lies in the folder (so it can be moved into place atomically),
        is named for this process, so two processes packing the same
        repository do not write the same file, and only the user may read
        it (the folder too: :mod:`longctx.store.permissions`).
        """
        path = self.folder / f"{_file_name(slot, state)}.{os.getpid()}.partial"
        try:
            make_private_folder(self.folder)
            create_private_file(path, truncate=True)
        except OSError as error:
            raise StoreError(f"cannot create {path}: {error}") from error
        return path

    def keep(self, text_file: Path, slot: str, state: str, size: int) -> str:
        """Move ``text_file`` into place as the text of ``slot`` at ``state``; return its name in the folder.

        Raises :class:`StoreError` if the file does not hold ``size`` bytes
        or cannot be moved.
        """
        name = _file_name(slot, state)
        try:
            if text_file.stat().st_size != size:
                raise StoreError(f"the snapshot text {text_file} does not hold the sections' {size} bytes")
            os.replace(text_file, self.folder / name)
        except OSError as error:
            raise StoreError(f"cannot keep a pack snapshot in {self.folder}: {error}") from error
        return name

    def open(self, name: str) -> StoredText | None:
        """The text file ``name``, open and mapped; None if it is gone or empty."""
        try:
            return StoredText(self.folder / name)
        except (OSError, ValueError):  # ValueError: an empty file cannot be mapped
            return None  # removed by hand, or by another process's newer save

    def remove_all_but(self, kept: Collection[str]) -> None:
        """Remove every file not named in ``kept``, except partial files a save may still be writing."""
        for stale in self.folder.iterdir():
            # Files of replaced or dropped snapshots, and partial files that
            # no save is writing any more (a save takes seconds).
            if stale.name not in kept and not (
                stale.name.endswith(".partial") and _younger_than(stale, 3600)
            ):
                with contextlib.suppress(OSError):  # in use elsewhere (Windows): a later save removes it
                    stale.unlink(missing_ok=True)


def _file_name(slot: str, state: str) -> str:
    # Cut to 32 characters each: the name stays short whatever the keys' length.
    return f"{slot[:32]}-{state[:32]}.txt"


def _younger_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime < seconds
    except OSError:
        return False
