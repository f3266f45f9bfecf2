"""Gitignore-style patterns: ignore files and include/exclude globs.

The only module that imports pathspec. Patterns follow ``.gitignore``
syntax (``*.log``, ``build/``, ``/top-only``, ``**/deep``, ``!negated``) and
match POSIX paths relative to a directory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from longctx.errors import ConfigError

if TYPE_CHECKING:
    # pathspec is imported when a pattern is first compiled: most packs have
    # no .longctxignore and no include/exclude patterns.
    from pathspec import GitIgnoreSpec

__all__ = ["GlobFilter", "IgnoreRules", "parent_directories"]


def parent_directories(path: str) -> list[str]:
    """Return the directories above the POSIX ``path``, outermost first (``a/b/c`` gives ``a``, ``a/b``)."""
    parts = path.split("/")
    return ["/".join(parts[:depth]) for depth in range(1, len(parts))]


def _compile(lines: Iterable[str], *, source: str) -> GitIgnoreSpec:
    from pathspec import GitIgnoreSpec

    try:
        return GitIgnoreSpec.from_lines(lines)
    except ValueError as error:  # pathspec's pattern errors are ValueErrors
        raise ConfigError(f"invalid pattern in {source}: {error}") from None


class IgnoreRules:
    """Rules from ignore files (``.gitignore``, ``.longctxignore``) at several directory levels.

    As in git, a file's rules apply below its directory, a deeper file
    overrides a shallower one, and within one file the last matching
    pattern wins. A path inside an ignored directory is ignored whatever
    the deeper rules say (:meth:`is_ignored_within` checks that;
    :meth:`is_ignored` assumes the caller pruned ignored directories).
    """

    def __init__(self) -> None:
        self._specs: dict[str, list[GitIgnoreSpec]] = {}

    def __bool__(self) -> bool:
        return bool(self._specs)

    def add(self, directory: str, lines: Iterable[str]) -> tuple[str, ...]:
        """Add the pattern ``lines`` of an ignore file in ``directory`` (POSIX, ``""`` for the root).

        Like git, an invalid line is ignored rather than fatal; the invalid
        lines are returned so the caller can report them.
        """
        from pathspec import GitIgnoreSpec

        kept = list(lines)
        try:
            spec = GitIgnoreSpec.from_lines(kept)
        except ValueError:
            valid, invalid = [], []
            for line in kept:
                try:
                    GitIgnoreSpec.from_lines([line])
                except ValueError:
                    invalid.append(line)
                else:
                    valid.append(line)
            spec = GitIgnoreSpec.from_lines(valid)
            self._specs.setdefault(directory, []).append(spec)
            return tuple(invalid)
        self._specs.setdefault(directory, []).append(spec)
        return ()

    def is_ignored(self, path: str, *, is_dir: bool) -> bool:
        """Tell whether the rules ignore ``path`` itself (its parents are not checked)."""
        if not self._specs:
            return False
        candidates = ["", *parent_directories(path)]
        for directory in reversed(candidates):
            specs = self._specs.get(directory)
            if not specs:
                continue
            relative = path[len(directory) + 1 :] if directory else path
            if is_dir:
                relative += "/"
            for spec in reversed(specs):
                verdict = spec.check_file(relative).include
                if verdict is not None:
                    return verdict
        return False

    def is_ignored_within(self, path: str) -> bool:
        """Tell whether the file ``path`` or one of its parent directories is ignored."""
        if not self._specs:
            return False
        if any(self.is_ignored(parent, is_dir=True) for parent in parent_directories(path)):
            return True
        return self.is_ignored(path, is_dir=False)


class GlobFilter:
    """The caller's include and exclude patterns.

    A path is kept when it (or one of its parent directories) matches an
    ``include`` pattern, or when there are none; and when neither it nor a
    parent directory matches an ``exclude`` pattern. Exclusion wins.
    """

    def __init__(self, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> None:
        self._include = _compile(include, source="include patterns") if include else None
        self._exclude = _compile(exclude, source="exclude patterns") if exclude else None

    def __bool__(self) -> bool:
        return self._include is not None or self._exclude is not None

    @staticmethod
    def _matches(spec: GitIgnoreSpec, path: str) -> bool:
        if spec.check_file(path).include:
            return True
        return any(spec.check_file(parent + "/").include for parent in parent_directories(path))

    def excludes(self, path: str) -> bool:
        """Tell whether the POSIX ``path`` is dropped by the patterns."""
        if self._exclude is not None and self._matches(self._exclude, path):
            return True
        return self._include is not None and not self._matches(self._include, path)
