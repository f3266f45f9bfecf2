"""PDF pages to images, through pypdfium2 (the only module that imports it).

A page goes as an image when its text layer is not usable (the rule of
:mod:`longctx.sources.text_layer`) and the corpus asks for images of such
pages (``CorpusOptions.pdf_pages="auto"``), or for every page
(``"images"``). It is rendered by PDFium, in grayscale, scaled so that its
longer side is ``side`` pixels (``CorpusOptions.page_image_side``; the
default, 1120, is chosen in ``docs/benchmarks.md``: a US Letter page is
866 x 1120, 1,242 image tokens for a Qwen2-VL-style processor), and encoded
by :func:`longctx.sources.png.encode_gray_png`, so the PNG is a pure
function of the PDF, the page, the side and the renderer: the same bytes on
any machine with the same pypdfium2 wheel. pypdfium2 ships its own PDFium
build, pinned in the project's dependencies; :func:`renderer_identity`
names both versions and the code here.

A page whose image is blank (every pixel white) is not sent: it carries
nothing a text layer would not. A page PDFium cannot load or render is
noted with PDFium's message and sent as nothing.

Rendering and encoding cost about 12 ms a page at the default side (``docs/benchmarks.md``),
less than reading the text layer, and a page's PNG is about a megabyte: pages
are rendered each time, not kept in the store.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Any, Final

from longctx.documents import ImagePart
from longctx.options.groups import DEFAULT_PAGE_IMAGE_SIDE
from longctx.recordtypes import record_type
from longctx.sources.png import encode_gray_png

__all__ = [
    "RenderedPage",
    "render_pages",
    "renderer_identity",
]


_WHITE: Final = b"\xff"


@record_type(slots=True)
class RenderedPage:
    """One page asked for: its ``image``, or None with a ``note`` saying why not (blank, failed)."""

    number: int
    image: ImagePart | None
    note: str | None = None


@functools.cache
def renderer_identity() -> str:
    """What shapes a rendered page's bytes: pypdfium2's and PDFium's versions and the code that encodes it."""
    import pypdfium2

    code = hashlib.sha256()
    folder = os.path.dirname(os.path.abspath(__file__))
    for name in ("page_images.py", "png.py"):
        try:
            with open(os.path.join(folder, name), "rb") as source:
                code.update(source.read())
        except OSError:  # no source beside the code (a frozen build): never reuse
            code.update(os.urandom(16))
    return (
        f"pypdfium2 {pypdfium2.version.PYPDFIUM_INFO}; pdfium {pypdfium2.version.PDFIUM_INFO};"
        f" code {code.hexdigest()[:16]}"
    )


def _image(png: bytes, width: int, height: int, source: str, reason: str) -> ImagePart:
    return ImagePart("image/png", png, hashlib.sha256(png).hexdigest(), width, height, source, reason)


def render_pages(
    data: bytes, pages: Mapping[int, str], *, side: int = DEFAULT_PAGE_IMAGE_SIDE
) -> list[RenderedPage]:
    """Render ``pages`` (page number from 1 -> why it goes as an image) of the PDF ``data``, in page order.

    Never raises for a bad PDF or page: such a page comes back without an
    image, with a note.
    """
    numbers = sorted(pages)
    return _render(data, numbers, side, pages) if numbers else []


_BLANK: Final = "blank: nothing to send"


def _source(number: int) -> str:
    return f"page {number}"


def _render(data: bytes, numbers: Sequence[int], side: int, reasons: Mapping[int, str]) -> list[RenderedPage]:
    """Render ``numbers`` of the PDF ``data`` with PDFium; a failure is a page without an image."""
    # Imported here: most corpora hold no page to render.
    import pypdfium2

    try:
        document = pypdfium2.PdfDocument(data)
    except Exception as error:  # noqa: BLE001 - PDFium's errors are one kind per cause
        return [RenderedPage(number, None, f"not rendered ({_message(error)})") for number in numbers]
    try:
        return [_render_page(document, number, side, reasons[number]) for number in numbers]
    finally:
        document.close()


def _render_page(document: Any, number: int, side: int, reason: str) -> RenderedPage:
    try:
        page = document[number - 1]
        try:
            width_points, height_points = page.get_size()
            scale = side / max(width_points, height_points, 1.0)
            bitmap = page.render(scale=scale, grayscale=True, may_draw_forms=False)
            try:
                pixels = _pixels(bitmap)
                width, height = bitmap.width, bitmap.height
            finally:
                bitmap.close()
        finally:
            page.close()
    except Exception as error:  # noqa: BLE001 - one bad page must not lose the others
        return RenderedPage(number, None, f"not rendered ({_message(error)})")
    if not pixels.strip(_WHITE):
        return RenderedPage(number, None, _BLANK)
    png = encode_gray_png(width, height, pixels)
    return RenderedPage(number, _image(png, width, height, _source(number), reason))


def _pixels(bitmap: Any) -> bytes:
    """The bitmap's rows without the padding PDFium may add at the end of each (its stride)."""
    raw = bytes(bitmap.buffer)
    width, stride = bitmap.width, bitmap.stride
    if stride == width:
        return raw[: width * bitmap.height]
    return b"".join(raw[row * stride : row * stride + width] for row in range(bitmap.height))


def _message(error: BaseException) -> str:
    text = " ".join(str(error).split())[:160]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
