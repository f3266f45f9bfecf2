"""Pack: the cache-friendly prompt prefix, its fingerprints, token counts, budget and shards.

A :class:`Pack` is the shared start of every request about a corpus: a
fixed system message and the start of the first user message (documents,
listing, boundary); the question comes right after it. It is a pure
function of the documents and the manifest (see :mod:`longctx.rendering`
and ``docs/pack-format.md``), fingerprinted per section so that a cache
break can be located (:func:`compare_packs`).

Counts: with a tokenizer, every section is counted, through the
:class:`~longctx.store.Store` cache when one is given. Sections are built so
that counts add up for GPT-style BPE tokenizers; with the server's own
tokenizer the whole prefix is counted once more (cached too), so
``prefix_tokens`` is exact even where they would not add up, and the chat
template's own tokens are measured (``template_overhead_tokens``).

Budget: :func:`build_pack` raises :class:`~longctx.errors.BudgetError`
(total, budget, largest files and folders) when the pack does not fit;
:func:`build_shards` splits the documents, in corpus order, into packs that
each fit.

:func:`pack` is the one call from paths to a pack: it loads the corpus and
renders and counts each document as soon as it is read (the counting runs
beside the reading, see :mod:`longctx.counting`), and with a store it reuses
the pack of a git repository whose state has not changed since
(:mod:`longctx.snapshots`) without reading a file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, BinaryIO, Final

from longctx import outputs
from longctx.config import CorpusOptions
from longctx.corpus import Corpus, Manifest, load_corpus
from longctx.documents import Document
from longctx.errors import BudgetError, ConfigError, PackError
from longctx.outputs import Saved
from longctx.pack import snapshots
from longctx.pack.counting import SectionCounter, count_texts
from longctx.pack.rendering import (
    BOUNDARY,
    CHANGES_MARKER,
    DOCUMENTS_OPENING,
    FORMAT_VERSION,
    SYSTEM_HEADER,
    ListingEntry,
    folder_lines,
    render_document,
    render_listing,
)
from longctx.store import Store, StoredText
from longctx.tokens import EstimateTokenizer, ServerTokenizer, Tokenizer, cached_counts, text_sha256

__all__ = [
    "DEFAULT_PROBE_QUESTION",
    "FORMAT_VERSION",
    "BoundaryCheck",
    "Budget",
    "Pack",
    "PackComparison",
    "PackResult",
    "PromptCount",
    "Section",
    "ShardedPack",
    "build_pack",
    "build_shards",
    "check_cache_boundary",
    "compare_packs",
    "pack",
]

DEFAULT_PROBE_QUESTION: Final = "Which files define the public API, and what does each of them do?"
"""The question :func:`check_cache_boundary` appends when none is given."""

_DOCUMENT_PREFIX: Final = "document:"
_EARLIER_PREFIX: Final = "earlier:"
_CHANGES: Final = "changes"
_LARGEST_SHOWN: Final = 10
# Files tracked above which a first pack starts its counting worker at once.
_EARLY_WORKER_FILES: Final = 256
# A miniature first user message, to measure what the chat template adds
# around the system message and the user message.
_TEMPLATE_PROBE_USER: Final = DOCUMENTS_OPENING + BOUNDARY + "Why?"


class _Text:
    """The descriptor behind :attr:`Section.text`: a str, or UTF-8 decoded on first read.

    A pack read back from the store (:mod:`longctx.snapshots`) holds its
    sections as views of the stored UTF-8: writing it out or comparing
    fingerprints never decodes 37 MB nobody reads.
    """

    def __get__(self, section: object, owner: type | None = None) -> str:
        if section is None:
            raise AttributeError("text")  # no default value, for dataclasses
        value = section.__dict__["text"]
        if isinstance(value, str):
            return value
        text = str(value, "utf-8", "surrogatepass")
        section.__dict__["text"] = text
        return text

    def __set__(self, section: object, value: str | memoryview) -> None:
        section.__dict__["text"] = value


@dataclass(frozen=True)
class Section:
    """One fingerprinted piece of the prompt prefix.

    ``name`` is ``header`` (the system message), ``opening``,
    ``document:<path>``, ``listing`` or ``boundary``; a layered pack
    (:mod:`longctx.sources.layers`) also has ``earlier:<path>`` (the base's
    copy of a file changed since) and ``changes`` (the marker before the
    documents changed since the base). ``fingerprint`` is the
    sha256 of ``text``'s UTF-8 bytes; ``tokens`` its count under the pack's
    tokenizer, when counted. ``text`` may be given as a view of its UTF-8
    (a section read back from the store); it is decoded when first read.
    """

    name: str
    text: _Text = _Text()
    # The descriptor above gives text no default (its class access raises
    # AttributeError), which dataclasses honour and mypy does not see.
    fingerprint: str  # type: ignore[misc]
    tokens: int | None = None

    def utf8(self) -> bytes | memoryview:
        """``text`` as UTF-8, without decoding a section given as UTF-8."""
        value = self.__dict__["text"]
        return value if isinstance(value, memoryview) else value.encode("utf-8", "surrogatepass")

    @property
    def path(self) -> str | None:
        """The document path of a ``document:`` section, else None."""
        return self.name[len(_DOCUMENT_PREFIX) :] if self.name.startswith(_DOCUMENT_PREFIX) else None

    @property
    def size_bytes(self) -> int:
        value = self.__dict__["text"]
        return value.nbytes if isinstance(value, memoryview) else len(value.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class PromptCount:
    """The tokens of one first request: pack prefix, chat template, question.

    ``total`` is None when a part is unknown (no template measure without the
    server tokenizer); ``estimated`` when any part is an estimate.
    """

    prefix_tokens: int | None
    template_overhead_tokens: int | None
    question_tokens: int | None
    estimated: bool

    @property
    def total(self) -> int | None:
        parts = (self.prefix_tokens, self.template_overhead_tokens, self.question_tokens)
        return (
            None if any(part is None for part in parts) else sum(part for part in parts if part is not None)
        )


@dataclass(frozen=True)
class Pack:
    """The shared prompt prefix of a corpus (or of one shard of it).

    ``system`` is the system message (the ``header`` section); ``prefix`` is
    the start of the first user message, the concatenation of every other
    section, ending with the boundary (``Question:`` and a line break); the
    question is appended right after it. ``fingerprint`` covers the format
    version, ``system`` and ``prefix``. ``prefix_tokens`` counts ``system``
    plus ``prefix`` as the server tokenizes them, without the chat
    template's own tokens, which are ``template_overhead_tokens`` (known
    with the server tokenizer only). ``part`` is the 1-based shard number
    when the pack is one of several.
    """

    format_version: str
    system: str
    sections: tuple[Section, ...]
    fingerprint: str
    tokenizer: str | None
    estimated: bool
    prefix_tokens: int | None
    template_overhead_tokens: int | None
    part: int | None = None
    sections_additive: bool | None = field(default=None)
    # The UTF-8 of every section in order, when the pack was read back from
    # the store: write_to hands it over in one piece.
    _stored_text: StoredText | None = field(default=None, compare=False, repr=False)

    @cached_property
    def prefix(self) -> str:
        """The start of the first user message: every section after the header, joined.

        Joined on first use and kept: a large pack's text is held once per
        section until someone needs it whole (see :meth:`prefix_parts`).
        """
        return "".join(self.prefix_parts())

    def prefix_parts(self) -> Iterator[str]:
        """The prefix's sections' texts in order, to write or send a pack without joining it."""
        return (section.text for section in self.sections[1:])

    def write_to(self, stream: BinaryIO) -> int:
        """Write ``system`` then ``prefix`` to ``stream`` as UTF-8, section by section; return the byte count.

        The fastest way to save a pack: nothing is joined, and a pack read
        back from the store is written from the stored bytes as they are.
        """
        if self._stored_text is not None:
            return self._stored_text.copy_to(stream)
        written = 0
        for section in self.sections:
            data = section.utf8()
            stream.write(data)
            written += len(data) if isinstance(data, bytes) else data.nbytes
        return written

    def save(self, path: str | os.PathLike[str]) -> Saved:
        """Save the pack's bytes (what :meth:`write_to` writes) to the file ``path``, whole or not at all.

        A file that already holds exactly these bytes is left as it is
        (``Saved.unchanged``); see :mod:`longctx.outputs` for the rest of
        the contract. Raises :class:`~longctx.errors.OutputError`.
        """
        stored = self._stored_text
        if stored is not None:
            return outputs.save(
                path, stored.size, lambda: stored.read_chunks(outputs.COMPARE_BYTES), self.write_to
            )
        # Encoded once, for the size, the comparison and the write alike.
        parts = [section.utf8() for section in self.sections]

        def write(stream: BinaryIO) -> int:
            for part in parts:
                stream.write(part)
            return sum(len(part) for part in parts)

        return outputs.save(path, sum(len(part) for part in parts), lambda: parts, write)

    @property
    def size_bytes(self) -> int:
        """The byte count :meth:`write_to` writes: every section's UTF-8."""
        if self._stored_text is not None:
            return self._stored_text.size
        return sum(section.size_bytes for section in self.sections)

    def user_content(self, question: str) -> str:
        """The first user message for ``question``: the prefix, then the question unchanged."""
        return self.prefix + question

    def messages(self, question: str) -> list[dict[str, str]]:
        """The chat messages of a first request: the system message, then the prefix and the question."""
        return [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.user_content(question)},
        ]

    @property
    def documents(self) -> tuple[Section, ...]:
        """The document sections, in pack order."""
        return tuple(section for section in self.sections if section.path is not None)

    @property
    def earlier_copies(self) -> tuple[Section, ...]:
        """The ``earlier:`` sections of a layered pack: the base's copies of files changed since."""
        return tuple(section for section in self.sections if section.name.startswith(_EARLIER_PREFIX))

    def section(self, name: str) -> Section:
        """The section called ``name``; raises KeyError when there is none."""
        for section in self.sections:
            if section.name == name:
                return section
        raise KeyError(name)

    @property
    def total_tokens(self) -> int | None:
        """Prefix plus template tokens: what the pack takes of the window before any question."""
        if self.prefix_tokens is None:
            return None
        return self.prefix_tokens + (self.template_overhead_tokens or 0)

    def prompt_count(self, question: str, tokenizer: Tokenizer) -> PromptCount:
        """Count the first request for ``question``: this pack's counts plus the question's tokens.

        ``tokenizer`` should be the one the pack was counted with; the
        question is counted alone (the boundary keeps it from merging with
        the prefix, see :func:`check_cache_boundary`).
        """
        return PromptCount(
            prefix_tokens=self.prefix_tokens,
            template_overhead_tokens=self.template_overhead_tokens,
            question_tokens=tokenizer.count(question),
            estimated=self.estimated or tokenizer.estimated,
        )

    def summary(self) -> dict[str, Any]:
        """JSON-able facts: version, fingerprints, counts (flagged when estimated), sections."""
        return {
            "format_version": self.format_version,
            "fingerprint": self.fingerprint,
            "part": self.part,
            "tokenizer": self.tokenizer,
            "estimated": self.estimated,
            "prefix_tokens": self.prefix_tokens,
            "template_overhead_tokens": self.template_overhead_tokens,
            "total_tokens": self.total_tokens,
            "sections_additive": self.sections_additive,
            "system_bytes": len(self.system.encode("utf-8")),
            "prefix_bytes": len(self.prefix.encode("utf-8")),
            "document_count": len(self.documents),
            "earlier_copy_count": len(self.earlier_copies),
            "sections": [
                {"name": section.name, "fingerprint": section.fingerprint, "tokens": section.tokens}
                for section in self.sections
            ],
        }


