"""Bytes to text: binary detection from content, decoding, line endings.

The rules, in order:

1. A UTF-32 or UTF-16 byte order mark means text in that encoding.
2. Otherwise a NUL byte in the first 8 KiB, or more than one byte in ten
   being a control byte (other than tab, newline, vertical tab, form feed,
   carriage return and escape), means binary. The extension plays no part:
   a ``.png`` that holds text is text, a ``.txt`` with NUL bytes is binary.
3. Text is decoded as UTF-8 (a UTF-8 byte order mark is dropped). Bytes
   that do not decode become U+FFFD and the result is marked ``lossy``:
   the file is kept, not skipped.
4. CRLF and lone CR become LF (see :class:`longctx.documents.Document`).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Final

__all__ = ["SNIFF_BYTES", "DecodedText", "decode_text", "looks_binary", "normalise_newlines"]

SNIFF_BYTES: Final = 8192
"""How much of the start of a file binary detection looks at (git uses 8000)."""

_CONTROL_SHARE_LIMIT: Final = 0.10

# Control bytes that ordinary text does not contain. Tab, LF, VT, FF, CR and
# ESC (ANSI colour codes in logs) are left out on purpose.
_ODD_CONTROL_BYTES: Final = (
    bytes(b for b in range(0x20) if b not in (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1B)) + b"\x7f"
)
_NOT_ODD_CONTROL_BYTES: Final = bytes(b for b in range(256) if b not in _ODD_CONTROL_BYTES)

# Longest first: the UTF-32 LE mark starts with the UTF-16 LE one.
_BYTE_ORDER_MARKS: Final[tuple[tuple[bytes, str], ...]] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


@dataclass(frozen=True, slots=True)
class DecodedText:
    """Text decoded from bytes.

    ``encoding`` names what was used (``utf-8``, ``utf-8-sig``,
    ``utf-16-le``...); ``lossy`` is true when some bytes did not decode and
    were replaced by U+FFFD.
    """

    text: str
    encoding: str
    lossy: bool


def _byte_order_mark(data: bytes) -> tuple[bytes, str] | None:
    for mark, encoding in _BYTE_ORDER_MARKS:
        if data.startswith(mark):
            return mark, encoding
    return None


def looks_binary(data: bytes) -> bool:
    """Tell whether ``data`` (a whole file) is binary, from its first 8 KiB."""
    mark = _byte_order_mark(data)
    if mark is not None and mark[1] != "utf-8":
        return False
    sample = data[:SNIFF_BYTES]
    if b"\x00" in sample:
        return True
    if not sample:
        return False
    odd_controls = len(sample.translate(None, _NOT_ODD_CONTROL_BYTES))
    return odd_controls > _CONTROL_SHARE_LIMIT * len(sample)


def decode_text(data: bytes) -> DecodedText:
    """Decode text bytes (see the module docstring); never raises.

    Line endings are left as they are; :func:`normalise_newlines` does that.
    """
    mark = _byte_order_mark(data)
    if mark is not None:
        bom, encoding = mark
        body = data[len(bom) :]
        label = "utf-8-sig" if encoding == "utf-8" else encoding
    else:
        body, encoding, label = data, "utf-8", "utf-8"
    try:
        return DecodedText(body.decode(encoding), label, lossy=False)
    except UnicodeDecodeError:
        return DecodedText(body.decode(encoding, "replace"), label, lossy=True)


def normalise_newlines(text: str) -> str:
    """Turn CRLF and lone CR into LF."""
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")
