"""What the store keeps of sessions: their packs, turns, requests and counter checks (made or skipped).

Every write is one transaction: a turn and the request that produced it are
committed together after the response arrived, so after a crash a session
holds every completed turn and no half turn.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any

from longctx.errors import SessionNotFound, StoreError
from longctx.store.db import Database, key_range
from longctx.store.pruning import PruneResult, PruneRule, prune_sessions
from longctx.store.records import (
    CounterCheckRecord,
    CounterSkip,
    Opening,
    RequestRecord,
    SessionRecord,
    StoredImage,
    StoredPack,
    TurnRecord,
    record_from_row,
)

__all__ = ["SessionLog"]


class SessionLog:
    """``store.sessions``: sessions and what belongs to them, written one transaction at a time.

    Sessions (created, listed, branched, deleted), their turns, the
    requests that answered them (and those that answered none, such as a
    warm start), the server-counter checks around their calls, the answer
    keys of a job's questions (:meth:`answered`), and the packs whose
    prefixes they were asked over. Reads and writes go over the store's one
    connection.
    """

    def __init__(self, database: Database, *, check_key: Callable[[Any, str], None] | None = None) -> None:
        # No I/O: the database opens on first use.
        self._database = database
        # Called in an answer's transaction with its key (the leases: the item must still be this run's).
        self._check_key = check_key

    # -- packs --------------------------------------------------------------

    def pack(self, fingerprint: str, *, images: bool = True) -> StoredPack | None:
        """The pack kept under ``fingerprint``, with its images (:class:`StoredImage`), or None.

        ``images`` False leaves them out (a listing needs the summary only).
        Raises :class:`StoreError` when an image's bytes are missing or no
        longer match their sha256 (a pack that would send other images, or
        placeholders, is not given back).
        """
        rows = self._database.query("SELECT * FROM packs WHERE fingerprint = ?", [fingerprint])
        if not rows:
            return None
        summary = json.loads(rows[0]["summary_json"])
        placed = self._pack_images(fingerprint, len(summary.get("images") or ())) if images else ()
        return record_from_row(StoredPack, rows[0], summary=summary, images=placed)

    def _pack_images(self, fingerprint: str, expected: int) -> tuple[StoredImage, ...]:
        """The images of pack ``fingerprint`` in place, checked against their digests and count."""
        rows = self._database.query(
            "SELECT pack_images.*, image_blobs.data AS data FROM pack_images"
            " LEFT JOIN image_blobs ON image_blobs.sha256 = pack_images.sha256"
            " WHERE pack_fingerprint = ? ORDER BY position",
            [fingerprint],
        )
        placed = []
        for row in rows:
            data = row["data"]
            if data is None or hashlib.sha256(data).hexdigest() != row["sha256"]:
                raise StoreError(
                    f"pack {fingerprint[:16]}: the bytes of its image {row['source']}"
                    f" (sha256 {row['sha256'][:16]}) are missing from the store or damaged;"
                    " the session cannot send the same images"
                )
            placed.append(
                StoredImage(
                    offset=row["start"],
                    length=row["length"],
                    media_type=row["media_type"],
                    data=bytes(data),
                    sha256=row["sha256"],
                    width=row["width"],
                    height=row["height"],
                    source=row["source"],
                    reason=row["reason"],
                )
            )
        if expected != len(placed):
            raise StoreError(
                f"pack {fingerprint[:16]} holds {expected} images but the store keeps {len(placed)}"
                " (kept by a longctx that stored no image bytes): pack the files again"
            )
        return tuple(placed)

    # -- sessions -----------------------------------------------------------

    def create_session(self, record: SessionRecord) -> None:
        """Store a new session; its id must not be taken."""
        with self._database.transaction() as connection:
            _insert_session(connection, record)

    def record_opening(self, opening: Opening) -> None:
        """Store a new session with its pack and earlier requests, atomically, before any turn."""
        with self._database.transaction() as connection:
            _insert_opening(connection, opening)

    def session(self, session_id: str) -> SessionRecord:
        """The session with ``session_id``; raises :class:`SessionNotFound`."""
        rows = self._database.query("SELECT * FROM sessions WHERE id = ?", [session_id])
        if not rows:
            raise SessionNotFound(session_id)
        return _session_record(rows[0])

    def sessions(self, *, include_branches: bool = False) -> list[SessionRecord]:
        """Stored sessions, newest first."""
        where = "" if include_branches else "WHERE parent_id IS NULL OR kind != 'sibling'"
        return [
            _session_record(row)
            for row in self._database.query(f"SELECT * FROM sessions {where} ORDER BY created_at DESC, id")
        ]

    def children(self, session_id: str) -> list[SessionRecord]:
        """Sessions branched directly from ``session_id`` (siblings and forks), oldest first."""
        return [
            _session_record(row)
            for row in self._database.query(
                "SELECT * FROM sessions WHERE parent_id = ? ORDER BY created_at, id", [session_id]
            )
        ]

    def delete_session(self, session_id: str) -> None:
        """Delete a session, its turns and requests; its branches keep theirs."""
        self.session(session_id)
        with self._database.transaction() as connection:
            connection.execute("DELETE FROM sessions WHERE id = ?", [session_id])

    def turns(self, session_id: str) -> list[TurnRecord]:
        """The session's own turns, in order (not those inherited from a parent)."""
        return [
            _turn_record(row)
            for row in self._database.query(
                "SELECT * FROM turns WHERE session_id = ? ORDER BY position", [session_id]
            )
        ]

    def commit_turn(
        self,
        turn: TurnRecord,
        request: RequestRecord,
        *,
        opening: Opening | None = None,
        new_session: SessionRecord | None = None,
        key: str | None = None,
    ) -> None:
        """Store a completed turn and the request that answered it, atomically.

        ``opening`` (the session itself, or a batch's parent, not yet stored),
        ``new_session`` (a sibling branch) and ``key`` (the caller's name for
        the question, see :meth:`answered`) are written in the same
        transaction, so a crash never leaves a session without its turn.
        Raises :class:`StoreError` if the position or the key is already
        taken, so a retried or replayed turn can never be stored twice.
        """
        try:
            with self._database.transaction() as connection:
                if opening is not None:
                    _insert_opening(connection, opening)
                if new_session is not None:
                    _insert_session(connection, new_session)
                if key is not None:
                    if self._check_key is not None:
                        self._check_key(connection, key)
                    connection.execute(
                        "INSERT INTO answer_keys (key, session_id, position) VALUES (?, ?, ?)",
                        (key, turn.session_id, turn.position),
                    )
                _insert_request(connection, request)
                connection.execute(
                    "INSERT INTO turns (session_id, position, question, answer, history_answer, reasoning,"
                    " request_id, created_at, preamble, file_changes_json, answer_ids_json, instruction,"
                    " citations_json, schema_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        turn.session_id,
                        turn.position,
                        turn.question,
                        turn.answer,
                        turn.history_answer,
                        turn.reasoning,
                        turn.request_id,
                        turn.created_at,
                        turn.preamble,
                        json.dumps(dict(turn.file_changes), sort_keys=True),
                        None if turn.answer_ids is None else json.dumps(list(turn.answer_ids)),
                        turn.instruction,
                        _citations_json(turn),
                        None if turn.schema is None else json.dumps(dict(turn.schema), sort_keys=True),
                    ),
                )
        except self._database.conflicts as error:
            raise StoreError(
                f"turn {turn.position} of session {turn.session_id} is already stored: {error}"
            ) from error

    def answered(self, keys: Sequence[str]) -> dict[str, TurnRecord]:
        """The stored turn of each of ``keys`` that has one (keys given to :meth:`commit_turn`)."""
        found: dict[str, TurnRecord] = {}
        wanted = list(dict.fromkeys(keys))
        # SQLite limits the parameters of one statement; 500 is far below every build's limit.
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            rows = self._database.query(
                "SELECT answer_keys.key AS answer_key, turns.* FROM answer_keys JOIN turns"
                " ON turns.session_id = answer_keys.session_id AND turns.position = answer_keys.position"
                f" WHERE answer_keys.key IN ({','.join('?' * len(chunk))})",
                chunk,
            )
            for row in rows:
                found[row["answer_key"]] = _turn_record(row)
        return found

    def answered_under(self, prefix: str) -> dict[str, TurnRecord]:
        """The stored turn of every key that starts with ``prefix`` (a job's keys: ``job:ID:``)."""
        # A range in byte order, so the index on the keys finds them (no scan of every key).
        in_range = "WHERE answer_keys.key COLLATE BINARY >= ? AND answer_keys.key COLLATE BINARY < ?"
        where, parameters = (in_range, list(key_range(prefix))) if prefix else ("", [])
        rows = self._database.query(
            "SELECT answer_keys.key AS answer_key, turns.* FROM answer_keys JOIN turns"
            " ON turns.session_id = answer_keys.session_id AND turns.position = answer_keys.position "
            + where,
            parameters,
        )
        return {row["answer_key"]: _turn_record(row) for row in rows}

    def prune(self, rule: PruneRule, *, dry_run: bool = False) -> PruneResult:
        """Delete the session trees ``rule`` selects, never one in use, and compact the file.

        See :mod:`longctx.store.pruning`; ``dry_run`` says what would go and deletes nothing.
        """
        return prune_sessions(self._database, rule, dry_run=dry_run)

    # -- requests -----------------------------------------------------------

    def record(self, *records: RequestRecord | CounterCheckRecord | CounterSkip) -> None:
        """Keep, in one transaction, what a session did besides its turns.

        A request that answered no turn (a warm start: the report counts its
        cost), the server counter's growth over a call's requests, and why a
        call's check was not made (a note the session already has is kept once).
        """
        with self._database.transaction() as connection:
            for record in records:
                if isinstance(record, RequestRecord):
                    _insert_request(connection, record)
                elif isinstance(record, CounterCheckRecord):
                    _insert_counter_check(connection, record)
                else:
                    _insert_counter_skip(connection, record)

    def counter_skips(self, session_ids: Sequence[str]) -> list[CounterSkip]:
        """Why calls of these sessions were not checked, in the order first recorded."""
        marks = ",".join("?" * len(session_ids))
        rows = self._database.query(
            f"SELECT session_id, note, batch_id FROM counter_skips WHERE session_id IN ({marks}) ORDER BY id",
            list(session_ids),
        )
        return [CounterSkip(row["session_id"], row["note"], row["batch_id"]) for row in rows]

    def counter_checks(self, session_ids: Sequence[str]) -> list[CounterCheckRecord]:
        """The counter checks of these sessions, in the order they were recorded."""
        marks = ",".join("?" * len(session_ids))
        return [
            record_from_row(CounterCheckRecord, row)
            for row in self._database.query(
                f"SELECT * FROM counter_checks WHERE session_id IN ({marks}) ORDER BY id", list(session_ids)
            )
        ]

    def requests(
        self,
        *,
        session_ids: Sequence[str] | None = None,
        batch_id: str | None = None,
        base_url: str | None = None,
        model: str | None = None,
    ) -> list[RequestRecord]:
        """Requests matching every filter given (all when none is), oldest first."""
        clauses: list[str] = []
        parameters: list[Any] = []
        if session_ids is not None:
            clauses.append(f"session_id IN ({','.join('?' * len(session_ids))})")
            parameters.extend(session_ids)
        for column, value in (("batch_id", batch_id), ("base_url", base_url), ("model", model)):
            if value is not None:
                clauses.append(f"{column} = ?")
                parameters.append(value)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._database.query(f"SELECT * FROM requests {where} ORDER BY started_at, id", parameters)
        return [RequestRecord.from_row(dict(row)) for row in rows]


