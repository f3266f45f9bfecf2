"""Git work trees, through GitPython's command runner (the only module that imports GitPython).

Only ``git.cmd.Git`` is used, imported on first use: it runs the listing
commands below with NUL-separated output, while GitPython's object model
(``git.Repo``), which would read the repository's objects, costs time on
every pack for nothing these commands need. The few short commands that
locate a work tree and take its state (:func:`find_repository`,
:func:`repository_state`) run git with :mod:`subprocess` directly: they are
all a re-pack of an unchanged repository runs, and GitPython's import alone
(about 70 ms) would be a fifth of that re-pack.

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
its last commit time (stopped early, so an old repository costs only the
history needed). That walk reaches the root commit in a mature repository
(some file was last touched near it), so with a :class:`CommitTimesCache`
(the :class:`~longctx.store.Store` is one) its result is kept by commit,
folder and set of paths: a layered repository walks once per base commit,
not on every edit. A shallow repository's walks are not kept (deepening
it changes what the same commit's history holds).

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

import hashlib
import logging
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Final, Protocol

from longctx.errors import SourceError
from longctx.ignore import IgnoreRules, parent_directories
from longctx.sources import Candidate, Listing, Skip, SkipReason
from longctx.sources.files import filesystem_path, is_inside, relative_target
from longctx.config import DEFAULT_MAX_STALE_SHARE
from longctx.sources.layers import plan_layers

if TYPE_CHECKING:
    from git.cmd import Git

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

_SUBMODULE_MODE: Final = "160000"
_LONGCTX_IGNORE: Final = ".longctxignore"
_READ_CHUNK: Final = 1 << 16
_TIMES_KEY_VERSION: Final = "commit-times/1"  # bump when what _last_commit_times returns changes
_STDERR_LIMIT: Final = 500

# Options that make git's output independent of the user's configuration:
# no index refresh written to disk, pathspecs taken literally (a folder
# called "[abc]" is not a glob), no pager, no colours.
_GIT_OPTIONS: Final = ("--no-pager", "--no-optional-locks", "-c", "color.ui=false")
_LITERAL: Final = "--literal-pathspecs"  # check-ignore rejects it: its arguments are paths already


@dataclass(frozen=True, slots=True)
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
    itself refuses to name a work tree for them).
    """
    target = os.path.realpath(directory)
    if not os.path.isdir(target):
        return None
    top = _plain_git(target, "rev-parse", "--show-toplevel")
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


class _Git:
    """Runs git in one work tree and turns failures into SourceError."""

    def __init__(self, root: RepositoryRoot, display_path: str) -> None:
        self.work_tree = root.work_tree
        self.display_path = display_path
        self.executable = _git_executable()
        # GitPython stops a streamed process when its wrapper is dropped:
        # the wrappers live as long as this runner.
        self._streams: list[Any] = []

    def command(self, *arguments: str) -> list[str]:
        literal = () if arguments[0] == "check-ignore" else (_LITERAL,)
        return [self.executable, *_GIT_OPTIONS, *literal, *arguments]

    def run(self, *arguments: str, allowed_exit_codes: tuple[int, ...] = (0,)) -> bytes:
        """Run git with ``arguments`` and return its standard output."""
        status, output, stderr = self._execute(arguments)
        if status not in allowed_exit_codes:
            raise SourceError(
                f"git {arguments[0]} failed (exit {status}): {_stderr_text(stderr)}", path=self.display_path
            )
        return output

    def exit_status(self, *arguments: str, allowed_exit_codes: tuple[int, ...]) -> int:
        """Run git with ``arguments`` and return its exit status, one of ``allowed_exit_codes``."""
        status, _, stderr = self._execute(arguments)
        if status not in allowed_exit_codes:
            raise SourceError(
                f"git {arguments[0]} failed (exit {status}): {_stderr_text(stderr)}", path=self.display_path
            )
        return status

    def _execute(self, arguments: tuple[str, ...]) -> tuple[int, bytes, bytes]:
        outcome = _execute(self.work_tree, self.command(*arguments))
        if outcome is None:
            raise SourceError("git is not installed or not on PATH", path=self.display_path)
        return outcome

    def popen(self, *arguments: str, stdin: bool = False) -> subprocess.Popen[bytes]:
        """Start git with ``arguments``, output on a pipe (for streamed reading), input too if asked."""
        from git.exc import GitCommandNotFound

        try:
            process = _runner(self.work_tree).execute(
                self.command(*arguments),
                as_process=True,
                istream=subprocess.PIPE if stdin else None,
                env=_git_environment(),
            )
        except (OSError, GitCommandNotFound):
            raise SourceError("git is not installed or not on PATH", path=self.display_path) from None
        self._streams.append(process)
        popen: subprocess.Popen[bytes] | None = process.proc
        if popen is None:
            raise SourceError(f"git {arguments[0]} did not start", path=self.display_path)
        return popen

    def close(self) -> None:
        """Let go of the streamed processes (each has finished or been stopped by then)."""
        self._streams.clear()


