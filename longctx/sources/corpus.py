"""Corpus: the ordered documents of one or more sources, and the manifest of all that was considered.

:func:`load_corpus` turns paths (git repositories, plain folders, single
files, PDFs) into a :class:`Corpus`: documents in a deterministic order and a
:class:`Manifest` that lists every path considered, included or skipped with
a reason. Nothing considered is dropped silently.

What "considered" means: every file a source lists (in a git repository,
what ``git ls-files --cached --others --exclude-standard`` lists; in a
folder, every entry that no ``.gitignore`` / ``.longctxignore`` ignores),
plus submodules, nested repositories, unlistable folders and links that
point nowhere useful. Paths ignored by those ignore files are not listed
one by one; paths dropped by the caller's ``include`` / ``exclude``
patterns are (``excluded-by-glob``).

The order is a pure function of the files: it does not depend on the order
the filesystem lists entries in, on the locale, on ``PYTHONHASHSEED`` or on
the machine. Paths are compared as UTF-8 bytes
(:func:`longctx.documents.path_sort_key`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import field, replace
from typing import TYPE_CHECKING, Any, Final, Literal

from longctx.documents import Document, path_sort_key
from longctx.errors import ConfigError, EmptyCorpus, InputError, SourceError
from longctx.options.groups import CorpusOptions, Limits
from longctx.recordtypes import record_type
from longctx.sources.files import display_path, is_inside, list_folder, list_single_file
from longctx.sources.ignore import GlobFilter
from longctx.sources.listing import Candidate, Listing, Skip, SkipReason
from longctx.sources.pdf import PdfTextCache
from longctx.sources.repo import find_repository, is_ignored_by_git, list_repository

if TYPE_CHECKING:
    from longctx.sources.reading import Included
    from longctx.store import Store

__all__ = [
    "MANIFEST_FORMAT_VERSION",
    "Corpus",
    "CorpusOutline",
    "Manifest",
    "ManifestEntry",
    "SkipReason",
    "check_sources",
    "load_corpus",
    "stream_corpus",
]

logger = logging.getLogger("longctx.sources.corpus")

MANIFEST_FORMAT_VERSION: Final = 1
"""Version of :meth:`Manifest.to_dict`'s layout; bumped when a key changes."""


