"""The store's SQLite database: one connection, its lock, transactions and schema versions.

Schema changes are migrations (:data:`MIGRATIONS`), applied in order and
recorded in ``PRAGMA user_version``; a database written by a newer longctx
is refused rather than misread. A migration, once released, is never
edited: databases out there were built by it.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, ClassVar, Final

from longctx.errors import StoreError
from longctx.store.failures import LOCK_WAIT_SECONDS, store_failure
from longctx.store.permissions import create_private_file, make_private_folder, warn_if_readable_by_others

__all__ = ["DATABASE_NAME", "MIGRATIONS", "Database", "key_range", "split_statements"]

DATABASE_NAME: Final = "longctx.db"
"""The database's file name in the longctx home folder."""

MIGRATIONS: Final[tuple[str, ...]] = (
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
    # 2: pack snapshots (longctx.packing.snapshots): a pack's summary and manifest,
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
    # 6: living sessions (longctx.sessions.changes): the changed files a turn's
    # user message carried before its question, and the file hashes they set,
    # so a resumed session renders that message byte for byte again.
    """
    ALTER TABLE turns ADD COLUMN preamble TEXT NOT NULL DEFAULT '';
    ALTER TABLE turns ADD COLUMN file_changes_json TEXT NOT NULL DEFAULT '{}';
    """,
    # 7: the special-token spellings a server's tokenizer treats as special
    # (longctx.sessions.corpus_sessions), by tokenizer identity: learned once per
    # served tokenizer through its tokenize route.
    """
    CREATE TABLE special_tokens (
        tokenizer TEXT PRIMARY KEY,
        spellings_json TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    """,
    # 8: answer keys (Session.ask_many's ``keys``, longctx.jobs.job): a
    # caller's name for a question, stored in the transaction of its answer,
    # so a job run again after a crash asks only what has no answer yet.
    """
    CREATE TABLE answer_keys (
        key TEXT PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        position INTEGER NOT NULL
    );
    CREATE INDEX answer_keys_by_session ON answer_keys(session_id);
    """,
    # 9: a turn's answer as the token ids the model generated (a session with
    # RequestOptions.token_history, longctx.sessions.token_history), so its
    # next turns send them back as they were and read the answer from the
    # cache. NULL: not asked for, or the server sent none.
    """
    ALTER TABLE turns ADD COLUMN answer_ids_json TEXT;
    """,
    # 10: counter checks of calls that overlapped share a window
    # (longctx.verification.counters): its id, and the cached tokens its other
    # calls reported, so a report counts the window's growth once.
    """
    ALTER TABLE counter_checks ADD COLUMN others_reported INTEGER DEFAULT 0;
    ALTER TABLE counter_checks ADD COLUMN window_id TEXT;
    """,
    # 11: cache tiers below GPU memory (longctx.backends.tiers): a request's
    # cached tokens loaded from host memory and from storage, where the
    # response split them, and a counter window's tokens by tier and the bytes
    # that came back from the host. NULL: not reported.
    """
    ALTER TABLE requests ADD COLUMN host_cached_tokens INTEGER;
    ALTER TABLE requests ADD COLUMN external_cached_tokens INTEGER;
    ALTER TABLE counter_checks ADD COLUMN host_tokens INTEGER;
    ALTER TABLE counter_checks ADD COLUMN external_tokens INTEGER;
    ALTER TABLE counter_checks ADD COLUMN loaded_bytes INTEGER;
    ALTER TABLE counter_checks ADD COLUMN tier_source TEXT;
    """,
    # 12: why a call got no counter check (a router whose workers cannot be
    # read, two server processes behind one URL, a replica that died): the
    # report's note, kept so a resumed session's report says it too. One row
    # per session, batch and note (a note repeated by every turn is kept once).
    """
    CREATE TABLE counter_skips (
        id INTEGER PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        batch_id TEXT,
        note TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE UNIQUE INDEX counter_skips_once ON counter_skips(session_id, ifnull(batch_id, ''), note);
    """,
    # 13: grounded answers (longctx.citations): what a cited question's user
    # message carried after the question (the instruction), so later turns
    # render it byte for byte again, and the answer's checked citations as
    # JSON. NULL citations: not asked for.
    """
    ALTER TABLE turns ADD COLUMN instruction TEXT NOT NULL DEFAULT '';
    ALTER TABLE turns ADD COLUMN citations_json TEXT;
    """,
    # 14: prompts sent as token ids (longctx.sessions.prompt_ids): a pack's
    # token ids up to where the question starts, and the chat template's ids
    # after a user message, per pack and server tokenizer identity (int32
    # little-endian blobs); and how each request's prompt went ('ids', or
    # 'text: why' where ids were wanted). NULL: text, as asked, or a row from before.
    """
    CREATE TABLE prompt_ids (
        tokenizer TEXT NOT NULL,
        pack_fingerprint TEXT NOT NULL,
        head BLOB NOT NULL,
        after_user BLOB NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (tokenizer, pack_fingerprint)
    ) WITHOUT ROWID;
    ALTER TABLE requests ADD COLUMN prompt_form TEXT;
    """,
    # 15: who is asking a job's item now (longctx.store.leases), so two runs
    # of one job never ask one item twice. A lease is the item's key without its nonce, the run that holds it
    # (its id, process id and host) and when it lapses unless renewed.
    """
    CREATE TABLE job_leases (
        key TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        pid INTEGER NOT NULL,
        host TEXT NOT NULL,
        expires_at REAL NOT NULL,
        taken_at REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX job_leases_by_run ON job_leases(run_id);
    """,
    # 16: typed answers (longctx.schemas): the schema a question was asked with, as JSON
    # ({"name", "schema", "multi"}). NULL: asked without one.
    """
    ALTER TABLE turns ADD COLUMN schema_json TEXT;
    """,
    # 17: a PDF text's pages whose text layer is not usable (longctx.sources.text_layer), as JSON
    # [[page, reason], ...]: the pages that go as images when asked. Rows kept before it hold
    # none, but their extractor identity is older than any that reads this column.
    """
    ALTER TABLE pdf_texts ADD COLUMN unusable_pages_json TEXT NOT NULL DEFAULT '[]';
    """,
    # 18: a pack's images (longctx.packing.image_parts.PlacedImage), so a session resumed from the store
    # sends the same images: each image's place in the pack's prefix and what it is, its bytes
    # kept once per sha256 in image_blobs (the database file is private, like the rest).
    """
    CREATE TABLE image_blobs (
        sha256 TEXT PRIMARY KEY,
        data BLOB NOT NULL
    );
    CREATE TABLE pack_images (
        pack_fingerprint TEXT NOT NULL REFERENCES packs(fingerprint) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        start INTEGER NOT NULL,
        length INTEGER NOT NULL,
        sha256 TEXT NOT NULL,
        media_type TEXT NOT NULL,
        width INTEGER NOT NULL,
        height INTEGER NOT NULL,
        source TEXT NOT NULL,
        reason TEXT NOT NULL,
        PRIMARY KEY (pack_fingerprint, position)
    ) WITHOUT ROWID;
    CREATE INDEX pack_images_by_sha256 ON pack_images(sha256);
    """,
    # 19: answer keys found by prefix (a job's, an item's: longctx.store.leases,
    # SessionLog.answered_under) through an index in byte order (key_range), not by
    # reading every key: a 10,000-item job's claims read every key of every item before.
    """
    CREATE INDEX answer_keys_in_byte_order ON answer_keys(key COLLATE BINARY);
    """,
)


