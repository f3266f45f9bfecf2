"""Writing small PDFs, for tests and examples (pypdf's writing side): text, and scans.

longctx reads PDFs in :mod:`longctx.sources.pdf`; tests and the notebook
examples need PDFs to read, made on the spot rather than shipped.
:func:`scanned_pdf` makes pages with no text layer (a picture of the text,
like a scanner's), the pages longctx sends as images.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject, NumberObject, StreamObject

__all__ = ["scanned_pdf", "text_pdf", "write_scanned_pdf", "write_text_pdf"]


def _add_text_page(writer: PdfWriter, text: str) -> None:
    page = writer.add_blank_page(612, 792)
    font = DictionaryObject(
        {
            NameObject("/Type"): NameObject("/Font"),
            NameObject("/Subtype"): NameObject("/Type1"),
            NameObject("/BaseFont"): NameObject("/Helvetica"),
        }
    )
    page[NameObject("/Resources")] = DictionaryObject(
        {NameObject("/Font"): DictionaryObject({NameObject("/F1"): writer._add_object(font)})}
    )
    escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
    operations = ["BT /F1 11 Tf 72 740 Td 13 TL"]
    operations.extend(f"({line}) Tj T*" for line in escaped.split("\n"))
    operations.append("ET")
    content = DecodedStreamObject()
    content.set_data("\n".join(operations).encode("latin-1", "replace"))
    page[NameObject("/Contents")] = writer._add_object(content)


def text_pdf(
    pages: Sequence[str | None], *, user_password: str | None = None, owner_password: str | None = None
) -> bytes:
    """A PDF whose pages hold ``pages`` (Latin-1 text; None makes a page with no text, like a scan).

    With ``user_password`` it is AES-128 encrypted (needs ``cryptography``).
    """
    writer = PdfWriter()
    for text in pages:
        if text is None:
            writer.add_blank_page(612, 792)
        else:
            _add_text_page(writer, text)
    if user_password is not None:
        writer.encrypt(user_password=user_password, owner_password=owner_password, algorithm="AES-128")
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def write_text_pdf(path: Path, pages: Sequence[str | None]) -> Path:
    """Write :func:`text_pdf` of ``pages`` to ``path`` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text_pdf(pages))
    return path


def scanned_pdf(pages: Sequence[str]) -> bytes:
    """A PDF of image-only pages, like a scan: each text rendered to a picture, no text layer.

    Each text is laid out on a PDF page (:func:`text_pdf`), rendered to a
    grayscale PNG by longctx's own renderer, and that PNG's pixel stream
    (PNG's filtered rows in zlib are what a PDF's FlateDecode with PNG
    predictors reads) drawn over a whole US Letter page.
    """
    # Imported here: rendering needs pypdfium2, which the text PDFs do not.
    from longctx.sources.page_images import render_pages
    from longctx.sources.png import image_data

    writer = PdfWriter()
    for text in pages:
        (rendered,) = render_pages(text_pdf([text]), {1: "scan"})
        if rendered.image is None:
            raise ValueError(f"a scanned page needs some text to show, not {text!r}")
        png, width, height = rendered.image.data, rendered.image.width, rendered.image.height
        image = StreamObject()
        image._data = image_data(png)
        image.update(
            {
                NameObject("/Type"): NameObject("/XObject"),
                NameObject("/Subtype"): NameObject("/Image"),
                NameObject("/Width"): NumberObject(width),
                NameObject("/Height"): NumberObject(height),
                NameObject("/ColorSpace"): NameObject("/DeviceGray"),
                NameObject("/BitsPerComponent"): NumberObject(8),
                NameObject("/Filter"): NameObject("/FlateDecode"),
                NameObject("/DecodeParms"): DictionaryObject(
                    {
                        NameObject("/Predictor"): NumberObject(15),
                        NameObject("/Colors"): NumberObject(1),
                        NameObject("/BitsPerComponent"): NumberObject(8),
                        NameObject("/Columns"): NumberObject(width),
                    }
                ),
            }
        )
        page = writer.add_blank_page(612, 792)
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/XObject"): DictionaryObject({NameObject("/Im1"): writer._add_object(image)})}
        )
        content = DecodedStreamObject()
        content.set_data(b"q 612 0 0 792 0 0 cm /Im1 Do Q")
        page[NameObject("/Contents")] = writer._add_object(content)
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def write_scanned_pdf(path: Path, pages: Sequence[str]) -> Path:
    """Write :func:`scanned_pdf` of ``pages`` to ``path`` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(scanned_pdf(pages))
    return path
