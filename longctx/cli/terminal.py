"""What a model wrote, shown on a terminal without the terminal acting on it.

A model's answer (and what a stored session or a citation repeats of it) is
text from outside: it may hold control characters, an ESC that starts a
colour (CSI), a window title or a hyperlink (OSC 8), a bell, a carriage
return that overwrites the line. On a terminal each of these is shown as
an escape one can read (``\\x1b[31m``, ``\\x07``) and never interpreted:
:func:`inert` works character by character, so an answer streamed in
pieces is made inert piece by piece, however a sequence is cut. A tab and
a newline stay; ``\\r`` is dropped (a line end written as ``\\r\\n`` reads
as it should).

Output that is not a terminal (a pipe, a file, ``--json``) carries the
text byte for byte: :func:`shown` chooses. longctx's own colours and links
(the citation links it checked, rich's spinner) are added after, around
text already made inert, so only longctx's sequences reach a terminal.
"""

from __future__ import annotations

import re
from typing import TextIO

__all__ = ["inert", "shown"]

# C0 controls but tab and newline, DEL, the C1 controls (U+009B is a one-byte CSI on some
# terminals), and the bidirectional overrides that reorder what a line shows.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    character = match.group()
    if character == "\r":
        return ""
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def inert(text: str) -> str:
    """``text`` with every character a terminal would act on made visible (``\\x1b``), ``\\r`` dropped."""
    return _UNSAFE.sub(_visible, text)


def shown(text: str, stream: TextIO) -> str:
    """``text`` as written to ``stream``: made :func:`inert` on a terminal, unchanged elsewhere."""
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream is no terminal
        terminal = False
    return inert(text) if terminal else text