@record_type(slots=True)
class ManifestEntry:
    """One path considered: ``included`` (with size, hash, kind) or ``skipped`` (with a reason).

    ``size_bytes`` is the size on disk when known; ``sha256`` and ``kind``
    are set for included files only (a secret's hash is not published).
    ``notes`` carry detail: "page 3: no extractable text", "decoded from
    utf-16-le", the rule a secret matched and its line, a link's target.
    They never carry file content.
    """

    path: str
    status: Literal["included", "skipped"]
    reason: SkipReason | None = None
    size_bytes: int | None = None
    sha256: str | None = None
    kind: str | None = None
    lossy: bool = False
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return the entry as JSON-able data; every key is always present."""
        return {
            "path": self.path,
            "status": self.status,
            "reason": None if self.reason is None else str(self.reason),
            "size_bytes": self.size_bytes,
            "sha256": self.sha256,
            "kind": self.kind,
            "lossy": self.lossy,
            "notes": list(self.notes),
        }


@record_type(slots=True)
class Manifest:
    """Every path considered, in :func:`~longctx.documents.path_sort_key` order."""

    entries: tuple[ManifestEntry, ...]
    _by_path: dict[str, ManifestEntry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Frozen: the lookup table is built once, here.
        object.__setattr__(self, "_by_path", {entry.path: entry for entry in self.entries})

    def __iter__(self) -> Iterator[ManifestEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def included(self) -> tuple[ManifestEntry, ...]:
        """The entries of files in the corpus."""
        return tuple(entry for entry in self.entries if entry.status == "included")

    @property
    def skipped(self) -> tuple[ManifestEntry, ...]:
        """The entries of paths left out, each with its reason."""
        return tuple(entry for entry in self.entries if entry.status == "skipped")

    def get(self, path: str) -> ManifestEntry | None:
        """Return the entry for ``path``, or None when it was not considered."""
        return self._by_path.get(path)

    def skipped_by_reason(self) -> dict[str, int]:
        """Count skipped paths per reason, reasons in alphabetical order."""
        counts: dict[str, int] = {}
        for entry in self.skipped:
            key = str(entry.reason)
            counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items()))

    def to_dict(self) -> dict[str, Any]:
        """Return the manifest as JSON-able data, identical for identical corpora."""
        included = sum(1 for entry in self.entries if entry.status == "included")
        return {
            "format_version": MANIFEST_FORMAT_VERSION,
            "summary": {
                "considered": len(self.entries),
                "included": included,
                "skipped": len(self.entries) - included,
                "skipped_by_reason": self.skipped_by_reason(),
            },
            "entries": [entry.to_dict() for entry in self.entries],
        }

    def to_json(self, *, indent: int | None = None) -> str:
        """Return :meth:`to_dict` as JSON; ASCII-only, so undecodable names survive as ``\\udcXX``."""
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        """The manifest :meth:`to_dict` described (its inverse); raises ValueError for another layout."""
        if data.get("format_version") != MANIFEST_FORMAT_VERSION:
            raise ValueError(
                f"manifest format {data.get('format_version')!r} is not {MANIFEST_FORMAT_VERSION}"
            )
        return cls(
            tuple(
                ManifestEntry(
                    path=entry["path"],
                    status=entry["status"],
                    reason=None if entry["reason"] is None else SkipReason(entry["reason"]),
                    size_bytes=entry["size_bytes"],
                    sha256=entry["sha256"],
                    kind=entry["kind"],
                    lossy=entry["lossy"],
                    notes=tuple(entry["notes"]),
                )
                for entry in data["entries"]
            )
        )


@record_type
class CorpusOutline:
    """What a corpus is, but for its documents: the manifest, the order, where it came from.

    ``ordering`` is the policy used. ``root`` is a display label (the base
    name of the one path loaded, ``None`` for several), never an absolute
    path. ``head_sha`` is the checked-out commit when the corpus is one git
    repository (``None`` for anything else, and before the first commit).
    ``layer_base`` is the base commit when the documents are layered (see
    :mod:`longctx.sources.history`): the base's files first, with the
    base's copies of files changed since (``earlier`` documents, not in
    the manifest, which describes the current files), then the files
    changed since; ``layer_note`` says why the documents are (or are not)
    layered, for the pack's summary line. :func:`stream_corpus` returns one: its documents went to
    the caller one by one.
    """

    manifest: Manifest
    ordering: str
    root: str | None
    head_sha: str | None
    layer_base: str | None = None
    layer_note: str | None = None


@record_type
class Corpus(CorpusOutline):
    """Documents in policy order, and the outline: the manifest of everything considered, and more."""

    documents: tuple[Document, ...] = field(kw_only=True)

    @property
    def total_bytes(self) -> int:
        """The raw size of the included files."""
        return sum(document.size_bytes for document in self.documents)


Paths = Sequence[str | os.PathLike[str]] | str | os.PathLike[str]
"""One path, or several: what :func:`load_corpus` takes."""


@record_type(slots=True)
class _Source:
    """One argument of load_corpus: its label, whether it is a single file, and what it lists."""

    label: str
    single_file: bool
    listing: Listing

    def corpus_path(self, path: str, *, several: bool) -> str:
        if not several:
            return path
        return self.label if self.single_file else f"{self.label}/{path}"


def _stability_key(candidate: Candidate) -> tuple[int, int, int, bytes]:
    # Committed and clean files first, oldest commit first; files with no
    # history (plain folders, single files) next; files changed in the work
    # tree last, by path (their last commit no longer dates their content).
    # An edit then invalidates the shortest possible suffix of the pack.
    # A layered repository puts its base first, in the order the base's own
    # pack had (every file there dated as of the base), then the same
    # order over the files changed since.
    if candidate.layer == 0:
        return (0, 0, candidate.last_commit_time or 0, path_sort_key(candidate.path))
    layer = candidate.layer or 0
    if candidate.dirty:
        return (layer, 2, 0, path_sort_key(candidate.path))
    if candidate.last_commit_time is None:
        return (layer, 1, 0, path_sort_key(candidate.path))
    return (layer, 0, candidate.last_commit_time, path_sort_key(candidate.path))


def _path_key(candidate: Candidate) -> tuple[int, int, int, bytes]:
    return (0, 0, 0, path_sort_key(candidate.path))


def _label(path: str) -> str:
    name = display_path(os.path.basename(os.path.normpath(os.path.abspath(path))))
    return name or "root"


def _load_source(path: str, max_stale_share: float, store: Store | None, *, default_ignores: bool) -> Listing:
    if os.path.isdir(path):
        repository = find_repository(path)
        if repository is not None and not is_ignored_by_git(repository):
            return list_repository(
                repository,
                path,
                max_stale_share=max_stale_share,
                times_cache=None if store is None else store.caches,
            )
        if repository is not None:
            logger.info("%s is ignored by git; reading it as a plain folder", _label(path))
        return list_folder(path, default_ignores=default_ignores)
    return list_single_file(path)


def check_sources(paths: Paths) -> None:
    """Refuse, reading no file's text and contacting nothing, paths that cannot give a document.

    Raises :class:`~longctx.errors.InputError` for no path or a path that
    does not exist (a mistyped PDF too), a file that cannot be read;
    :class:`~longctx.errors.SourceError` for a folder that cannot be listed;
    :class:`~longctx.errors.EmptyCorpus` for a folder holding no file at all
    (``.git`` aside), as for a folder whose files were all skipped (CLI exit
    8, as docs/cli.md says, whether ``pack`` or ``ask`` finds it).
    Sessions call it on first use before they connect, and the CLI before
    it opens a backend, so such a mistake fails at once rather
    than after a server was tried. What passes may still give no document
    (every file ignored or skipped): :func:`load_corpus` says so.
    """
    listed = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not listed:
        raise InputError("no paths to load")
    for raw in listed:
        path = os.fspath(raw)
        if not os.path.lexists(path):
            raise InputError("no such file or folder", path=path)
        if os.path.isdir(path):
            if not _holds_a_file(path):
                # The exit code of every "nothing to pack" (8), as `longctx pack` gives it.
                raise EmptyCorpus(f"nothing to pack in {path}: the folder holds no file")
        elif not os.access(path, os.R_OK):
            raise InputError("cannot read file: permission denied", path=path)


def _holds_a_file(folder: str) -> bool:
    """Whether anything but folders (and ``.git``) is below ``folder``; stops at the first such entry."""
    pending = [folder]
    while pending:
        location = pending.pop()
        try:
            with os.scandir(location) as listing:
                for entry in listing:
                    if entry.name == ".git":
                        continue
                    if not entry.is_dir(follow_symlinks=False):
                        return True
                    pending.append(entry.path)
        except OSError as error:
            if location == folder:
                raise SourceError(f"cannot list folder: {error.strerror}", path=folder) from None
            return True  # a subfolder that cannot be listed: the listing will say so, as a skip
    return False


def load_corpus(
    paths: Paths,
    options: CorpusOptions | None = None,
    *,
    store: Store | None = None,
    on_text: Callable[[str, int], None] | None = None,
) -> Corpus:
    """Load ``paths`` into a corpus (see the module docstring for what is considered).

    Each path is a folder inside a git work tree (the repository is used,
    restricted to that folder), a plain folder, or a file (a PDF, a
    notebook, text...); a single path may be passed bare. Documents are
    named relative to their path; with several paths, each is prefixed by
    its path's base name (``repo/src/a.py``; a file passed directly is named
    by its base name alone), a repeated base name getting ``-2``, ``-3``...
    in argument order. A path given twice, or inside a folder also given,
    is loaded once.

    ``options`` (:class:`~longctx.options.groups.CorpusOptions`, defaults when
    None) choose the documents and their order. Its ``ordering`` is
    ``"stability"`` (committed files by last commit time,
    oldest first; then files without history; then files changed in the
    work tree or untracked; ties and the last two groups by path) or
    ``"path"``. The default is ``stability`` when a git repository is among
    the sources, ``path`` otherwise. With ``stability``, a git repository
    is layered when its history allows (:mod:`longctx.sources.history`):
    its files as of a recent base commit, then the files changed since, the
    base's copies of those (``earlier`` documents) taking at most
    ``max_stale_share`` of the base's tracked bytes (0 turns layering off). ``include`` / ``exclude`` are
    gitignore-style patterns matched against paths relative to each
    argument. Credentials are skipped unless ``allow_secrets``; even then
    the manifest notes them. Outside git, the folders tools make
    (``.venv``, ``node_modules``, ``__pycache__``...) are one
    ``ignored-by-default`` entry each unless ``default_ignores`` is off. With a ``store``, the text
    of a PDF read before is taken from it rather than extracted again (see
    :mod:`longctx.sources.pdf`), and so are a repository's last-commit times
    as of a commit already walked (see :mod:`longctx.sources.repo`).

    ``on_text``, when given, is called with each document's path and
    characters as soon as its text is decoded, in corpus order, before the
    costly passes over it (special tokens, credentials, hashing) and before
    the next file is read; what it raises stops the load and propagates.
    A document the total-size limit leaves out is not told; one the
    credential pass would skip already was. A pack's budget uses it
    (:class:`~longctx.packing.budget.LowerBound`) to refuse a corpus whose
    characters alone prove it cannot fit without reading the rest.

    Raises :class:`~longctx.errors.EmptyCorpus` when no document is left
    (its message names what was skipped and why),
    :class:`~longctx.errors.InputError` for a path that does not
    exist, :class:`~longctx.errors.ConfigError` for a bad ordering, pattern
    or limit, :class:`~longctx.errors.SourceError` when a whole source
    cannot be read (git failing, an unlistable folder). A problem with one
    file never raises: it is a skip in the manifest.
    """
    outline, documents = _load(paths, options, None, keep=True, store=store, on_text=on_text)
    return Corpus(
        outline.manifest,
        outline.ordering,
        outline.root,
        outline.head_sha,
        outline.layer_base,
        outline.layer_note,
        documents=documents,
    )


def stream_corpus(
    paths: Paths,
    options: CorpusOptions | None,
    on_document: Callable[[Document], None],
    *,
    store: Store | None = None,
    on_text: Callable[[str, int], None] | None = None,
) -> CorpusOutline:
    """:func:`load_corpus`, handing each document to ``on_document`` as soon as it is read, in corpus order.

    Work on a document (rendering, counting) starts before the last file
    is read, and nothing keeps the documents but the caller, so each text
    is held once. Returns the outline (manifest, ordering, origin); raises
    what :func:`load_corpus` raises. ``on_text`` is :func:`load_corpus`'s.
    """
    outline, _ = _load(paths, options, on_document, keep=False, store=store, on_text=on_text)
    return outline


@record_type
class _Screened:
    """The sources' listings through the globs: the manifest entries so far, and the files to read."""

    entries: list[ManifestEntry]
    candidates: list[Candidate]


