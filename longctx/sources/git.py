"""Git: the one place longctx starts git, and the only module that imports GitPython.

Every command runs as ``git --no-pager --no-optional-locks -c color.ui=false
--literal-pathspecs ...`` (``check-ignore`` rejects the last option: its
arguments are paths already), with messages in English whatever the locale,
and finishes as one :class:`GitResult`: exit status, standard output and
standard error, byte for byte. Paths travel NUL-separated (``-z``) and are
decoded by :func:`decode_path`.

Two ways to start git, for two kinds of caller:

- :class:`GitRunner` runs a listing's commands in one work tree through
  GitPython's command runner (``git.cmd.Git``; GitPython is the project's
  chosen git library), imported on first use. GitPython's object model
  (``git.Repo``), which would read the repository's objects, costs time on
  every pack for nothing these commands need, so it is never used. A failure
  raises :class:`~longctx.errors.SourceError` naming the command; large
  outputs can be streamed (:meth:`GitRunner.stream`).
- :func:`probe` and :func:`probe_together` run the few short commands that
  locate a work tree and take its state with :mod:`subprocess` directly, and
  never raise: they are all that a re-pack of an unchanged repository runs,
  and GitPython's import alone (about 70 ms) would be a fifth of that
  re-pack. Before them, :func:`could_find_repository` tells a folder git
  could find no repository from without starting git at all.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Generator, Sequence
from functools import cache
from typing import TYPE_CHECKING, Final

from longctx.errors import SourceError
from longctx.recordtypes import record_type

if TYPE_CHECKING:
    from git.cmd import Git

__all__ = [
    "SUBMODULE_MODE",
    "GitResult",
    "GitRunner",
    "could_find_repository",
    "decode_path",
    "probe",
    "probe_together",
    "split_records",
]

SUBMODULE_MODE: Final = "160000"
"""The mode git gives a submodule (a commit, not a file) in the index and in trees."""

_READ_CHUNK: Final = 1 << 16
_STDERR_LIMIT: Final = 500

# Options that make git's output independent of the user's configuration:
# no index refresh written to disk, no pager, no colours; pathspecs taken
# literally (a folder called "[abc]" is not a glob).
_GIT_OPTIONS: Final = ("--no-pager", "--no-optional-locks", "-c", "color.ui=false")
_LITERAL: Final = "--literal-pathspecs"


@record_type(slots=True)
class GitResult:
    """A finished git command: its exit status and its two outputs, exactly as git wrote them."""

    returncode: int
    stdout: bytes
    stderr: bytes


def decode_path(raw: bytes) -> str:
    """A path as git printed it (bytes), as a str: UTF-8, other bytes as lone surrogates.

    ``surrogateescape`` names a path the same way under every locale (see
    :func:`longctx.sources.files.display_path`), and encodes back to the
    same bytes.
    """
    return raw.decode("utf-8", "surrogateescape")


def split_records(output: bytes) -> list[bytes]:
    """Split NUL-terminated output (``-z``) into its records, without the empty one after the last NUL."""
    records = output.split(b"\0")
    if records and records[-1] == b"":
        records.pop()
    return records


def probe(cwd: str, *arguments: str) -> GitResult | None:
    """Run git with ``arguments`` in ``cwd``, without GitPython; None when git cannot be started there.

    A failing command is a result like any other (see ``returncode``):
    callers of a probe ask a question that "no" answers.
    """
    return probe_together(cwd, [arguments])[0]


def probe_together(cwd: str, commands: Sequence[Sequence[str]]) -> list[GitResult | None]:
    """Run several git commands in ``cwd`` at the same time, as :func:`probe` runs one; results in order.

    Their outputs are read one process after the other: a later one whose
    pipe fills waits until it is read, which cannot deadlock (no process
    waits on another).
    """
    environment = _environment()
    started: list[subprocess.Popen[bytes] | None] = []
    for arguments in commands:
        try:
            started.append(
                subprocess.Popen(
                    _command(_executable(), arguments),
                    cwd=cwd,
                    env=environment,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
            )
        except OSError:  # no git, or cwd is not a folder
            started.append(None)
    results: list[GitResult | None] = []
    for process in started:
        if process is None:
            results.append(None)
            continue
        stdout, stderr = process.communicate()
        results.append(GitResult(process.returncode, stdout, stderr))
    return results


# The variables that let git find a repository other than by looking up from the folder.
_DISCOVERY_VARIABLES: Final = ("GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR")


def could_find_repository(target: str) -> bool:
    """False only where git's discovery finds no repository from the folder ``target`` (a resolved path).

    Git looks in the folder and each parent for a ``.git`` entry (a folder,
    or a file naming one) or for a folder that is itself a git directory
    (``HEAD``, ``objects`` and ``refs``), unless a variable names one. A
    folder with none of these above it is told without starting git: a
    process each time, and a batch over a folder asks two to four times.
    """
    if any(name in os.environ for name in _DISCOVERY_VARIABLES):
        return True
    folder = target
    while True:
        if os.path.lexists(os.path.join(folder, ".git")) or (
            os.path.lexists(os.path.join(folder, "HEAD"))
            and os.path.isdir(os.path.join(folder, "objects"))
            and os.path.isdir(os.path.join(folder, "refs"))
        ):
            return True
        parent = os.path.dirname(folder)
        if parent == folder:
            return False
        folder = parent


class GitRunner:
    """Runs git in one work tree through GitPython; failures become SourceError naming ``display_path``.

    Holds no process between calls: each finishes (or, streamed, is
    stopped) before its method returns.
    """

    def __init__(self, work_tree: str, display_path: str) -> None:
        self.work_tree = work_tree
        self.display_path = display_path
        self.executable = _executable()

    def run(
        self, *arguments: str, allowed_exit_codes: tuple[int, ...] = (0,), input: bytes | None = None
    ) -> GitResult:
        """Run git with ``arguments`` (``input`` on its standard input, if given) and wait for it.

        Raises :class:`~longctx.errors.SourceError` when git cannot be
        started or exits with a status not in ``allowed_exit_codes``; the
        message names the git command and quotes its standard error.
        """
        process, _wrapper = self._start(arguments, stdin=input is not None)
        stdout, stderr = process.communicate(input)
        result = GitResult(process.returncode, stdout, stderr)
        if result.returncode not in allowed_exit_codes:
            raise self._failure(arguments, result.returncode, stderr)
        return result

    def stream(self, *arguments: str) -> Generator[bytes, None, None]:
        """Yield git's standard output in chunks as git writes it (git starts at the first chunk asked for).

        Closing the iterator before the end (use :func:`contextlib.closing`)
        stops git: a caller that has what it needs saves the rest of the
        work. Raises :class:`~longctx.errors.SourceError` when git cannot be
        started, or exits with a non-zero status once its whole output has
        been read.
        """
        process, _wrapper = self._start(arguments, stdin=False)
        assert process.stdout is not None
        finished = False
        try:
            while chunk := os.read(process.stdout.fileno(), _READ_CHUNK):
                yield chunk
            finished = True
        finally:
            if not finished and process.poll() is None:
                process.kill()  # stopped early, or unwinding an error: the rest is not needed
            _, stderr = process.communicate()
        if process.returncode != 0:
            raise self._failure(arguments, process.returncode, stderr)

    def _start(self, arguments: Sequence[str], *, stdin: bool) -> tuple[subprocess.Popen[bytes], object]:
        """Start git; the process and GitPython's wrapper, which stops the process when it is dropped.

        The caller keeps the wrapper until the process has finished.
        """
        # Imported here, not at the top: the probes above, all a re-pack of
        # an unchanged repository runs, must not pay for GitPython's import.
        from git.exc import GitCommandNotFound

        try:
            wrapper = _gitpython(self.work_tree).execute(
                _command(self.executable, arguments),
                as_process=True,
                istream=subprocess.PIPE if stdin else None,
                env=_environment(),
            )
        except (OSError, GitCommandNotFound):
            raise SourceError("git is not installed or not on PATH", path=self.display_path) from None
        process: subprocess.Popen[bytes] | None = wrapper.proc
        if process is None:
            raise SourceError(f"git {arguments[0]} did not start", path=self.display_path)
        return process, wrapper

    def _failure(self, arguments: Sequence[str], returncode: int, stderr: bytes) -> SourceError:
        text = " ".join(stderr.decode("utf-8", "replace").split())[:_STDERR_LIMIT]
        return SourceError(f"git {arguments[0]} failed (exit {returncode}): {text}", path=self.display_path)


def _command(executable: str, arguments: Sequence[str]) -> list[str]:
    literal = () if arguments[0] == "check-ignore" else (_LITERAL,)
    return [executable, *_GIT_OPTIONS, *literal, *arguments]


def _environment() -> dict[str, str]:
    # Messages in English whatever the user's locale (as GitPython runs
    # git); paths travel as raw bytes (-z) either way.
    return {**os.environ, "LANGUAGE": "C", "LC_ALL": "C"}


def _executable() -> str:
    # GitPython's own variable for the git binary, honoured by the probes too.
    return os.environ.get("GIT_PYTHON_GIT_EXECUTABLE") or "git"


@cache
def _gitpython(cwd: str) -> Git:
    from git.cmd import Git  # see GitRunner._start: imported on first use

    return Git(cwd)
