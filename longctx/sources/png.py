"""Images as bytes: a PNG encoder whose output is the same on every machine, and image headers read.

:func:`encode_gray_png` writes an 8-bit grayscale PNG whose zlib stream
uses *stored* deflate blocks only (no compression). Why stored: the bytes
of compressed deflate depend on the zlib build (zlib, zlib-ng, Intel's and
Cloudflare's forks choose different matches and block splits at the same
level), so a PNG made by ``zlib.compress`` or by Pillow can differ from one
machine to the next although its pixels do not. A stored block is fully
specified by the format (a header byte, the length and its complement, the
bytes), and the two checksums (CRC-32 per chunk, Adler-32 of the stream)
are defined functions, so the file is a pure function of the pixels. The
price is size: one byte per pixel plus one per row (an 866 x 1120 page is
about 0.97 MB, 1.3 MB as base64 in a request); an engine decodes the
image and hashes its pixels for its prefix cache, so size costs transfer
time only, never cache hits.

:func:`image_size` reads the width and height of a PNG or JPEG from its
header, what an image's token count is computed from, without a decoder.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

from longctx.recordtypes import record_type

__all__ = ["ImageSize", "encode_gray_png", "image_data", "image_size"]

_SIGNATURE: Final = b"\x89PNG\r\n\x1a\n"
_STORED_BLOCK: Final = 65535  # the largest a stored deflate block may hold
_ZLIB_HEADER: Final = b"\x78\x01"  # deflate, 32 KiB window, no dictionary, "fastest" level flag
_IDAT_CHUNK: Final = 1 << 20  # IDAT chunks of at most 1 MiB: any split is valid PNG, this one is fixed


@record_type(slots=True)
class ImageSize:
    """An image's media type and its size in pixels."""

    media_type: str
    width: int
    height: int


def _chunk(kind: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(kind)) & 0xFFFFFFFF
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


def _stored_zlib(data: bytes) -> bytes:
    """``data`` as a zlib stream of stored deflate blocks (see the module docstring)."""
    parts = [_ZLIB_HEADER]
    view = memoryview(data)
    offsets = range(0, max(len(data), 1), _STORED_BLOCK)
    for offset in offsets:
        block = view[offset : offset + _STORED_BLOCK]
        final = 1 if offset + _STORED_BLOCK >= len(data) else 0
        parts.append(struct.pack("<BHH", final, len(block), len(block) ^ 0xFFFF))
        parts.append(bytes(block))
    parts.append(struct.pack(">I", zlib.adler32(data) & 0xFFFFFFFF))
    return b"".join(parts)


def encode_gray_png(width: int, height: int, pixels: bytes) -> bytes:
    """An 8-bit grayscale PNG of ``pixels`` (``height`` rows of ``width`` bytes, top row first).

    The same pixels give the same bytes on every machine (see the module
    docstring). Raises ValueError when ``pixels`` is not ``width * height`` bytes.
    """
    if width <= 0 or height <= 0 or len(pixels) != width * height:
        raise ValueError(f"{len(pixels)} bytes are not {width} x {height} pixels")
    # Filter type 0 (None) before every row: the bytes stay the pixels.
    rows = b"".join(b"\x00" + pixels[row * width : (row + 1) * width] for row in range(height))
    stream = _stored_zlib(rows)
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunks = [_SIGNATURE, _chunk(b"IHDR", header)]
    chunks.extend(
        _chunk(b"IDAT", stream[offset : offset + _IDAT_CHUNK])
        for offset in range(0, len(stream), _IDAT_CHUNK)
    )
    chunks.append(_chunk(b"IEND", b""))
    return b"".join(chunks)


# JPEG start-of-frame markers (baseline, extended, progressive, lossless...; not DHT/JPG/DAC).
_JPEG_FRAMES: Final = frozenset(
    {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
)


def image_data(png: bytes) -> bytes:
    """The zlib stream of a PNG: its IDAT chunks' payloads joined (what a PDF's /FlateDecode image holds)."""
    stream, offset = b"", 8
    while offset < len(png):
        (length,) = struct.unpack(">I", png[offset : offset + 4])
        if png[offset + 4 : offset + 8] == b"IDAT":
            stream += png[offset + 8 : offset + 8 + length]
        offset += 12 + length
    return stream


def image_size(data: bytes) -> ImageSize | None:
    """The media type and size of the PNG or JPEG ``data``; None for anything else or a damaged header."""
    if data.startswith(_SIGNATURE) and len(data) >= 24 and data[12:16] == b"IHDR":
        width, height = struct.unpack(">II", data[16:24])
        return ImageSize("image/png", width, height) if width and height else None
    if data.startswith(b"\xff\xd8"):
        return _jpeg_size(data)
    return None


def _jpeg_size(data: bytes) -> ImageSize | None:
    """Walk a JPEG's marker segments to its frame header."""
    index = 2
    while index + 4 <= len(data):
        if data[index] != 0xFF:
            return None
        marker = data[index + 1]
        if marker == 0xFF:  # fill byte
            index += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            index += 2
            continue
        (length,) = struct.unpack(">H", data[index + 2 : index + 4])
        if marker in _JPEG_FRAMES:
            if index + 9 > len(data):
                return None
            height, width = struct.unpack(">HH", data[index + 5 : index + 9])
            return ImageSize("image/jpeg", width, height) if width and height else None
        index += 2 + length
    return None