@dataclass(frozen=True)
class Budget:
    """How many tokens a pack may take: the context length less what the answer and question need.

    ``prompt_budget`` = ``context_length`` - ``reserved_output_tokens`` -
    ``reserved_question_tokens``; a pack fits when its prefix plus the chat
    template's tokens are at most that.
    """

    context_length: int
    reserved_output_tokens: int = 4096
    reserved_question_tokens: int = 1024

    def __post_init__(self) -> None:
        for name in ("context_length", "reserved_output_tokens", "reserved_question_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"Budget.{name} must be a non-negative integer, not {value!r}")
        if self.prompt_budget <= 0:
            raise ConfigError(
                f"the budget leaves no room for a pack: context {self.context_length} - output "
                f"{self.reserved_output_tokens} - question {self.reserved_question_tokens} <= 0"
            )

    @property
    def prompt_budget(self) -> int:
        return self.context_length - self.reserved_output_tokens - self.reserved_question_tokens

    def describe(self) -> str:
        return (
            f"{self.prompt_budget:,} (context {self.context_length:,}"
            f" - output {self.reserved_output_tokens:,}"
            f" - question {self.reserved_question_tokens:,})"
        )


@dataclass(frozen=True)
class ShardedPack:
    """A corpus split into packs that each fit the budget, in corpus order.

    Each shard is a full :class:`Pack` (same header, its own documents, its
    own listing, ``part`` 1, 2, ...); the listing of skipped paths is in the
    last one. ``fingerprint`` covers the shards' fingerprints in order.
    """

    shards: tuple[Pack, ...]
    budget: Budget
    fingerprint: str

    def summary(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "fingerprint": self.fingerprint,
            "prompt_budget": self.budget.prompt_budget,
            "shards": [shard.summary() for shard in self.shards],
        }


@dataclass(frozen=True)
class PackResult:
    """What :func:`pack` returns: the pack, the manifest of every path considered, and how it was made.

    ``ordering`` is the policy the documents were put in. ``reused`` is True
    when the pack and manifest were read back from the store (the
    repository had not changed since they were built) rather than built
    from the files; either way they are what :func:`build_pack` and
    :func:`~longctx.corpus.load_corpus` give for the same inputs.
    """

    pack: Pack
    # The manifest, or for a reused pack the call that decodes it: most
    # callers of a reused pack never read its thousands of entries.
    _manifest: Manifest | Callable[[], Manifest] = field(repr=False, compare=False)
    ordering: str
    reused: bool

    @cached_property
    def manifest(self) -> Manifest:
        """Every path considered, with what became of it (see :class:`~longctx.corpus.Manifest`)."""
        return self._manifest if isinstance(self._manifest, Manifest) else self._manifest()


@dataclass(frozen=True)
class PackComparison:
    """Where two packs part, and how much of the old prefix a server cache can still reuse.

    ``first_difference`` is the name of the first section that differs (the
    new pack's, or the old one's when the new pack ended first), None when
    the packs are identical. ``surviving_bytes`` counts the UTF-8 bytes of
    ``system + prefix`` shared from the start (whole sections, plus the
    common start of the first differing one); ``surviving_tokens`` the
    tokens of the whole sections shared from the start, when both packs were
    counted by the same tokenizer (a lower bound on the reusable tokens).
    ``partial_tokens`` adds the tokens of the first differing section's
    shared start, up to its last shared line break, when
    :func:`compare_packs` was given the tokenizer.
    """

    identical: bool
    first_difference: str | None
    detail: str
    surviving_sections: int
    surviving_bytes: int
    surviving_tokens: int | None
    old_prefix_tokens: int | None
    partial_tokens: int | None = None

    @property
    def surviving_share(self) -> float | None:
        """Surviving tokens (whole sections and ``partial_tokens``) per old pack token (1.0: identical)."""
        if self.surviving_tokens is None or not self.old_prefix_tokens:
            return None
        return (self.surviving_tokens + (self.partial_tokens or 0)) / self.old_prefix_tokens


@dataclass(frozen=True)
class BoundaryCheck:
    """Whether the prefix's tokens are a prefix of the tokens of prefix + question.

    ``divergent_position`` is the index of the first token where they
    differ (None when ``ok``).
    """

    ok: bool
    prefix_tokens: int
    prompt_tokens: int
    divergent_position: int | None
    question: str


# -- building -----------------------------------------------------------------


def _fingerprint(text: str) -> str:
    return text_sha256(text)


def _pack_digest_start(system: str) -> hashlib._Hash:
    """A sha256 fed with the format version and the system message, each followed by a NUL byte."""
    digest = hashlib.sha256()
    for part in (FORMAT_VERSION, system):
        digest.update(part.encode("utf-8"))
        digest.update(b"\0")
    return digest


def _pack_fingerprint(system: str, prefix_parts: Iterable[str]) -> str:
    """sha256 of the format version, the system message and the prefix, each followed by a NUL byte."""
    digest = _pack_digest_start(system)
    for part in prefix_parts:
        digest.update(part.encode("utf-8"))
    digest.update(b"\0")
    return digest.hexdigest()


def _clean_text(text: str) -> str:
    """``text`` with lone surrogates (never valid in UTF-8) replaced by U+FFFD."""
    if text.isascii():  # known without reading the text
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(char) <= 0xDFFF else char for char in text)
    return text


