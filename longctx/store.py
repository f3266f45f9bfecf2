"""The embedded SQLite store: sessions, turns, requests, packs, token counts.

One database file, ``longctx.db`` under the longctx home folder
(``$LONGCTX_HOME``, else the user data folder). Every write is one
transaction: a turn and the request that produced it are committed
together after the response arrived, so after a crash a session holds every
completed turn and no half turn.

Schema changes are migrations, applied in order and recorded in
``PRAGMA user_version``; a database written by a newer longctx is refused
rather than misread.
"""

from __future__ import annotations

import contextlib
import io
import json
import mmap
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from longctx.config import default_home
from longctx.errors import SessionNotFound, StoreError

if TYPE_CHECKING:
    from longctx.sources.pdf import PdfText

__all__ = [
    "DATABASE_NAME",
    "CounterCheckRecord",
    "RequestRecord",
    "SessionRecord",
    "Store",
    "StoredPack",
    "StoredPackSnapshot",
    "StoredText",
    "TurnRecord",
    "default_home",
]

DATABASE_NAME = "longctx.db"

_MIGRATIONS: tuple[str, ...] = (
    # 1: token counts, packs, sessions, turns, requests.
    """
    CREATE TABLE token_counts (
        tokenizer TEXT NOT NULL,
        content_sha256 TEXT NOT NULL,
        tokens INTEGER NOT NULL,
        PRIMARY KEY (tokenizer, content_sha256)
    ) WITHOUT ROWID;

    CREATE TABLE packs (
        fingerprint TEXT PRIMARY KEY,
        format_version TEXT NOT NULL,
        system TEXT NOT NULL,
        prefix TEXT NOT NULL,
        summary_json TEXT NOT NULL,
        created_at REAL NOT NULL
    );

    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        created_at REAL NOT NULL,
        kind TEXT NOT NULL,
        title TEXT NOT NULL,
        pack_fingerprint TEXT REFERENCES packs(fingerprint),
        parent_id TEXT REFERENCES sessions(id) ON DELETE SET NULL,
        parent_turns INTEGER,
        settings_json TEXT NOT NULL
    );
    CREATE INDEX sessions_by_parent ON sessions(parent_id);

    CREATE TABLE turns (
        session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        question TEXT NOT NULL,
        answer TEXT NOT NULL,
        history_answer TEXT NOT NULL,
        reasoning TEXT,
        request_id TEXT,
        created_at REAL NOT NULL,
        PRIMARY KEY (session_id, position)
    );

    CREATE TABLE requests (
        id TEXT PRIMARY KEY,
        session_id TEXT REFERENCES sessions(id) ON DELETE CASCADE,
        batch_id TEXT,
        purpose TEXT NOT NULL,
        started_at REAL NOT NULL,
        base_url TEXT NOT NULL,
        engine TEXT NOT NULL,
        model TEXT NOT NULL,
        prompt_tokens INTEGER,
        cached_tokens INTEGER,
        created_cache_tokens INTEGER,
        completion_tokens INTEGER,
        ttft_seconds REAL,
        total_seconds REAL,
        attempts INTEGER NOT NULL,
        cached_reason TEXT
    );
    CREATE INDEX requests_by_session ON requests(session_id, started_at);
    CREATE INDEX requests_by_batch ON requests(batch_id);

    CREATE TABLE counter_checks (
        id INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        batch_id TEXT,
        base_url TEXT NOT NULL,
        counter TEXT NOT NULL,
        before INTEGER NOT NULL,
        after INTEGER NOT NULL,
        reported INTEGER,
        requests INTEGER NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE INDEX counter_checks_by_session ON counter_checks(session_id);
    """,
    # 2: pack snapshots (longctx.pack.snapshots): a pack's summary and manifest,
    # kept under the state of the repository it was built from; its text is a
    # file beside the database (SQLite writes a 37 MB value twice, through its
    # journal, about ten times slower than a plain file).
    """
    CREATE TABLE pack_snapshots (
        slot TEXT PRIMARY KEY,
        state TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        summary_json TEXT NOT NULL,
        section_sizes_json TEXT NOT NULL,
        text_file TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    """,
    # 3: a snapshot's manifest apart from its summary: a reused pack's
    # manifest (thousands of entries) is decoded only if someone reads it.
    # Rows from before have none and are not read back (snapshot format 2).
    """
    ALTER TABLE pack_snapshots ADD COLUMN manifest_json TEXT;
    """,
    # 4: PDF texts by extractor and content (longctx.sources.pdf): a PDF
    # already read is not parsed again. The text is UTF-8 with lone
    # surrogates kept (surrogatepass), hence a blob.
    """
    CREATE TABLE pdf_texts (
        extractor TEXT NOT NULL,
        content_sha256 TEXT NOT NULL,
        text BLOB NOT NULL,
        page_count INTEGER NOT NULL,
        notes_json TEXT NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (extractor, content_sha256)
    );
    """,
    # 5: last-commit times of a repository's files as of a commit
    # (longctx.sources.repo): the walk over history is done once per commit.
    """
    CREATE TABLE commit_times (
        key TEXT PRIMARY KEY,
        times_json TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    """,
)


