"""PDFs to text, through pypdf (the only module that imports it).

The text of a PDF is its pages in order, each preceded by a marker line::

    --- page 1 of 12 ---
    <text of page 1>
    --- page 2 of 12 ---
    ...

Every page gets its marker, also one with no extractable text (a scanned
page, or a blank one); such pages are listed in the notes so the manifest
says which pages carry nothing. The marker format is part of the pack: the
packer keeps it, and changing it changes every pack of a PDF.

An encrypted PDF is opened with the empty password when that works (many
PDFs are encrypted only to set permissions); otherwise it is not read.
A PDF pypdf cannot parse is reported with pypdf's message. C0 control
characters other than tab and line feed (what pypdf makes of glyphs it
cannot map, such as NUL bytes from math fonts) become U+FFFD, counted in the
notes. Messages and notes carry no Python object address, so they are the
same on every run. What pypdf logs
while reading one (a font it cannot fully decode, a damaged object it
worked around) becomes the PDF's notes, shortened, rather than lines on the
user's terminal.

Extraction is slow (pypdf parses every content stream in Python: about a
second for a long report), so a :class:`PdfTextCache` (the
:class:`~longctx.store.Store` is one) keeps each text by the sha256 of the
PDF's bytes and :func:`extractor_identity`, the pypdf version and this
code: a PDF already read is not parsed again, and a new pypdf or a change
here reads every PDF afresh. Failures are not kept: they are quick, and
their messages are worth seeing again.
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final, Literal, Protocol

from longctx.recordtypes import record_type
from longctx.sources.decoding import normalise_newlines
from longctx.sources.text_layer import judge_page

__all__ = [
    "PAGE_MARKER",
    "PdfFailure",
    "PdfText",
    "PdfTextCache",
    "UnusablePage",
    "extract_pdf",
    "extract_pdf_cached",
    "extractor_identity",
    "page_marker",
]

PAGE_MARKER: Final = "--- page {number} of {count} ---"
"""The line before each page's text; ``number`` counts from 1."""

_MESSAGE_LIMIT: Final = 200
_PYPDF_NOTES_LIMIT: Final = 5  # distinct pypdf messages noted per PDF; the rest are counted

logger = logging.getLogger("longctx.sources")


@record_type(slots=True)
class UnusablePage:
    """A page whose text layer is not usable (:func:`~longctx.sources.text_layer.judge_page`), and why."""

    number: int
    reason: str


@record_type(slots=True)
class PdfText:
    """The text of a readable PDF, with page markers; ``notes`` name empty pages and the like.

    ``unusable_pages`` are the pages whose text layer the rule of
    :mod:`longctx.sources.text_layer` finds not usable, in page order:
    the pages that go as images when the corpus asks for that.
    """

    text: str
    page_count: int
    notes: tuple[str, ...]
    unusable_pages: tuple[UnusablePage, ...] = ()


@record_type(slots=True)
class PdfFailure:
    """A PDF that could not be read: ``encrypted`` or ``corrupt``, with a message."""

    reason: Literal["encrypted", "corrupt"]
    message: str


class PdfTextCache(Protocol):
    """Where extracted texts are kept, by extractor identity and the PDF's sha256.

    It keeps plain records, ``{"text": str, "page_count": int, "notes":
    list[str]}`` (the text may hold lone surrogates), so that a cache (the
    store) needs to know nothing of :class:`PdfText`.
    """

    def pdf_text(self, extractor: str, content_sha256: str) -> Mapping[str, Any] | None: ...

    def save_pdf_text(self, extractor: str, content_sha256: str, record: Mapping[str, Any]) -> None: ...


def _as_record(extracted: PdfText) -> dict[str, Any]:
    """``extracted`` as a :class:`PdfTextCache` keeps it."""
    return {
        "text": extracted.text,
        "page_count": extracted.page_count,
        "notes": list(extracted.notes),
        "unusable_pages": [[page.number, page.reason] for page in extracted.unusable_pages],
    }


def _from_record(record: Mapping[str, Any]) -> PdfText:
    """The :class:`PdfText` a :class:`PdfTextCache` record was made from."""
    unusable = tuple(UnusablePage(number, reason) for number, reason in record.get("unusable_pages", ()))
    return PdfText(record["text"], record["page_count"], tuple(record["notes"]), unusable)


@functools.cache
def extractor_identity() -> str:
    """What shapes an extracted text: pypdf's and fontTools' versions, this code and its newline rule."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pypdf_version = version("pypdf")
    except PackageNotFoundError:
        pypdf_version = "unknown"
    try:  # pypdf decodes CFF and Type 1 font encodings with it: it shapes the text too
        fonttools_version = version("fonttools")
    except PackageNotFoundError:
        fonttools_version = "none"
    code = hashlib.sha256()
    folder = os.path.dirname(os.path.abspath(__file__))
    for name in ("pdf.py", "decoding.py", "text_layer.py"):
        try:
            with open(os.path.join(folder, name), "rb") as source:
                code.update(source.read())
        except OSError:  # no source beside the code (a frozen build): never reuse
            code.update(os.urandom(16))
    # "pages judged": the record holds each page's text-layer verdict (kept since store migration 17).
    return f"pypdf {pypdf_version}; fonttools {fonttools_version}; pages judged; code {code.hexdigest()[:16]}"


def extract_pdf_cached(data: bytes, content_sha256: str, cache: PdfTextCache | None) -> PdfText | PdfFailure:
    """:func:`extract_pdf`, through ``cache`` when given (``content_sha256`` is the sha256 of ``data``)."""
    if cache is None:
        return extract_pdf(data)
    extractor = extractor_identity()
    kept = cache.pdf_text(extractor, content_sha256)
    if kept is not None:
        return _from_record(kept)
    extracted = extract_pdf(data)
    if isinstance(extracted, PdfText):
        cache.save_pdf_text(extractor, content_sha256, _as_record(extracted))
    return extracted


def page_marker(number: int, count: int) -> str:
    """Return the marker line (without newline) for page ``number`` of ``count``."""
    return PAGE_MARKER.format(number=number, count=count)


def _message(error: BaseException) -> str:
    return f"{type(error).__name__}: {_shortened(_stable(str(error))) or type(error).__name__}"


def _shortened(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 3] + "..."


class _Collector(logging.Handler):
    """Keeps the distinct messages pypdf logs at WARNING and above."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: dict[str, None] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.messages[_shortened(_stable(record.getMessage()))] = None


