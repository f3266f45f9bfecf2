"""Git work trees: what a repository source lists, and the state that tells a re-pack nothing moved.

Git runs through :mod:`longctx.sources.git`; last-commit times and layers
come from :mod:`longctx.sources.history`.

What a repository source considers is exactly what git lists: tracked files
plus untracked files that git does not ignore (``git ls-files --cached
--others --exclude-standard``: nested ``.gitignore`` files,
``.git/info/exclude`` and the global excludes file, as git itself decides),
restricted to the folder that was asked for. Paths ignored by git, or by a
``.longctxignore`` file (same syntax, read in the folder asked for, its
parents up to the top of the work tree, and below it), are not considered
and not listed.

Git is run a fixed number of times whatever the size of the repository:
``ls-files`` twice (tracked with modes, untracked), ``status`` once (dirty
files) and ``log`` once, streamed, over history until every tracked file has
its last commit time (kept in a :class:`CommitTimesCache` when one is given:
see :mod:`longctx.sources.history`), plus a few more for a layered listing.
:func:`find_repository` and :func:`repository_state` run git through the
module's probes (no GitPython import: they are all a re-pack of an unchanged
repository runs).

Paths travel NUL-separated (``-z``), so spaces, newlines and names that
are not UTF-8 survive; the latter become lone surrogates (UTF-8 with
``surrogateescape``, whatever the locale).

- Submodules (mode 160000) and nested repositories git does not descend into
  are listed as ``submodule``, their paths ending in ``/``.
- Tracked files deleted in the work tree are listed as ``unreadable``.
- Symbolic links (mode 120000) are candidates like other files: the reader
  follows them inside the root and reports the rest.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import field
from typing import Final

from longctx.options.groups import DEFAULT_MAX_STALE_SHARE
from longctx.recordtypes import record_type
from longctx.sources.files import filesystem_path, is_inside, relative_target
from longctx.sources.git import (
    SUBMODULE_MODE,
    GitRunner,
    could_find_repository,
    decode_path,
    probe,
    probe_together,
    split_records,
)
from longctx.sources.history import (
    CommitTimesCache,
    Layering,
    head_commit,
    last_commit_times,
    plan_layers,
    usable_times_cache,
)
from longctx.sources.ignore import IgnoreRules, parent_directories
from longctx.sources.listing import Candidate, Listing, Skip, SkipReason

__all__ = [
    "CommitTimesCache",
    "RepositoryRoot",
    "RepositoryState",
    "find_repository",
    "is_ignored_by_git",
    "list_repository",
    "repository_state",
]

logger = logging.getLogger("longctx.sources")

_LONGCTX_IGNORE: Final = ".longctxignore"


@record_type(slots=True)
class RepositoryRoot:
    """Where a folder sits in a git work tree.

    ``work_tree`` is the resolved top of the work tree, ``subdirectory``
    the POSIX path of the folder inside it (``""`` for the top).
    """

    work_tree: str
    subdirectory: str


def find_repository(directory: str) -> RepositoryRoot | None:
    """Return the git work tree that contains ``directory``, or None when there is none.

    Bare repositories and folders inside ``.git`` count as none (git
    itself refuses to name a work tree for them), and so does every folder
    when git cannot run. Runs git once, without GitPython, unless git could
    find no repository from there (:func:`could_find_repository`).
    """
    target = os.path.realpath(directory)
    if not os.path.isdir(target) or not could_find_repository(target):
        return None
    top = probe(target, "rev-parse", "--show-toplevel")
    if top is None or top.returncode != 0 or not top.stdout.strip():
        return None
    work_tree = os.path.realpath(os.fsdecode(top.stdout.rstrip(b"\n")))
    if not is_inside(target, work_tree):
        return None
    subdirectory = relative_target(target, work_tree)
    if subdirectory == ".":
        subdirectory = ""
    if ".git" in subdirectory.split("/"):
        return None
    return RepositoryRoot(work_tree, subdirectory)


@record_type(slots=True)
class RepositoryState:
    """What git says about a work tree folder: enough to tell that nothing git tracks has moved.

    ``work_tree`` and ``subdirectory`` are as in :class:`RepositoryRoot`.
    ``head`` is the checked-out commit (None before the first commit).
    ``changes`` is ``git status --porcelain=v2 -z --untracked-files=all``
    for the folder, without its header lines: every modified, staged,
    deleted and untracked (not ignored) path, with modes and index object
    names. ``changed_paths`` are the repository paths it names (the caller
    must look at their content: status does not change when a modified file
    is edited again). ``hidden_changes`` is True when an index entry in the
    folder is marked assume-unchanged or skip-worktree: git status does not
    report edits to such files. ``tracked_files`` is the number of index
    entries in the folder (a hint of the corpus's size).
    """

    work_tree: str
    subdirectory: str
    head: str | None
    changes: bytes
    changed_paths: tuple[str, ...]
    hidden_changes: bool
    tracked_files: int = 0


def repository_state(directory: str) -> RepositoryState | None:
    """The :class:`RepositoryState` of ``directory``; None when it is not a folder git lists as a repository.

    None too where :func:`list_repository` would not be used (a folder git
    ignores, a folder inside ``.git``) or git fails. Runs git three or four
    times (``rev-parse``, ``check-ignore`` for a subfolder, ``status``,
    ``ls-files -v``).
    """
    root = find_repository(directory)
    if root is None:
        return None
    work_tree, subdirectory = root.work_tree, root.subdirectory
    pathspec = ("--", filesystem_path(subdirectory)) if subdirectory else ()
    if subdirectory:
        ignored = probe(work_tree, "check-ignore", "-q", "--", filesystem_path(subdirectory))
        if ignored is None or ignored.returncode != 1:  # 0: ignored; 128: git failed
            return None
    # Both at once: status dominates, and ls-files -v runs in its shadow.
    status, flags = probe_together(
        work_tree,
        [
            (
                "status",
                "--porcelain=v2",
                "--branch",
                "-z",
                "--untracked-files=all",
                "--no-renames",
                "--ignore-submodules=dirty",
                *pathspec,
            ),
            ("ls-files", "-v", "-z", *pathspec),
        ],
    )
    if status is None or status.returncode != 0 or flags is None or flags.returncode != 0:
        return None
    head: str | None = None
    changes: list[bytes] = []
    paths: list[str] = []
    for record in split_records(status.stdout):
        if record.startswith(b"# branch.oid "):
            oid = record[len(b"# branch.oid ") :].decode("ascii", "replace")
            head = None if oid == "(initial)" else oid
        elif not record.startswith(b"#"):
            changes.append(record)
            # Fields before the path: 8 for ordinary entries, 10 for
            # unmerged ones; "? path" for untracked files.
            fields = {b"1": 8, b"u": 10}.get(record[:1])
            raw = record.split(b" ", fields)[fields] if fields else record[2:]
            paths.append(decode_path(raw))
    # ls-files -v tags: "H" cached; lower case: assume-unchanged; "S": skip-worktree.
    entries = split_records(flags.stdout)
    hidden = any(record[:1].islower() or record[:1] == b"S" for record in entries)
    return RepositoryState(
        work_tree, subdirectory, head, b"\0".join(changes), tuple(paths), hidden, tracked_files=len(entries)
    )


def is_ignored_by_git(root: RepositoryRoot) -> bool:
    """Tell whether git ignores the folder ``root.subdirectory`` (then git lists nothing in it)."""
    if not root.subdirectory:
        return False
    runner = GitRunner(root.work_tree, root.subdirectory)
    folder = filesystem_path(root.subdirectory)
    return runner.run("check-ignore", "-q", "--", folder, allowed_exit_codes=(0, 1)).returncode == 0


def list_repository(
    root: RepositoryRoot,
    directory: str,
    *,
    max_stale_share: float = DEFAULT_MAX_STALE_SHARE,
    times_cache: CommitTimesCache | None = None,
) -> Listing:
    """List the repository folder ``directory`` (found as ``root``) as the module docstring says.

    With ``max_stale_share`` above 0 the listing is layered when history
    allows (see :mod:`longctx.sources.history`): candidates carry their
    layer, and the base's copies of changed files come as extra candidates
    (``earlier``) with their bytes.

    Last-commit times are kept in ``times_cache`` when given (never for a
    shallow repository: see :mod:`longctx.sources.history`).

    Raises :class:`~longctx.errors.SourceError` when git fails.
    """
    runner = GitRunner(root.work_tree, directory)
    pathspec = ("--", filesystem_path(root.subdirectory)) if root.subdirectory else ()
    head_sha = head_commit(runner)
    if head_sha is not None:
        times_cache = usable_times_cache(runner, times_cache)
    files = _work_tree_files(runner, pathspec)
    rules = _longctx_rules(root, [*files.tracked, *files.untracked])

    def considered(repo_path: str) -> bool:
        return not (rules and rules.is_ignored_within(repo_path))

    wanted = {
        path for path, mode in files.tracked.items() if mode != SUBMODULE_MODE and path not in files.deleted
    }
    history = _history(
        runner,
        pathspec,
        head_sha,
        wanted,
        considered,
        max_stale_share=max_stale_share,
        times_cache=times_cache,
    )
    entries = _Entries(root, os.path.realpath(directory), considered)
    entries.add_tracked(files, history)
    entries.add_untracked(files.untracked, layered=history.layering is not None)
    entries.add_earlier(history)
    logger.debug(
        "repository: %d tracked, %d untracked, %d modified, history for %d of %d files",
        len(files.tracked),
        len(files.untracked),
        len(files.modified),
        len(history.times),
        len(wanted),
    )
    return Listing(
        tuple(entries.candidates),
        tuple(entries.skipped),
        head_sha=head_sha,
        is_repository=True,
        layer_base=None if history.layering is None else history.layering.base,
        layer_note=history.note,
    )


@record_type(slots=True)
class _WorkTreeFiles:
    """What git lists in the folder: tracked paths with their modes, untracked ones, and the dirty ones."""

    tracked: dict[str, str]  # repository path -> mode
    untracked: list[str]
    modified: set[str]
    deleted: set[str]


def _work_tree_files(runner: GitRunner, pathspec: tuple[str, ...]) -> _WorkTreeFiles:
    """Ask git for the folder's tracked files (with modes), untracked ones it does not ignore, dirty ones."""
    tracked: dict[str, str] = {}
    for record in split_records(runner.run("ls-files", "-z", "--stage", *pathspec).stdout):
        meta, _, raw_path = record.partition(b"\t")
        # Unmerged paths appear once per stage; any stage gives the mode.
        tracked.setdefault(decode_path(raw_path), meta.split(b" ", 1)[0].decode("ascii"))
    untracked = [
        decode_path(record)
        for record in split_records(
            runner.run("ls-files", "-z", "--others", "--exclude-standard", *pathspec).stdout
        )
    ]
    modified, deleted = _dirty_paths(
        runner.run(
            "status",
            "--porcelain=v1",
            "-z",
            "--untracked-files=no",
            "--no-renames",
            "--ignore-submodules=all",
            *pathspec,
        ).stdout
    )
    return _WorkTreeFiles(tracked, untracked, modified, deleted)


@record_type(slots=True)
class _History:
    """The listing's layering (None for a plain one) and last-commit times.

    ``times`` holds every file's time in a plain listing, and the base's
    files' times as of the base in a layered one; ``times_now`` the changed
    files' own (layered listings only).
    """

    layering: Layering | None
    note: str | None
    times: dict[str, int]
    times_now: dict[str, int]


def _history(
    runner: GitRunner,
    pathspec: tuple[str, ...],
    head_sha: str | None,
    wanted: set[str],
    considered: Callable[[str], bool],
    *,
    max_stale_share: float,
    times_cache: CommitTimesCache | None,
) -> _History:
    """Choose the layering (when there is history) and read the last-commit times it needs."""
    if head_sha is None:
        return _History(None, None, {}, {})
    plan = plan_layers(runner, pathspec, max_stale_share=max_stale_share, considered=considered)
    layering = plan.layering
    if layering is None:
        times = last_commit_times(runner, wanted, pathspec, head_sha, times_cache) if wanted else {}
        return _History(None, plan.note, times, {})
    # The base's files are placed by their last commit as of the base
    # (the order the pack had then); the changed ones by their own.
    in_base = {path for path in layering.base_tree if considered(path)}
    times = last_commit_times(runner, in_base, pathspec, layering.base, times_cache)
    changed = wanted & layering.changed
    times_now = last_commit_times(runner, changed, pathspec, head_sha, times_cache) if changed else {}
    return _History(layering, plan.note, times, times_now)


@record_type(frozen=False, slots=True)
class _Entries:
    """The listing as it is built: the candidates and skips so far, and what is considered at all."""

    root: RepositoryRoot
    root_real: str
    considered: Callable[[str], bool]
    candidates: list[Candidate] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)

    def path(self, repo_path: str) -> str:
        """The path relative to the folder asked for."""
        return repo_path.removeprefix(self.root.subdirectory + "/" if self.root.subdirectory else "")

    def location(self, repo_path: str) -> str:
        return os.path.join(self.root.work_tree, filesystem_path(repo_path))

    def add_tracked(self, files: _WorkTreeFiles, history: _History) -> None:
        """Tracked files as candidates; submodules and files deleted in the work tree as skips."""
        layering = history.layering
        for repo_path, mode in files.tracked.items():
            if not self.considered(repo_path):
                continue
            path = self.path(repo_path)
            if mode == SUBMODULE_MODE:
                self.skipped.append(
                    Skip(path + "/", SkipReason.SUBMODULE, ("git submodule; not descended into",))
                )
            elif repo_path in files.deleted:
                self.skipped.append(Skip(path, SkipReason.UNREADABLE, ("deleted in the working tree",)))
            else:
                layer = None
                if layering is not None:
                    layer = 1 if repo_path in layering.changed or repo_path not in layering.base_tree else 0
                self.candidates.append(
                    Candidate(
                        path=path,
                        location=self.location(repo_path),
                        root_real=self.root_real,
                        last_commit_time=(history.times_now if layer == 1 else history.times).get(repo_path),
                        dirty=repo_path in files.modified,
                        layer=layer,
                    )
                )

    def add_untracked(self, untracked: list[str], *, layered: bool) -> None:
        """Untracked files as dirty candidates (new since any base); nested repositories as skips."""
        for repo_path in untracked:
            if repo_path.endswith("/"):
                # git shows a nested repository as one entry and does not enter it.
                if self.considered(repo_path.rstrip("/")):
                    self.skipped.append(
                        Skip(
                            self.path(repo_path),
                            SkipReason.SUBMODULE,
                            ("nested git repository, not a registered submodule",),
                        )
                    )
                continue
            if self.considered(repo_path):
                self.candidates.append(
                    Candidate(
                        path=self.path(repo_path),
                        location=self.location(repo_path),
                        root_real=self.root_real,
                        dirty=True,
                        notes=("untracked",),
                        layer=1 if layered else None,
                    )
                )

    def add_earlier(self, history: _History) -> None:
        """The base's copies of files changed or deleted since, with their bytes (layered listings only)."""
        if history.layering is None:
            return
        for repo_path, content in history.layering.earlier.items():
            self.candidates.append(
                Candidate(
                    path=self.path(repo_path),
                    location=self.location(repo_path),
                    root_real=self.root_real,
                    last_commit_time=history.times.get(repo_path),
                    layer=0,
                    content=content,
                )
            )


