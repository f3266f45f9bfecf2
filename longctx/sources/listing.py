"""What a source considers: the files it will try to read, and the paths it will not, with why.

:class:`Listing` holds a source's :class:`Candidate` files and its
:class:`Skip` entries, each with a :class:`SkipReason` from a closed
vocabulary (part of the manifest format).
"""

from __future__ import annotations

from enum import StrEnum

from longctx.recordtypes import record_type

__all__ = ["Candidate", "Listing", "Skip", "SkipReason"]


class SkipReason(StrEnum):
    """Why a considered path is not in the corpus: a closed vocabulary.

    The values are part of the manifest format; adding one is a format
    change, renaming one is a breaking change.
    """

    BINARY = "binary"
    """The content is not text (NUL bytes or many control bytes)."""
    TOO_LARGE = "too-large"
    """Larger than ``Limits.max_file_bytes``."""
    TOTAL_SIZE_LIMIT = "total-size-limit"
    """Including it would pass ``Limits.max_total_bytes``."""
    FILE_COUNT_LIMIT = "file-count-limit"
    """``Limits.max_files`` documents were already included."""
    SECRET = "secret"
    """Its name or its content looks like a credential."""
    UNREADABLE = "unreadable"
    """The operating system refused to open or read it, or it vanished."""
    ENCRYPTED = "encrypted"
    """An encrypted PDF that the empty password does not open."""
    CORRUPT = "corrupt"
    """A PDF or notebook that its parser rejects."""
    SUBMODULE = "submodule"
    """A git submodule, or a nested repository git does not descend into."""
    LFS_POINTER = "lfs-pointer"
    """A Git LFS pointer file: the real content is not in the work tree."""
    SYMLINK_OUTSIDE_ROOT = "symlink-outside-root"
    """A symbolic link whose target is outside the corpus root."""
    SYMLINK_LOOP = "symlink-loop"
    """A symbolic link that never resolves (a cycle), or leads to a folder above it."""
    EXCLUDED_BY_GLOB = "excluded-by-glob"
    """Dropped by an ``include`` / ``exclude`` pattern of the caller."""
    NOT_A_REGULAR_FILE = "not-a-regular-file"
    """A FIFO, socket, device, or (in a repository) a link to a directory."""
    IGNORED_BY_DEFAULT = "ignored-by-default"
    """A folder outside git that tools made (``.venv``, ``node_modules``...), not entered;
    ``CorpusOptions.default_ignores`` off packs it."""


@record_type(slots=True)
class Candidate:
    """A file a source will try to read.

    ``path`` is the POSIX path relative to the source's root, ``location``
    the filesystem path to open, ``root_real`` the resolved root that a
    symbolic link must stay inside. ``last_commit_time`` and ``dirty`` come
    from git (``None`` / ``False`` elsewhere). ``notes`` travel to the
    manifest.

    In a layered repository listing (:mod:`longctx.sources.history`)
    ``layer`` is 0 for the base's files and 1 for files changed or added
    since (``None`` when the listing is not layered; its
    ``last_commit_time`` is then as of the base for layer 0); a candidate
    with ``content`` is an *earlier copy*: the base's bytes of a file
    changed or deleted since, read from git rather than from ``location``.
    """

    path: str
    location: str
    root_real: str
    last_commit_time: int | None = None
    dirty: bool = False
    notes: tuple[str, ...] = ()
    layer: int | None = None
    content: bytes | None = None

    @property
    def earlier(self) -> bool:
        """True for the base's copy of a file changed or deleted since."""
        return self.content is not None


@record_type(slots=True)
class Skip:
    """A considered path that is not in the corpus, and why.

    ``notes`` add detail (a parser's message, the rule that matched a
    secret, the target of a link) but never file content. ``size_bytes`` is
    the size on disk when it is known.
    """

    path: str
    reason: SkipReason
    notes: tuple[str, ...] = ()
    size_bytes: int | None = None


@record_type(slots=True)
class Listing:
    """What one source considers: files to read and paths already skipped.

    ``head_sha`` is the commit checked out when the source is a git
    repository (``None`` for folders, single files, and repositories
    without a commit); ``is_repository`` says which kind of source it was.
    ``layer_base`` is the base commit of a layered listing; ``layer_note``
    says why it is (or is not) layered (see :class:`~longctx.sources.history.LayerPlan`).
    """

    candidates: tuple[Candidate, ...]
    skipped: tuple[Skip, ...]
    head_sha: str | None = None
    is_repository: bool = False
    layer_base: str | None = None
    layer_note: str | None = None
