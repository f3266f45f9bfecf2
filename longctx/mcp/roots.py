"""The folders a server that acts for an agent may read: its roots, and the check every path passes.

An agent acts on text it did not write (a README, an issue, a web page can
tell it to call a tool), so ``longctx mcp`` reads only inside its roots, the
convention of the MCP filesystem server:

1. the roots the client declares (MCP ``roots/list``, read again after
   ``notifications/roots/list_changed``), its ``file://`` ones;
2. else the folders given with ``--root`` (repeatable);
3. else the folder the server was started in.

A client that declares an empty list (or none that is a ``file://`` URI)
leaves the server on 2 or 3. A path is inside a root when, with ``~``
expanded, ``..`` removed and every symbolic link resolved, it is the root or
lies under it (the root's own links resolved too); anything else is refused
with an :class:`~longctx.errors.InputError` naming the rule, before anything
is read. If the client declared roots but could not list them, every path is
refused: the server does not guess.

:class:`AllowedRoots` is thread-safe: tool calls run in worker threads while
the client's roots change on the event loop. It imports no MCP SDK.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from urllib.parse import unquote, urlsplit

from longctx.errors import InputError
from longctx.recordtypes import record_type

__all__ = ["AllowedRoots", "RootsInForce", "resolved_path"]


def resolved_path(path: str | os.PathLike[str]) -> str:
    """``path`` as the file system sees it: ``~`` expanded, absolute, ``..`` removed, links resolved."""
    return os.path.realpath(os.path.expanduser(os.fspath(path)))


def _file_uri_path(uri: str) -> str | None:
    """The local path of a ``file://`` URI (percent-decoded), or None for any other URI."""
    parts = urlsplit(uri)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        return None
    return unquote(parts.path) or None


@record_type
class RootsInForce:
    """The roots a path is checked against now, and where they come from (``origin``, for messages).

    ``failure`` is set when the client declared roots that could not be
    listed: then no path is inside.
    """

    folders: tuple[str, ...]
    origin: str
    failure: str | None = None

    def describe(self) -> str:
        if self.failure is not None:
            return f"{self.origin}, which could not be listed: {self.failure}"
        return f"{self.origin}: {', '.join(self.folders)}"


class AllowedRoots:
    """The roots in force: the client's when it declared some, else ``folders``, else ``started_in``.

    Constructing one does no I/O; the roots are resolved when a path is
    checked, so a root that is a link is judged by where it points then.
    """

    def __init__(
        self, folders: Sequence[str | os.PathLike[str]] = (), *, started_in: str | None = None
    ) -> None:
        self._given = tuple(os.fspath(folder) for folder in folders)
        self._started_in = started_in
        self._client: tuple[str, ...] | None = None
        self._client_failure: str | None = None
        self._lock = threading.Lock()

    def use_client_roots(self, uris: Sequence[str] | None) -> None:
        """Follow the client's roots (``None``: it declares none); non-``file://`` URIs are ignored."""
        folders = None if uris is None else tuple(p for p in map(_file_uri_path, uris) if p is not None)
        with self._lock:
            self._client = folders or None
            self._client_failure = None

    def client_roots_failed(self, reason: str) -> None:
        """The client declared roots but listing them failed: refuse every path until they are listed."""
        with self._lock:
            self._client = None
            self._client_failure = reason

    def in_force(self) -> RootsInForce:
        """The roots a path is checked against now."""
        with self._lock:
            client, failure = self._client, self._client_failure
        if failure is not None:
            return RootsInForce((), "the client's roots", failure)
        if client:
            return RootsInForce(client, "the client's roots")
        if self._given:
            return RootsInForce(self._given, "the --root folders")
        return RootsInForce((self._started_in or os.getcwd(),), "the folder the server was started in")

    def check(self, paths: Sequence[str]) -> tuple[str, ...]:
        """``paths`` resolved (see :func:`resolved_path`) if every one lies inside a root in force.

        Raises :class:`~longctx.errors.InputError` naming the first path
        outside, the rule and the roots in force; nothing is read.
        """
        roots = self.in_force()
        folders = [resolved_path(folder) for folder in roots.folders]
        resolved = tuple(resolved_path(path) for path in paths)
        for given, path in zip(paths, resolved, strict=True):
            if not any(_inside(path, folder) for folder in folders):
                shown = given if given == path else f"{given} (resolved: {path})"
                raise InputError(
                    f"{shown} is outside the roots of this server: it reads only inside "
                    f"{roots.describe()} (after '..' and symbolic links are resolved); "
                    "the client's roots or `longctx mcp --root FOLDER` widen it",
                    path=given,
                )
        return resolved


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)
