"""Saving a result to the user's file: whole or not at all, and left alone when it already holds it.

:func:`save` is how ``longctx pack -o FILE`` (and :meth:`Pack.save
<longctx.packing.Pack.save>`) writes. Its contract:

- **Whole or not at all.** A regular file (or a new one) is written to a
  temporary file beside it, then renamed over it: a reader, a crash or a full
  disk never leaves a half-written pack under the name. The file keeps its
  permission bits; a symbolic link is written through (its target is
  replaced, the link stays).
- **Left alone when equal.** When the file already holds exactly these bytes
  (same size, then compared), it is not rewritten: re-packing an unchanged
  repository leaves its output, and whatever watches the file's modification
  time, untouched. Comparing reads the file once (about 20 ms for a 37 MB
  pack); rewriting would cost about twice that and free and reallocate every
  page of it.
- **Other targets as they are.** A FIFO, a terminal or ``/dev/stdout`` cannot
  be renamed over: it is opened and written, as a shell redirection would.
- **Errors** are :class:`~longctx.errors.OutputError`, naming the file; the
  file is then as it was, and no temporary file is left behind.

Not ``fsync``-ed: the rename protects against a crashed or killed process,
which is what a pack's user meets; surviving power loss would cost every
save a disk flush for a file that can be rebuilt from the repository.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
from collections.abc import Callable, Iterable
from typing import BinaryIO, Final

from longctx.errors import OutputError
from longctx.recordtypes import record_type

__all__ = ["COMPARE_BYTES", "Saved", "save", "save_text"]

# Bytes compared per read when checking an existing file: large enough that
# the per-read overhead vanishes, small enough to stay in the CPU cache.
COMPARE_BYTES: Final = 1 << 18


@record_type(slots=True)
class Saved:
    """What :func:`save` did: ``size`` bytes are at ``path``; ``unchanged``: the file already held them."""

    path: str
    size: int
    unchanged: bool


def save(
    path: str | os.PathLike[str],
    size: int,
    chunks: Callable[[], Iterable[bytes | bytearray | memoryview]],
    write: Callable[[BinaryIO], int],
) -> Saved:
    """Put ``size`` bytes at ``path``, as the module docstring says.

    ``chunks`` gives the bytes in order, to compare with an existing file
    (each piece is used before the next is asked for, so they may share
    one buffer; pieces of :data:`COMPARE_BYTES` compare fastest);
    ``write`` writes them all to an open binary file and returns the count,
    which must be ``size``.
    """
    name = os.fspath(path)
    target = os.path.realpath(name)  # through links, as open() writes
    try:
        status: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        status = None
    except OSError as error:
        raise OutputError(f"cannot write the output: {error.strerror}", path=name) from error
    if status is not None and not stat.S_ISREG(status.st_mode):
        return Saved(name, _write_in_place(name, target, write), unchanged=False)
    if status is not None and status.st_size == size and _holds(target, chunks()):
        return Saved(name, size, unchanged=True)
    _replace(name, target, size, write, None if status is None else stat.S_IMODE(status.st_mode))
    return Saved(name, size, unchanged=False)


def _holds(target: str, expected: Iterable[bytes | bytearray | memoryview]) -> bool:
    """Whether the file at ``target`` holds exactly the bytes of ``expected`` (its size already matches).

    The file is read into one buffer, reused: a fresh object per read would
    cost this process a page fault per page read. The buffer is compared on
    the left: a bytearray's ``==`` compares with any buffer in one memcmp,
    where a memoryview's goes item by item.
    """
    buffer = bytearray(COMPARE_BYTES)
    view = memoryview(buffer)
    try:
        with open(target, "rb", buffering=0) as file:
            for chunk in expected:
                for start in range(0, len(chunk), COMPARE_BYTES):
                    part = chunk if len(chunk) <= COMPARE_BYTES else chunk[start : start + COMPARE_BYTES]
                    size = len(part)
                    if not _read_exactly(file, view[:size]):
                        return False
                    if (buffer if size == COMPARE_BYTES else buffer[:size]) != part:
                        return False
            return file.read(1) == b""
    except OSError:
        return False  # unreadable (write-only, say): rewritten, which reports a real failure


def _read_exactly(file: io.FileIO, into: memoryview) -> bool:
    """Fill ``into`` from ``file``; False when the file ends first."""
    filled = 0
    while filled < len(into):
        count = file.readinto(into[filled:])
        if not count:
            return False
        filled += count
    return True


def _replace(name: str, target: str, size: int, write: Callable[[BinaryIO], int], mode: int | None) -> None:
    """Write ``size`` bytes to a new file beside ``target``, then rename it over ``target``."""
    folder, base = os.path.split(target)
    temporary = os.path.join(folder, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        # 0o666 less the umask, as open() creates; an existing file's bits are copied below.
        descriptor = os.open(
            temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666
        )
    except PermissionError:
        # The file may be writable in a folder that is not (a shared
        # output file): write it in place, as open() would.
        _write_in_place(name, target, write)
        return
    except OSError as error:
        raise OutputError(f"cannot write the output: {error.strerror}", path=name) from error
    try:
        with open(descriptor, "wb") as file:
            written = write(file)
        if written != size:  # a caller's bug, caught before the file is in place
            raise OutputError(f"wrote {written} bytes where {size} were expected", path=name)
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(error, OSError):
            message = f"cannot write the output: {error.strerror or error}"
            raise OutputError(message, path=name) from error
        raise


def _write_in_place(name: str, target: str, write: Callable[[BinaryIO], int]) -> int:
    try:
        with open(target, "wb") as file:
            return write(file)
    except OSError as error:
        raise OutputError(f"cannot write the output: {error.strerror or error}", path=name) from error


def save_text(path: str | os.PathLike[str], text: str) -> Saved:
    """:func:`save` for a text, as UTF-8: whole or not at all, left alone when the file already holds it."""
    data = text.encode("utf-8")
    return save(path, len(data), lambda: (data,), lambda stream: stream.write(data))
