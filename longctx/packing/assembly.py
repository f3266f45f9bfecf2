"""Assembling a pack from rendered sections: their fingerprints, their counts, the pack's fingerprint.

Shared by the builder (:mod:`longctx.packing.build`, which renders and counts
documents as they are read) and the shards (:mod:`longctx.packing.budget`,
which assemble packs from slices of a corpus): both give their sections to
:func:`assemble`, so a corpus that fits is the same pack either way. It
lives apart from both because the builder checks the budget and the
budget's shards assemble packs: in either module it would close a circle.

Counts: with a tokenizer, every section is counted, through the
:class:`~longctx.store.Store` cache when one is given. Sections are built so
that counts add up for GPT-style BPE tokenizers; with the server's own
tokenizer the whole prefix is counted once more (cached too), so
``prefix_tokens`` is exact even where they would not add up, and the chat
template's own tokens are measured (``template_overhead_tokens``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import field
from typing import Final

from longctx.documents import Document, ImagePart
from longctx.packing.image_parts import PlacedImage
from longctx.packing.model import Pack, Section, pack_fingerprint, section_fingerprint
from longctx.packing.rendering import (
    BOUNDARY,
    DOCUMENTS_OPENING,
    FORMAT_VERSION,
    IMAGES_FORMAT_VERSION,
    IMAGES_SYSTEM_HEADER,
    SYSTEM_HEADER,
    ListingEntry,
    render_document,
)
from longctx.recordtypes import record_type
from longctx.sources.corpus import CorpusOutline
from longctx.store import Store, StoredText
from longctx.tokens.images import ImageTokenCounter, estimate_image_counter
from longctx.tokens.tokenizers import TemplateTokenizer, Tokenizer, cached_counts

__all__ = [
    "ImageCost",
    "PackCounter",
    "Sections",
    "assemble",
    "clean_text",
    "document_section_texts",
    "included_notes",
    "is_listed",
    "skipped_entries",
]

# A miniature first user message, to measure what the chat template adds
# around the system message and the user message.
_TEMPLATE_PROBE_USER: Final = DOCUMENTS_OPENING + BOUNDARY + "Why?"


def clean_text(text: str) -> str:
    """``text`` with lone surrogates (never valid in UTF-8) replaced by U+FFFD."""
    if text.isascii():  # known without reading the text
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(char) <= 0xDFFF else char for char in text)
    return text


def is_listed(document: Document) -> bool:
    """Whether ``document`` has its own line in the listing: not a PDF page's or a notebook output's image."""
    return document.image is None or document.image.source == "file"


def document_section_texts(documents: Sequence[Document]) -> list[str]:
    """Each document rendered as its pack section, in the order given."""
    return [render_document(document.path, clean_text(document.text)) for document in documents]


@record_type
class ImageCost:
    """What a pack's images cost: tokens (None: not counted), the counter's identity, whether estimated."""

    tokens: int | None
    counter: str | None
    estimated: bool


@record_type(frozen=False)
class PackCounter:
    """Counts a build's sections through the store's count cache, and measures the chat template's overhead.

    Without a tokenizer nothing is counted (:meth:`counts` is None); the
    template overhead is measured only with the server's own tokenizer
    (a :class:`~longctx.tokens.TemplateTokenizer`), once per system message.
    Images are counted by ``image_counter``, or by the documented estimate
    (:func:`~longctx.tokens.images.estimate_image_counter`) when none is given.
    """

    tokenizer: Tokenizer | None
    store: Store | None
    image_counter: ImageTokenCounter | None = None
    _overheads: dict[str, int] = field(default_factory=dict)

    def image_tokens(self, images: Sequence[ImagePart]) -> ImageCost:
        """What ``images`` cost; no tokens without a tokenizer."""
        if self.tokenizer is None or not images:
            return ImageCost(None, None, False)
        counter = self.image_counter or estimate_image_counter()
        return ImageCost(sum(counter.count_images(images)), counter.identity, counter.estimated)

    def counts(self, texts: Sequence[str], digests: Sequence[str] | None = None) -> list[int] | None:
        """The token count of each text (``digests``: their fingerprints); None without a tokenizer."""
        if self.tokenizer is None:
            return None
        return cached_counts(self.tokenizer, texts, self.store, digests=digests)

    def template_overhead(self, system: str) -> int | None:
        """Tokens the chat template adds around ``system`` and a question; None without the server's."""
        if not isinstance(self.tokenizer, TemplateTokenizer):
            return None
        if system not in self._overheads:
            self._overheads[system] = self._measure_overhead(self.tokenizer, system)
        return self._overheads[system]

    def _measure_overhead(self, tokenizer: TemplateTokenizer, system: str) -> int:
        # Cached under a key no real text can have: the counts table maps a
        # text digest to tokens, so this is the digest of a tagged string.
        key = section_fingerprint(f"\0template-overhead\0{system}\0{_TEMPLATE_PROBE_USER}")
        identity = tokenizer.identity
        if self.store is not None:
            known = self.store.caches.token_counts(identity, [key])
            if key in known:
                return known[key]
        messages = [{"role": "system", "content": system}, {"role": "user", "content": _TEMPLATE_PROBE_USER}]
        whole = len(tokenizer.tokenize_messages(messages, add_generation_prompt=True))
        parts = tokenizer.count_many([system, _TEMPLATE_PROBE_USER])
        overhead = whole - sum(parts)
        if self.store is not None:
            self.store.caches.save_token_counts(identity, {key: overhead})
        return overhead