def key_range(prefix: str) -> tuple[str, str]:
    """The keys starting with ``prefix`` (not empty), in byte order: ``low <= key COLLATE BINARY < high``."""
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


class Database:
    """One connection to a longctx database, shared between threads under one lock.

    The parts of :class:`longctx.store.Store` (its sessions and caches)
    share one: they read through :meth:`query` and write through
    :meth:`transaction`.
    Constructing one does no I/O; opening (:meth:`connect`, or the first read
    or write) creates the file (and its folder) if needed, private to the
    user (:mod:`longctx.store.permissions`: an existing one looser than that
    is warned about, not changed), brings its schema up to date, and raises
    :class:`StoreError` when either fails. Every failure of the database
    (a full disk, a read-only, locked or damaged file) is a
    :class:`StoreError` naming the file and what to do
    (:mod:`longctx.store.failures`); none changes what is stored.
    """

    local: ClassVar[bool] = True
    """One host's store: a lease's holder can be checked by its process (:mod:`longctx.store.leases`)."""
    conflicts: ClassVar[tuple[type[BaseException], ...]] = (sqlite3.IntegrityError,)
    """What a broken constraint raises out of :meth:`transaction` (the caller's to explain)."""

    def __init__(self, path: Path) -> None:
        # No I/O here: the database is opened by open() or on first use.
        self.path = path
        self.location = str(path)
        """The store as messages name it: the database file."""
        self._lock = threading.RLock()
        self._opened: sqlite3.Connection | None = None
        self._closed = False

    def connect(self) -> None:
        """Open the database now (creating it and updating its schema) rather than on first use."""
        with self._lock:
            if self._closed:
                raise StoreError(f"the longctx database {self.path} is closed")
            if self._opened is not None:
                return
            try:
                # Private before SQLite sees it: the -wal and -shm files take the database file's mode.
                make_private_folder(self.path.parent)
                create_private_file(self.path)
                connection = sqlite3.connect(
                    self.path, check_same_thread=False, isolation_level=None, timeout=LOCK_WAIT_SECONDS
                )
            except (OSError, sqlite3.Error) as error:
                raise store_failure(error, self.path, "opening") from error
            connection.row_factory = sqlite3.Row
            try:
                connection.execute("PRAGMA foreign_keys = ON")
                _switch_to_wal(connection, self.path)
                connection.execute("PRAGMA synchronous = NORMAL")
                _migrate(connection, self.path)
            except (StoreError, sqlite3.Error) as error:
                connection.close()
                if isinstance(error, StoreError):
                    raise
                raise store_failure(error, self.path, "opening") from error
            self._opened = connection
            warn_if_readable_by_others(self.path.parent)

    @property
    def _connection(self) -> sqlite3.Connection:
        with self._lock:
            if self._opened is None:
                self.connect()
            assert self._opened is not None
            return self._opened

    def close(self) -> None:
        """Close the connection; closing it again does nothing."""
        with self._lock:
            self._closed = True
            if self._opened is not None:
                self._opened.close()
                # Every later use goes through connect(), which names the closed store: a thread still
                # writing (a borrowed store's owner closed it) gets a StoreError, not SQLite's error.
                self._opened = None

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic unit of writes: all of it is committed, or none.

        A failure of the database is a :class:`StoreError` naming the file
        and what to do, but a broken constraint (``sqlite3.IntegrityError``),
        which is the caller's to explain.
        """
        with self._lock:
            try:
                self._connection.execute("BEGIN IMMEDIATE")
                yield self._connection
                self._connection.execute("COMMIT")
            except BaseException as error:
                _roll_back(self._connection)
                if isinstance(error, sqlite3.Error) and not isinstance(error, sqlite3.IntegrityError):
                    raise store_failure(error, self.path, "writing to") from error
                raise

    def vacuum(self) -> None:
        """Give the space of deleted rows back to the disk: VACUUM, then a checkpoint that empties the log.

        Needs free space for a copy of the database; a failure is a
        :class:`StoreError` and changes nothing stored.
        """
        with self._lock:
            try:
                self._connection.execute("VACUUM")
                self._connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as error:
                raise store_failure(error, self.path, "compacting") from error

    def size_bytes(self) -> int:
        """The database file and its write-ahead log, in bytes."""
        total = 0
        for suffix in ("", "-wal"):
            path = self.path.with_name(self.path.name + suffix)
            if path.exists():
                total += path.stat().st_size
        return total

    def clock(self, connection: sqlite3.Connection) -> float:
        """The time now, in seconds since the epoch, by which leases lapse: this host's clock."""
        return time.time()

    def serialize(self, connection: sqlite3.Connection) -> None:
        """Nothing: a SQLite transaction (``BEGIN IMMEDIATE``) already has the one write lock."""

    def query(self, sql: str, parameters: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """The rows ``sql`` selects; a failure is a :class:`StoreError` naming the database."""
        with self._lock:
            try:
                return self._connection.execute(sql, parameters).fetchall()
            except sqlite3.Error as error:
                raise store_failure(error, self.path, "reading") from error


# How long an opener keeps trying to switch a fresh database to WAL while others hold it.
_WAL_SWITCH_SECONDS = 30.0


def _switch_to_wal(connection: sqlite3.Connection, path: Path) -> None:
    """Put the database in WAL mode, waiting out the other openers of a fresh file.

    Changing the journal mode needs the database to itself, and SQLite
    answers "database is locked" at once, without its busy handler, when
    another connection holds it meanwhile (seen in 2 of 7 runs of 40
    openers racing on a new file on a loaded machine). Once one opener has
    switched, the others find WAL already set and pass at once.
    """
    deadline = time.monotonic() + _WAL_SWITCH_SECONDS
    while True:
        try:
            connection.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) and "busy" not in str(error):
                raise
            if time.monotonic() > deadline:
                raise StoreError(f"cannot switch {path} to WAL mode: {error}") from error
            time.sleep(0.02)