def _screened(sources: Sequence[_Source], globs: GlobFilter, *, several: bool) -> _Screened:
    """Each source's skips as manifest entries, and its candidates the globs keep, named in the corpus."""
    entries: list[ManifestEntry] = []
    candidates: list[Candidate] = []
    for source in sources:
        for skip in source.listing.skipped:
            name = source.corpus_path(skip.path, several=several)
            if globs and globs.excludes(skip.path.rstrip("/")):
                entries.append(ManifestEntry(name, "skipped", SkipReason.EXCLUDED_BY_GLOB))
            else:
                entries.append(ManifestEntry(name, "skipped", skip.reason, skip.size_bytes, notes=skip.notes))
        for candidate in source.listing.candidates:
            name = source.corpus_path(candidate.path, several=several)
            if globs and globs.excludes(candidate.path):
                if not candidate.earlier:  # the current file has the path's entry
                    entries.append(ManifestEntry(name, "skipped", SkipReason.EXCLUDED_BY_GLOB))
            else:
                # A copy only where the name differs (several sources): a
                # dataclass copy per file costs 10 ms per 5,000 files before
                # the first file can be read.
                candidates.append(candidate if name == candidate.path else replace(candidate, path=name))
    return _Screened(entries, candidates)


def _load(
    paths: Paths,
    options: CorpusOptions | None,
    on_document: Callable[[Document], None] | None,
    *,
    keep: bool,
    store: Store | None,
    on_text: Callable[[str, int], None] | None = None,
) -> tuple[CorpusOutline, tuple[Document, ...]]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    options = options or CorpusOptions()
    ordering, limits, allow_secrets = options.ordering, options.limits, options.allow_secrets
    globs = GlobFilter(options.include, options.exclude)
    stale_share = 0 if ordering == "path" else options.max_stale_share
    sources = _load_sources(
        _distinct_paths(paths), stale_share, store, default_ignores=options.default_ignores
    )
    several = len(sources) > 1
    repositories = [source.listing for source in sources if source.listing.is_repository]
    policy = ordering or ("stability" if repositories else "path")

    screened = _screened(sources, globs, several=several)
    entries, candidates = screened.entries, screened.candidates
    candidates.sort(key=_stability_key if policy == "stability" else _path_key)
    documents, document_bytes = _read_in_order(
        candidates,
        limits,
        allow_secrets,
        entries,
        on_document,
        keep=keep,
        pdf_cache=None if store is None else store.caches,
        special_tokens=options.special_tokens,
        on_text=on_text,
        image_rules=(options.pdf_pages, options.page_image_side, options.image_files),
    )

    entries.sort(key=lambda entry: (path_sort_key(entry.path), entry.status))
    if not any(entry.status == "included" for entry in entries):
        raise _empty(paths, entries)
    outline = CorpusOutline(
        manifest=Manifest(tuple(entries)),
        ordering=policy,
        root=None if several else sources[0].label,
        head_sha=repositories[0].head_sha if repositories and not several else None,
        layer_base=repositories[0].layer_base if repositories and not several else None,
        layer_note=repositories[0].layer_note if repositories and not several else None,
    )
    logger.info(
        "corpus: %d documents (%d bytes), %d skipped %s, ordering %s",
        sum(entry.status == "included" for entry in entries),
        document_bytes,
        sum(entry.status == "skipped" for entry in entries),
        outline.manifest.skipped_by_reason(),
        policy,
    )
    return outline, documents


