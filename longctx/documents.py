"""Document, the unit of a corpus, and its canonical ordering key.

A :class:`Document` is one file as it will be packed: its corpus-relative
path, its decoded text and the facts about the bytes on disk it came from.
:func:`path_sort_key` is the one order of paths used everywhere (corpus,
manifest, packer), so that two machines always agree on it.
"""

from __future__ import annotations

import base64
from dataclasses import field
from typing import Final, Literal, get_args

from longctx.recordtypes import record_type

__all__ = ["DOCUMENT_KINDS", "Document", "DocumentKind", "ImagePart", "path_sort_key"]

DocumentKind = Literal["code", "text", "markdown", "notebook", "pdf", "image"]
"""What a document holds; the packer may use it to label the fence."""

DOCUMENT_KINDS: Final[tuple[str, ...]] = get_args(DocumentKind)


@record_type(slots=True)
class ImagePart:
    """The image an ``image`` document stands for: its encoded bytes and what they are.

    ``data`` is the image file as sent (a rendered page is a PNG made by
    :mod:`longctx.sources.png`, byte-identical on every machine; an image
    file or a notebook output is sent as its own bytes); ``sha256`` is the
    digest of ``data``. ``source`` says where it came from (``page 3 of
    5``, ``cell 4, output 1``, ``file``) and ``reason`` why it goes as an
    image (``no usable text layer: 0 characters``, ``asked``, ``image
    file``...). ``width`` and ``height`` are in pixels: what an image's
    token count is computed from.
    """

    media_type: str
    data: bytes = field(repr=False)
    sha256: str
    width: int
    height: int
    source: str
    reason: str

    def data_url(self) -> str:
        """``data`` as a ``data:`` URL, what an OpenAI ``image_url`` content part carries."""
        return f"data:{self.media_type};base64,{base64.b64encode(self.data).decode('ascii')}"


@record_type(slots=True)
class Document:
    """One file of a corpus, decoded and ready to pack.

    ``path`` is the POSIX path relative to the corpus root (with the
    argument's label in front when several paths were loaded, see
    :func:`longctx.sources.corpus.load_corpus`); a file passed directly is named by
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

    An ``image`` document (``kind == "image"``, ``image`` set) stands for
    one image: a page of a PDF rendered because its text layer is not
    usable (or because every page was asked for), an image output of a
    notebook, an image file. Its ``text`` is one placeholder line naming the
    image and its digest (what the pack's text form and its fingerprint
    hold); a request sends the image itself in that line's place. It follows
    the document it belongs to (a PDF's pages after the PDF's text).

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
    image: ImagePart | None = None


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