@dataclass(frozen=True)
class SessionRecord:
    """A stored session: its settings and where it branched from."""

    id: str
    created_at: float
    kind: str
    title: str
    pack_fingerprint: str | None
    parent_id: str | None
    parent_turns: int | None
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TurnRecord:
    """One completed question and answer.

    ``history_answer`` is the answer as the chat template will render it in
    later requests (reasoning removed where the template drops it); later
    prompts are built from it so their prefix matches what the server saw.
    """

    session_id: str
    position: int
    question: str
    answer: str
    history_answer: str
    reasoning: str | None
    request_id: str | None
    created_at: float


@dataclass(frozen=True)
class RequestRecord:
    """Usage and timing of one request to a server.

    A count the server did not report is ``None``; ``cached_reason`` says why
    (for instance the flag that would turn reporting on).
    """

    id: str
    session_id: str | None
    batch_id: str | None
    purpose: str
    started_at: float
    base_url: str
    engine: str
    model: str
    prompt_tokens: int | None
    cached_tokens: int | None
    created_cache_tokens: int | None
    completion_tokens: int | None
    ttft_seconds: float | None
    total_seconds: float | None
    attempts: int
    cached_reason: str | None = None


@dataclass(frozen=True)
class CounterCheckRecord:
    """A server counter read before and after one call's requests."""

    session_id: str
    batch_id: str | None
    base_url: str
    counter: str
    before: int
    after: int
    reported: int | None
    requests: int


@dataclass(frozen=True)
class StoredPack:
    """What a session needs of its pack to resume without the original files."""

    fingerprint: str
    format_version: str
    system: str
    prefix: str
    summary: Mapping[str, Any]


class StoredText:
    """A text file of the store, open and mapped: read in place, or copied to a stream by the kernel.

    ``view`` is the file's bytes, mapped (read on demand, never copied
    whole). The file stays open as long as this object lives: renaming or
    removing its name does not change what it reads.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Open and map ``path`` (raises OSError); the file must not be empty."""
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
        # Closed when this object is collected (or at exit), whoever holds it.
        self._closer = weakref.finalize(self, os.close, descriptor)
        self._descriptor = descriptor
        self.view = memoryview(mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ))

    @property
    def size(self) -> int:
        return self.view.nbytes

    def read_chunks(self, size: int) -> Iterator[bytearray | memoryview]:
        """The text in order, ``size`` bytes at a time, read from the file rather than the mapping.

        Every piece is the same buffer, refilled: use it before asking for
        the next. Reading costs a copy; the mapping, or a new object per
        piece, would cost a page fault per page.
        """
        preadv = getattr(os, "preadv", None)
        if preadv is None:  # Windows: the mapping it is
            for offset in range(0, self.size, size):
                yield self.view[offset : offset + size]
            return
        buffer = bytearray(size)
        offset = 0
        while offset < self.size:
            count = preadv(self._descriptor, [buffer], offset)
            if count <= 0:
                raise OSError(f"the stored pack text ended at byte {offset} of {self.size}")
            yield buffer if count == size else memoryview(buffer)[:count]
            offset += count

    def copy_to(self, stream: BinaryIO) -> int:
        """Write the whole text to ``stream``; return the byte count.

        A file opened with :func:`open` (or its ``.buffer``, or a raw
        ``FileIO``) gets the bytes straight from the page cache
        (``sendfile``), without the page faults of reading the mapping; any
        other stream, or a platform or file that refuses, gets the mapped
        bytes written. (Only those types: a compressing stream such as
        ``GzipFile`` has a ``fileno()`` too, that of the file under it.)
        """
        size = self.view.nbytes
        sent = 0
        sendfile = getattr(os, "sendfile", None)
        raw = stream.raw if isinstance(stream, (io.BufferedWriter, io.BufferedRandom)) else stream
        target = raw.fileno() if isinstance(raw, io.FileIO) and not raw.closed else None
        if sendfile is not None and target is not None:
            stream.flush()
            try:
                while sent < size:
                    count = sendfile(target, self._descriptor, sent, size - sent)
                    if count == 0:
                        break
                    sent += count
            except OSError:
                pass  # e.g. macOS sends to sockets only: write the rest below
        if sent < size:
            stream.write(self.view[sent:])
        return size