_EMPTY_EXAMPLES: Final = 3  # paths named per skip reason in the message of an empty corpus


def _empty(paths: Sequence[str | os.PathLike[str]], entries: list[ManifestEntry]) -> EmptyCorpus:
    """The error for ``paths`` whose manifest ``entries`` include nothing: what was skipped and why."""
    named = ", ".join(display_path(os.fspath(path)) for path in paths)
    if not entries:
        return EmptyCorpus(f"nothing to pack in {named}: no file found (after ignore rules)")
    by_reason: dict[str, list[str]] = {}
    for entry in entries:
        by_reason.setdefault(str(entry.reason), []).append(entry.path)
    parts = []
    for reason, skipped in sorted(by_reason.items(), key=lambda item: (-len(item[1]), item[0])):
        shown = ", ".join(_message_path(path) for path in skipped[:_EMPTY_EXAMPLES])
        more = f" and {len(skipped) - _EMPTY_EXAMPLES} more" if len(skipped) > _EMPTY_EXAMPLES else ""
        parts.append(f"{len(skipped)} {reason} ({shown}{more})")
    return EmptyCorpus(
        f"nothing to pack in {named}: every file was skipped: " + "; ".join(parts),
        skipped={reason: len(skipped) for reason, skipped in by_reason.items()},
    )


