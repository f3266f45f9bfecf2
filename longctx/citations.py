"""Grounded answers: the places an answer says it rests on, read from its text and checked against the pack.

A question asked with ``cite=True`` ends its user message with
:data:`CITE_INSTRUCTION` (after the question, so the cached prefix is the
same bytes as a plain question's), and its request carries
:func:`cite_schema` as the answer's schema (a body field, never prompt
text): JSON, the answer, then up to three sources, each a document's path
and one of that document's lines, held there by the engine's grammar.
:func:`cited_text` reads the JSON back into the answer followed by a
``Sources:`` block (``- PATH:START-END "QUOTE"``); an answer in prose (a
server that ignored the schema) is read by its own ``Sources:`` block
(:func:`parse_claims`). Every claim is checked against the exact text of
the documents the request carried (:func:`verify_claim`): the path is a
document there, the lines exist in it, and the quote occurs in those lines
(whitespace runs compared as one space). A claim without a quote is never
verified: a path alone checks nothing about what the answer says. A claim
that fails is kept, marked unverified with the reason. Every step is a pure
function of its arguments.

Why the grammar: asked in prose, the test suite's small real model
(Qwen2.5-Coder-0.5B-Instruct) never wrote a quote that verified, and with a
free quote in JSON 3 of 27 did; held to the lines, all did and every answer
stayed right (benchmarks/citations_quality.py; docs/testing.md has the
table). A verified quote is a real line of the document named; whether that
line supports the answer is still the reader's to judge.

Why quotes as well as lines: a model copies a span of its context verbatim
far more reliably than it counts lines in a long document (the pack carries
no line numbers, so a line range is the model's estimate). The quote is the
part that can be checked exactly; where it stands elsewhere in the document
than the lines claimed, the reason says where, and a claim with a quote and
no lines gets its lines from where the quote is.
"""

from __future__ import annotations

import bisect
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final
from urllib.parse import quote as url_quote

from longctx.packing.rendering import read_documents
from longctx.recordtypes import record_type

__all__ = [
    "CITE_INSTRUCTION",
    "NO_QUOTE",
    "Citation",
    "CitationClaim",
    "CitedAnswer",
    "CitedText",
    "Grounding",
    "cite_schema",
    "cited_text",
    "file_link",
    "parse_claims",
    "read_citations",
    "strip_sources",
    "verify_claim",
]

CITE_INSTRUCTION: Final = (
    "\n\n"
    'Answer in JSON: "answer" is your answer; "sources" lists the places in the documents it rests on, '
    'each with its "path" (as its fence shows it) and a "quote": a short passage copied exactly from that '
    "document."
)
"""What a cited question's user message ends with, after the question (never in the cached prefix).

The request also carries :func:`cite_schema` as its answer's schema (a body
field, not prompt text), so that the engine decodes the answer, then its
sources, each quote one of its document's lines.
"""

MAX_SOURCES: Final = 3
"""The most sources a cited answer's schema lets it give (each a line of a document)."""