@dataclass(frozen=True)
class StoredPackSnapshot:
    """A stored pack snapshot: its summary (see :mod:`longctx.pack.snapshots`) and its sections' text.

    ``text`` is the UTF-8 of every section in order, open and mapped from
    its file; ``section_sizes`` the byte length of each section;
    ``manifest_json`` the manifest as it was saved, not yet decoded.
    """

    slot: str
    state: str
    fingerprint: str
    summary: Mapping[str, Any]
    text: StoredText
    section_sizes: tuple[int, ...]
    manifest_json: str = field(repr=False)


class Store:
    """A connection to the longctx database; safe to share between threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._connection = sqlite3.connect(
                path, check_same_thread=False, isolation_level=None, timeout=30
            )
        except (OSError, sqlite3.Error) as error:
            raise StoreError(f"cannot open the longctx database at {path}: {error}") from error
        self._lock = threading.RLock()
        self._connection.row_factory = sqlite3.Row
        self._connection.execute("PRAGMA foreign_keys = ON")
        self._connection.execute("PRAGMA journal_mode = WAL")
        self._connection.execute("PRAGMA synchronous = NORMAL")
        self._migrate()

    @classmethod
    def open(cls, home: Path | None = None) -> Store:
        """Open (creating if needed) the database in ``home`` or :func:`default_home`."""
        return cls((home or default_home()) / DATABASE_NAME)

    def close(self) -> None:
        with self._lock:
            self._connection.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic unit of writes: all of it is committed, or none."""
        with self._lock:
            try:
                self._connection.execute("BEGIN IMMEDIATE")
                yield self._connection
                self._connection.execute("COMMIT")
            except BaseException:
                if self._connection.in_transaction:
                    self._connection.execute("ROLLBACK")
                raise

    def _query(self, sql: str, parameters: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._connection.execute(sql, parameters).fetchall()
            except sqlite3.Error as error:
                raise StoreError(f"reading the longctx database {self.path} failed: {error}") from error

    def _migrate(self) -> None:
        with self._lock:
            version = self._connection.execute("PRAGMA user_version").fetchone()[0]
            if version > len(_MIGRATIONS):
                raise StoreError(
                    f"the database {self.path} has schema version {version}, newer than this "
                    f"longctx understands ({len(_MIGRATIONS)}); upgrade longctx"
                )
            for number, script in enumerate(_MIGRATIONS[version:], start=version + 1):
                try:
                    self._connection.executescript(
                        f"BEGIN;\n{script}\nPRAGMA user_version = {number};\nCOMMIT;"
                    )
                except sqlite3.Error as error:
                    if self._connection.in_transaction:
                        self._connection.execute("ROLLBACK")
                    raise StoreError(f"migrating {self.path} to schema {number} failed: {error}") from error

    # -- token counts -------------------------------------------------------

    def token_counts(self, tokenizer: str, content_hashes: Sequence[str]) -> dict[str, int]:
        """Known counts for ``content_hashes`` under ``tokenizer``; unknown ones are absent."""
        found: dict[str, int] = {}
        unique = list(dict.fromkeys(content_hashes))
        # SQLite limits bound parameters per statement; 500 stays far below it.
        for start in range(0, len(unique), 500):
            chunk = unique[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for row in self._query(
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
        with self.transaction() as connection:
            connection.executemany(
                "INSERT OR REPLACE INTO token_counts (tokenizer, content_sha256, tokens) VALUES (?, ?, ?)",
                [(tokenizer, digest, tokens) for digest, tokens in counts.items()],
            )

    # -- PDF texts ----------------------------------------------------------

    def pdf_text(self, extractor: str, content_sha256: str) -> PdfText | None:
        """The text kept for the PDF with this sha256 by this extractor (see :mod:`longctx.sources.pdf`)."""
        from longctx.sources.pdf import PdfText

        rows = self._query(
            "SELECT text, page_count, notes_json FROM pdf_texts WHERE extractor = ? AND content_sha256 = ?",
            [extractor, content_sha256],
        )
        if not rows:
            return None
        row = rows[0]
        text = bytes(row["text"]).decode("utf-8", "surrogatepass")
        return PdfText(text, row["page_count"], tuple(json.loads(row["notes_json"])))

    def save_pdf_text(self, extractor: str, content_sha256: str, extracted: PdfText) -> None:
        with self.transaction() as connection:
            connection.execute(
                "INSERT OR REPLACE INTO pdf_texts (extractor, content_sha256, text, page_count,"
                " notes_json, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                (extractor, content_sha256, extracted.text.encode("utf-8", "surrogatepass"),
                 extracted.page_count, json.dumps(list(extracted.notes)), time.time()),
            )  # fmt: skip

    # -- last-commit times -------------------------------------------------

    def commit_times(self, key: str) -> dict[str, int] | None:
        """The times kept under ``key`` (see :mod:`longctx.sources.repo`), or None."""
        rows = self._query("SELECT times_json FROM commit_times WHERE key = ?", [key])
        if not rows:
            return None
        times: dict[str, int] = json.loads(rows[0]["times_json"])
        return times

    def save_commit_times(self, key: str, times: dict[str, int], *, keep: int = 64) -> None:
        """Keep ``times`` under ``key``; only the ``keep`` newest sets are kept."""
        with self.transaction() as connection:
            connection.execute(
                "INSERT OR REPLACE INTO commit_times (key, times_json, created_at) VALUES (?, ?, ?)",
                (key, json.dumps(times), time.time()),
            )
            connection.execute(
                "DELETE FROM commit_times WHERE key NOT IN"
                " (SELECT key FROM commit_times ORDER BY created_at DESC, key LIMIT ?)",
                [keep],
            )

    # -- packs --------------------------------------------------------------

    def save_pack(self, pack: StoredPack) -> None:
        """Keep a pack's prefix so its sessions can resume; idempotent."""
        with self.transaction() as connection:
            connection.execute(
                "INSERT OR IGNORE INTO packs"
                " (fingerprint, format_version, system, prefix, summary_json, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (pack.fingerprint, pack.format_version, pack.system, pack.prefix,
                 json.dumps(pack.summary, sort_keys=True), time.time()),
            )  # fmt: skip

    def pack(self, fingerprint: str) -> StoredPack | None:
        rows = self._query("SELECT * FROM packs WHERE fingerprint = ?", [fingerprint])
        if not rows:
            return None
        row = rows[0]
        return StoredPack(
            fingerprint=row["fingerprint"],
            format_version=row["format_version"],
            system=row["system"],
            prefix=row["prefix"],
            summary=json.loads(row["summary_json"]),
        )

    # -- pack snapshots -----------------------------------------------------

    @property
    def _snapshot_folder(self) -> Path:
        return self.path.parent / "pack-snapshots"

    def new_pack_snapshot_file(self, slot: str, state: str) -> Path:
        """A fresh path to write a snapshot's text to, then hand to :meth:`save_pack_snapshot`.

        It lies in the store's folder (so it can be moved into place
        atomically) and is named for this process, so two processes packing
        the same repository do not write the same file.
        """
        folder = self._snapshot_folder
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StoreError(f"cannot create {folder}: {error}") from error
        return folder / f"{slot[:32]}-{state[:32]}.txt.{os.getpid()}.partial"

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
        :class:`StoredPackSnapshot`). ``text_file`` (from :meth:`new_pack_snapshot_file`) holds each
        section's UTF-8 in order, ``section_sizes`` their lengths; it is
        moved into place before the row that points to it is committed.
        Only the ``keep`` newest snapshots are kept.
        """
        folder = self._snapshot_folder
        name = f"{slot[:32]}-{state[:32]}.txt"
        try:
            if text_file.stat().st_size != sum(section_sizes):
                raise StoreError(
                    f"the snapshot text {text_file} does not hold the sections' {sum(section_sizes)} bytes"
                )
            os.replace(text_file, folder / name)
        except OSError as error:
            raise StoreError(f"cannot keep a pack snapshot in {folder}: {error}") from error
        # Not sort_keys: the summary is read back, never compared as text,
        # and sorting the keys of its thousands of entries triples the time
        # of the dump (about 20 ms at the end of a large first pack).
        summary_json, manifest_json = json.dumps(summary), json.dumps(manifest)
        with self.transaction() as connection:
            connection.execute("DELETE FROM pack_snapshots WHERE slot = ?", [slot])
            connection.execute(
                "INSERT INTO pack_snapshots (slot, state, fingerprint, summary_json, manifest_json,"
                " section_sizes_json, text_file, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (slot, state, fingerprint, summary_json, manifest_json,
                 json.dumps(list(section_sizes)), name, time.time()),
            )  # fmt: skip
            connection.execute(
                "DELETE FROM pack_snapshots WHERE slot NOT IN"
                " (SELECT slot FROM pack_snapshots ORDER BY created_at DESC, slot LIMIT ?)",
                [keep],
            )
            kept = {row[0] for row in connection.execute("SELECT text_file FROM pack_snapshots")}
        for stale in folder.iterdir():
            # Files of replaced or dropped snapshots, and partial files that
            # no save is writing any more (a save takes seconds).
            if stale.name not in kept and not (
                stale.name.endswith(".partial") and _younger_than(stale, 3600)
            ):
                with contextlib.suppress(OSError):  # in use elsewhere (Windows): a later save removes it
                    stale.unlink(missing_ok=True)

    def has_pack_snapshot(self, slot: str) -> bool:
        """Whether ``slot`` holds a snapshot, whatever its state."""
        return bool(self._query("SELECT 1 FROM pack_snapshots WHERE slot = ? LIMIT 1", [slot]))

    def pack_snapshot(self, slot: str, state: str) -> StoredPackSnapshot | None:
        """The snapshot in ``slot`` if it was saved for ``state`` and its text is intact, else None."""
        rows = self._query(
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
        try:
            text = StoredText(self._snapshot_folder / row["text_file"])
        except (OSError, ValueError):  # ValueError: an empty file cannot be mapped
            return None  # removed by hand, or by another process's newer save
        if text.size != sum(sizes):
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

    # -- sessions -----------------------------------------------------------

    def create_session(self, record: SessionRecord) -> None:
        with self.transaction() as connection:
            _insert_session(connection, record)

    def session(self, session_id: str) -> SessionRecord:
        """The session with ``session_id``; raises :class:`SessionNotFound`."""
        rows = self._query("SELECT * FROM sessions WHERE id = ?", [session_id])
        if not rows:
            raise SessionNotFound(session_id)
        return _session_record(rows[0])

    def sessions(self, *, include_branches: bool = False) -> list[SessionRecord]:
        """Stored sessions, newest first."""
        where = "" if include_branches else "WHERE parent_id IS NULL OR kind != 'sibling'"
        return [
            _session_record(row)
            for row in self._query(f"SELECT * FROM sessions {where} ORDER BY created_at DESC, id")
        ]

    def children(self, session_id: str) -> list[SessionRecord]:
        """Sessions branched directly from ``session_id`` (siblings and forks), oldest first."""
        return [
            _session_record(row)
            for row in self._query(
                "SELECT * FROM sessions WHERE parent_id = ? ORDER BY created_at, id", [session_id]
            )
        ]

    def delete_session(self, session_id: str) -> None:
        """Delete a session, its turns and requests; its branches keep theirs."""
        self.session(session_id)
        with self.transaction() as connection:
            connection.execute("DELETE FROM sessions WHERE id = ?", [session_id])

    def turns(self, session_id: str) -> list[TurnRecord]:
        """The session's own turns, in order (not those inherited from a parent)."""
        return [
            TurnRecord(
                session_id=row["session_id"],
                position=row["position"],
                question=row["question"],
                answer=row["answer"],
                history_answer=row["history_answer"],
                reasoning=row["reasoning"],
                request_id=row["request_id"],
                created_at=row["created_at"],
            )
            for row in self._query("SELECT * FROM turns WHERE session_id = ? ORDER BY position", [session_id])
        ]

    def commit_turn(
        self, turn: TurnRecord, request: RequestRecord, *, new_session: SessionRecord | None = None
    ) -> None:
        """Store a completed turn and the request that answered it, atomically.

        ``new_session`` (a sibling branch) is created in the same transaction,
        so a crash never leaves a branch without its turn. Raises
        :class:`StoreError` if the position is already taken, so a retried or
        replayed turn can never be stored twice.
        """
        try:
            with self.transaction() as connection:
                if new_session is not None:
                    _insert_session(connection, new_session)
                _insert_request(connection, request)
                connection.execute(
                    "INSERT INTO turns (session_id, position, question, answer, history_answer, reasoning,"
                    " request_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (turn.session_id, turn.position, turn.question, turn.answer, turn.history_answer,
                     turn.reasoning, turn.request_id, turn.created_at),
                )  # fmt: skip
        except sqlite3.IntegrityError as error:
            raise StoreError(
                f"turn {turn.position} of session {turn.session_id} is already stored: {error}"
            ) from error

    # -- requests -----------------------------------------------------------

    def record_counter_check(self, check: CounterCheckRecord) -> None:
        """Keep the server counter's growth over a call's requests."""
        with self.transaction() as connection:
            connection.execute(
                "INSERT INTO counter_checks"
                " (session_id, batch_id, base_url, counter, before, after, reported,"
                " requests, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (check.session_id, check.batch_id, check.base_url, check.counter, check.before, check.after,
                 check.reported, check.requests, time.time()),
            )  # fmt: skip

    def counter_checks(self, session_ids: Sequence[str]) -> list[CounterCheckRecord]:
        marks = ",".join("?" * len(session_ids))
        return [
            CounterCheckRecord(
                session_id=row["session_id"], batch_id=row["batch_id"], base_url=row["base_url"],
                counter=row["counter"], before=row["before"], after=row["after"], reported=row["reported"],
                requests=row["requests"],
            )
            for row in self._query(
                f"SELECT * FROM counter_checks WHERE session_id IN ({marks}) ORDER BY id", list(session_ids)
            )
        ]  # fmt: skip

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
        rows = self._query(f"SELECT * FROM requests {where} ORDER BY started_at, id", parameters)
        return [RequestRecord(**{key: row[key] for key in row.keys()}) for row in rows]  # noqa: SIM118