@dataclass(frozen=True, slots=True)
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
    real = os.path.realpath(directory)
    top = _plain_git(real, "rev-parse", "--show-toplevel")
    if top is None or top.returncode != 0:
        return None
    work_tree = os.path.realpath(os.fsdecode(top.stdout.rstrip(b"\n")))
    if not is_inside(real, work_tree):
        return None
    subdirectory = relative_target(real, work_tree)
    subdirectory = "" if subdirectory == "." else subdirectory
    if ".git" in subdirectory.split("/"):
        return None
    pathspec = ("--", filesystem_path(subdirectory)) if subdirectory else ()
    if subdirectory:
        ignored = _plain_git(work_tree, "check-ignore", "-q", "--", filesystem_path(subdirectory))
        if ignored is None or ignored.returncode != 1:  # 0: ignored; 128: git failed
            return None
    # Both at once: status dominates, and ls-files -v runs in its shadow.
    status, flags = _plain_git_together(
        work_tree,
        [
            (_LITERAL, "status", "--porcelain=v2", "--branch", "-z", "--untracked-files=all",
             "--no-renames", "--ignore-submodules=dirty", *pathspec),
            (_LITERAL, "ls-files", "-v", "-z", *pathspec),
        ],
    )  # fmt: skip
    if status is None or status.returncode != 0 or flags is None or flags.returncode != 0:
        return None
    head: str | None = None
    changes: list[bytes] = []
    paths: list[str] = []
    for record in _split_records(status.stdout):
        if record.startswith(b"# branch.oid "):
            oid = record[len(b"# branch.oid ") :].decode("ascii", "replace")
            head = None if oid == "(initial)" else oid
        elif not record.startswith(b"#"):
            changes.append(record)
            # Fields before the path: 8 for ordinary entries, 10 for
            # unmerged ones; "? path" for untracked files.
            fields = {b"1": 8, b"u": 10}.get(record[:1])
            raw = record.split(b" ", fields)[fields] if fields else record[2:]
            paths.append(_git_path(raw))
    # ls-files -v tags: "H" cached; lower case: assume-unchanged; "S": skip-worktree.
    entries = _split_records(flags.stdout)
    hidden = any(record[:1].islower() or record[:1] == b"S" for record in entries)
    return RepositoryState(
        work_tree, subdirectory, head, b"\0".join(changes), tuple(paths), hidden, tracked_files=len(entries)
    )


def _git_environment() -> dict[str, str]:
    # Messages in English whatever the user's locale (as GitPython ran git);
    # paths travel as raw bytes (-z) either way.
    return {**os.environ, "LANGUAGE": "C", "LC_ALL": "C"}


def _git_executable() -> str:
    # GitPython's own variable for the git binary.
    return os.environ.get("GIT_PYTHON_GIT_EXECUTABLE") or "git"


@dataclass(frozen=True, slots=True)
class _Completed:
    returncode: int
    stdout: bytes
    stderr: bytes