@record_type
class Citation:
    """One place an answer cites, and whether it is in the pack.

    ``start_line`` and ``end_line`` (1-based, inclusive) are None when the
    answer gave none and no quote placed it; ``quote`` is None when it gave
    none. ``verified``: the path is a document of the pack, the lines exist
    in it, and there is a quote and it occurs in them; otherwise ``reason``
    says which part failed (it is None for a verified citation).
    """

    path: str
    start_line: int | None
    end_line: int | None
    quote: str | None
    verified: bool
    reason: str | None = None

    @property
    def location(self) -> str:
        """``path:START-END`` (``path:LINE`` for one line, the path alone without lines)."""
        if self.start_line is None:
            return self.path
        if self.end_line is None or self.end_line == self.start_line:
            return f"{self.path}:{self.start_line}"
        return f"{self.path}:{self.start_line}-{self.end_line}"

    def describe(self) -> str:
        """One line: the location, the quote, and the reason when unverified."""
        quoted = f' "{self.quote}"' if self.quote else ""
        status = "" if self.verified else f"  [unverified: {self.reason}]"
        return f"{self.location}{quoted}{status}"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the CLI's ``--json``, the store's column): every field by name."""
        return {
            "path": self.path,
            "start_line": self.start_line,
            "end_line": self.end_line,
            "quote": self.quote,
            "verified": self.verified,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Citation:
        """The citation :meth:`to_dict` wrote."""
        return cls(
            path=str(data["path"]),
            start_line=data.get("start_line"),
            end_line=data.get("end_line"),
            quote=data.get("quote"),
            verified=bool(data["verified"]),
            reason=data.get("reason"),
        )


@record_type
class CitedAnswer:
    """A report's entry for one cited answer: its question, turn (from 1), citations, per citation a link.

    ``links`` holds a ``file://`` URL for each citation whose document was
    found on this machine (None for the others), in the order of ``citations``.
    """

    question: str
    turn: int
    citations: tuple[Citation, ...]
    links: tuple[str | None, ...] = ()


@record_type
class CitationClaim:
    """One line of a ``Sources:`` block as written: a path, maybe lines, maybe a quote; not yet checked."""

    path: str
    start_line: int | None
    end_line: int | None
    quote: str | None


# The heading of the block: "Sources:", "**Sources:**", "## Sources", "References", "Citations".
_HEADING = re.compile(
    r"\s*(?:#{1,6}\s*)?[*_]{0,2}(?:sources|citations|references)"
    r"(?:[*_]{0,2}\s*:[*_]{0,2}|[*_]{0,2}\s*$)\s*(?P<rest>.*)",
    re.IGNORECASE,
)
_BULLET = re.compile(r"\s*(?:[-*+\u2022]|\d{1,3}[.)]|\[\d{1,3}\])\s+")
# PATH:START-END, PATH:LINE, PATH#L12-L20, PATH#L12, with a trailing colon or comma allowed.
_LOCATION = re.compile(
    r"(?P<path>.+?)(?::(?P<start>\d+)(?:\s*[-\u2013\u2014]\s*(?P<end>\d+))?"
    r"|#L(?P<anchor_start>\d+)(?:-L?(?P<anchor_end>\d+))?)?[:,]?"
)
# "lines 12-20", "line 12", "(lines 12-20)", "L12-L20" after the path.
_LINES_WORDS = re.compile(
    r"\(?\b(?:lines?\s+|L)(?P<start>\d+)(?:\s*[-\u2013\u2014]\s*L?(?P<end>\d+))?\)?", re.I
)
_QUOTES = (
    re.compile(r'"(?P<quote>.+)"', re.S),
    re.compile(r"\u201c(?P<quote>.+)\u201d", re.S),
    re.compile(r"`(?P<quote>[^`]+)`"),
)


def parse_claims(answer: str) -> tuple[CitationClaim, ...]:
    """The claims of the last ``Sources:`` block of ``answer``, in order, each once; none without one.

    Every non-blank line after the heading is a claim, up to the first blank
    line after one: a line that names no path is a claim of its text as the
    path, which :func:`verify_claim` then finds in no document.
    """
    block = _sources_block(answer.splitlines())
    if block is None:
        return ()
    claims: list[CitationClaim] = []
    for entry in block[2]:
        claim = _claim(entry)
        if claim is not None and claim not in claims:
            claims.append(claim)
    return tuple(claims)


def strip_sources(answer: str) -> str:
    """``answer`` without its last ``Sources:`` block (heading and claims), as the answer alone; stripped."""
    lines = answer.splitlines()
    block = _sources_block(lines)
    if block is None:
        return answer.strip()
    start, end, _ = block
    return "\n".join(lines[:start] + lines[end:]).strip()


def _sources_block(lines: list[str]) -> tuple[int, int, list[str]] | None:
    """The last ``Sources:`` block of ``lines``: its heading's index, the index after it, its entries."""
    heading = next(
        (i for i in range(len(lines) - 1, -1, -1) if _HEADING.fullmatch(lines[i])),
        None,
    )
    if heading is None:
        return None
    rest = _HEADING.fullmatch(lines[heading])
    entries = [rest.group("rest")] if rest is not None and rest.group("rest").strip() else []
    end = heading + 1
    for line in lines[heading + 1 :]:
        if not line.strip():
            if entries:
                break
            end += 1
            continue
        entries.append(line)
        end += 1
    return heading, end, entries


def _claim(entry: str) -> CitationClaim | None:
    """One entry of the block read as a claim; None for an entry that is only a bullet."""
    text = _BULLET.sub("", entry, count=1).strip()
    if not text:
        return None
    quote = None
    if text.startswith("`") and text.count("`") >= 2:
        head, _, tail = text[1:].partition("`")
    else:
        head, _, tail = text.partition(" ")
        if head.startswith(('"', "\u201c")):  # no path before the quote
            head, tail = "", text
    location = _LOCATION.fullmatch(head)
    path = location.group("path") if location is not None and location.group("path") else head
    start = _int(location, "start", "anchor_start")
    end = _int(location, "end", "anchor_end")
    for pattern in _QUOTES:
        found = pattern.search(tail)
        if found is not None:
            quote = found.group("quote").strip() or None
            tail = tail[: found.start()] + tail[found.end() :]  # line words inside the quote are its text
            break
    words = _LINES_WORDS.search(tail) if start is None else None
    if words is not None:
        start, end = int(words.group("start")), _int(words, "end")
    return CitationClaim(
        path.strip("`'\"").removeprefix("./"), start, end if end is not None else start, quote
    )