@record_type
class Sections:
    """What :func:`assemble` makes a pack of: document sections, their listing, and what is known of them.

    ``document_texts`` are the sections between the opening and the listing
    (documents, earlier copies, the changes marker), called ``names``.
    ``document_counts`` and ``document_fingerprints``, when given, are
    theirs already (a builder counted and hashed them as they came).
    ``documents_digest``, when given, is :func:`~longctx.packing.model.pack_digest_start` already
    fed with the opening and the documents' UTF-8 bytes; :func:`assemble`
    finishes it, so it serves one pack (not one with images: their header
    differs, so their fingerprint is worked out afresh). ``stored_text`` is the store's copy
    of every section's UTF-8, for a pack written as it was built. ``images``
    are the image documents' sections: (index in ``document_texts``, image).
    """

    document_texts: Sequence[str | memoryview]
    names: Sequence[str]
    listing: str
    part: int | None = None
    document_counts: Sequence[int] | None = None
    document_fingerprints: Sequence[str] | None = None
    documents_digest: hashlib._Hash | None = None
    stored_text: StoredText | None = None
    images: Sequence[tuple[int, ImagePart]] = ()


def _placed(given: Sections) -> tuple[PlacedImage, ...]:
    """Each image of ``given`` at its placeholder line: the line after its section's opening fence."""
    placed: list[PlacedImage] = []
    offsets = {index: image for index, image in given.images}
    start = len(DOCUMENTS_OPENING)
    for index, text in enumerate(given.document_texts):
        section = _as_str(text)
        image = offsets.get(index)
        if image is not None:
            line_start = section.index("\n") + 1
            line_end = section.index("\n", line_start) + 1
            placed.append(PlacedImage(start + line_start, line_end - line_start, image))
        start += len(section)
    return tuple(placed)


def _section_counts(
    given: Sections, counter: PackCounter, texts: Sequence[str | memoryview], fingerprints: Sequence[str]
) -> list[int] | None:
    """Each section's tokens (None without a tokenizer); documents counted already are not counted again."""
    if counter.tokenizer is None:
        return None
    if given.document_counts is None:
        return counter.counts([_as_str(text) for text in texts], fingerprints)
    fixed_indexes = (0, 1, len(texts) - 2, len(texts) - 1)
    fixed = counter.counts(
        [_as_str(texts[i]) for i in fixed_indexes], [fingerprints[i] for i in fixed_indexes]
    )
    assert fixed is not None
    return [fixed[0], fixed[1], *given.document_counts, fixed[2], fixed[3]]