def _document_section_texts(documents: Sequence[Document]) -> list[str]:
    return [render_document(document.path, _clean_text(document.text)) for document in documents]


@dataclass
class _Counter:
    """Counts through the store for one build, and the server-only extras."""

    tokenizer: Tokenizer | None
    store: Store | None
    _overheads: dict[str, int] = field(default_factory=dict)

    def counts(self, texts: Sequence[str], digests: Sequence[str] | None = None) -> list[int] | None:
        if self.tokenizer is None:
            return None
        return cached_counts(self.tokenizer, texts, self.store, digests=digests)

    def template_overhead(self, system: str) -> int | None:
        if not isinstance(self.tokenizer, ServerTokenizer):
            return None
        if system not in self._overheads:
            self._overheads[system] = self._measure_overhead(self.tokenizer, system)
        return self._overheads[system]

    def _measure_overhead(self, tokenizer: ServerTokenizer, system: str) -> int:
        # Cached under a key no real text can have: the counts table maps a
        # text digest to tokens, so this is the digest of a tagged string.
        key = _fingerprint(f"\0template-overhead\0{system}\0{_TEMPLATE_PROBE_USER}")
        identity = tokenizer.identity
        if self.store is not None:
            known = self.store.token_counts(identity, [key])
            if key in known:
                return known[key]
        messages = [{"role": "system", "content": system}, {"role": "user", "content": _TEMPLATE_PROBE_USER}]
        whole = len(tokenizer.tokenize_messages(messages, add_generation_prompt=True))
        parts = tokenizer.count_many([system, _TEMPLATE_PROBE_USER])
        overhead = whole - sum(parts)
        if self.store is not None:
            self.store.save_token_counts(identity, {key: overhead})
        return overhead


