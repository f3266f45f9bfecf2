"""The line a pack gets when PDF pages had no text: which documents, which pages, what to do.

In the default text mode a scanned page is in the pack as a note only
(``[no text on pages 1, 2]`` in the listing): the model never sees it. The
commands that pack say so on stderr, once, naming the documents and the
flag that sends such pages as images (``--pdf-pages auto``) to a server
whose model takes them.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from longctx import Manifest

__all__ = ["textless_pages_line"]

_NO_TEXT = re.compile(r"page (\d+): (?:no extractable text|text extraction failed)")
_AS_IMAGE = re.compile(r"page (\d+): sent as an image")
_SHOWN = 3  # documents named in the line; the rest counted


def textless_pages_line(manifest: Manifest, pdf_pages: str) -> str | None:
    """The stderr line for the packed documents with pages without text; None when there are none.

    A page sent as an image (``auto`` asked, or the default ``server`` made
    auto by a server whose model takes images) is in the pack: not named.
    Only the text modes' line says what to do.
    """
    found: list[tuple[str, list[str]]] = []
    for entry in manifest.included:
        as_images = {match.group(1) for note in entry.notes if (match := _AS_IMAGE.match(note))}
        pages = [
            match.group(1)
            for note in entry.notes
            if (match := _NO_TEXT.match(note)) and match.group(1) not in as_images
        ]
        if pages:
            found.append((entry.path, pages))
    if not found or pdf_pages not in ("text", "server"):
        return None
    named = "; ".join(
        f"{path} (page{'s' if len(pages) > 1 else ''} {', '.join(pages)})" for path, pages in found[:_SHOWN]
    )
    more = f" and {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""
    documents = "document has" if len(found) == 1 else "documents have"
    return (
        f"{len(found)} {documents} pages without text, not in the pack (scanned?): {named}{more}. "
        "Send them as images with --pdf-pages auto, to a server whose model takes images"
        " (to try one: longctx serve --cpu-demo --vision)"
    )
