"""What goes to the model as an image, and the ``image`` documents that carry it.

Three things can go as images, for a vision-language model:

- **PDF pages** (``ImageRules.pdf_pages``): ``"text"`` (the default) sends
  text only, as before (a page without text is noted ``no extractable
  text`` in the manifest and the listing); ``"auto"`` renders each page
  whose text layer is not usable (:mod:`longctx.sources.text_layer`) and
  sends its image after the PDF's text; ``"images"`` renders every page.
  The PDF's text document is the same in every mode (a page sent as an
  image keeps what text it has, which helps exact quotes). The manifest
  entry of the PDF notes each page sent as an image and why, and each page
  that was not (blank, or PDFium could not render it).
- **image outputs of notebooks** (``image/png``, ``image/jpeg``) and
- **image files** (``.png``, ``.jpg``, ``.jpeg``) of a folder or repository,
  both when ``ImageRules.image_files`` (off by default; such files are
  otherwise ``binary`` skips and outputs are dropped). They go as their
  own bytes, which are already the same on every machine.

An image document follows the document it belongs to, in the order of its
source (pages, then cells and outputs): a PDF's pages right after its
text, a notebook's outputs right after its cells; an image file is a
document of its own in corpus order. Its path names the image:
``scan.pdf#page=3``, ``analysis.ipynb#cell=4,output=1``, or the file's own
path. Its text is one placeholder line (:func:`placeholder`) naming the
media type, the size and the sha256 of the bytes, so the pack's text form
and its fingerprint change when the image does; a request sends the image
itself in that line's place (:mod:`longctx.packing.rendering`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, Final

from longctx.documents import Document, ImagePart
from longctx.options.groups import DEFAULT_PAGE_IMAGE_SIDE
from longctx.recordtypes import record_type
from longctx.sources.page_images import render_pages
from longctx.sources.pdf import PdfText
from longctx.sources.png import image_size

__all__ = [
    "IMAGE_FILE_SUFFIXES",
    "ImageDocuments",
    "ImageRules",
    "image_file_document",
    "notebook_image_documents",
    "page_image_documents",
    "placeholder",
]

IMAGE_FILE_SUFFIXES: Final = frozenset({".png", ".jpg", ".jpeg"})
"""The image files sent as images when ``ImageRules.image_files`` is on."""
_NOTEBOOK_IMAGE_TYPES: Final = ("image/png", "image/jpeg")


@record_type(slots=True)
class ImageRules:
    """What goes as an image: the PDF page mode, the rendered side, and image files and outputs."""

    pdf_pages: str = "text"
    page_image_side: int = DEFAULT_PAGE_IMAGE_SIDE
    image_files: bool = False


@record_type(slots=True)
class ImageDocuments:
    """The image documents of one file, in order, and the manifest notes that say what went and why."""

    documents: tuple[Document, ...] = ()
    notes: tuple[str, ...] = ()


def placeholder(image: ImagePart) -> str:
    """The text of an image document: one line naming the image, replaced by the image in a request."""
    return f"[image {image.media_type} {image.width}x{image.height} sha256:{image.sha256}]\n"


def _image_document(parent: Document, path: str, image: ImagePart) -> Document:
    """The image document of ``image``, belonging to ``parent`` (its layer and dates)."""
    return replace(
        parent,
        path=path,
        text=placeholder(image),
        kind="image",
        sha256=image.sha256,
        size_bytes=len(image.data),
        lossy=False,
        image=image,
    )


def page_image_documents(
    parent: Document, data: bytes, extracted: PdfText, rules: ImageRules
) -> ImageDocuments:
    """The images of ``parent``'s PDF pages that ``rules`` send as images (``data``: the PDF's bytes)."""
    unusable = {page.number: page.reason for page in extracted.unusable_pages}
    if rules.pdf_pages in ("text", "server"):  # "server" unresolved: no server said it takes images
        return ImageDocuments()
    if rules.pdf_pages == "images":
        asked = {number: "asked: pdf_pages='images'" for number in range(1, extracted.page_count + 1)}
    else:
        asked = {number: f"no usable text layer: {reason}" for number, reason in unusable.items()}
    documents: list[Document] = []
    notes: list[str] = []
    for page in render_pages(data, asked, side=rules.page_image_side):
        if page.image is None:
            notes.append(f"page {page.number}: not sent as an image ({page.note})")
            continue
        image = replace(page.image, source=f"page {page.number} of {extracted.page_count}")
        documents.append(_image_document(parent, f"{parent.path}#page={page.number}", image))
        notes.append(f"page {page.number}: sent as an image ({image.reason}; {image.width}x{image.height})")
    return ImageDocuments(tuple(documents), tuple(notes))


def image_file_document(parent: Document, data: bytes) -> Document | None:
    """``parent`` (an image file read as bytes ``data``) as an image document; None when not PNG or JPEG."""
    size = image_size(data)
    if size is None:
        return None
    image = ImagePart(
        size.media_type, data, hashlib.sha256(data).hexdigest(), size.width, size.height, "file", "image file"
    )
    return _image_document(parent, parent.path, image)


def notebook_image_documents(parent: Document, notebook_text: str) -> ImageDocuments:
    """The image outputs (PNG, JPEG) of the notebook ``parent``, whose JSON is ``notebook_text``."""
    try:
        notebook = json.loads(notebook_text)
    except (ValueError, RecursionError):
        return ImageDocuments()  # the text reader already skipped it as corrupt
    documents: list[Document] = []
    notes: list[str] = []
    for cell, output, data in _outputs(notebook):
        size = image_size(data)
        where = f"cell {cell}, output {output}"
        if size is None:
            notes.append(f"{where}: an image output that is not a readable PNG or JPEG, not sent")
            continue
        image = ImagePart(
            size.media_type, data, hashlib.sha256(data).hexdigest(), size.width, size.height, where, "output"
        )
        documents.append(_image_document(parent, f"{parent.path}#cell={cell},output={output}", image))
        notes.append(f"{where}: sent as an image ({size.width}x{size.height})")
    return ImageDocuments(tuple(documents), tuple(notes))


def _outputs(notebook: Any) -> Iterator[tuple[int, int, bytes]]:
    """Each image output of ``notebook``: (cell from 1, output from 1, the decoded bytes), in order."""
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        return
    for cell_number, cell in enumerate(cells, 1):
        outputs = cell.get("outputs") if isinstance(cell, dict) else None
        if not isinstance(outputs, list):
            continue
        for output_number, output in enumerate(outputs, 1):
            data = output.get("data") if isinstance(output, dict) else None
            if not isinstance(data, dict):
                continue
            for media_type in _NOTEBOOK_IMAGE_TYPES:
                encoded = data.get(media_type)
                if isinstance(encoded, list):
                    encoded = "".join(part for part in encoded if isinstance(part, str))
                if isinstance(encoded, str):
                    try:
                        yield cell_number, output_number, base64.b64decode(encoded)
                    except (binascii.Error, ValueError):
                        continue
                    break