def _assemble(
    document_texts: Sequence[str | memoryview],
    section_names: Sequence[str],
    listing: str,
    *,
    part: int | None,
    counter: _Counter,
    document_counts: Sequence[int] | None = None,
    document_fingerprints: Sequence[str] | None = None,
    documents_digest: hashlib._Hash | None = None,
    stored_text: StoredText | None = None,
) -> Pack:
    """The pack of these document sections (named ``section_names``) and listing.

    ``documents_digest``, when given, is :func:`_pack_digest_start` already
    fed with the opening and the documents' UTF-8 bytes (a builder that
    encoded each document once for its fingerprint fed it too).
    """
    names = ["header", "opening", *section_names, "listing", "boundary"]
    texts: list[str | memoryview] = [SYSTEM_HEADER, DOCUMENTS_OPENING, *document_texts, listing, BOUNDARY]
    if document_fingerprints is None:
        document_fingerprints = [_fingerprint(_as_str(text)) for text in document_texts]
    fingerprints = [
        _fingerprint(SYSTEM_HEADER),
        _fingerprint(DOCUMENTS_OPENING),
        *document_fingerprints,
        _fingerprint(listing),
        _fingerprint(BOUNDARY),
    ]
    counts: list[int] | None
    if counter.tokenizer is None:
        counts = None
    elif document_counts is not None:
        fixed_indexes = (0, 1, len(texts) - 2, len(texts) - 1)
        fixed = counter.counts(
            [_as_str(texts[i]) for i in fixed_indexes], [fingerprints[i] for i in fixed_indexes]
        )
        assert fixed is not None
        counts = [fixed[0], fixed[1], *document_counts, fixed[2], fixed[3]]
    else:
        counts = counter.counts([_as_str(text) for text in texts], fingerprints)
    sections = tuple(
        Section(name, text, fingerprint, None if counts is None else counts[index])
        for index, (name, text, fingerprint) in enumerate(zip(names, texts, fingerprints, strict=True))
    )
    prefix_tokens: int | None = None
    additive: bool | None = None
    if counts is not None:
        prefix_tokens = sum(counts)
        if isinstance(counter.tokenizer, ServerTokenizer):
            # The server is the authority: count the whole user prefix once
            # (cached like any text) and trust it over the sum.
            whole = counter.counts(["".join(_as_str(text) for text in texts[1:])])
            assert whole is not None
            additive = whole[0] == sum(counts[1:])
            prefix_tokens = counts[0] + whole[0]
    tokenizer = counter.tokenizer
    if documents_digest is None:
        fingerprint = _pack_fingerprint(SYSTEM_HEADER, (_as_str(text) for text in texts[1:]))
    else:
        for text in (listing, BOUNDARY):
            documents_digest.update(text.encode("utf-8"))
        documents_digest.update(b"\0")
        fingerprint = documents_digest.hexdigest()
    return Pack(
        format_version=FORMAT_VERSION,
        system=SYSTEM_HEADER,
        sections=sections,
        fingerprint=fingerprint,
        tokenizer=None if tokenizer is None else tokenizer.identity,
        estimated=bool(tokenizer is not None and tokenizer.estimated),
        prefix_tokens=prefix_tokens,
        template_overhead_tokens=counter.template_overhead(SYSTEM_HEADER),
        part=part,
        sections_additive=additive,
        _stored_text=stored_text,
    )


