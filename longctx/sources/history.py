"""History: when each file last changed, and the layers that keep a pack's prefix through commits.

Last-commit times
-----------------

A repository's files are ordered by the committer time of the newest commit
that touched each (:func:`last_commit_times`). One ``git log``, streamed
newest first, walks history until every file asked for has its time, and is
stopped there, so an old repository costs only the history needed. That walk
reaches the root commit in a mature repository (some file was last touched
near it), so with a :class:`CommitTimesCache` (the
:class:`~longctx.store.Store` is one) its result is kept by commit, folder
and set of paths: a layered repository walks once per base commit, not on
every edit. A shallow repository's walks are not kept (deepening it changes
what the same commit's history holds; see :func:`usable_times_cache`).

Layers
------

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
state is kept anywhere), so every machine and process packs the same bytes
(:func:`plan_layers`):

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

import hashlib
import logging
from collections.abc import Callable, Sequence
from contextlib import closing
from typing import Final, Protocol

from longctx.errors import SourceError
from longctx.recordtypes import record_type
from longctx.sources.git import SUBMODULE_MODE, GitRunner, decode_path

__all__ = [
    "LEVELS",
    "CommitTimesCache",
    "LayerPlan",
    "Layering",
    "head_commit",
    "last_commit_times",
    "plan_layers",
    "usable_times_cache",
]

logger = logging.getLogger("longctx.sources")

LEVELS: Final[tuple[int, ...]] = (16, 8, 4, 2, 1)
"""Base spacings tried, in first-parent commits, coarsest first."""

_SYMLINK_MODE: Final = "120000"  # its blob is the link's target, not what the pack showed
_NULL_OBJECT: Final = "0" * 40
_TIMES_KEY_VERSION: Final = "commit-times/1"  # bump when what _last_commit_times returns changes


class CommitTimesCache(Protocol):
    """Where last-commit times are kept, under a key that names the commit, folder and paths walked for."""

    def commit_times(self, key: str) -> dict[str, int] | None: ...

    def save_commit_times(self, key: str, times: dict[str, int]) -> None: ...


def head_commit(runner: GitRunner) -> str | None:
    """The full sha of the checked-out commit; None on a branch with no commit yet."""
    output = runner.run("rev-parse", "-q", "--verify", "HEAD^{commit}", allowed_exit_codes=(0, 1)).stdout
    # Exit 1 without output: an unborn branch, no commit yet.
    sha = output.decode("ascii", "replace").strip()
    return sha or None


def usable_times_cache(runner: GitRunner, cache: CommitTimesCache | None) -> CommitTimesCache | None:
    """``cache``, or None in a shallow repository, whose walks are never kept (see the module docstring)."""
    if cache is None:
        return None
    shallow = runner.run("rev-parse", "--is-shallow-repository").stdout.strip() == b"true"
    return None if shallow else cache


def last_commit_times(
    runner: GitRunner,
    wanted: set[str],
    pathspec: tuple[str, ...],
    commit: str,
    cache: CommitTimesCache | None,
) -> dict[str, int]:
    """Map each repository path in ``wanted`` to its last commit time as of ``commit`` (a full sha).

    A path no commit in that history touches is left out. Read from and
    kept in ``cache`` when given. The key names everything the walk depends
    on: the commit (its history cannot change, short of a shallow
    repository, which is never cached), the folder (``pathspec``), and the
    paths asked for (the walk stops once it has them). Raises
    :class:`~longctx.errors.SourceError` when git fails.
    """
    if cache is None:
        return _last_commit_times(runner, wanted, pathspec, commit)
    digest = hashlib.sha256()
    for part in (_TIMES_KEY_VERSION, commit, *pathspec, "\0", *sorted(wanted)):
        digest.update(part.encode("utf-8", "surrogateescape") + b"\0")
    key = digest.hexdigest()
    kept = cache.commit_times(key)
    if kept is not None:
        return kept
    times = _last_commit_times(runner, wanted, pathspec, commit)
    cache.save_commit_times(key, times)
    return times


def _last_commit_times(
    runner: GitRunner, wanted: set[str], pathspec: tuple[str, ...], revision: str = "HEAD"
) -> dict[str, int]:
    """Map each path in ``wanted`` to the committer time of its newest commit in ``revision``'s history.

    One ``git log`` streams the history newest first; it is stopped as soon
    as every wanted path has been seen.
    """
    times: dict[str, int] = {}
    remaining = set(wanted)
    if not remaining:
        return times
    # -z output: each commit is "\0<time>\0" followed by its files, each
    # ending in "\0", the first one prefixed with "\n". A file name is never
    # empty, so an empty token always starts a commit header.
    log = runner.stream(
        "log",
        "-z",
        "--name-only",
        "--no-renames",
        "--no-show-signature",
        "--format=%x00%ct",
        revision,
        *pathspec,
    )
    with closing(log) as chunks:
        pending = b""
        state = "file"
        commit_time = 0
        for chunk in chunks:
            tokens = (pending + chunk).split(b"\0")
            pending = tokens.pop()
            for token in tokens:
                if state == "time":
                    commit_time = int(token)
                    state = "first-file"
                elif not token:
                    state = "time"
                else:
                    name = token[1:] if state == "first-file" and token.startswith(b"\n") else token
                    state = "file"
                    path = decode_path(name)
                    if path in remaining:
                        remaining.discard(path)
                        times[path] = commit_time
            if not remaining:
                break  # every wanted path has its time: the rest of history is not needed
    return times


@record_type(slots=True)
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


@record_type(slots=True)
class LayerPlan:
    """What :func:`plan_layers` chose, and why, in words for the pack's summary line.

    ``layering`` is None for a plain pack. ``note`` says which base the pack
    is layered on, or why it is not, and when a coarser base was passed over
    because its earlier copies took more than ``max_stale_share``, that the
    pack starts over from a nearer base (the prefix the server held for the
    coarser one is lost) and what to do about it. None when there is
    nothing to say (no commits yet, or a plain pack with no base passed over).
    """

    layering: Layering | None
    note: str | None


@record_type(slots=True)
class _Change:
    path: str
    old_mode: str
    old_object: str
    status: str


def _with_earlier_copies(changes: Sequence[_Change]) -> list[_Change]:
    """The changes whose earlier copy a layered pack keeps: files modified, retyped or deleted, not links."""
    return [
        change
        for change in changes
        if change.status in "MTD" and change.old_object != _NULL_OBJECT and change.old_mode != _SYMLINK_MODE
    ]


def plan_layers(
    runner: GitRunner,
    pathspec: tuple[str, ...],
    *,
    max_stale_share: float,
    considered: Callable[[str], bool],
) -> LayerPlan:
    """Choose the base for the checked-out commit (see the module docstring), and say why.

    ``pathspec`` restricts git to the folder asked for; ``considered``
    tells whether a repository path may be packed at all (ignore files).
    Raises :class:`~longctx.errors.SourceError` when git fails.
    """
    if max_stale_share <= 0:
        return LayerPlan(
            None, "layering off (max_stale_share 0): a commit re-packs from its first changed file"
        )
    number = int(runner.run("rev-list", "--first-parent", "--count", "HEAD").stdout.strip() or b"0")
    if number == 0:
        return LayerPlan(None, None)
    tried: set[int] = set()
    # Coarser bases passed over: (base, level, share of the tracked bytes their earlier copies take).
    passed_over: list[tuple[str, int, float]] = []
    for level in LEVELS:
        back = (number - 1) % level
        if back in tried:
            continue
        tried.add(back)
        base = runner.run("rev-parse", "--verify", f"HEAD~{back}^{{commit}}").stdout.decode("ascii").strip()
        changes = [change for change in _changes_since(runner, base, pathspec) if considered(change.path)]
        if not changes:
            logger.debug("layers: nothing changed since %s (level %d): a plain pack", base[:12], level)
            if not passed_over:
                return LayerPlan(None, None)
            return LayerPlan(
                None, _layer_note(None, changed=0, passed_over=passed_over, share=max_stale_share)
            )
        sizes = _tree_sizes(runner, base, pathspec)
        stale = _with_earlier_copies(changes)
        stale_bytes = sum(sizes.get(change.path, 0) for change in stale)
        total = sum(size for path, size in sizes.items() if considered(path))
        if stale_bytes > max_stale_share * total:
            logger.debug(
                "layers: %d earlier bytes of %d since %s (level %d) is too many",
                stale_bytes,
                total,
                base[:12],
                level,
            )
            passed_over.append((base, level, stale_bytes / total if total else 1.0))
            continue
        earlier = _read_objects(runner, {change.path: change.old_object for change in stale})
        logger.debug(
            "layers: base %s (level %d), %d changed, %d earlier copies (%d bytes)",
            base[:12],
            level,
            len(changes),
            len(earlier),
            stale_bytes,
        )
        layering = Layering(
            base=base,
            level=level,
            changed=frozenset(change.path for change in changes if change.status != "D"),
            earlier=earlier,
            base_tree=frozenset(sizes),
        )
        note = _layer_note(layering, changed=len(changes), passed_over=passed_over, share=max_stale_share)
        return LayerPlan(layering, note)
    return LayerPlan(None, _layer_note(None, changed=0, passed_over=passed_over, share=max_stale_share))


def _layer_note(
    layering: Layering | None, *, changed: int, passed_over: list[tuple[str, int, float]], share: float
) -> str:
    """The words of a :class:`LayerPlan`: the base chosen (or a plain pack), and the bases passed over."""
    if layering is not None:
        copies = len(layering.earlier)
        text = (
            f"layered on base {layering.base[:12]} (every {layering.level} commits): {changed} file(s) "
            f"changed since are packed after it, with {copies} earlier cop{'y' if copies == 1 else 'ies'} "
            "left in place, so the prefix before them stays cached until the base moves"
        )
    else:
        text = "a plain pack of the checked-out commit"
    if passed_over:
        coarse_base, coarse_level, stale = passed_over[0]
        text += (
            f"; base {coarse_base[:12]} (every {coarse_level} commits) was passed over: the earlier "
            f"copies since it would be {stale:.0%} of the tracked bytes, over max_stale_share {share:.0%}, "
            "so this pack starts over from a nearer base and the server's cached prefix is lost once "
            "(a larger --max-stale-share keeps it, at the cost of more duplicated text)"
        )
    return text


def _changes_since(runner: GitRunner, base: str, pathspec: tuple[str, ...]) -> list[_Change]:
    """Each file that differs between ``base`` and the work tree (``git diff --raw``), submodules left out."""
    output = runner.run(
        "diff", "--raw", "-z", "--no-renames", "--no-abbrev", "--ignore-submodules=all", base, *pathspec
    ).stdout
    records = output.split(b"\0")
    changes: list[_Change] = []
    # Records come in pairs: ":old_mode new_mode old_object new_object status", then the path.
    for meta, raw_path in zip(records[0::2], records[1::2], strict=False):
        if not meta.startswith(b":"):
            continue
        old_mode, new_mode, old_object, _, status = meta[1:].decode("ascii").split(" ")
        if SUBMODULE_MODE in (old_mode, new_mode):
            continue
        changes.append(_Change(decode_path(raw_path), old_mode, old_object, status[:1]))
    return changes


def _tree_sizes(runner: GitRunner, base: str, pathspec: tuple[str, ...]) -> dict[str, int]:
    """Map each file of ``base``'s tree (in the folder) to its size in bytes."""
    sizes: dict[str, int] = {}
    output = runner.run("ls-tree", "-r", "-z", "--long", "--full-tree", base, *pathspec).stdout
    for record in output.split(b"\0"):
        if not record:
            continue
        meta, _, raw_path = record.partition(b"\t")
        mode, kind, _, size = meta.decode("ascii").split()
        if kind == "blob" and mode != SUBMODULE_MODE:
            sizes[decode_path(raw_path)] = int(size)
    return sizes


def _read_objects(runner: GitRunner, objects: dict[str, str]) -> dict[str, bytes]:
    """Read each path's blob with one ``git cat-file --batch``; map path to bytes."""
    if not objects:
        return {}
    paths = sorted(objects)
    request = "".join(f"{objects[path]}\n" for path in paths).encode("ascii")
    output = runner.run("cat-file", "--batch", input=request).stdout
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