@contextmanager
def _pypdf_messages() -> Iterator[_Collector]:
    """pypdf's log records while the block runs, kept from the root logger (and so from the terminal).

    pypdf's logger is one for the process: a PDF read at the same time in
    another thread would have its messages collected here too (longctx
    reads a corpus's files one after the other).
    """
    pypdf_logger = logging.getLogger("pypdf")
    collector = _Collector()
    propagate = pypdf_logger.propagate
    pypdf_logger.addHandler(collector)
    pypdf_logger.propagate = False
    try:
        yield collector
    finally:
        pypdf_logger.removeHandler(collector)
        pypdf_logger.propagate = propagate


# Python object addresses in pypdf's messages (IndirectObject(8, 0, 140435891653584),
# "<... object at 0x7f...>") differ from run to run; the notes must not.
_ADDRESS_IN_OBJECT = re.compile(r"IndirectObject\((\d+), (\d+), \d+\)")
_HEX_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
# C0 controls other than tab and line feed (CR is already a line feed):
# what pypdf makes of glyphs it cannot map (math fonts), never text.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f]")


def _stable(message: str) -> str:
    """``message`` without the object addresses that change from one run to the next."""
    return _HEX_ADDRESS.sub("", _ADDRESS_IN_OBJECT.sub(r"IndirectObject(\1, \2)", message))


def _pypdf_notes(messages: Sequence[str]) -> list[str]:
    notes = [f"pypdf: {message}" for message in messages[:_PYPDF_NOTES_LIMIT]]
    if len(messages) > _PYPDF_NOTES_LIMIT:
        notes.append(f"pypdf: {len(messages) - _PYPDF_NOTES_LIMIT} more messages")
    return notes


def extract_pdf(data: bytes) -> PdfText | PdfFailure:
    """Extract the text of the PDF ``data``; never raises for a bad PDF (see the module docstring)."""
    with _pypdf_messages() as collector:
        extracted = _extract(data)
    if isinstance(extracted, PdfText) and collector.messages:
        notes = (*extracted.notes, *_pypdf_notes(list(collector.messages)))
        return PdfText(extracted.text, extracted.page_count, notes, extracted.unusable_pages)
    return extracted


def _extract(data: bytes) -> PdfText | PdfFailure:
    """The text of the PDF ``data``, or why not.

    Messages come from pypdf and may quote bytes of the file; callers that
    publish them should pass them through
    :func:`longctx.sources.secrets.redact_if_secret`.
    """
    # Imported here: pypdf takes 0.07 s to import, and most corpora hold no PDF.
    import pypdf
    from pypdf.errors import DependencyError

    # pypdf raises far more than its own PdfReadError on malformed input
    # (ValueError, KeyError, TypeError, AssertionError, RecursionError...),
    # so a broad catch around the parser is the only way to honour "a
    # corrupt file is skipped, never fatal".
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        notes: list[str] = []
        if reader.is_encrypted:
            try:
                opened = reader.decrypt("")
            except DependencyError as error:
                return PdfFailure("encrypted", _message(error))
            if opened == pypdf.PasswordType.NOT_DECRYPTED:
                return PdfFailure("encrypted", "the empty password does not open it")
            notes.append("encrypted; opened with the empty password")
        pages = reader.pages
        count = len(pages)
    except Exception as error:  # noqa: BLE001 - see the comment above
        return PdfFailure("corrupt", _message(error))

    parts: list[str] = []
    unusable: list[UnusablePage] = []
    empty_pages = controls = 0
    for number in range(1, count + 1):
        parts.append(page_marker(number, count) + "\n")
        try:
            page_text = pages[number - 1].extract_text()
        except Exception as error:  # noqa: BLE001 - one bad page must not lose the others
            notes.append(f"page {number}: text extraction failed ({_message(error)})")
            unusable.append(UnusablePage(number, "text extraction failed"))
            continue
        body, replaced = _CONTROLS.subn("\ufffd", normalise_newlines(page_text))
        body = body.strip("\n")
        controls += replaced
        verdict = judge_page(body, *_page_size(pages[number - 1]))
        if not verdict.usable:
            unusable.append(UnusablePage(number, verdict.reason or "not usable"))
        if not body.strip():
            empty_pages += 1
            notes.append(f"page {number}: no extractable text")
            continue
        parts.append(body + "\n")
    if controls:
        notes.append(f"{controls} control characters (glyphs pypdf could not map) replaced by U+FFFD")
    if count == 0:
        notes.append("no pages")
    logger.debug("pdf: %d pages, %d without text", count, empty_pages)
    return PdfText("".join(parts), count, tuple(notes), tuple(unusable))


_LETTER: Final = (612.0, 792.0)


def _page_size(page: Any) -> tuple[float, float]:
    """The page's media box in points; US Letter when the box cannot be read (a damaged page)."""
    try:
        box = page.mediabox
        return abs(float(box.width)), abs(float(box.height))
    except Exception:  # noqa: BLE001 - pypdf raises many kinds on a damaged box
        return _LETTER