def _as_str(text: str | memoryview) -> str:
    return text if isinstance(text, str) else str(text, "utf-8", "surrogatepass")


def _skipped_entries(corpus: Corpus) -> list[ListingEntry]:
    return [ListingEntry(entry.path, str(entry.reason)) for entry in corpus.manifest.skipped]


class _PackBuilder:
    """Renders documents into sections as they arrive, and has them counted meanwhile.

    Fed by :func:`build_pack` from a loaded corpus, or by :func:`pack` while
    the corpus loads; :meth:`finish` assembles the pack either way, so both
    give the same pack.
    """

    def __init__(
        self,
        tokenizer: Tokenizer | None,
        store: Store | None,
        snapshot: snapshots.SnapshotWriter | None = None,
    ) -> None:
        self.counter = _Counter(tokenizer, store)
        self.snapshot = snapshot
        self.section_counter = None if tokenizer is None else SectionCounter(tokenizer, store)
        self.names: list[str] = []
        self.paths: list[str] = []  # the current documents' paths, for the listing
        self.changes_marked = False  # the marker goes before the first document changed since the base
        # Without a snapshot the texts are kept here; with one, the written
        # file holds them and the pack's sections are views of it.
        self.texts: list[str] = []
        self.fingerprints: list[str] = []
        self.digest = _pack_digest_start(SYSTEM_HEADER)
        self.digest.update(DOCUMENTS_OPENING.encode("utf-8"))
        if snapshot is not None:
            snapshot.write(SYSTEM_HEADER.encode("utf-8"))
            snapshot.write(DOCUMENTS_OPENING.encode("utf-8"))

    def add(self, document: Document) -> None:
        if document.layer == 1 and not self.changes_marked:
            self._add_section(_CHANGES, CHANGES_MARKER, CHANGES_MARKER.encode("utf-8"))
            self.changes_marked = True
        text = render_document(document.path, document.text)
        # One encoding for both hashes (the section's and the pack's) and
        # the snapshot's copy. It fails only on lone surrogates in the
        # text (a rendered path never has them): then the text is cleaned
        # and rendered again, which _clean_text would otherwise have
        # checked with an encoding of its own.
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            text = render_document(document.path, _clean_text(document.text))
            data = text.encode("utf-8")
        if document.earlier:
            self._add_section(_EARLIER_PREFIX + document.path, text, data)
        else:
            self._add_section(_DOCUMENT_PREFIX + document.path, text, data)
            self.paths.append(document.path)

    def _add_section(self, name: str, text: str, data: bytes) -> None:
        fingerprint = hashlib.sha256(data).hexdigest()
        self.digest.update(data)
        if self.snapshot is not None:
            self.snapshot.write(data)
        self.names.append(name)
        if self.snapshot is None:
            self.texts.append(text)
        self.fingerprints.append(fingerprint)
        if self.section_counter is not None:
            self.section_counter.add(text, fingerprint, data)

    def finish(self, corpus: Corpus) -> Pack:
        listing = render_listing([*(ListingEntry(path) for path in self.paths), *_skipped_entries(corpus)])
        texts: Sequence[str | memoryview] = self.texts
        stored: StoredText | None = None
        if self.snapshot is not None:
            self.snapshot.write(listing.encode("utf-8"))
            self.snapshot.write(BOUNDARY.encode("utf-8"))
            stored = self.snapshot.mapped()
            views: list[memoryview] = []
            start = 0
            for size in self.snapshot.sizes:
                views.append(stored.view[start : start + size])
                start += size
            texts = views[2:-2]  # the documents, between the header and opening and the listing and boundary
        counts = None if self.section_counter is None else self.section_counter.counts()
        return _assemble(
            texts,
            self.names,
            listing,
            part=None,
            counter=self.counter,
            document_counts=counts,
            document_fingerprints=self.fingerprints,
            documents_digest=self.digest,
            stored_text=stored,
        )

    def close(self) -> None:
        if self.section_counter is not None:
            self.section_counter.close()


