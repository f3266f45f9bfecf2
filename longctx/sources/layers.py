"""Layers: keep a repository's pack prefix through commits by appending changes instead of rewriting.

The server reuses a prompt only up to its first changed byte. Ordering files
by last commit (oldest first) keeps a commit's damage to the files after the
oldest one it touches; on real histories that still throws away a third to
a half of the pack at a typical commit (docs/benchmarks.md, edit retention).
Layering goes further: the pack shows the repository as it was at a *base*
commit, in that commit's stability order, and then, after a fixed marker,
the current copies of the files that changed since. A commit then changes
only the tail of the pack, and the prefix the server holds stays valid until
the base moves.

The base is a pure function of the repository's first-parent history (no
state is kept anywhere), so every machine and process packs the same bytes:

- the first-parent commits are numbered from the root (1, 2, ...); at level
  ``K`` the base is the newest ancestor of HEAD whose number is ``1 + m K``
  (HEAD itself at level 1);
- levels are tried from the coarsest (:data:`LEVELS`): the first whose
  *earlier copies* (the base's versions of files since changed or deleted)
  take at most ``max_stale_share`` of the bytes git tracks at the base (in
  the folder, binary files included: git tells their sizes without reading
  them, so the share of the packed text can be higher) is used, so the
  duplication stays bounded and a large change falls back to a nearer base;
- when nothing changed since the chosen base, there is nothing to layer and
  the pack is the plain stability order.

Between bases the changes section grows by the files each commit touches;
at a base the pack starts over from the new commit's plain order.
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from longctx.config import DEFAULT_MAX_STALE_SHARE
from longctx.errors import SourceError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["LEVELS", "Layering", "plan_layers"]

logger = logging.getLogger("longctx.sources")

LEVELS: Final[tuple[int, ...]] = (16, 8, 4, 2, 1)
"""Base spacings tried, in first-parent commits, coarsest first."""

_SUBMODULE_MODE: Final = "160000"
_SYMLINK_MODE: Final = "120000"  # its blob is the link's target, not what the pack showed
_NULL_OBJECT: Final = "0" * 40


class GitRunner(Protocol):
    """What layering needs of :class:`longctx.sources.repo`'s git runner."""

    display_path: str

    def run(self, *arguments: str, allowed_exit_codes: tuple[int, ...] = (0,)) -> bytes: ...

    def popen(self, *arguments: str, stdin: bool = False) -> subprocess.Popen[bytes]: ...


@dataclass(frozen=True, slots=True)
class Layering:
    """The base a repository folder is packed from, and what changed since (repository paths).

    ``changed``: paths whose current content (work tree included) differs
    from the base's, or that are new since. ``earlier``: the base's bytes of
    every path changed or deleted since; they are packed where the base put
    them. ``base_tree``: every file path of the base's tree in the folder.
    """

    base: str
    level: int
    changed: frozenset[str]
    earlier: dict[str, bytes]
    base_tree: frozenset[str]


@dataclass(frozen=True, slots=True)
class _Change:
    path: str
    old_mode: str
    old_object: str
    status: str