def _dirty_paths(status_output: bytes) -> tuple[set[str], set[str]]:
    """Parse ``git status --porcelain=v1 -z`` into (paths changed in any way, paths deleted)."""
    modified: set[str] = set()
    deleted: set[str] = set()
    records = iter(split_records(status_output))
    for record in records:
        if len(record) < 4:
            continue
        code, path = record[:2].decode("ascii", "replace"), decode_path(record[3:])
        modified.add(path)
        if code[1] == "D":
            deleted.add(path)
        if code[0] in "RC":
            next(records, None)  # the source path of a rename or copy follows
    return modified, deleted


def _longctx_rules(root: RepositoryRoot, listed: list[str]) -> IgnoreRules:
    """Collect ``.longctxignore`` files: above the folder asked for, and listed inside it."""
    directories = {""}
    if root.subdirectory:
        directories.update(parent_directories(root.subdirectory), [root.subdirectory])
    directories |= {path.rpartition("/")[0] for path in listed if path.rpartition("/")[2] == _LONGCTX_IGNORE}
    rules = IgnoreRules()
    for directory in sorted(directories, key=lambda d: d.encode("utf-8", "surrogateescape")):
        location = os.path.join(root.work_tree, filesystem_path(directory), _LONGCTX_IGNORE)
        try:
            with open(location, "rb") as handle:
                lines = handle.read().decode("utf-8", "surrogateescape").splitlines()
        except FileNotFoundError:
            continue
        except OSError as error:
            logger.warning("cannot read %s: %s", f"{directory}/{_LONGCTX_IGNORE}".lstrip("/"), error.strerror)
            continue
        invalid = rules.add(directory, lines)
        if invalid:
            logger.warning(
                "%s: %d invalid pattern(s) ignored",
                f"{directory}/{_LONGCTX_IGNORE}".lstrip("/"),
                len(invalid),
            )
    return rules