def build_pack(
    corpus: Corpus,
    *,
    tokenizer: Tokenizer | None = None,
    store: Store | None = None,
    budget: Budget | None = None,
) -> Pack:
    """Render ``corpus`` as one pack, counted with ``tokenizer`` and checked against ``budget``.

    Without a tokenizer nothing is counted (``prefix_tokens`` is None),
    unless a budget is given: then the documented estimate is used and the
    pack is flagged ``estimated``. Counts go through ``store`` when given,
    so re-packing an unchanged corpus asks the tokenizer nothing.

    Raises :class:`~longctx.errors.BudgetError` when the pack plus the chat
    template's tokens exceed ``budget.prompt_budget``; the error names the
    largest files and folders (see :func:`build_shards` for the alternative).
    """
    if budget is not None and tokenizer is None:
        tokenizer = EstimateTokenizer()
    builder = _PackBuilder(tokenizer, store)
    try:
        for document in corpus.documents:
            builder.add(document)
        built = builder.finish(corpus)
    finally:
        builder.close()
    if budget is not None:
        _check_budget(built, budget)
    return built


def pack(
    paths: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    options: CorpusOptions | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    store: Store | None = None,
    budget: Budget | None = None,
    reuse: bool = True,
) -> PackResult:
    """Load ``paths`` and pack them: :func:`~longctx.corpus.load_corpus` then :func:`build_pack`, faster.

    The arguments are those two functions' (``options`` None means
    :class:`~longctx.config.CorpusOptions`'s defaults). Documents are rendered and
    counted while the corpus is read. With ``store`` and ``reuse``, a single
    folder of a git repository whose state has not changed since its last
    pack with the same options (same commit, same changed, staged and
    untracked files with the same content, see :mod:`longctx.snapshots`) is
    not read again: its pack and manifest come back from the store
    (``reused`` is True). Raises what those two functions raise.
    """
    options = options or CorpusOptions()
    if budget is not None and tokenizer is None:
        tokenizer = EstimateTokenizer()
    key: snapshots.SnapshotKey | None = None
    if store is not None and reuse:
        key = snapshots.snapshot_key(paths, options, tokenizer)
    if key is not None and store is not None:
        stored = snapshots.load_snapshot(store, key)
        if stored is not None:
            if budget is not None:
                _check_budget(stored.pack, budget)
            return PackResult(stored.pack, stored.manifest, stored.ordering, reused=True)
    # The snapshot's text is written as the documents are rendered.
    writer = None if key is None or store is None else snapshots.SnapshotWriter(store, key)
    builder = _PackBuilder(tokenizer, store, writer)
    if (
        key is not None
        and store is not None
        and builder.section_counter is not None
        and key.tracked_files >= _EARLY_WORKER_FILES
        and not store.has_pack_snapshot(key.slot)
    ):
        # The first pack of a large repository with these options: its
        # texts are most likely not counted yet, so the counting worker
        # starts now and is ready when the first files are read.
        builder.section_counter.start_worker()
    try:
        # The builder keeps what it needs of each document: the corpus need
        # not hold every text a second time.
        corpus = load_corpus(paths, options, on_document=builder.add, keep_documents=False, store=store)
        built = builder.finish(corpus)
    except BaseException:
        if writer is not None:
            writer.discard()
        raise
    finally:
        builder.close()
    if writer is not None:
        writer.keep(built, corpus)
    if budget is not None:
        _check_budget(built, budget)
    return PackResult(built, corpus.manifest, corpus.ordering, reused=False)