def assemble(given: Sections, counter: PackCounter) -> Pack:
    """The pack of ``given``'s document sections and listing, counted through ``counter``.

    A pack with images gets the images' system message and format version
    (``longctx-pack/5``); one without is exactly as it always was.
    """
    listing = given.listing
    images = _placed(given)
    system, version = (
        (IMAGES_SYSTEM_HEADER, IMAGES_FORMAT_VERSION) if images else (SYSTEM_HEADER, FORMAT_VERSION)
    )
    names = ["header", "opening", *given.names, "listing", "boundary"]
    texts: list[str | memoryview] = [
        system,
        DOCUMENTS_OPENING,
        *given.document_texts,
        listing,
        BOUNDARY,
    ]
    document_fingerprints = given.document_fingerprints
    if document_fingerprints is None:
        document_fingerprints = [section_fingerprint(_as_str(text)) for text in given.document_texts]
    fingerprints = [
        section_fingerprint(system),
        section_fingerprint(DOCUMENTS_OPENING),
        *document_fingerprints,
        section_fingerprint(listing),
        section_fingerprint(BOUNDARY),
    ]
    counts = _section_counts(given, counter, texts, fingerprints)
    sections = tuple(
        Section(name, text, fingerprint, None if counts is None else counts[index])
        for index, (name, text, fingerprint) in enumerate(zip(names, texts, fingerprints, strict=True))
    )
    prefix_tokens: int | None = None
    additive: bool | None = None
    if counts is not None:
        prefix_tokens = sum(counts)
        if isinstance(counter.tokenizer, TemplateTokenizer):
            # The server is the authority: count the whole user prefix once
            # (cached like any text) and trust it over the sum.
            whole = counter.counts(["".join(_as_str(text) for text in texts[1:])])
            assert whole is not None
            additive = whole[0] == sum(counts[1:])
            prefix_tokens = counts[0] + whole[0]
    tokenizer = counter.tokenizer
    fingerprint = _pack_fingerprint(given, texts, version if images else None)
    image_cost = counter.image_tokens([placed.image for placed in images])
    return Pack(
        format_version=version,
        system=system,
        sections=sections,
        fingerprint=fingerprint,
        tokenizer=None if tokenizer is None else tokenizer.identity,
        estimated=bool(tokenizer is not None and (tokenizer.estimated or image_cost.estimated)),
        prefix_tokens=prefix_tokens,
        template_overhead_tokens=counter.template_overhead(system),
        part=given.part,
        sections_additive=additive,
        _stored_text=given.stored_text,
        images=images,
        image_tokens=image_cost.tokens,
        image_counter=image_cost.counter,
    )


def _pack_fingerprint(given: Sections, texts: Sequence[str | memoryview], images_version: str | None) -> str:
    """The fingerprint of the pack of ``texts`` (header first); ``images_version`` for a pack with images."""
    documents_digest = given.documents_digest
    if images_version is not None:  # its header is not the one the builder's digest started with
        return pack_fingerprint(_as_str(texts[0]), (_as_str(text) for text in texts[1:]), images_version)
    if documents_digest is None:
        return pack_fingerprint(_as_str(texts[0]), (_as_str(text) for text in texts[1:]))
    for text in (given.listing, BOUNDARY):
        documents_digest.update(text.encode("utf-8"))
    documents_digest.update(b"\0")
    return documents_digest.hexdigest()


def _as_str(text: str | memoryview) -> str:
    return text if isinstance(text, str) else str(text, "utf-8", "surrogatepass")


def skipped_entries(corpus: CorpusOutline) -> list[ListingEntry]:
    """The listing's entries for the paths the corpus skipped, each with its reason."""
    return [ListingEntry(entry.path, str(entry.reason)) for entry in corpus.manifest.skipped]


_NO_TEXT_NOTE = re.compile(r"page (\d+): (?:no extractable text|text extraction failed)")


def included_notes(corpus: CorpusOutline) -> dict[str, str]:
    """The listing note of each packed path whose text lacks pages: ``no text on pages 2, 5``."""
    notes: dict[str, str] = {}
    for entry in corpus.manifest.included:
        pages = [match.group(1) for note in entry.notes if (match := _NO_TEXT_NOTE.match(note))]
        if pages:
            notes[entry.path] = ("no text on page " if len(pages) == 1 else "no text on pages ") + ", ".join(
                pages
            )
    return notes