def _insert_pack(connection: sqlite3.Connection, pack: StoredPack) -> None:
    connection.execute(
        "INSERT OR IGNORE INTO packs"
        " (fingerprint, format_version, system, prefix, summary_json, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (
            pack.fingerprint,
            pack.format_version,
            pack.system,
            pack.prefix,
            json.dumps(pack.summary, sort_keys=True),
            time.time(),
        ),
    )
    for position, placed in enumerate(pack.images):
        image = placed.image
        connection.execute(
            "INSERT OR IGNORE INTO image_blobs (sha256, data) VALUES (?, ?)", (image.sha256, image.data)
        )
        connection.execute(
            "INSERT OR IGNORE INTO pack_images (pack_fingerprint, position, start, length, sha256,"
            " media_type, width, height, source, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                pack.fingerprint,
                position,
                placed.offset,
                placed.length,
                image.sha256,
                image.media_type,
                image.width,
                image.height,
                image.source,
                image.reason,
            ),
        )


def _insert_opening(connection: sqlite3.Connection, opening: Opening) -> None:
    if opening.pack is not None:
        _insert_pack(connection, opening.pack)
    _insert_session(connection, opening.session)
    for request in opening.requests:
        _insert_request(connection, request)
    for check in opening.counter_checks:
        _insert_counter_check(connection, check)
    for skip in opening.counter_skips:
        _insert_counter_skip(connection, skip)