@cache
def _runner(cwd: str) -> Git:
    from git.cmd import Git

    return Git(cwd)


def _execute(cwd: str, command: list[str]) -> tuple[int, bytes, bytes] | None:
    """Run ``command`` in ``cwd`` through GitPython; (status, stdout, stderr), or None without git."""
    from git.exc import GitCommandNotFound

    try:
        result: Any = _runner(cwd).execute(
            command,
            with_extended_output=True,
            with_exceptions=False,
            stdout_as_string=False,
            strip_newline_in_stdout=False,
            env=_git_environment(),
        )
    except (OSError, GitCommandNotFound):
        return None
    status, stdout, stderr = result
    return int(status), _as_bytes(stdout), _as_bytes(stderr)


def _plain_git(cwd: str, *arguments: str) -> _Completed | None:
    """Run git in ``cwd`` with :class:`_Git`'s options, without GitPython; None when git cannot run."""
    return _plain_git_together(cwd, [arguments])[0]


def _plain_git_together(cwd: str, commands: Sequence[Sequence[str]]) -> list[_Completed | None]:
    """Run several git commands in ``cwd`` at the same time, as :func:`_plain_git` runs one.

    Their outputs are read one process after the other: a later one whose
    pipe fills waits until it is read, which cannot deadlock (no process
    waits on another).
    """
    environment = _git_environment()
    started: list[subprocess.Popen[bytes] | None] = []
    for arguments in commands:
        try:
            started.append(
                subprocess.Popen(
                    [_git_executable(), *_GIT_OPTIONS, *arguments],
                    cwd=cwd,
                    env=environment,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
            )
        except OSError:
            started.append(None)
    results: list[_Completed | None] = []
    for process in started:
        if process is None:
            results.append(None)
            continue
        stdout, stderr = process.communicate()
        results.append(_Completed(process.returncode, stdout, stderr))
    return results


def _as_bytes(stream: object) -> bytes:
    if isinstance(stream, bytes):
        return stream
    return str(stream or "").encode("utf-8", "surrogateescape")


def _stderr_text(stderr: object) -> str:
    text = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else str(stderr)
    text = " ".join(text.split())
    return text[:_STDERR_LIMIT]


def is_ignored_by_git(root: RepositoryRoot) -> bool:
    """Tell whether git ignores the folder ``root.subdirectory`` (then git lists nothing in it)."""
    if not root.subdirectory:
        return False
    runner = _Git(root, root.subdirectory)
    try:
        folder = filesystem_path(root.subdirectory)
        return runner.exit_status("check-ignore", "-q", "--", folder, allowed_exit_codes=(0, 1)) == 0
    finally:
        runner.close()


def _git_path(raw: bytes) -> str:
    # Git paths are bytes; UTF-8 with surrogateescape names them the same
    # way under every locale (see files.display_path).
    return raw.decode("utf-8", "surrogateescape")


def _split_records(output: bytes) -> list[bytes]:
    records = output.split(b"\0")
    if records and records[-1] == b"":
        records.pop()
    return records


def _head_sha(runner: _Git) -> str | None:
    output = runner.run("rev-parse", "-q", "--verify", "HEAD^{commit}", allowed_exit_codes=(0, 1))
    # Exit 1 without output: an unborn branch, no commit yet.
    sha = output.decode("ascii", "replace").strip()
    return sha or None


class CommitTimesCache(Protocol):
    """Where last-commit times are kept, under a key that names the commit, folder and paths walked for."""

    def commit_times(self, key: str) -> dict[str, int] | None: ...

    def save_commit_times(self, key: str, times: dict[str, int]) -> None: ...


def list_repository(
    root: RepositoryRoot,
    directory: str,
    *,
    max_stale_share: float = DEFAULT_MAX_STALE_SHARE,
    times_cache: CommitTimesCache | None = None,
) -> Listing:
    """List the repository folder ``directory`` (found as ``root``) as the module docstring says.

    With ``max_stale_share`` above 0 the listing is layered when history
    allows (see :mod:`longctx.sources.layers`): candidates carry their
    layer, and the base's copies of changed files come as extra candidates
    (``earlier``) with their bytes.

    Last-commit times are kept in ``times_cache`` when given (see above).

    Raises :class:`~longctx.errors.SourceError` when git fails.
    """
    runner = _Git(root, directory)
    try:
        return _list(runner, root, directory, max_stale_share, times_cache)
    finally:
        runner.close()


def _list(
    runner: _Git,
    root: RepositoryRoot,
    directory: str,
    max_stale_share: float,
    times_cache: CommitTimesCache | None,
) -> Listing:
    pathspec = ("--", filesystem_path(root.subdirectory)) if root.subdirectory else ()
    prefix = root.subdirectory + "/" if root.subdirectory else ""
    root_real = os.path.realpath(directory)
    head_sha = _head_sha(runner)
    if times_cache is not None and head_sha is not None and _is_shallow(runner):
        times_cache = None

    tracked: dict[str, str] = {}  # repository path -> mode
    for record in _split_records(runner.run("ls-files", "-z", "--stage", *pathspec)):
        meta, _, raw_path = record.partition(b"\t")
        # Unmerged paths appear once per stage; any stage gives the mode.
        tracked.setdefault(_git_path(raw_path), meta.split(b" ", 1)[0].decode("ascii"))
    untracked = [
        _git_path(record)
        for record in _split_records(
            runner.run("ls-files", "-z", "--others", "--exclude-standard", *pathspec)
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
        )
    )
    rules = _longctx_rules(root, [*tracked, *untracked])

    def considered(repo_path: str) -> bool:
        return not (rules and rules.is_ignored_within(repo_path))

    wanted = {path for path, mode in tracked.items() if mode != _SUBMODULE_MODE and path not in deleted}
    layering = None
    times_now: dict[str, int] = {}
    if head_sha is not None:
        layering = plan_layers(
            runner, pathspec, max_stale_share=max_stale_share, considered=considered, git_path=_git_path
        )
    if layering is None:
        times = (
            _cached_commit_times(runner, wanted, pathspec, head_sha, times_cache)
            if head_sha is not None and wanted
            else {}
        )
    else:
        assert head_sha is not None  # layering needs history
        # The base's files are placed by their last commit as of the base
        # (the order the pack had then); the changed ones by their own.
        in_base = {path for path in layering.base_tree if considered(path)}
        times = _cached_commit_times(runner, in_base, pathspec, layering.base, times_cache)
        changed = wanted & layering.changed
        times_now = _cached_commit_times(runner, changed, pathspec, head_sha, times_cache) if changed else {}
    candidates: list[Candidate] = []
    skipped: list[Skip] = []

    def layer_of(repo_path: str) -> int | None:
        if layering is None:
            return None
        return 1 if repo_path in layering.changed or repo_path not in layering.base_tree else 0

    for repo_path, mode in tracked.items():
        if not considered(repo_path):
            continue
        path = repo_path.removeprefix(prefix)
        if mode == _SUBMODULE_MODE:
            skipped.append(Skip(path + "/", SkipReason.SUBMODULE, ("git submodule; not descended into",)))
        elif repo_path in deleted:
            skipped.append(Skip(path, SkipReason.UNREADABLE, ("deleted in the working tree",)))
        else:
            layer = layer_of(repo_path)
            candidates.append(
                Candidate(
                    path=path,
                    location=os.path.join(root.work_tree, filesystem_path(repo_path)),
                    root_real=root_real,
                    last_commit_time=times_now.get(repo_path) if layer == 1 else times.get(repo_path),
                    dirty=repo_path in modified,
                    layer=layer,
                )
            )
    for repo_path in untracked:
        if repo_path.endswith("/"):
            # git shows a nested repository as one entry and does not enter it.
            if considered(repo_path.rstrip("/")):
                skipped.append(
                    Skip(
                        repo_path.removeprefix(prefix),
                        SkipReason.SUBMODULE,
                        ("nested git repository, not a registered submodule",),
                    )
                )
            continue
        if considered(repo_path):
            candidates.append(
                Candidate(
                    path=repo_path.removeprefix(prefix),
                    location=os.path.join(root.work_tree, filesystem_path(repo_path)),
                    root_real=root_real,
                    dirty=True,
                    notes=("untracked",),
                    layer=None if layering is None else 1,
                )
            )
    if layering is not None:
        for repo_path, content in layering.earlier.items():
            candidates.append(
                Candidate(
                    path=repo_path.removeprefix(prefix),
                    location=os.path.join(root.work_tree, filesystem_path(repo_path)),
                    root_real=root_real,
                    last_commit_time=times.get(repo_path),
                    layer=0,
                    content=content,
                )
            )
    logger.debug(
        "repository: %d tracked, %d untracked, %d modified, history for %d of %d files",
        len(tracked),
        len(untracked),
        len(modified),
        len(times),
        len(wanted),
    )
    return Listing(
        tuple(candidates),
        tuple(skipped),
        head_sha=head_sha,
        is_repository=True,
        layer_base=None if layering is None else layering.base,
    )


def _dirty_paths(status_output: bytes) -> tuple[set[str], set[str]]:
    """Parse ``git status --porcelain=v1 -z`` into (paths changed in any way, paths deleted)."""
    modified: set[str] = set()
    deleted: set[str] = set()
    records = iter(_split_records(status_output))
    for record in records:
        if len(record) < 4:
            continue
        code, path = record[:2].decode("ascii", "replace"), _git_path(record[3:])
        modified.add(path)
        if code[1] == "D":
            deleted.add(path)
        if code[0] in "RC":
            next(records, None)  # the source path of a rename or copy follows
    return modified, deleted


def _is_shallow(runner: _Git) -> bool:
    return runner.run("rev-parse", "--is-shallow-repository").strip() == b"true"


def _cached_commit_times(
    runner: _Git,
    wanted: set[str],
    pathspec: tuple[str, ...],
    commit: str,
    cache: CommitTimesCache | None,
) -> dict[str, int]:
    """:func:`_last_commit_times` as of ``commit`` (a full sha), through ``cache`` when given.

    The key names everything the walk depends on: the commit (its history
    cannot change, short of a shallow repository, which is never cached),
    the folder, and the paths asked for (the walk stops once it has them).
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
    runner: _Git, wanted: set[str], pathspec: tuple[str, ...], revision: str = "HEAD"
) -> dict[str, int]:
    """Map each path in ``wanted`` to the committer time of its newest commit in ``revision``'s history.

    One ``git log`` streams the history newest first; it is stopped as soon
    as every wanted path has been seen.
    """
    # -z output: each commit is "\0<time>\0" followed by its files, each
    # ending in "\0", the first one prefixed with "\n". A file name is never
    # empty, so an empty token always starts a commit header.
    times: dict[str, int] = {}
    remaining = set(wanted)
    popen = runner.popen(
        "log",
        "-z",
        "--name-only",
        "--no-renames",
        "--no-show-signature",
        "--format=%x00%ct",
        revision,
        *pathspec,
    )
    assert popen.stdout is not None
    reached_end = False
    try:
        pending = b""
        state = "file"
        commit_time = 0
        while remaining:
            chunk = os.read(popen.stdout.fileno(), _READ_CHUNK)
            if not chunk:
                reached_end = True
                break
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
                    path = _git_path(name)
                    if path in remaining:
                        remaining.discard(path)
                        times[path] = commit_time
    finally:
        if not reached_end and popen.poll() is None:
            # Every wanted path has its time (or we are unwinding an
            # error): the rest of history is not needed.
            popen.kill()
        _, stderr = popen.communicate()
    if reached_end and popen.returncode != 0:
        raise SourceError(
            f"git log failed (exit {popen.returncode}): {_stderr_text(stderr)}", path=runner.display_path
        )
    return times


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