def _younger_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime < seconds
    except OSError:
        return False


def _insert_session(connection: sqlite3.Connection, record: SessionRecord) -> None:
    connection.execute(
        "INSERT INTO sessions (id, created_at, kind, title, pack_fingerprint, parent_id, parent_turns,"
        " settings_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (record.id, record.created_at, record.kind, record.title, record.pack_fingerprint,
         record.parent_id, record.parent_turns, json.dumps(dict(record.settings), sort_keys=True)),
    )  # fmt: skip


def _insert_request(connection: sqlite3.Connection, request: RequestRecord) -> None:
    connection.execute(
        "INSERT INTO requests (id, session_id, batch_id, purpose, started_at, base_url, engine, model,"
        " prompt_tokens, cached_tokens, created_cache_tokens, completion_tokens, ttft_seconds,"
        " total_seconds, attempts, cached_reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (request.id, request.session_id, request.batch_id, request.purpose, request.started_at,
         request.base_url, request.engine, request.model, request.prompt_tokens, request.cached_tokens,
         request.created_cache_tokens, request.completion_tokens, request.ttft_seconds,
         request.total_seconds, request.attempts, request.cached_reason),
    )  # fmt: skip


def _session_record(row: sqlite3.Row) -> SessionRecord:
    return SessionRecord(
        id=row["id"],
        created_at=row["created_at"],
        kind=row["kind"],
        title=row["title"],
        pack_fingerprint=row["pack_fingerprint"],
        parent_id=row["parent_id"],
        parent_turns=row["parent_turns"],
        settings=json.loads(row["settings_json"]),
    )
