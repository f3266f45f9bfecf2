"""Document, the unit of a corpus, and its canonical ordering key.

A :class:`Document` is one file as it will be packed: its corpus-relative
path, its decoded text and the facts about the bytes on disk it came from.
:func:`path_sort_key` is the one order of paths used everywhere (corpus,
manifest, packer), so that two machines always agree on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

__all__ = ["DOCUMENT_KINDS", "Document", "DocumentKind", "path_sort_key"]

DocumentKind = Literal["code", "text", "markdown", "notebook", "pdf"]
"""What a document holds; the packer may use it to label the fence."""

DOCUMENT_KINDS: Final[tuple[str, ...]] = get_args(DocumentKind)


@dataclass(frozen=True, slots=True)
class Document:
    """One file of a corpus, decoded and ready to pack.

    ``path`` is the POSIX path relative to the corpus root (with the
    argument's label in front when several paths were loaded, see
    :func:`longctx.corpus.load_corpus`); a file passed directly is named by
    its base name. A file name that is not valid UTF-8 keeps its raw bytes as
    lone surrogates (``surrogateescape``), so a renderer must encode paths
    with an error handler such as ``backslashreplace``.

    ``text`` is exactly what gets packed:

    - line endings are normalised: CRLF and lone CR become LF, because git's
      ``autocrlf`` gives the same commit different bytes on different
      machines and the pack must not change with them;
    - a UTF-8 byte order mark is dropped; UTF-16/UTF-32 with a byte order mark
      are decoded; any other bytes that are not UTF-8 are replaced by U+FFFD
      and ``lossy`` is set;
    - a notebook is rendered as its cells in order, each after a
      ``# %% [markdown]`` / ``# %% [code]`` / ``# %% [raw]`` marker, outputs
      dropped;
    - a PDF is its extracted text, each page preceded by a line
      ``--- page N of M ---``.

    ``sha256`` and ``size_bytes`` describe the raw bytes on disk, before any
    of the above. ``last_commit_time`` (unix seconds, committer time) and
    ``dirty`` (modified in the working tree, staged, or untracked) are known
    only for files of a git repository; they drive the ``stability`` order.

    ``layer`` and ``earlier`` come from a layered repository listing
    (:mod:`longctx.sources.history`): layer 0 holds the base commit's files,
    layer 1 the files changed or added since; an ``earlier`` document is
    the base's copy of a file changed or deleted since, packed where the
    base put it and superseded by the layer-1 copy of the same path.
    """

    path: str
    text: str
    kind: str
    sha256: str
    size_bytes: int
    lossy: bool = False
    last_commit_time: int | None = None
    dirty: bool = False
    layer: int | None = None
    earlier: bool = False


def path_sort_key(path: str) -> bytes:
    """Return the canonical sort key of ``path``: its UTF-8 bytes.

    Comparing bytes, never the locale's collation, gives the same order on
    every machine, filesystem and locale. Undecodable names (lone surrogates
    from ``surrogateescape``) sort by their original bytes.
    """
    try:
        return path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        # A lone surrogate that did not come from surrogateescape (built by
        # hand, not read from a filesystem) still needs a total order.
        return path.encode("utf-8", "surrogatepass")