def _int(match: re.Match[str] | None, *groups: str) -> int | None:
    """The first of ``groups`` that ``match`` set, as an int."""
    if match is None:
        return None
    return next((int(value) for value in (match.group(g) for g in groups) if value is not None), None)


class _Words:
    """A document's text as its words, each with its line: a search blind to runs of whitespace."""

    def __init__(self, text: str) -> None:
        words: list[str] = []
        self.lines: list[int] = []
        for number, line in enumerate(text.split("\n"), start=1):
            for word in line.split():
                words.append(word)
                self.lines.append(number)
        self.joined = " ".join(words)
        self.offsets = [0]
        for word in words[:-1]:
            self.offsets.append(self.offsets[-1] + len(word) + 1)

    def occurrences(self, quote: str) -> list[tuple[int, int]]:
        """The (first line, last line) of every place ``quote`` occurs, whitespace runs matched as one."""
        needle = " ".join(quote.split())
        found: list[tuple[int, int]] = []
        start = self.joined.find(needle)
        while needle and start >= 0:
            first = bisect.bisect_right(self.offsets, start) - 1
            last = bisect.bisect_right(self.offsets, start + len(needle) - 1) - 1
            found.append((self.lines[first], self.lines[last]))
            start = self.joined.find(needle, start + 1)
        return found


def _line_count(text: str) -> int:
    return len(text.split("\n")) - (1 if text.endswith("\n") else 0) if text else 0


def verify_claim(claim: CitationClaim, documents: Mapping[str, str]) -> Citation:
    """``claim`` checked against ``documents`` (path to exact text, as the request carried them)."""
    text = documents.get(claim.path)
    if text is None:
        return _unverified(claim, f"no document {claim.path!r} in the pack")
    count = _line_count(text)
    start, end = claim.start_line, claim.end_line
    if start is not None and end is not None:
        if start < 1 or end < start:
            return _unverified(claim, f"lines {start}-{end} are not a range")
        if end > count:
            return _unverified(claim, f"lines {start}-{end} are past the end of {claim.path} ({count} lines)")
    if claim.quote is None:
        # A path (and lines) alone is the model's say-so: nothing in it can be checked against the text,
        # so it never counts as verified ("Sources: secrets.py" named a file the answer never read).
        return _unverified(claim, NO_QUOTE)
    places = _Words(text).occurrences(claim.quote)
    if not places:
        return _unverified(claim, f"the quote is not in {claim.path}")
    if start is None or end is None:
        first, last = places[0]
        return Citation(claim.path, first, last, claim.quote, verified=True)
    if any(start <= first and last <= end for first, last in places):
        return Citation(claim.path, start, end, claim.quote, verified=True)
    first, last = places[0]
    where = f"line {first}" if first == last else f"lines {first}-{last}"
    return _unverified(claim, f"the quote is not in lines {start}-{end}: it is at {where}")


NO_QUOTE: Final = "no quote: a path and lines alone cannot be checked against the text"
"""The reason of a citation that names a place without quoting it (never verified)."""


def _unverified(claim: CitationClaim, reason: str) -> Citation:
    return Citation(claim.path, claim.start_line, claim.end_line, claim.quote, verified=False, reason=reason)


def read_citations(answer: str, documents: Mapping[str, str]) -> tuple[Citation, ...]:
    """Every claim of ``answer``'s ``Sources:`` block, checked against ``documents``; () without a block."""
    checked = [verify_claim(claim, documents) for claim in parse_claims(answer)]
    # Two lines that say the same once checked (one with lines, one whose quote placed it) are one.
    return tuple(citation for index, citation in enumerate(checked) if citation not in checked[:index])


def cite_schema(documents: Mapping[str, str]) -> dict[str, Any]:
    """The JSON Schema of a cited answer over ``documents`` (path to text): the answer, then its sources.

    Each source is one document's path and one of its lines (stripped, not
    blank), as an ``enum`` per document: the engine's grammar, not the
    model's care, makes every quote a line of the document it names.
    Measured on Qwen2.5-Coder-0.5B-Instruct (benchmarks/citations_quality.py,
    docs/testing.md): asked in prose, none of its quotes verified; in JSON
    with a free quote, 3 of 27; held to the lines, all, with every answer
    right (sources first cost three answers).
    """
    sources = [
        {
            "type": "object",
            "properties": {
                "path": {"const": path},
                "quote": {"enum": sorted({line.strip() for line in text.splitlines() if line.strip()})},
            },
            "required": ["path", "quote"],
            "additionalProperties": False,
        }
        for path, text in documents.items()
        if text.strip()
    ]
    return {
        "type": "object",
        "properties": {
            "answer": {"type": "string"},
            "sources": {"type": "array", "items": {"anyOf": sources}, "minItems": 1, "maxItems": MAX_SOURCES},
        },
        "required": ["answer", "sources"],
        "additionalProperties": False,
    }


