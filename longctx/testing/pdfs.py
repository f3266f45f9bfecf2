"""Writing small text PDFs, for tests and examples (pypdf's writing side).

longctx reads PDFs in :mod:`longctx.sources.pdf`; tests and the notebook
example need PDFs to read, made on the spot rather than shipped.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

__all__ = ["text_pdf", "write_text_pdf"]


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
