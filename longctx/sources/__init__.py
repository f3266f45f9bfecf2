"""Sources: turn a path into candidate files, and a candidate into a Document.

A source lists what it considers (:class:`Listing`): the files it will try to
read (:class:`Candidate`) and the paths it already knows it will not read
(:class:`Skip`, with a reason from :class:`SkipReason`). Reading a candidate
(:class:`longctx.sources.reading.FileReader`) gives a Document or one
more Skip. :mod:`longctx.corpus` puts the pieces together.

- :mod:`~longctx.sources.repo`: git work trees: the listing and the state;
- :mod:`~longctx.sources.history`: last-commit times and layers;
- :mod:`~longctx.sources.git`: the one git runner (GitPython behind it);
- :mod:`~longctx.sources.files`: plain folders and single files;
- :mod:`~longctx.sources.ignore`: gitignore-style patterns (``include``/``exclude``, ``.longctxignore``);
- :mod:`~longctx.sources.reading`: one file on disk to a Document;
- :mod:`~longctx.sources.decoding`: binary detection and text decoding;
- :mod:`~longctx.sources.notebook`: Jupyter notebooks to text;
- :mod:`~longctx.sources.pdf`: PDFs to text, through pypdf;
- :mod:`~longctx.sources.text_layer`: whether a PDF page's text layer is usable;
- :mod:`~longctx.sources.page_images`: PDF pages to images, through pypdfium2;
- :mod:`~longctx.sources.png`: a PNG encoder whose bytes are the same everywhere, image headers;
- :mod:`~longctx.sources.images`: what goes as an image, and the image documents;
- :mod:`~longctx.sources.secrets`: credential detection;
- :mod:`~longctx.sources.special_tokens`: special-token spellings broken in document text.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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
