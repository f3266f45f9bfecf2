"""Living sessions: files changed since the pack travel in the next user message.

A pack is the start of every request of a session, so it cannot change
without losing the cached prefix and the history after it. When a file of
a repository session changes between turns, the session instead appends
the file's current text (or a line saying it was deleted or renamed) to the
next user message, before the question. Everything sent before stays
byte for byte the same, so the server still serves the pack and the
earlier turns from its cache, and the model reads the current code.

The check is cheap when nothing moved: the repository state the pack
snapshots use (``git status`` and the content of the files it names, see
:mod:`longctx.packing.snapshots`) is compared with the state last seen;
only when it differs (or the paths are not a git repository) are the
files read again and compared by content hash with what the model has
seen: the pack's manifest, then every change an earlier turn carried.

What a turn carried is stored with it (``TurnRecord.preamble`` and
``file_changes``), so a resumed or forked session renders each earlier
user message exactly as it was sent, and knows what the model has seen.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from typing import Any, Literal

from longctx.errors import ContextOverflow
from longctx.options.groups import CorpusOptions
from longctx.packing.rendering import render_document, render_path
from longctx.packing.snapshots import snapshot_key
from longctx.recordtypes import record_type
from longctx.sources.corpus import Corpus, load_corpus
from longctx.store import Store, TurnRecord

__all__ = [
    "CHANGES_CLOSING",
    "CHANGES_OPENING",
    "ChangeTracker",
    "Changes",
    "FileChange",
    "check_room",
    "corpus_hashes",
]

CHANGES_OPENING = (
    "<files-changed>\n"
    "These files changed since the documents above were taken. Each document below is the current "
    'text of its path and replaces every earlier copy; a line "[deleted] PATH" means the file no '
    'longer exists, "[renamed] OLD -> NEW" that it moved unchanged.\n'
)
"""The opening of the block of changed files; it ends the way a pack section does (one line break)."""

CHANGES_CLOSING = "</files-changed>\n"

ChangeKind = Literal["changed", "added", "deleted", "renamed"]


@record_type
class FileChange:
    """One path that changed: ``kind`` says how; ``previous_path`` is set for a rename."""

    path: str
    kind: ChangeKind
    previous_path: str | None = None

    def describe(self) -> str:
        if self.kind == "renamed":
            return f"{self.previous_path} renamed to {self.path}"
        return f"{self.path} {self.kind}"


@record_type
class Changes:
    """What the next user message carries before its question.

    ``text`` is the block itself; ``files`` maps each path it covers to its
    new content hash (None for a path deleted or renamed away); ``changes``
    lists them for people; ``estimated_tokens`` is the block's size by the
    documented estimate.
    """

    changes: tuple[FileChange, ...]
    text: str
    files: Mapping[str, str | None] = field(default_factory=dict)
    estimated_tokens: int = 0

    def summary_line(self) -> str:
        """One line for the turn line and the report: how many files, and which."""
        shown = ", ".join(change.describe() for change in self.changes[:5])
        more = f", and {len(self.changes) - 5} more" if len(self.changes) > 5 else ""
        count = len(self.changes)
        return f"appended {count} changed file{'s' if count != 1 else ''} ({shown}{more})"


def known_files(baseline: Mapping[str, str], turns: Sequence[TurnRecord]) -> dict[str, str]:
    """What the model has seen of each path: the pack's hashes, then each turn's changes in order."""
    files = dict(baseline)
    for turn in turns:
        for path, digest in turn.file_changes.items():
            if digest is None:
                files.pop(path, None)
            else:
                files[path] = digest
    return files


def corpus_hashes(corpus: Corpus) -> dict[str, str]:
    """Each included path of ``corpus`` and its content hash: the baseline a living session starts from."""
    return {entry.path: entry.sha256 for entry in corpus.manifest.included if entry.sha256 is not None}


class ChangeTracker:
    """Finds, before a turn, what changed in ``paths`` since the model last saw it.

    ``baseline`` is the pack's path to content hash; ``state`` the
    repository state the pack was read at (None when unknown). Constructing
    one reads nothing.
    """

    def __init__(
        self,
        paths: Sequence[str],
        options: CorpusOptions,
        baseline: Mapping[str, str],
        state: str | None,
    ) -> None:
        self.paths = tuple(paths)
        self.options = options
        self.baseline = dict(baseline)
        self._seen_state = state

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> ChangeTracker | None:
        """The tracker a stored session's settings describe (see :meth:`to_settings`); None if none."""
        living = settings.get("living")
        if not isinstance(living, Mapping):
            return None
        return cls(
            tuple(living["paths"]),
            CorpusOptions.from_dict(living.get("corpus") or {}),
            living.get("files") or {},
            # A resumed session reads its files again: the state may have
            # moved while no process was watching.
            None,
        )

    def to_settings(self) -> dict[str, Any]:
        """The ``living`` entry of a session's settings: enough to track changes after a resume."""
        return {
            "living": {
                "paths": list(self.paths),
                "corpus": self.options.to_dict(),
                "files": dict(sorted(self.baseline.items())),
            }
        }

    @staticmethod
    def state_of(paths: Sequence[str], options: CorpusOptions) -> str | None:
        """The repository state of ``paths`` (one git folder), or None when git cannot vouch for it."""
        key = snapshot_key(list(paths), options, None)
        return None if key is None else key.state

    def pending(
        self,
        store: Store | None,
        turns: Sequence[TurnRecord],
        *,
        count: Callable[[str], int],
    ) -> Changes | None:
        """The changes the next user message must carry, or None when the model has seen every file.

        ``count`` estimates a text's tokens (for :meth:`check_room`).
        """
        state = self.state_of(self.paths, self.options)
        if state is not None and state == self._seen_state:
            return None
        corpus = load_corpus(list(self.paths), self.options, store=store)
        current = corpus_hashes(corpus)
        seen = known_files(self.baseline, turns)
        if current == seen:
            self._seen_state = state
            return None
        # The state is not marked seen until a turn carrying these changes is
        # stored: if its request fails, the next turn finds them again.
        texts = {document.path: document.text for document in corpus.documents}
        return _changes(seen, current, texts, count)


