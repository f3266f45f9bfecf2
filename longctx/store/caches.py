"""The store's content caches: what is slow to compute and fixed by its input, kept by that input.

Token counts by tokenizer and content sha256; extracted texts of PDFs by
extractor and content sha256; the special-token spellings of a served
tokenizer by its identity; the last-commit times of a repository's files
by commit; pack snapshots by slot and repository state; a pack's prompt token
ids by pack and tokenizer identity. Each value is plain
data: what it means is its producer's business (:mod:`longctx.tokens`,
:mod:`longctx.sources.pdf`, :mod:`longctx.sources.repo`,
:mod:`longctx.packing.snapshots`), and the store imports none of them.
"""

from __future__ import annotations

import json
import sys
import time
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from longctx.store.blobs import SnapshotTexts
from longctx.store.db import Database
from longctx.store.records import StoredPackIds, StoredPackSnapshot

__all__ = ["ContentCaches"]


class ContentCaches:
    """``store.caches``: what is slow to compute and fixed by its input, kept by that input.

    Token counts (by tokenizer and content sha256), PDF texts (by extractor
    and content sha256), last-commit times (by key), special-token
    spellings (by tokenizer identity) and the rows of pack snapshots (by
    slot and repository state; their texts are files in ``store.blobs``).
    Reads and writes go over the store's one connection.
    """

    def __init__(self, database: Database, blobs: SnapshotTexts) -> None:
        # No I/O: the database opens on first use.
        self._database = database
        self._blobs = blobs

    # -- token counts -------------------------------------------------------

    def token_counts(self, tokenizer: str, content_hashes: Sequence[str]) -> dict[str, int]:
        """Known counts for ``content_hashes`` under ``tokenizer``; unknown ones are absent."""
        found: dict[str, int] = {}
        unique = list(dict.fromkeys(content_hashes))
        # SQLite limits bound parameters per statement; 500 stays far below it.
        for start in range(0, len(unique), 500):
            chunk = unique[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for row in self._database.query(
                "SELECT content_sha256, tokens FROM token_counts"
                f" WHERE tokenizer = ? AND content_sha256 IN ({marks})",
                [tokenizer, *chunk],
            ):
                found[row["content_sha256"]] = row["tokens"]
        return found

    def save_token_counts(self, tokenizer: str, counts: Mapping[str, int]) -> None:
        """Remember ``counts`` (content sha256 -> tokens) for ``tokenizer``."""
        if not counts:
            return
        with self._database.transaction() as connection:
            connection.executemany(
                "INSERT OR REPLACE INTO token_counts (tokenizer, content_sha256, tokens) VALUES (?, ?, ?)",
                [(tokenizer, digest, tokens) for digest, tokens in counts.items()],
            )

    # -- a pack's prompt token ids -------------------------------------------

    def pack_ids(self, tokenizer: str, fingerprint: str) -> StoredPackIds | None:
        """The prompt ids kept for pack ``fingerprint`` under ``tokenizer`` (an identity), or None."""
        rows = self._database.query(
            "SELECT head, after_user FROM prompt_ids WHERE tokenizer = ? AND pack_fingerprint = ?",
            [tokenizer, fingerprint],
        )
        if not rows:
            return None
        return StoredPackIds(_ids_from(rows[0]["head"]), _ids_from(rows[0]["after_user"]))

    def save_pack_ids(self, tokenizer: str, fingerprint: str, ids: StoredPackIds) -> None:
        """Remember a pack's prompt ids under ``tokenizer`` (see :mod:`longctx.sessions.prompt_ids`)."""
        with self._database.transaction() as connection:
            connection.execute(
                "INSERT OR REPLACE INTO prompt_ids"
                " (tokenizer, pack_fingerprint, head, after_user, created_at) VALUES (?, ?, ?, ?, ?)",
                (tokenizer, fingerprint, _ids_blob(ids.head), _ids_blob(ids.after_user), time.time()),
            )

    # -- PDF texts ----------------------------------------------------------

    def pdf_text(self, extractor: str, content_sha256: str) -> dict[str, Any] | None:
        """The text kept for this content by this extractor, or None.

        The record is ``{"text": str, "page_count": int, "notes": list[str],
        "unusable_pages": list[[int, str]]}``, as given to :meth:`save_pdf_text`;
        what it means is the extractor's business (:mod:`longctx.sources.pdf`),
        not the store's.
        """
        rows = self._database.query(
            "SELECT text, page_count, notes_json, unusable_pages_json FROM pdf_texts"
            " WHERE extractor = ? AND content_sha256 = ?",
            [extractor, content_sha256],
        )
        if not rows:
            return None
        row = rows[0]
        return {
            "text": bytes(row["text"]).decode("utf-8", "surrogatepass"),
            "page_count": row["page_count"],
            "notes": json.loads(row["notes_json"]),
            "unusable_pages": json.loads(row["unusable_pages_json"]),
        }

    def save_pdf_text(self, extractor: str, content_sha256: str, record: Mapping[str, Any]) -> None:
        """Keep ``record`` (shaped as :meth:`pdf_text` returns it) for this content and extractor.

        The text may hold lone surrogates (a PDF's text need not be valid
        Unicode); they are kept, hence the blob.
        """
        with self._database.transaction() as connection:
            connection.execute(
                "INSERT OR REPLACE INTO pdf_texts (extractor, content_sha256, text, page_count,"
                " notes_json, unusable_pages_json, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    extractor,
                    content_sha256,
                    str(record["text"]).encode("utf-8", "surrogatepass"),
                    int(record["page_count"]),
                    json.dumps(list(record["notes"])),
                    json.dumps([list(page) for page in record.get("unusable_pages", ())]),
                    time.time(),
                ),
            )

    # -- last-commit times -------------------------------------------------

    def commit_times(self, key: str) -> dict[str, int] | None:
        """The times kept under ``key`` (see :mod:`longctx.sources.repo`), or None."""
        rows = self._database.query("SELECT times_json FROM commit_times WHERE key = ?", [key])
        if not rows:
            return None
        times: dict[str, int] = json.loads(rows[0]["times_json"])
        return times

    def save_commit_times(self, key: str, times: dict[str, int], *, keep: int = 64) -> None:
        """Keep ``times`` under ``key``; only the ``keep`` newest sets are kept."""
        with self._database.transaction() as connection:
            connection.execute(
                "INSERT OR REPLACE INTO commit_times (key, times_json, created_at) VALUES (?, ?, ?)",
                (key, json.dumps(times), time.time()),
            )
            connection.execute(
                "DELETE FROM commit_times WHERE key NOT IN"
                " (SELECT key FROM commit_times ORDER BY created_at DESC, key LIMIT ?)",
                [keep],
            )

    # -- special tokens -----------------------------------------------------

    def special_tokens(self, tokenizer: str) -> tuple[str, ...] | None:
        """The special-token spellings kept for the tokenizer ``tokenizer`` (its identity), or None."""
        rows = self._database.query(
            "SELECT spellings_json FROM special_tokens WHERE tokenizer = ?", [tokenizer]
        )
        if not rows:
            return None
        return tuple(json.loads(rows[0]["spellings_json"]))

    def save_special_tokens(self, tokenizer: str, spellings: Sequence[str]) -> None:
        """Keep ``spellings`` as the special tokens of ``tokenizer`` (its identity)."""
        with self._database.transaction() as connection:
            connection.execute(
                "INSERT OR REPLACE INTO special_tokens (tokenizer, spellings_json, created_at)"
                " VALUES (?, ?, ?)",
                (tokenizer, json.dumps(list(spellings)), time.time()),
            )

    # -- pack snapshots -----------------------------------------------------

    def save_pack_snapshot(
        self,
        slot: str,
        state: str,
        *,
        fingerprint: str,
        summary: Mapping[str, Any],
        manifest: Mapping[str, Any],
        text_file: Path,
        section_sizes: Sequence[int],
        keep: int = 8,
    ) -> None:
        """Keep a pack snapshot in ``slot``, replacing the slot's previous one.

        ``summary`` and ``manifest`` are JSON-able (kept apart: see
        :class:`~longctx.store.records.StoredPackSnapshot`). ``text_file``
        (from ``store.blobs.new_file``) holds each section's UTF-8 in order,
        ``section_sizes`` their lengths; it is moved into place before the
        row that points to it is committed. Only the ``keep`` newest
        snapshots are kept.
        """
        texts = self._blobs
        name = texts.keep(text_file, slot, state, sum(section_sizes))
        # Not sort_keys: the summary is read back, never compared as text,
        # and sorting the keys of its thousands of entries triples the time
        # of the dump (about 20 ms at the end of a large first pack).
        summary_json, manifest_json = json.dumps(summary), json.dumps(manifest)
        with self._database.transaction() as connection:
            connection.execute("DELETE FROM pack_snapshots WHERE slot = ?", [slot])
            connection.execute(
                "INSERT INTO pack_snapshots (slot, state, fingerprint, summary_json, manifest_json,"
                " section_sizes_json, text_file, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    slot,
                    state,
                    fingerprint,
                    summary_json,
                    manifest_json,
                    json.dumps(list(section_sizes)),
                    name,
                    time.time(),
                ),
            )
            connection.execute(
                "DELETE FROM pack_snapshots WHERE slot NOT IN"
                " (SELECT slot FROM pack_snapshots ORDER BY created_at DESC, slot LIMIT ?)",
                [keep],
            )
            kept = {row[0] for row in connection.execute("SELECT text_file FROM pack_snapshots")}
        texts.remove_all_but(kept)

    def has_pack_snapshot(self, slot: str) -> bool:
        """Whether ``slot`` holds a snapshot, whatever its state."""
        return bool(self._database.query("SELECT 1 FROM pack_snapshots WHERE slot = ? LIMIT 1", [slot]))

    def pack_snapshot(self, slot: str, state: str) -> StoredPackSnapshot | None:
        """The snapshot in ``slot`` if it was saved for ``state`` and its text is intact, else None."""
        rows = self._database.query(
            "SELECT fingerprint, summary_json, manifest_json, section_sizes_json, text_file"
            " FROM pack_snapshots WHERE slot = ? AND state = ?",
            [slot, state],
        )
        if not rows or rows[0]["manifest_json"] is None:  # none, or saved before the manifest had its column
            return None
        row = rows[0]
        sizes = tuple(json.loads(row["section_sizes_json"]))
        if not sizes or not sum(sizes):
            return None
        text = self._blobs.open(row["text_file"])
        if text is None or text.size != sum(sizes):
            return None
        return StoredPackSnapshot(
            slot=slot,
            state=state,
            fingerprint=row["fingerprint"],
            summary=json.loads(row["summary_json"]),
            text=text,
            section_sizes=sizes,
            manifest_json=row["manifest_json"],
        )


def _ids_blob(ids: Sequence[int]) -> bytes:
    """Token ids as int32, little-endian (4 bytes a token: a 1M-token pack is 4 MB)."""
    packed = array("i", ids)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def _ids_from(blob: bytes) -> tuple[int, ...]:
    unpacked = array("i")
    unpacked.frombytes(blob)
    if sys.byteorder != "little":
        unpacked.byteswap()
    return tuple(unpacked)
