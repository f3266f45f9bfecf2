"""Plain folders and single files: list what to read.

A folder is walked with ``os.scandir``. What it considers:

- ``.gitignore`` and ``.longctxignore`` files in the folder and any folder
  below it are honoured with git's precedence (deeper files win; within a
  folder ``.longctxignore`` wins over ``.gitignore``); an ignored path is not
  considered at all (not listed in the manifest) and an ignored folder is
  not entered. Git's global excludes and ``.git/info/exclude`` belong to
  repositories and are not read here.
- Entries named ``.git`` (a repository's data, or the ``.git`` file of a
  worktree) are never content and are not listed.
- Folders that hold what tools made rather than what people wrote
  (:data:`DEFAULT_IGNORED_FOLDERS`: ``.venv``, ``node_modules``,
  ``__pycache__``...; and any folder holding a ``pyvenv.cfg``, a virtual
  environment whatever its name) are not entered unless
  ``default_ignores`` is off: each is one ``ignored-by-default`` entry of the
  manifest, its path ending in ``/``. A git repository needs no such list:
  its own ignore files say what is not content.
- A symbolic link to a folder inside the root is followed: its files are
  listed under the link's path, so they may appear twice (under the real
  folder too). A link to a folder above it (a loop) is listed as
  ``symlink-loop``, a link that leaves the root as ``symlink-outside-root``.
  Links to files are checked when read (:mod:`longctx.sources.reading`).
- Every other entry (files, links to files, FIFOs, sockets) becomes a
  candidate; reading decides whether it is included.
- A subfolder that cannot be listed is skipped as ``unreadable``, its path
  ending in ``/``.

The walk's order does not matter: the corpus sorts everything.
"""

from __future__ import annotations

import codecs
import logging
import os
import stat
import sys
from typing import Final

from longctx.errors import SourceError
from longctx.recordtypes import record_type
from longctx.sources.ignore import IgnoreRules
from longctx.sources.listing import Candidate, Listing, Skip, SkipReason

__all__ = [
    "DEFAULT_IGNORED_FOLDERS",
    "IGNORE_FILE_NAMES",
    "display_path",
    "filesystem_path",
    "is_inside",
    "list_folder",
    "list_single_file",
    "relative_target",
]

IGNORE_FILE_NAMES: tuple[str, ...] = (".gitignore", ".longctxignore")
"""Ignore files read in every folder, in increasing order of precedence."""

DEFAULT_IGNORED_FOLDERS: frozenset[str] = frozenset(
    {
        ".venv",  # virtual environments (any folder with a pyvenv.cfg counts too)
        "node_modules",
        "__pycache__",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".hg",
        ".svn",
    }
)
"""Folder names a plain folder's walk does not enter by default: environments, caches, other VCS data.

Kept to names no one gives a folder of their own writing (``build`` and
``dist`` are left out: in many projects they are sources). repomix and
gitingest skip these by default too.
"""

_VENV_MARKER: Final = "pyvenv.cfg"

logger = logging.getLogger("longctx.sources")

_FILESYSTEM_IS_UTF8: Final = codecs.lookup(sys.getfilesystemencoding()).name == "utf-8"


def is_inside(real_path: str, root_real: str) -> bool:
    """Tell whether the resolved ``real_path`` is ``root_real`` or below it."""
    return real_path == root_real or real_path.startswith(root_real.rstrip(os.sep) + os.sep)


def display_path(filesystem_name: str) -> str:
    """Return how longctx names a path it got from the filesystem: its bytes read as UTF-8.

    Python decodes file names with the locale's encoding; re-reading the
    bytes as UTF-8 (undecodable bytes as lone surrogates) gives the same
    document paths under a Latin-1 or ASCII locale as under a UTF-8 one.
    """
    if _FILESYSTEM_IS_UTF8:
        return filesystem_name
    return os.fsencode(filesystem_name).decode("utf-8", "surrogateescape")


def filesystem_path(display: str) -> str:
    """Return the filesystem form of a path named by :func:`display_path` (its inverse)."""
    if _FILESYSTEM_IS_UTF8:
        return display
    return os.fsdecode(display.encode("utf-8", "surrogateescape"))


def relative_target(real_path: str, root_real: str) -> str:
    """Return the POSIX path of ``real_path`` relative to ``root_real`` (both resolved), as displayed."""
    relative = os.path.relpath(real_path, root_real)
    return "." if relative == os.curdir else display_path(relative.replace(os.sep, "/"))


def _join(directory: str, name: str) -> str:
    return f"{directory}/{name}" if directory else name


@record_type(slots=True)
class _PendingFolder:
    location: str
    path: str
    # (st_dev, st_ino) of every folder from the root down to this one: a
    # link back to one of them is a loop.
    ancestors: frozenset[tuple[int, int]]


def _read_ignore_files(folder: _PendingFolder, names: set[str], rules: IgnoreRules) -> None:
    for name in IGNORE_FILE_NAMES:
        if name not in names:
            continue
        location = os.path.join(folder.location, name)
        try:
            if not stat.S_ISREG(os.lstat(location).st_mode):
                continue
            with open(location, "rb") as handle:
                lines = handle.read().decode("utf-8", "surrogateescape").splitlines()
        except OSError as error:
            logger.warning("cannot read %s: %s", _join(folder.path, name), error.strerror)
            continue
        invalid = rules.add(folder.path, lines)
        if invalid:
            logger.warning("%s: %d invalid pattern(s) ignored", _join(folder.path, name), len(invalid))