def _message_path(path: str) -> str:
    """``path`` for a message: as it is, or as a JSON string when it holds a control character."""
    return json.dumps(path) if any(ord(character) < 32 for character in path) else path


def _distinct_paths(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Check that every path exists; drop repeats of the same file or folder.

    A repeat is the same file or folder given twice, or a path inside a
    folder that is also given (it is packed once, as part of that folder).
    """
    if not paths:
        raise InputError("no paths to load")
    distinct: list[str] = []
    seen: set[str] = set()
    for raw in paths:
        path = os.fspath(raw)
        if not isinstance(path, str):
            raise ConfigError(f"paths must be str or os.PathLike[str], not {type(path).__name__}")
        if not os.path.lexists(path):
            raise InputError("no such file or folder", path=path)
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            distinct.append(path)
    folders = [os.path.realpath(path) for path in distinct if os.path.isdir(path)]
    kept = []
    for path in distinct:
        real = os.path.realpath(path)
        outer = next((folder for folder in folders if real != folder and is_inside(real, folder)), None)
        if outer is not None and _same_work_tree(real, outer):
            logger.info("%s is inside another path given, packed once as part of it", display_path(path))
        else:
            kept.append(path)
    return kept


def _same_work_tree(inner: str, outer: str) -> bool:
    """Whether ``outer``'s listing holds ``inner`` (a path inside the folder ``outer``).

    A plain folder lists everything below it; a repository nested in a
    repository is a skip of the outer one's listing (``submodule``), so a
    path inside it given too is no repeat.
    """
    folder = inner if os.path.isdir(inner) else os.path.dirname(inner)
    inner_tree, outer_tree = find_repository(folder), find_repository(outer)
    inner_top = None if inner_tree is None else inner_tree.work_tree
    outer_top = None if outer_tree is None else outer_tree.work_tree
    return outer_top is None or inner_top == outer_top


def _load_sources(
    paths: list[str], max_stale_share: float, store: Store | None, *, default_ignores: bool
) -> list[_Source]:
    """List each path, labelled by its base name (``-2``, ``-3``... for repeats, in argument order)."""
    sources: list[_Source] = []
    used: set[str] = set()
    for path in paths:
        label = base = _label(path)
        number = 2
        while label in used:
            label, number = f"{base}-{number}", number + 1
        used.add(label)
        listing = _load_source(path, max_stale_share, store, default_ignores=default_ignores)
        sources.append(_Source(label, not os.path.isdir(path), listing))
    return sources


def _read_in_order(
    candidates: list[Candidate],
    limits: Limits,
    allow_secrets: bool,
    entries: list[ManifestEntry],
    on_document: Callable[[Document], None] | None,
    *,
    keep: bool,
    pdf_cache: PdfTextCache | None,
    special_tokens: tuple[str, ...] = (),
    on_text: Callable[[str, int], None] | None = None,
    image_rules: tuple[str, int, bool] | None = None,
) -> tuple[tuple[Document, ...], int]:
    """Read the ordered candidates until a corpus limit stops it; append an entry for each to ``entries``.

    Returns the documents (none unless ``keep``) and their total size in
    bytes. ``on_text`` hears each text that the total-size limit lets in.
    """
    # Imported here: a pack read back from the store (longctx.packing.snapshots)
    # needs this module's manifest but reads no file, and the readers'
    # imports (secret patterns, PDF and notebook support) are a tenth of
    # its import time.
    from longctx.sources.images import ImageRules
    from longctx.sources.reading import FileReader

    reading = _Reading(limits, entries, on_document, on_text, keep=keep)
    reader = FileReader(
        max_file_bytes=limits.max_file_bytes,
        allow_secrets=allow_secrets,
        pdf_cache=pdf_cache,
        special_tokens=special_tokens,
        on_text=None if on_text is None else reading.told,
        image_rules=None if image_rules is None else ImageRules(*image_rules),
    )
    for candidate in candidates:
        if reading.stop is None and reading.included >= limits.max_files:
            reading.stop = (SkipReason.FILE_COUNT_LIMIT, f"the corpus already holds {limits.max_files} files")
        if reading.stop is not None:
            if not candidate.earlier:
                entries.append(
                    ManifestEntry(candidate.path, "skipped", reading.stop[0], notes=(reading.stop[1],))
                )
            continue
        if candidate.earlier:
            reading.add_earlier(reader.read(candidate))
        else:
            reading.add(reader.read(candidate))
    return tuple(reading.documents), reading.total_bytes


@record_type(frozen=False)
class _Reading:
    """What reading the candidates in order has taken so far, and the corpus limit that stopped it."""

    limits: Limits
    entries: list[ManifestEntry]
    on_document: Callable[[Document], None] | None
    on_text: Callable[[str, int], None] | None
    keep: bool
    documents: list[Document] = field(default_factory=list)
    included: int = 0
    total_bytes: int = 0
    stop: tuple[SkipReason, str] | None = None

    def told(self, path: str, characters: int, size_bytes: int) -> None:
        """Pass a text read on to ``on_text``, unless the total-size limit will leave it out."""
        # A document past the total-size limit is left out by add: it is no part of the pack.
        if self.on_text is not None and self.total_bytes + size_bytes <= self.limits.max_total_bytes:
            self.on_text(path, characters)

    def add(self, result: Included | Skip) -> None:
        """Take a current file's document, or enter why it is skipped (the total-size limit too)."""
        if isinstance(result, Skip):
            logger.debug("skipped %s: %s %s", result.path, result.reason, "; ".join(result.notes))
            self.entries.append(
                ManifestEntry(result.path, "skipped", result.reason, result.size_bytes, notes=result.notes)
            )
            return
        document = result.document
        if self.total_bytes + document.size_bytes > self.limits.max_total_bytes:
            self.stop = self._total_size_stop()
            self.entries.append(
                ManifestEntry(
                    document.path, "skipped", self.stop[0], document.size_bytes, notes=(self.stop[1],)
                )
            )
            return
        if self.keep:
            self.documents.append(document)
        self.included += 1
        self.total_bytes += document.size_bytes
        self.entries.append(_included_entry(result))
        if self.on_document is not None:
            self.on_document(document)
        for image in result.attachments:  # a PDF's pages, a notebook's outputs: in its entry's notes
            if self.keep:
                self.documents.append(image)
            if self.on_document is not None:
                self.on_document(image)

    def add_earlier(self, result: Included | Skip) -> None:
        """Take a copy the base had (no manifest entry), unless a limit or the current rules stop it."""
        # Packed for the prefix's sake, described by the current file's
        # entry, and dropped (with a log line) where the current rules
        # would not pack it.
        if isinstance(result, Skip):
            logger.debug("earlier copy of %s not packed: %s", result.path, result.reason)
        elif self.total_bytes + result.document.size_bytes > self.limits.max_total_bytes:
            self.stop = self._total_size_stop()
        else:
            self.total_bytes += result.document.size_bytes
            if self.keep:
                self.documents.append(result.document)
            if self.on_document is not None:
                self.on_document(result.document)

    def _total_size_stop(self) -> tuple[SkipReason, str]:
        return (SkipReason.TOTAL_SIZE_LIMIT, f"the corpus would pass {self.limits.max_total_bytes} bytes")


def _included_entry(result: Included) -> ManifestEntry:
    document = result.document
    return ManifestEntry(
        path=document.path,
        status="included",
        size_bytes=document.size_bytes,
        sha256=document.sha256,
        kind=document.kind,
        lossy=document.lossy,
        notes=result.notes,
    )
