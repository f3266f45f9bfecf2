"""Whether a PDF page's text layer is usable, or the page should go as an image.

The rule, per page, on the text the PDF reader extracted (after control
characters became U+FFFD) and the page's size:

- *visible* characters are those that are neither whitespace nor U+FFFD;
- the text layer is **not usable** when there are no visible characters
  (``no text layer``: a scan, a slide exported as a picture, a blank page);
- or fewer than :data:`MIN_CHARACTERS_PER_SQUARE_INCH` visible characters
  per square inch of the page (0.5: 47 on a US Letter page, 48 on A4), so a
  page whose only text is a figure's caption, a slide's title or a page
  number over a picture goes as an image (``too little text``);
- or at least :data:`MAX_UNMAPPED_SHARE` of its non-whitespace characters
  are U+FFFD (``mostly unmapped glyphs``: fonts without a usable Unicode
  mapping, where the text is noise).

A page of body text holds 2,000 to 4,000 visible characters on a Letter
page (40 to 45 per square inch), two orders of magnitude over the
threshold; the cost of a false "not usable" is one image's tokens, of a
false "usable" a page the model cannot see. A blank page is judged not
usable here; the renderer then finds its image blank and sends nothing.
"""

from __future__ import annotations

import re
from typing import Final

from longctx.recordtypes import record_type

__all__ = ["MAX_UNMAPPED_SHARE", "MIN_CHARACTERS_PER_SQUARE_INCH", "PageVerdict", "judge_page"]

MIN_CHARACTERS_PER_SQUARE_INCH: Final = 0.5
"""Below this many visible characters per square inch a text layer is not usable."""
MAX_UNMAPPED_SHARE: Final = 0.3
"""From this share of U+FFFD among non-whitespace characters on, a text layer is not usable."""
_POINTS_PER_INCH: Final = 72.0
# A fixed set, never the running Python's Unicode database, so the verdict is the same everywhere.
_WHITESPACE: Final = re.compile(
    "[\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200b\u2028\u2029\u202f\u205f\u3000\ufeff]"
)


@record_type(slots=True)
class PageVerdict:
    """A page's text layer judged: ``usable``, or the ``reason`` it is not."""

    usable: bool
    reason: str | None = None


def judge_page(text: str, width_points: float, height_points: float) -> PageVerdict:
    """Judge the text layer of a page of the given size (points) holding ``text``: the rule above."""
    unmapped = text.count("\ufffd")
    non_space = len(text) - len(_WHITESPACE.findall(text))
    visible = non_space - unmapped
    if visible <= 0:
        return PageVerdict(False, "no text layer")
    area = max(width_points, 1.0) * max(height_points, 1.0) / (_POINTS_PER_INCH * _POINTS_PER_INCH)
    if visible < MIN_CHARACTERS_PER_SQUARE_INCH * area:
        return PageVerdict(False, f"too little text ({visible} characters)")
    if unmapped >= MAX_UNMAPPED_SHARE * non_space:
        return PageVerdict(False, f"mostly unmapped glyphs ({unmapped} of {non_space} characters)")
    return PageVerdict(True)