def _default_skip(path: str, reason: str) -> Skip:
    return Skip(path + "/", SkipReason.IGNORED_BY_DEFAULT, (f"{reason}; --no-default-ignores packs it",))


def _subfolder(
    entry: os.DirEntry[str], path: str, folder: _PendingFolder, rules: IgnoreRules, *, default_ignores: bool
) -> _PendingFolder | Skip | None:
    """The folder ``entry`` (at ``path``) to walk next, or why it is left out (None: ignored, unlisted)."""
    if rules.is_ignored(path, is_dir=True):
        return None
    if default_ignores and entry.name in DEFAULT_IGNORED_FOLDERS:
        return _default_skip(path, "a tool's folder, not written by hand")
    try:
        entry_stat = entry.stat(follow_symlinks=False)
    except OSError as error:
        return Skip(path + "/", SkipReason.UNREADABLE, (error.strerror or "stat failed",))
    key = (entry_stat.st_dev, entry_stat.st_ino)
    if key in folder.ancestors:  # a bind mount of a parent
        return Skip(path + "/", SkipReason.SYMLINK_LOOP, ("folder mounted inside itself",))
    return _PendingFolder(entry.path, path, folder.ancestors | {key})


def list_folder(directory: str, *, default_ignores: bool = True) -> Listing:
    """List the folder ``directory`` as described in the module docstring.

    ``default_ignores`` (on by default) leaves out the folders of
    :data:`DEFAULT_IGNORED_FOLDERS` and virtual environments, one manifest
    entry each. Raises :class:`~longctx.errors.SourceError` when ``directory`` itself
    cannot be listed.
    """
    root_real = os.path.realpath(directory)
    try:
        root_stat = os.stat(directory)
    except OSError as error:
        raise SourceError(f"cannot read folder: {error.strerror}", path=directory) from None
    rules = IgnoreRules()
    candidates: list[Candidate] = []
    skipped: list[Skip] = []
    stack = [_PendingFolder(directory, "", frozenset({(root_stat.st_dev, root_stat.st_ino)}))]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder.location) as listing:
                entries = list(listing)
        except OSError as error:
            if not folder.path:
                raise SourceError(f"cannot list folder: {error.strerror}", path=directory) from None
            skipped.append(
                Skip(
                    folder.path + "/", SkipReason.UNREADABLE, (f"folder cannot be listed: {error.strerror}",)
                )
            )
            continue
        names = {entry.name for entry in entries}
        if default_ignores and folder.path and _VENV_MARKER in names:
            skipped.append(_default_skip(folder.path, "a virtual environment (it holds pyvenv.cfg)"))
            continue
        _read_ignore_files(folder, names, rules)
        for entry in entries:
            if entry.name == ".git":
                continue
            path = _join(folder.path, display_path(entry.name))
            try:
                is_link = entry.is_symlink()
                is_dir = not is_link and entry.is_dir(follow_symlinks=False)
            except OSError:
                is_link = is_dir = False
            if is_dir:
                found = _subfolder(entry, path, folder, rules, default_ignores=default_ignores)
                if isinstance(found, Skip):
                    skipped.append(found)
                elif found is not None:
                    stack.append(found)
                continue
            if rules.is_ignored(path, is_dir=False):
                continue
            if is_link:
                followed = _follow_folder_link(entry.path, path, folder, root_real)
                if isinstance(followed, Skip):
                    skipped.append(followed)
                    continue
                if isinstance(followed, _PendingFolder):
                    if not rules.is_ignored(path, is_dir=True):
                        stack.append(followed)
                    continue
            candidates.append(Candidate(path=path, location=entry.path, root_real=root_real))
    logger.debug("folder: %d candidates, %d skipped while listing", len(candidates), len(skipped))
    return Listing(tuple(candidates), tuple(skipped))


def _follow_folder_link(
    location: str, path: str, folder: _PendingFolder, root_real: str
) -> _PendingFolder | Skip | None:
    """Decide about a symbolic link met in a walk: a folder to enter, a skip, or None for a file."""
    try:
        target_stat = os.stat(location)
    except OSError:
        return None  # broken or looping: reading classifies it
    if not stat.S_ISDIR(target_stat.st_mode):
        return None
    real = os.path.realpath(location)
    if not is_inside(real, root_real):
        return Skip(path, SkipReason.SYMLINK_OUTSIDE_ROOT, ("link to a folder outside the root",))
    target = relative_target(real, root_real)
    key = (target_stat.st_dev, target_stat.st_ino)
    if key in folder.ancestors:
        return Skip(path, SkipReason.SYMLINK_LOOP, (f"link to {target}/, a folder above it",))
    return _PendingFolder(location, path, folder.ancestors | {key})


def list_single_file(file_path: str) -> Listing:
    """List one file passed directly: a single candidate named by its base name.

    A link passed directly is followed wherever it points (the caller named
    it) and read at its resolved location.
    """
    real = os.path.realpath(file_path)
    name = display_path(os.path.basename(os.path.normpath(file_path)))
    return Listing((Candidate(path=name, location=real, root_real=os.path.dirname(real)),), ())