def _migrate(connection: sqlite3.Connection, path: Path) -> None:
    """Apply the migrations the database lacks, safe against other threads and processes.

    Several connections may open a fresh database at once (threads with
    their own ``Store``, or processes). The version is read, and the
    missing migrations applied, inside one ``BEGIN IMMEDIATE`` transaction:
    SQLite's write lock makes every other opener wait, and each re-reads
    ``user_version`` under the lock, so a migration runs exactly once.
    """
    version = connection.execute("PRAGMA user_version").fetchone()[0]
    if version == len(MIGRATIONS):
        return  # the common case: up to date, no write lock taken
    try:
        connection.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as error:
        raise store_failure(error, path, "locking to update the schema of") from error
    number = version
    try:
        # Re-read under the lock: another opener may have migrated meanwhile.
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version > len(MIGRATIONS):
            raise StoreError(
                f"the database {path} has schema version {version}, newer than this "
                f"longctx understands ({len(MIGRATIONS)}); upgrade longctx"
            )
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            for statement in _statements(script):
                connection.execute(statement)
            connection.execute(f"PRAGMA user_version = {number}")
        connection.execute("COMMIT")
    except sqlite3.Error as error:
        _roll_back(connection)
        raise store_failure(error, path, f"migrating to schema {number}") from error
    except BaseException:
        _roll_back(connection)
        raise


def _roll_back(connection: sqlite3.Connection) -> None:
    """Undo the open transaction, if any; a rollback that fails (the disk gone) leaves SQLite to undo it."""
    if not connection.in_transaction:
        return
    # Failing, the journal undoes it when the connection closes or the next one opens.
    with suppress(sqlite3.Error):
        connection.execute("ROLLBACK")


def split_statements(script: str) -> Iterator[str]:
    """The statements of ``script``, one at a time.

    ``executescript`` cannot be used inside the transaction: on Python
    3.11 it commits a pending transaction first, which would drop the lock.
    """
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            if pending.strip():
                yield pending.strip()
            pending = ""
    if pending.strip():
        yield pending.strip()


_statements = split_statements  # the name the migrations call (a test interrupts it there)