def plan_layers(
    runner: GitRunner,
    pathspec: tuple[str, ...],
    *,
    max_stale_share: float,
    considered: Callable[[str], bool],
    git_path: Callable[[bytes], str],
) -> Layering | None:
    """Choose the base for the checked-out commit (see the module docstring); None for a plain pack.

    ``considered`` tells whether a repository path may be packed at all
    (ignore files); ``git_path`` decodes git's raw path bytes. Raises
    :class:`~longctx.errors.SourceError` when git fails.
    """
    if max_stale_share <= 0:
        return None
    number = int(runner.run("rev-list", "--first-parent", "--count", "HEAD").strip() or b"0")
    if number == 0:
        return None
    tried: set[int] = set()
    for level in LEVELS:
        back = (number - 1) % level
        if back in tried:
            continue
        tried.add(back)
        base = runner.run("rev-parse", "--verify", f"HEAD~{back}^{{commit}}").decode("ascii").strip()
        changes = [
            change for change in _changes_since(runner, base, pathspec, git_path) if considered(change.path)
        ]
        if not changes:
            logger.debug("layers: nothing changed since %s (level %d): a plain pack", base[:12], level)
            return None
        sizes = _tree_sizes(runner, base, pathspec, git_path)
        stale = [
            change
            for change in changes
            if change.status in "MTD"
            and change.old_object != _NULL_OBJECT
            and change.old_mode != _SYMLINK_MODE
        ]
        stale_bytes = sum(sizes.get(change.path, 0) for change in stale)
        total = sum(size for path, size in sizes.items() if considered(path))
        if stale_bytes > max_stale_share * total:
            logger.debug(
                "layers: %d earlier bytes of %d since %s (level %d) is too many",
                stale_bytes, total, base[:12], level,
            )  # fmt: skip
            continue
        earlier = _read_objects(runner, {change.path: change.old_object for change in stale})
        logger.debug(
            "layers: base %s (level %d), %d changed, %d earlier copies (%d bytes)",
            base[:12], level, len(changes), len(earlier), stale_bytes,
        )  # fmt: skip
        return Layering(
            base=base,
            level=level,
            changed=frozenset(change.path for change in changes if change.status != "D"),
            earlier=earlier,
            base_tree=frozenset(sizes),
        )
    return None


def _changes_since(
    runner: GitRunner, base: str, pathspec: tuple[str, ...], git_path: Callable[[bytes], str]
) -> list[_Change]:
    """Each file that differs between ``base`` and the work tree (``git diff --raw``), submodules left out."""
    output = runner.run(
        "diff", "--raw", "-z", "--no-renames", "--no-abbrev", "--ignore-submodules=all", base, *pathspec
    )
    records = output.split(b"\0")
    changes: list[_Change] = []
    # Records come in pairs: ":old_mode new_mode old_object new_object status", then the path.
    for meta, raw_path in zip(records[0::2], records[1::2], strict=False):
        if not meta.startswith(b":"):
            continue
        old_mode, new_mode, old_object, _, status = meta[1:].decode("ascii").split(" ")
        if _SUBMODULE_MODE in (old_mode, new_mode):
            continue
        changes.append(_Change(git_path(raw_path), old_mode, old_object, status[:1]))
    return changes


def _tree_sizes(
    runner: GitRunner, base: str, pathspec: tuple[str, ...], git_path: Callable[[bytes], str]
) -> dict[str, int]:
    """Map each file of ``base``'s tree (in the folder) to its size in bytes."""
    sizes: dict[str, int] = {}
    for record in runner.run("ls-tree", "-r", "-z", "--long", "--full-tree", base, *pathspec).split(b"\0"):
        if not record:
            continue
        meta, _, raw_path = record.partition(b"\t")
        mode, kind, _, size = meta.decode("ascii").split()
        if kind == "blob" and mode != _SUBMODULE_MODE:
            sizes[git_path(raw_path)] = int(size)
    return sizes


def _read_objects(runner: GitRunner, objects: dict[str, str]) -> dict[str, bytes]:
    """Read each path's blob with one ``git cat-file --batch``; map path to bytes."""
    if not objects:
        return {}
    paths = sorted(objects)
    process = runner.popen("cat-file", "--batch", stdin=True)
    request = "".join(f"{objects[path]}\n" for path in paths).encode("ascii")
    output, _ = process.communicate(request)
    if process.returncode != 0:
        raise SourceError(f"git cat-file failed (exit {process.returncode})", path=runner.display_path)
    contents: dict[str, bytes] = {}
    position = 0
    for path in paths:
        end = output.index(b"\n", position)
        header = output[position:end].split(b" ")
        if len(header) != 3 or header[1] != b"blob":
            raise SourceError(f"git cat-file could not read {objects[path]}", path=runner.display_path)
        size = int(header[2])
        contents[path] = output[end + 1 : end + 1 + size]
        position = end + 1 + size + 1  # the content is followed by a line feed
    return contents