def _check_budget(pack: Pack, budget: Budget) -> None:
    total = pack.total_tokens
    assert total is not None
    if total <= budget.prompt_budget:
        return
    files = sorted(
        ((section.path, section.tokens or 0) for section in pack.documents if section.path is not None),
        key=lambda item: (-item[1], item[0]),
    )
    folders: dict[str, int] = {}
    for path, tokens in files:
        parts = path.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            folder = "/".join(parts[:depth]) + "/"
            folders[folder] = folders.get(folder, 0) + tokens
    top_folders = sorted(folders.items(), key=lambda item: (-item[1], item[0]))[:_LARGEST_SHOWN]
    top_files = files[:_LARGEST_SHOWN]
    excess = total - budget.prompt_budget
    estimated = " (estimated)" if pack.estimated else ""

    def listed(items: Sequence[tuple[str, int]]) -> str:
        return "; ".join(f"{path} {tokens:,}" for path, tokens in items) or "none"

    earlier = sum(section.tokens or 0 for section in pack.earlier_copies)
    layered = (
        f" Of these, {earlier:,} are earlier copies of files changed since the pack's base commit"
        " (max_stale_share=0 leaves them out)."
        if earlier
        else ""
    )
    message = (
        f"the pack needs {total:,} tokens{estimated} but the budget is {budget.describe()}: "
        f"{excess:,} tokens must go.{layered} Largest folders: {listed(top_folders)}. "
        f"Largest files: {listed(top_files)}. Exclude some of them, or split the pack into shards."
    )
    raise BudgetError(
        message,
        total_tokens=total,
        budget_tokens=budget.prompt_budget,
        largest=tuple(top_folders) + tuple(top_files),
    )


def build_shards(
    corpus: Corpus,
    *,
    budget: Budget,
    tokenizer: Tokenizer | None = None,
    store: Store | None = None,
) -> ShardedPack:
    """Split ``corpus`` into packs that each fit ``budget``, filled greedily in corpus order.

    A shard holds the next documents while they fit with its own listing
    (the paths of its documents; the skipped paths go in the last shard).
    Adding documents at the end of the corpus leaves the earlier shards
    unchanged (the first shard only gains its part number when a second
    shard appears). A corpus that fits is one shard without a part number,
    byte-identical to :func:`build_pack`'s pack (for a layered corpus, to
    the pack of its current files in the same order: shards leave out the
    earlier copies and the changes marker). Without a tokenizer the
    documented estimate is used.

    Raises :class:`~longctx.errors.BudgetError` naming a document that alone
    does not fit (longctx does not cut documents).
    """
    tokenizer = tokenizer or EstimateTokenizer()
    counter = _Counter(tokenizer, store)
    # Shards hold the current files once each: the earlier copies of a
    # layered corpus serve one pack's prefix, not a split.
    documents = tuple(document for document in corpus.documents if not document.earlier)
    texts = _document_section_texts(documents)
    counts = count_texts(tokenizer, texts, [_fingerprint(text) for text in texts], store)
    chains = cached_counts(tokenizer, [folder_lines(document.path) for document in documents], store)
    skipped = _skipped_entries(corpus)
    empty = _assemble([], [], render_listing(skipped, part=1), part=1, counter=counter)
    fixed = empty.total_tokens or 0  # header, opening, listing tags and skipped paths, boundary, template
    limit = budget.prompt_budget
    if fixed > limit:
        raise BudgetError(
            f"even an empty pack needs {fixed:,} tokens (header, listing of skipped paths, chat template), "
            f"more than the budget of {budget.describe()}",
            total_tokens=fixed,
            budget_tokens=limit,
        )
    for document, tokens, chain in zip(documents, counts, chains, strict=True):
        if fixed + tokens + chain > limit:
            raise BudgetError(
                f"{document.path} alone needs {tokens:,} tokens, more than a shard can hold "
                f"(budget {budget.describe()}, of which {fixed:,} go to the header, listing and template); "
                "exclude it or use a larger context",
                total_tokens=fixed + tokens + chain,
                budget_tokens=limit,
                largest=((document.path, tokens),),
            )

    groups = _greedy_groups(counts, chains, limit - fixed)
    shards: list[Pack] = []
    index = 0
    while index < len(groups):
        start, stop = groups[index]
        last = index == len(groups) - 1
        part = None if len(groups) == 1 else index + 1
        shard = _shard(documents, texts, counts, start, stop, skipped if last else [], part, counter)
        if (shard.total_tokens or 0) > limit and stop - start > 1:
            # The upper bound was not one (a tokenizer whose counts do not
            # add up): give the last document to the next shard and redo.
            groups[index] = (start, stop - 1)
            if last:
                groups.append((stop - 1, stop))
            else:
                groups[index + 1] = (stop - 1, groups[index + 1][1])
            continue
        if (shard.total_tokens or 0) > limit:
            _check_budget(shard, budget)
        shards.append(shard)
        index += 1
    if not shards:
        shards.append(_shard(documents, texts, counts, 0, 0, skipped, None, counter))
    if len(shards) == 1 and shards[0].part is not None:
        shards[0] = _shard(documents, texts, counts, 0, len(documents), skipped, None, counter)
    digest = hashlib.sha256("\n".join(shard.fingerprint for shard in shards).encode()).hexdigest()
    return ShardedPack(shards=tuple(shards), budget=budget, fingerprint=digest)


