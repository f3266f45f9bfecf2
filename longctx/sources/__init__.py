"""Sources: turn a path into candidate files, and a candidate into a Document.

A source lists what it considers (:class:`Listing`): the files it will try to
read (:class:`Candidate`) and the paths it already knows it will not read
(:class:`Skip`, with a reason from :class:`SkipReason`). Reading a candidate
(:class:`longctx.sources.reading.FileReader`) gives a Document or one
more Skip. :mod:`longctx.sources.corpus` puts the pieces together: the
corpus, its ordering and its manifest.

- :mod:`~longctx.sources.listing`: :class:`Listing`, :class:`Candidate`, :class:`Skip`, :class:`SkipReason`;
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

from typing import TYPE_CHECKING

from longctx.exports import lazy_exports

# The package's names (its ``__all__``), each with the module it comes from, imported on first use
# (PEP 562): a module of the package (the counting worker's special tokens) loads alone.
_EXPORTS: dict[str, str] = {
    "Candidate": "longctx.sources.listing",
    "Listing": "longctx.sources.listing",
    "Skip": "longctx.sources.listing",
    "SkipReason": "longctx.sources.listing",
    "check_sources": "longctx.sources.corpus",
}

if TYPE_CHECKING:
    from longctx.sources.corpus import check_sources as check_sources
    from longctx.sources.listing import Candidate as Candidate
    from longctx.sources.listing import Listing as Listing
    from longctx.sources.listing import Skip as Skip
    from longctx.sources.listing import SkipReason as SkipReason


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = list(_EXPORTS)
