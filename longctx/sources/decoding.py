"""Bytes to text: binary detection from content, decoding, line endings.

The rules, in order:

1. A UTF-32 or UTF-16 byte order mark means text in that encoding.
2. Otherwise a NUL byte in the first 8 KiB, or more than one byte in ten
   being a control byte (other than tab, newline, vertical tab, form feed,
   carriage return and escape), means binary. The extension plays no part:
   a ``.png`` that holds text is text, a ``.txt`` with NUL bytes is binary.
3. Text is decoded as UTF-8 (a UTF-8 byte order mark is dropped): valid
   UTF-8, nearly every file, costs one ``bytes.decode`` and nothing more.
4. Text that is not valid UTF-8, has no byte order mark and holds fewer
   valid UTF-8 sequences of more than one byte than bad bytes (else it is
   UTF-8 with a few bad bytes: rule 5) has its encoding detected by
   charset-normalizer (Latin-1, cp1252, Shift JIS...); ``detected`` is
   then set and ``encoding`` names what was found. The only module that
   imports charset-normalizer, and only when a file needs it.
5. When nothing is detected, or a byte order mark's encoding does not fit,
   bytes that do not decode become U+FFFD and the result is marked
   ``lossy``: the file is kept, not skipped.
6. CRLF and lone CR become LF (see :class:`longctx.documents.Document`).
"""

from __future__ import annotations

import codecs
from typing import Final

from longctx.recordtypes import record_type

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


@record_type(slots=True)
class DecodedText:
    """Text decoded from bytes.

    ``encoding`` names what was used (``utf-8``, ``utf-8-sig``,
    ``utf-16-le``, ``cp1252``...); ``lossy`` is true when some bytes did not
    decode and were replaced by U+FFFD; ``detected`` is true when the
    encoding was guessed from the content (the text was not UTF-8).
    """

    text: str
    encoding: str
    lossy: bool
    detected: bool = False


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
        pass
    replaced = body.decode(encoding, "replace")
    # As many valid multi-byte sequences as bad bytes: UTF-8 with a few stray bytes, not another
    # encoding (a cp1252 reading would turn its good characters into mojibake). Text in another
    # encoding forms a valid sequence only now and then, by accident.
    bad = replaced.count("\ufffd")
    if mark is None and sum(not character.isascii() for character in replaced) - bad < bad:
        detected = _detect(body)
        if detected is not None:
            return detected
    return DecodedText(replaced, label, lossy=True)


# Without a byte order mark, UTF-16/32 text of any Latin script holds NUL bytes and is
# binary by rule 2: a guess of these for text without NULs is noise.
_NEVER_GUESSED: Final = ("utf_16", "utf_16_be", "utf_16_le", "utf_32", "utf_32_be", "utf_32_le", "utf_7")

# Where candidates read equally well (a short text fits many single-byte code
# pages), the one most files in the world are written in wins: cp1252 (a
# superset of Latin-1's printable characters) before the other Windows and
# East Asian code pages.
_PREFERRED: Final = ("cp1252", "cp1250", "cp1251", "cp932", "gb18030", "big5", "euc_kr", "cp1253", "cp1254")


def _detect(data: bytes) -> DecodedText | None:
    """``data`` decoded in the encoding charset-normalizer finds for it, or None when it finds none."""
    # Imported here: it costs some 30 ms and valid UTF-8 never needs it.
    from charset_normalizer import from_bytes

    matches = list(from_bytes(data, cp_exclusion=list(_NEVER_GUESSED)))
    if not matches:
        return None
    first = matches[0]
    tied = [match for match in matches if (match.chaos, match.coherence) == (first.chaos, first.coherence)]
    candidates = [name for name in _PREFERRED if any(name in match.could_be_from_charset for match in tied)]
    for name in [*candidates, first.encoding]:
        encoding = codecs.lookup(name).name
        if encoding == "utf-8":  # what it says of nearly-UTF-8 bytes: not a decoding without loss
            return None
        try:
            return DecodedText(data.decode(encoding), encoding, lossy=False, detected=True)
        except UnicodeDecodeError:
            continue
    return None


def normalise_newlines(text: str) -> str:
    """Turn CRLF and lone CR into LF."""
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")