def _greedy_groups(counts: Sequence[int], chains: Sequence[int], room: int) -> list[tuple[int, int]]:
    """Half-open index ranges of documents: each as long as its documents and listing lines fit ``room``."""
    groups: list[tuple[int, int]] = []
    start = 0
    used = 0
    for index, (tokens, chain) in enumerate(zip(counts, chains, strict=True)):
        need = tokens + chain
        if index > start and used + need > room:
            groups.append((start, index))
            start, used = index, 0
        used += need
    if start < len(counts):
        groups.append((start, len(counts)))
    return groups


def _shard(  # noqa: PLR0917 - one private call site, positional by design
    documents: Sequence[Document],
    texts: Sequence[str],
    counts: Sequence[int],
    start: int,
    stop: int,
    skipped: list[ListingEntry],
    part: int | None,
    counter: _Counter,
) -> Pack:
    paths = [document.path for document in documents[start:stop]]
    listing = render_listing([*(ListingEntry(path) for path in paths), *skipped], part=part)
    names = [_DOCUMENT_PREFIX + path for path in paths]
    return _assemble(
        texts[start:stop], names, listing, part=part, counter=counter, document_counts=counts[start:stop]
    )


# -- comparing ----------------------------------------------------------------


def _common_prefix_length(old: bytes, new: bytes) -> int:
    length = min(len(old), len(new))
    if old[:length] == new[:length]:
        return length
    low, high = 0, length
    while low < high:
        middle = (low + high + 1) // 2
        if old[:middle] == new[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def compare_packs(old: Pack, new: Pack, *, tokenizer: Tokenizer | None = None) -> PackComparison:
    """Name the first section where ``new`` departs from ``old`` and measure what survives before it.

    With ``tokenizer`` (the one both packs were counted with), the shared
    start of the first differing section is counted too, up to its last
    shared line break (``partial_tokens``).
    """
    same_tokenizer = old.tokenizer is not None and old.tokenizer == new.tokenizer
    surviving_tokens: int | None = 0 if same_tokenizer else None
    surviving_bytes = 0
    index = 0
    for old_section, new_section in zip(old.sections, new.sections, strict=False):
        # Bytes are what a server cache sees: a document that became its
        # own earlier copy (a layered pack) still matches.
        if old_section.fingerprint != new_section.fingerprint:
            break
        surviving_bytes += old_section.size_bytes
        if surviving_tokens is not None:
            surviving_tokens = None if old_section.tokens is None else surviving_tokens + old_section.tokens
        index += 1
    old_total = old.prefix_tokens if same_tokenizer else None
    if index == len(old.sections) == len(new.sections):
        return PackComparison(True, None, "the packs are identical", index, surviving_bytes,
                              old.prefix_tokens if same_tokenizer else None, old_total)  # fmt: skip
    partial: int | None = None
    if index < len(new.sections) and index < len(old.sections):
        old_section, new_section = old.sections[index], new.sections[index]
        old_bytes = old_section.text.encode("utf-8")
        shared = _common_prefix_length(old_bytes, new_section.text.encode("utf-8"))
        surviving_bytes += shared
        if tokenizer is not None and surviving_tokens is not None:
            cut = old_bytes.rfind(b"\n", 0, shared) + 1
            partial = tokenizer.count(old_bytes[:cut].decode("utf-8")) if cut else 0
        name = new_section.name
        if old_section.name == new_section.name:
            detail = f"{name} changed"
        elif any(section.name == new_section.name for section in old.sections[index:]):
            detail = f"{old_section.name} was removed or moved (now {name} follows)"
        else:
            detail = f"{name} is new, before {old_section.name}"
    elif index < len(new.sections):
        name = new.sections[index].name
        detail = f"{name} was added at the end"
    else:
        name = old.sections[index].name
        detail = f"{name} and what follows were removed"
    return PackComparison(False, name, detail, index, surviving_bytes, surviving_tokens, old_total, partial)


# -- the cache boundary --------------------------------------------------------


def check_cache_boundary(
    pack: Pack, tokenizer: ServerTokenizer, question: str = DEFAULT_PROBE_QUESTION
) -> BoundaryCheck:
    """Check with the server tokenizer that the prefix's tokens are a prefix of prefix + question's.

    When they are, every request about this pack (any question, any
    sibling) starts with the same tokens and the server's prefix cache can
    serve all of them; when not, ``divergent_position`` is where they part.
    """
    if not question:
        raise PackError("check_cache_boundary needs a non-empty question")
    shared = tokenizer.encode(pack.prefix)
    full = tokenizer.encode(pack.user_content(question))
    position: int | None = None
    for index, token in enumerate(shared):
        if index >= len(full) or full[index] != token:
            position = index
            break
    return BoundaryCheck(
        ok=position is None,
        prefix_tokens=len(shared),
        prompt_tokens=len(full),
        divergent_position=position,
        question=question,
    )
