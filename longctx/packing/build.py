"""Building a pack: from a loaded corpus (:func:`build_pack`), or from paths as they are read (:func:`pack`).

Both feed the documents, in corpus order, to one builder that renders each
as it arrives and has it counted meanwhile (the counting runs beside the
reading, see :mod:`longctx.packing.counting`), then assembles the pack
(:mod:`longctx.packing.assembly`): the two give the same pack for the same
corpus. Either raises :class:`~longctx.errors.BudgetError` when given a
budget the pack does not fit (:mod:`longctx.packing.budget`).

:func:`pack` is the one call from paths to a pack: it loads the corpus and
packs it as it is read, and with a store it reuses the pack of a git
repository whose state has not changed since (:mod:`longctx.packing.snapshots`)
without reading a file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from longctx.documents import Document, ImagePart
from longctx.options.groups import CorpusOptions
from longctx.packing import snapshots
from longctx.packing.assembly import (
    PackCounter,
    Sections,
    assemble,
    clean_text,
    included_notes,
    is_listed,
    skipped_entries,
)
from longctx.packing.budget import LowerBound, character_sizes, check_budget, check_lower_bound
from longctx.packing.counting import SectionCounter
from longctx.packing.model import (
    DOCUMENT_PREFIX,
    EARLIER_PREFIX,
    Budget,
    Pack,
    PackResult,
    pack_digest_start,
)
from longctx.packing.rendering import (
    BOUNDARY,
    CHANGES_MARKER,
    DOCUMENTS_OPENING,
    SYSTEM_HEADER,
    ListingEntry,
    render_document,
    render_listing,
)
from longctx.sources.corpus import Corpus, CorpusOutline, stream_corpus
from longctx.store import Store, StoredText
from longctx.tokens.images import ImageTokenCounter
from longctx.tokens.tokenizers import EstimateTokenizer, Tokenizer, special_token_spellings

__all__ = ["build_pack", "pack"]

_CHANGES: Final = "changes"
# Files tracked above which a first pack starts its counting worker at once.
_EARLY_WORKER_FILES: Final = 256


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
        image_counter: ImageTokenCounter | None = None,
    ) -> None:
        self.counter = PackCounter(tokenizer, store, image_counter)
        self.images: list[tuple[int, ImagePart]] = []  # (index among the document sections, image)
        self.snapshot = snapshot
        self.section_counter = None if tokenizer is None else SectionCounter(tokenizer, store)
        self.names: list[str] = []
        self.paths: list[str] = []  # the current documents' paths, for the listing
        self.changes_marked = False  # the marker goes before the first document changed since the base
        # Without a snapshot the texts are kept here; with one, the written
        # file holds them and the pack's sections are views of it.
        self.texts: list[str] = []
        self.fingerprints: list[str] = []
        self.digest = pack_digest_start(SYSTEM_HEADER)
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
        # and rendered again, which clean_text would otherwise have
        # checked with an encoding of its own.
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            text = render_document(document.path, clean_text(document.text))
            data = text.encode("utf-8")
        if document.image is not None:
            self.images.append((len(self.names), document.image))
        if document.earlier:
            self._add_section(EARLIER_PREFIX + document.path, text, data)
        else:
            self._add_section(DOCUMENT_PREFIX + document.path, text, data)
            if is_listed(document):
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

    def finish(self, corpus: CorpusOutline) -> Pack:
        notes = included_notes(corpus)
        listing = render_listing(
            [*(ListingEntry(path, note=notes.get(path)) for path in self.paths), *skipped_entries(corpus)]
        )
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
        sections = Sections(
            texts,
            self.names,
            listing,
            document_counts=counts,
            document_fingerprints=self.fingerprints,
            documents_digest=self.digest,
            stored_text=stored,
            images=self.images,
        )
        return assemble(sections, self.counter)

    def close(self) -> None:
        if self.section_counter is not None:
            self.section_counter.close()


def build_pack(
    corpus: Corpus,
    *,
    tokenizer: Tokenizer | None = None,
    store: Store | None = None,
    budget: Budget | None = None,
    image_counter: ImageTokenCounter | None = None,
) -> Pack:
    """Render ``corpus`` as one pack, counted with ``tokenizer`` and checked against ``budget``.

    Without a tokenizer nothing is counted (``prefix_tokens`` is None),
    unless a budget is given: then the documented estimate is used and the
    pack is flagged ``estimated``. Counts go through ``store`` when given,
    so re-packing an unchanged corpus asks the tokenizer nothing.

    Raises :class:`~longctx.errors.BudgetError` when the pack plus the chat
    template's tokens exceed ``budget.prompt_budget``, before any count when
    the characters alone prove it (:func:`~longctx.packing.budget.check_lower_bound`); the error names the
    largest files and folders (see :func:`~longctx.packing.budget.build_shards` for the alternative).
    Images (a corpus's ``image`` documents) are counted by ``image_counter``,
    or by the documented estimate (:mod:`longctx.tokens.images`), whenever the text is counted.
    """
    if budget is not None:
        check_lower_bound(character_sizes(corpus.documents), budget)  # before any tokenizer is asked
        tokenizer = tokenizer or EstimateTokenizer()
    builder = _PackBuilder(tokenizer, store, image_counter=image_counter)
    try:
        for document in corpus.documents:
            builder.add(document)
        built = builder.finish(corpus)
    finally:
        builder.close()
    if budget is not None:
        check_budget(built, budget)
    return built


def with_tokenizer_specials(options: CorpusOptions, tokenizer: Tokenizer | None) -> CorpusOptions:
    """``options`` plus the special-token spellings ``tokenizer`` knows offline (those not broken anyway)."""
    # Imported here: the spelling list is not needed to read a pack back from the store.
    from longctx.sources.special_tokens import DEFAULT_SPELLINGS

    known = set(DEFAULT_SPELLINGS) | set(options.special_tokens)
    added = [spelling for spelling in special_token_spellings(tokenizer) if spelling not in known]
    if not added:
        return options
    return replace(options, special_tokens=(*options.special_tokens, *added))


def pack(
    paths: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    options: CorpusOptions | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    store: Store | None = None,
    budget: Budget | None = None,
    reuse: bool = True,
    image_counter: ImageTokenCounter | None = None,
) -> PackResult:
    """Load ``paths`` and pack them: :func:`~longctx.sources.corpus.load_corpus`, :func:`build_pack`, faster.

    The arguments are those two functions' (``options`` None means
    :class:`~longctx.options.groups.CorpusOptions`'s defaults). Documents are rendered and
    counted while the corpus is read. With ``store`` and ``reuse``, a single
    folder of a git repository whose state has not changed since its last
    pack with the same options (same commit, same changed, staged and
    untracked files with the same content, see :mod:`longctx.packing.snapshots`) is
    not read again: its pack and manifest come back from the store
    (``reused`` is True); not a pack that may hold images (``options`` asking for
    images): it is packed from the files, and its ``reuse_note`` says so.
    Raises what those two functions raise.
    """
    options = with_tokenizer_specials(options or CorpusOptions(), tokenizer)
    if budget is not None and tokenizer is None:
        tokenizer = EstimateTokenizer()
    key: snapshots.SnapshotKey | None = None
    if store is not None and reuse and not _may_hold_images(options):
        key = snapshots.snapshot_key(paths, options, tokenizer)
    if key is not None and store is not None:
        stored = snapshots.load_snapshot(store, key)
        if stored is not None:
            if budget is not None:
                check_budget(stored.pack, budget)
            return PackResult(
                stored.pack,
                stored.manifest,
                stored.ordering,
                reused=True,
                _manifest_summary=stored.manifest_summary,
            )
    # The snapshot's text is written as the documents are rendered.
    writer = None if key is None or store is None else snapshots.SnapshotWriter(store, key)
    builder = _PackBuilder(tokenizer, store, writer, image_counter)
    if (
        key is not None
        and store is not None
        and builder.section_counter is not None
        and key.tracked_files >= _EARLY_WORKER_FILES
        and not store.caches.has_pack_snapshot(key.slot)
    ):
        # The first pack of a large repository with these options: its
        # texts are most likely not counted yet, so the counting worker
        # starts now and is ready when the first files are read.
        builder.section_counter.start_worker()
    try:
        # The builder keeps what it needs of each document: the corpus need
        # not hold every text a second time. The lower bound is checked as
        # each text is decoded, before its costly passes and any count.
        bound = None if budget is None else LowerBound(budget)
        corpus = stream_corpus(
            paths, options, builder.add, store=store, on_text=None if bound is None else bound.add
        )
        if writer is not None:
            writer.files_read()
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
        check_budget(built, budget)
    images_note = store is not None and reuse and _may_hold_images(options)
    return _built_result(built, corpus, IMAGES_NOT_REUSED if images_note else None)


def _built_result(built: Pack, corpus: CorpusOutline, reuse_note: str | None) -> PackResult:
    """The result of a pack built from the files (not reused), with why it was not reused, if asked."""
    return PackResult(
        built,
        corpus.manifest,
        corpus.ordering,
        reused=False,
        layer_note=corpus.layer_note,
        reuse_note=reuse_note,
    )


# Why a pack that may hold images is never read back from a snapshot: snapshots keep the
# pack's text, and an image pack's images are rendered from the files.
IMAGES_NOT_REUSED: Final = "not reused from the store: a pack that may hold images is packed from the files"


def _may_hold_images(options: CorpusOptions) -> bool:
    """Whether ``options`` may put images in a pack (page images, image files)."""
    return options.pdf_pages not in ("text", "server") or options.image_files
