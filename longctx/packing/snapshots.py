"""Pack snapshots: a git repository packed again in the same state is read back from the store.

A re-pack of an unchanged repository would read, decode, scan and render
every file again to get the same bytes. :func:`~longctx.packing.build.pack`
instead keys each pack it builds by what it was asked and by the
repository's state, keeps it (sections, counts, manifest) in the
:class:`~longctx.store.Store`, and when the key matches later it rebuilds
the :class:`~longctx.packing.model.Pack` and :class:`~longctx.sources.corpus.Manifest`
from the store without opening a file: one ``git status``, one SQLite read.

The key has two parts. The *slot* is what was asked: the resolved folder,
the loading options (ordering, include, exclude, limits, secrets), the
tokenizer's identity, the pack and manifest format versions, and the code
that builds packs (size and modification time of every longctx module and
of the pypdf and pathspec packages, so an upgrade or a local edit misses).
The *state* is the repository's: the HEAD commit, the full ``git status
--porcelain=v2 --untracked-files=all`` of the folder (modified, staged,
deleted and untracked paths, with index modes and object names: a
``.gitignore`` edit, a new untracked file, a ``git add`` or a checkout
changes it), the sha256 of the content of every path it names (editing a
modified file again does not change the status), and the content of the
``.longctxignore`` files read above the folder (git may ignore those). A
slot holds one snapshot: the newest state packed.

What git cannot vouch for is never snapshotted: several paths, a plain
folder or file, a folder git ignores, a repository where index entries are
marked assume-unchanged or skip-worktree (status hides edits to them). A
corpus that followed symbolic links (inside the folder: links out of it are
skipped with a reason) is snapshotted with each link's path, target and the
target's content digest; the snapshot is used only if every link still
leads to the same target with the same content (the target may be a file
git ignores, whose edits ``git status`` never shows). A repository that
changed while it was packed is not snapshotted either: the state is taken
again after the load and must be the same.
Clean tracked files are trusted to git's own change detection (stat data,
and content for racily-clean entries), which ``git status`` itself relies on.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any, BinaryIO, Final

from longctx.errors import StoreError
from longctx.options.groups import CorpusOptions
from longctx.packing.model import ManifestSummary, Pack, Section
from longctx.packing.rendering import FORMAT_VERSION
from longctx.recordtypes import record_type
from longctx.sources.corpus import MANIFEST_FORMAT_VERSION, CorpusOutline, Manifest
from longctx.sources.files import filesystem_path
from longctx.sources.repo import RepositoryState, repository_state
from longctx.store import Store, StoredPackSnapshot, StoredText
from longctx.tokens.tokenizers import Tokenizer

__all__ = [
    "SNAPSHOT_FORMAT_VERSION",
    "Snapshot",
    "SnapshotKey",
    "load_snapshot",
    "snapshot_key",
]

logger = logging.getLogger("longctx.snapshots")

SNAPSHOT_FORMAT_VERSION: Final = 4
"""Version of the stored summary's layout and of the key's recipe; part of every key."""

_LONGCTX_IGNORE: Final = ".longctxignore"
_LINK_NOTE: Final = "symbolic link to "
# Third-party packages whose behaviour shapes a pack's bytes: pypdf extracts
# PDF text, pathspec matches .longctxignore and include/exclude patterns.
_SHAPING_PACKAGES: Final = ("pypdf", "pathspec")


@record_type(slots=True)
class SnapshotKey:
    """Where a pack is kept (``slot``: what was asked) and for which repository ``state``.

    ``head`` is the commit the state was taken at; ``directory`` the
    resolved folder that was asked for; ``tracked_files`` the number of
    files git tracks in it (a hint of the pack's size).
    """

    slot: str
    state: str
    head: str | None
    directory: str
    tracked_files: int = 0


@record_type
class Snapshot:
    """A pack and its manifest read back from the store, with the ordering they were built with.

    The manifest is kept as the JSON it was saved as, and decoded by
    :meth:`manifest`: a caller that only writes or sends the pack never
    pays for its thousands of entries. ``manifest_summary`` is what the
    pack's summary line says of it, stored beside it.
    """

    pack: Pack
    ordering: str
    manifest_json: str = field(repr=False)
    manifest_summary: ManifestSummary | None = None

    def manifest(self) -> Manifest:
        """The manifest, decoded; raises :class:`~longctx.errors.StoreError` if the stored one is damaged."""
        try:
            return Manifest.from_dict(json.loads(self.manifest_json))
        except (KeyError, TypeError, ValueError) as error:
            raise StoreError(
                f"the manifest stored with pack {self.pack.fingerprint[:16]} cannot be read back ({error});"
                " pack again with no store, or delete the store's pack-snapshots"
            ) from error


def _digest(parts: Sequence[Any]) -> str:
    return hashlib.sha256(json.dumps(parts, ensure_ascii=True).encode("ascii")).hexdigest()


def _code_identity() -> list[Any]:
    """Size and modification time of every longctx module and of the packages that shape a pack."""
    # This module is in longctx/packing/: its grandparent is the whole library.
    package = Path(__file__).resolve().parent.parent
    stamps: list[Any] = []
    for folder, folders, files in os.walk(package):
        folders[:] = sorted(name for name in folders if name not in ("__pycache__", "testing"))
        for name in sorted(files):
            if name.endswith(".py"):
                status = os.stat(os.path.join(folder, name))
                stamps.append(
                    [os.path.relpath(os.path.join(folder, name), package), status.st_size, status.st_mtime_ns]
                )
    for name in _SHAPING_PACKAGES:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        if origin is None:
            stamps.append([name, None])
            continue
        status = os.stat(origin)
        stamps.append([name, origin, status.st_size, status.st_mtime_ns])
    return stamps


def _content_digest(location: str) -> str:
    """sha256 of a changed path's content: a file's bytes, a link's target; or what it is instead."""
    try:
        status = os.lstat(location)
    except OSError as error:
        return f"missing:{error.errno}"
    if os.path.islink(location):
        return "link:" + os.readlink(location)
    if not os.path.isfile(location):
        return f"mode:{status.st_mode:o}"
    digest = hashlib.sha256()
    try:
        with open(location, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    except OSError as error:
        return f"unreadable:{error.errno}"
    return digest.hexdigest()


def _ignore_files_above(state: RepositoryState) -> Iterator[str]:
    """The ``.longctxignore`` files read whatever git says of them: from the work tree's top to the folder."""
    folders = [""]
    if state.subdirectory:
        parts = state.subdirectory.split("/")
        folders += ["/".join(parts[: depth + 1]) for depth in range(len(parts))]
    for folder in folders:
        yield os.path.join(state.work_tree, filesystem_path(folder), _LONGCTX_IGNORE)


def _state_digest(state: RepositoryState) -> str:
    changed = [
        [path, _content_digest(os.path.join(state.work_tree, filesystem_path(path)))]
        for path in state.changed_paths
    ]
    ignores = [_content_digest(location) for location in _ignore_files_above(state)]
    return _digest([state.head, state.changes.hex(), changed, ignores])


def snapshot_key(
    paths: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    options: CorpusOptions,
    tokenizer: Tokenizer | None,
) -> SnapshotKey | None:
    """The key of the pack these arguments would give, or None when git cannot vouch for it (see above)."""
    if not isinstance(paths, (str, os.PathLike)):
        if len(paths) != 1:
            return None
        paths = paths[0]
    directory = os.fspath(paths)
    if not isinstance(directory, str) or not os.path.isdir(directory):
        return None
    state = repository_state(directory)
    if state is None or state.hidden_changes or state.head is None:
        return None
    slot = _digest(
        [
            SNAPSHOT_FORMAT_VERSION,
            FORMAT_VERSION,
            MANIFEST_FORMAT_VERSION,
            os.path.realpath(directory),
            state.work_tree,
            state.subdirectory,
            options.ordering,
            list(options.include),
            list(options.exclude),
            [options.limits.max_file_bytes, options.limits.max_total_bytes, options.limits.max_files],
            options.allow_secrets,
            options.default_ignores,
            None if tokenizer is None else tokenizer.identity,
            options.max_stale_share,
            list(options.special_tokens),
            _code_identity(),
        ]
    )
    return SnapshotKey(
        slot, _state_digest(state), state.head, os.path.realpath(directory), tracked_files=state.tracked_files
    )


def _followed_links(directory: str, corpus: CorpusOutline) -> list[list[str]]:
    """Each symbolic link the corpus followed: its path, its target, the target's content digest.

    Links lead inside the folder (others are skipped), but the target may be
    a file git ignores, whose edits ``git status`` never shows: the state
    of a snapshot includes what each link pointed to and the target's
    content, checked again before the snapshot is used.
    """
    links = []
    for entry in corpus.manifest.included:
        for note in entry.notes:
            if note.startswith(_LINK_NOTE):
                target = note.removeprefix(_LINK_NOTE)
                location = os.path.join(directory, filesystem_path(target))
                links.append([entry.path, target, _content_digest(location)])
    return links


def _links_unchanged(directory: str, links: Sequence[Sequence[str]]) -> bool:
    """Whether every link of a snapshot still resolves to the same target, with the same content."""
    real_directory = os.path.realpath(directory)
    for path, target, digest in links:
        resolved = os.path.realpath(os.path.join(directory, filesystem_path(path)))
        expected = os.path.join(real_directory, filesystem_path(target))
        if resolved != expected or _content_digest(expected) != digest:
            logger.info("pack snapshot not used: the link %s changed", path)
            return False
    return True


def load_snapshot(store: Store, key: SnapshotKey) -> Snapshot | None:
    """The snapshot kept for ``key``, rebuilt; None when there is none (or it cannot be read back).

    A snapshot of a corpus that followed symbolic links is used only when
    each still points to the same file with the same content.
    """
    stored = store.caches.pack_snapshot(key.slot, key.state)
    if stored is None:
        return None
    links = stored.summary.get("links")
    if not (
        isinstance(links, list)
        and all(
            isinstance(link, list) and len(link) == 3 and all(isinstance(part, str) for part in link)
            for link in links
        )
        and _links_unchanged(key.directory, links)
    ):
        return None
    # The sections keep views of the mapped file (it closes with the last
    # of them): their text is decoded only if someone reads it.
    return _rebuild(stored, key)


def _rebuild(stored: StoredPackSnapshot, key: SnapshotKey) -> Snapshot | None:
    summary = stored.summary
    try:
        described = summary["pack"]
        if summary["version"] != SNAPSHOT_FORMAT_VERSION or described["format_version"] != FORMAT_VERSION:
            return None
        if len(described["sections"]) != len(stored.section_sizes):
            return None
        sections = tuple(
            Section(name, text, fingerprint, tokens)
            for (name, fingerprint, tokens), text in zip(
                described["sections"], _slices(stored.text.view, stored.section_sizes), strict=True
            )
        )
        pack = Pack(
            format_version=described["format_version"],
            system=sections[0].text,
            sections=sections,
            fingerprint=stored.fingerprint,
            tokenizer=described["tokenizer"],
            estimated=described["estimated"],
            prefix_tokens=described["prefix_tokens"],
            template_overhead_tokens=described["template_overhead_tokens"],
            part=described["part"],
            sections_additive=described["sections_additive"],
            _stored_text=stored.text,
        )
        ordering = summary["ordering"]
        described_manifest = summary["manifest"]
        manifest_summary = ManifestSummary(
            {str(reason): int(count) for reason, count in described_manifest["skipped_by_reason"].items()},
            tuple(str(path) for path in described_manifest["lossy_paths"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        logger.warning("a stored pack snapshot cannot be read back (%s); packing from the files", error)
        return None
    logger.info("pack snapshot reused: %s at %s", pack.fingerprint[:16], (key.head or "no commit")[:12])
    return Snapshot(pack, ordering, stored.manifest_json, manifest_summary)


def _slices(view: memoryview, sizes: Sequence[int]) -> Iterator[memoryview]:
    """Consecutive read-only views of ``view``, of the given sizes."""
    start = 0
    for size in sizes:
        yield view[start : start + size]
        start += size


class SnapshotWriter:
    """Writes a pack's text to the store as the pack is built, and keeps it if git still vouches for it.

    :meth:`write` takes each section's UTF-8 in order (the builder encodes
    each section once, for its fingerprint, and hands the bytes over), so
    the text is never encoded or held whole a second time. :meth:`files_read`
    says the last file is read (the repository's state is taken again from
    then on); :meth:`keep` then stores the snapshot, or drops it: see the
    module docstring. :meth:`discard` drops it (the pack failed).
    """

    def __init__(self, store: Store, key: SnapshotKey) -> None:
        self.store = store
        self.key = key
        self.sizes: list[int] = []
        self._path = store.blobs.new_file(key.slot, key.state)
        self._file: BinaryIO | None = open(self._path, "wb")  # noqa: SIM115 - closed by keep or discard
        self._state_taker: threading.Thread | None = None
        self._state_after: RepositoryState | None = None

    def files_read(self) -> None:
        """Start taking the repository's state again, in the background: every file of the pack is read.

        A change from now on is not in the pack, so this state vouches for
        it as well as one taken at :meth:`keep`; git runs while the pack's
        last texts are counted, rather than after. Without this call,
        :meth:`keep` takes the state itself.
        """
        if self._state_taker is None:
            self._state_taker = threading.Thread(
                target=self._take_state, name="longctx-snapshot-state", daemon=True
            )
            self._state_taker.start()

    def _take_state(self) -> None:
        self._state_after = repository_state(self.key.directory)

    def _state_after_load(self) -> RepositoryState | None:
        if self._state_taker is None:
            return repository_state(self.key.directory)
        self._state_taker.join()
        return self._state_after

    def write(self, data: bytes) -> None:
        if self._file is not None:
            self._file.write(data)
            self.sizes.append(len(data))

    def mapped(self) -> StoredText:
        """All written so far, open and mapped from the file (it outlives the name)."""
        assert self._file is not None
        self._file.flush()
        return StoredText(self._path)

    def discard(self) -> None:
        if self._state_taker is not None:
            self._state_taker.join()  # no git left running after the call
        if self._file is not None:
            self._file.close()
            self._file = None
        self._path.unlink(missing_ok=True)

    def keep(self, pack: Pack, corpus: CorpusOutline) -> bool:
        """Store the snapshot of ``pack`` and the manifest; False (dropped) when it cannot be trusted."""
        if self._file is None:
            return False
        self._file.close()
        self._file = None
        try:
            if not self._trustworthy(pack, corpus, self._state_after_load()):
                self._path.unlink(missing_ok=True)
                return False
            self.store.caches.save_pack_snapshot(
                self.key.slot,
                self.key.state,
                fingerprint=pack.fingerprint,
                summary={**_summary(pack, corpus), "links": _followed_links(self.key.directory, corpus)},
                manifest=corpus.manifest.to_dict(),
                text_file=self._path,
                section_sizes=self.sizes,
            )
        except BaseException:
            self._path.unlink(missing_ok=True)
            raise
        return True

    def _trustworthy(self, pack: Pack, corpus: CorpusOutline, state: RepositoryState | None) -> bool:
        key = self.key
        if corpus.head_sha != key.head or pack.part is not None or len(self.sizes) != len(pack.sections):
            return False
        if state is None or state.hidden_changes or _state_digest(state) != key.state:
            logger.info("pack snapshot not kept: the repository changed while it was packed")
            return False
        return True


def _summary(pack: Pack, corpus: CorpusOutline) -> dict[str, Any]:
    manifest = ManifestSummary.of(corpus.manifest)
    return {
        "version": SNAPSHOT_FORMAT_VERSION,
        "ordering": corpus.ordering,
        "manifest": {
            "skipped_by_reason": manifest.skipped_by_reason,
            "lossy_paths": list(manifest.lossy_paths),
        },
        "pack": {
            "format_version": pack.format_version,
            "tokenizer": pack.tokenizer,
            "estimated": pack.estimated,
            "prefix_tokens": pack.prefix_tokens,
            "template_overhead_tokens": pack.template_overhead_tokens,
            "part": pack.part,
            "sections_additive": pack.sections_additive,
            "sections": [[section.name, section.fingerprint, section.tokens] for section in pack.sections],
        },
    }
