"""Images placed in a pack's text, and the OpenAI content parts a request sends for them.

A pack with images (see :mod:`longctx.sources.images`) is text like any
other: each image is a placeholder line in its own fenced document. A
:class:`PlacedImage` says where that line sits in the pack's prefix (by
character offset, worked out while the pack was assembled, never by
searching the text, so a document that spells a placeholder cannot move an
image). :func:`content_parts` turns the prefix and a question into the
content of the first user message: ``[text, image_url, text, ...]``, each
placeholder line replaced by its image as a ``data:`` URL, in its place.
A prefix without images stays one string (callers send it as before).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from longctx.documents import ImagePart
from longctx.recordtypes import record_type

__all__ = ["PlacedImage", "content_parts"]


@record_type(slots=True)
class PlacedImage:
    """An image and its placeholder line in a pack's prefix: ``length`` characters from ``offset``."""

    offset: int
    length: int
    image: ImagePart


def content_parts(prefix: str, images: Sequence[PlacedImage], question: str) -> list[dict[str, Any]]:
    """The first user message's content parts: ``prefix`` with its images in place, then ``question``.

    Text parts are the prefix's text between placeholders (the question is
    appended to the last one); each placeholder becomes an ``image_url``
    part. ``images`` are in prefix order.
    """
    parts: list[dict[str, Any]] = []
    start = 0
    for placed in images:
        parts.append({"type": "text", "text": prefix[start : placed.offset]})
        parts.append({"type": "image_url", "image_url": {"url": placed.image.data_url()}})
        start = placed.offset + placed.length
    parts.append({"type": "text", "text": prefix[start:] + question})
    return parts