@record_type
class CitedText:
    """A cited answer as read: its text to show and keep, and its citations checked against the pack.

    An answer in :func:`cite_schema`'s JSON becomes its answer followed by a
    ``Sources:`` block (``- PATH:START-END "QUOTE"``, which
    :func:`parse_claims` reads back as the same claims); an answer in prose
    (a server that ignored the schema) is kept as it is, its own block read.
    """

    text: str
    citations: tuple[Citation, ...]


def cited_text(answer: str, documents: Mapping[str, str]) -> CitedText:
    """``answer`` (:func:`cite_schema`'s JSON, or prose with a ``Sources:`` block) read and checked."""
    found = _json_answer(answer)
    if found is None:
        return CitedText(answer, read_citations(answer, documents))
    text, claims = found
    checked = [verify_claim(claim, documents) for claim in claims]
    citations = tuple(citation for index, citation in enumerate(checked) if citation not in checked[:index])
    if citations:
        text += "\n\nSources:\n" + "\n".join(f'- {c.location} "{c.quote}"' for c in citations)
    return CitedText(text, citations)


def _json_answer(answer: str) -> tuple[str, list[CitationClaim]] | None:
    """The answer and the claims of a JSON cited answer, or of one cut after its answer; None for prose."""
    try:
        data = json.loads(answer)
    except ValueError:
        data = _cut_json(answer)
    if not isinstance(data, dict) or not isinstance(data.get("answer"), str):
        return None
    sources = data.get("sources")
    claims = [
        CitationClaim(str(source.get("path", "")), None, None, str(source.get("quote") or "").strip() or None)
        for source in (sources if isinstance(sources, list) else [])
        if isinstance(source, dict)
    ]
    return data["answer"].strip(), claims


_ANSWER_KEY = re.compile(r'\s*\{\s*"answer"\s*:\s*')
_SOURCES_KEY = re.compile(r'\s*,\s*"sources"\s*:\s*\[')


def _cut_json(answer: str) -> dict[str, Any] | None:
    """The answer and the whole sources of :func:`cite_schema`'s JSON cut at ``max_tokens``; None if none.

    The answer comes first, so an answer cut among its sources keeps it and
    every source written to its closing brace.
    """
    decoder = json.JSONDecoder()
    opening = _ANSWER_KEY.match(answer)
    if opening is None:
        return None
    try:
        text, end = decoder.raw_decode(answer, opening.end())
    except ValueError:
        return None
    sources: list[Any] = []
    listed = _SOURCES_KEY.match(answer, end)
    position = listed.end() if listed is not None else len(answer)
    while position < len(answer):
        while position < len(answer) and answer[position] in " \t\r\n,":  # between two sources
            position += 1
        try:
            source, position = decoder.raw_decode(answer, position)
        except ValueError:
            break
        sources.append(source)
    return {"answer": text, "sources": sources}


@record_type
class Grounding:
    """A cited question's part: what its message ends with, and the text its answer is checked in.

    ``texts`` are the pack's prefix and the blocks of changed files that the
    history and the question's own message carried, in order (a later copy
    of a path replaces an earlier one).
    """

    instruction: str
    texts: tuple[str, ...]

    @property
    def documents(self) -> dict[str, str]:
        """The documents of :attr:`texts`, path to exact text."""
        return read_documents("".join(self.texts))

    @property
    def schema(self) -> dict[str, Any]:
        """The answer's schema over these documents (:func:`cite_schema`): a body field, not prompt text."""
        return cite_schema(self.documents)

    def read(self, answer: str) -> CitedText:
        """``answer`` read as :func:`cited_text` reads it, against the documents of :attr:`texts`."""
        return cited_text(answer, self.documents)

    def citations(self, answer: str) -> tuple[Citation, ...]:
        """The citations of ``answer``, each checked against the documents of :attr:`texts`."""
        return self.read(answer).citations


def file_link(path: str, roots: Sequence[str]) -> str | None:
    """A ``file://`` URL of the document ``path`` on this machine, found under ``roots`` (the packed paths).

    A document is named relative to its packed path, or, with several, under
    that path's base name (see :func:`longctx.load_corpus`): ``root/path``
    and ``parent-of-root/path`` are tried, in the order of ``roots``. None
    when neither is a file (a pack made elsewhere, a file since deleted).
    """
    for root in roots:
        candidates = [os.path.join(root, path)] if os.path.isdir(root) else []
        base = os.path.basename(os.path.normpath(root))
        if path == base or path.startswith(base + "/"):
            candidates.append(os.path.join(os.path.dirname(os.path.normpath(root)), path))
        for candidate in candidates:
            if os.path.isfile(candidate):
                return "file://" + url_quote(os.path.abspath(candidate).replace(os.sep, "/"))
    return None