def _changes(
    seen: Mapping[str, str],
    current: Mapping[str, str],
    texts: Mapping[str, str],
    count: Callable[[str], int],
) -> Changes:
    removed = sorted(path for path in seen if path not in current)
    added = sorted(path for path in current if path not in seen)
    changed = sorted(path for path in current if path in seen and seen[path] != current[path])
    # A path that vanished while another appeared with its exact content moved.
    by_digest = {seen[path]: path for path in removed}
    renamed = {path: by_digest.pop(current[path]) for path in added if current[path] in by_digest}
    entries: list[FileChange] = []
    files: dict[str, str | None] = {}
    sections = [CHANGES_OPENING]
    for path in sorted({*changed, *added}):
        files[path] = current[path]
        if path in renamed:
            entries.append(FileChange(path, "renamed", renamed[path]))
            sections.append(f"[renamed] {render_path(renamed[path])} -> {render_path(path)}\n")
            continue
        entries.append(FileChange(path, "changed" if path in changed else "added"))
        sections.append(render_document(path, texts.get(path, "")))
    for path in removed:
        files[path] = None
        if path not in renamed.values():
            entries.append(FileChange(path, "deleted"))
            sections.append(f"[deleted] {render_path(path)}\n")
    sections.append(CHANGES_CLOSING)
    text = "".join(sections)
    return Changes(tuple(entries), text, files, count(text))


def check_room(
    changes: Changes,
    *,
    prompt_tokens: int,
    max_tokens: int,
    context_length: int | None,
    paths: Sequence[str],
) -> None:
    """Raise :class:`~longctx.errors.ContextOverflow` when ``changes`` would pass the window.

    ``prompt_tokens`` is what the next request holds besides the changes.
    """
    if not context_length:
        return
    needed = prompt_tokens + changes.estimated_tokens + max_tokens
    if needed <= context_length:
        return
    shown = " ".join(os.fspath(path) for path in paths) or "PATHS"
    raise ContextOverflow(
        f"the files changed since the pack ({changes.estimated_tokens:,} tokens, about) would pass the "
        f"server's window: {needed:,} of {context_length:,} tokens with the history and the answer; "
        f"start a fresh pack with `longctx chat {shown}`",
        prompt_tokens=needed,
        context_length=context_length,
    )