def _insert_counter_skip(connection: sqlite3.Connection, skip: CounterSkip) -> None:
    connection.execute(
        "INSERT OR IGNORE INTO counter_skips (session_id, batch_id, note, created_at) VALUES (?, ?, ?, ?)",
        (skip.session_id, skip.batch_id, skip.note, time.time()),
    )


def _insert_counter_check(connection: sqlite3.Connection, check: CounterCheckRecord) -> None:
    connection.execute(
        "INSERT INTO counter_checks"
        " (session_id, batch_id, base_url, counter, before, after, reported,"
        " requests, others_reported, window_id, host_tokens, external_tokens, loaded_bytes, tier_source,"
        " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            check.session_id,
            check.batch_id,
            check.base_url,
            check.counter,
            check.before,
            check.after,
            check.reported,
            check.requests,
            check.others_reported,
            check.window_id,
            check.host_tokens,
            check.external_tokens,
            check.loaded_bytes,
            check.tier_source,
            time.time(),
        ),
    )


def _insert_session(connection: sqlite3.Connection, record: SessionRecord) -> None:
    connection.execute(
        "INSERT INTO sessions (id, created_at, kind, title, pack_fingerprint, parent_id, parent_turns,"
        " settings_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            record.id,
            record.created_at,
            record.kind,
            record.title,
            record.pack_fingerprint,
            record.parent_id,
            record.parent_turns,
            json.dumps(dict(record.settings), sort_keys=True),
        ),
    )


def _insert_request(connection: sqlite3.Connection, request: RequestRecord) -> None:
    row = request.to_row()
    columns = ", ".join(row)
    connection.execute(
        f"INSERT INTO requests ({columns}) VALUES ({', '.join('?' * len(row))})", list(row.values())
    )


def _turn_record(row: sqlite3.Row) -> TurnRecord:
    answer_ids, citations, schema = row["answer_ids_json"], row["citations_json"], row["schema_json"]
    return record_from_row(
        TurnRecord,
        row,
        file_changes=json.loads(row["file_changes_json"]),
        schema=None if schema is None else json.loads(schema),
        answer_ids=None if answer_ids is None else tuple(json.loads(answer_ids)),
        citations=None if citations is None else tuple(json.loads(citations)),
    )


def _citations_json(turn: TurnRecord) -> str | None:
    """A turn's citations as stored: a JSON list of their dicts; NULL when none were asked for."""
    if turn.citations is None:
        return None
    return json.dumps([dict(citation) for citation in turn.citations])


def _session_record(row: sqlite3.Row) -> SessionRecord:
    return record_from_row(SessionRecord, row, settings=json.loads(row["settings_json"]))
