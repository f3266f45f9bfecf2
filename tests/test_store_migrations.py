"""A database left by an earlier longctx is upgraded in place; one from a later longctx is refused."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from longctx.errors import StoreError
from longctx.store import DATABASE_NAME, Store
from longctx.store.db import MIGRATIONS

# The schema of the release before pack snapshots kept their manifest apart.
_EARLIER_VERSION = 2


def _database_at(home: Path, version: int, *rows: str) -> Path:
    """A database in ``home`` as longctx left it at schema ``version``, with ``rows`` inserted."""
    home.mkdir(exist_ok=True)
    path = home / DATABASE_NAME
    connection = sqlite3.connect(path)
    for number, script in enumerate(MIGRATIONS[:version], start=1):
        connection.executescript(f"BEGIN;\n{script}\nPRAGMA user_version = {number};\nCOMMIT;")
    for row in rows:
        connection.execute(row)
    connection.commit()
    connection.close()
    return path


_SESSION_ROW = (
    "INSERT INTO sessions (id, created_at, kind, title, settings_json) VALUES ('s', 0, 'session', 't', '{}')"
)


def _earlier_database(home: Path) -> Path:
    home.mkdir()
    # A snapshot as that release saved it: the manifest inside the summary.
    (home / "pack-snapshots").mkdir()
    (home / "pack-snapshots" / "old.txt").write_text("header")
    return _database_at(
        home,
        _EARLIER_VERSION,
        f"INSERT INTO token_counts (tokenizer, content_sha256, tokens) VALUES ('t', '{'a' * 64}', 7)",
        "INSERT INTO pack_snapshots (slot, state, fingerprint, summary_json, section_sizes_json, text_file,"
        " created_at) VALUES ('slot', 'state', 'f', '{\"manifest\": {}}', '[6]', 'old.txt', 0)",
    )


def test_an_earlier_database_is_upgraded_and_keeps_its_counts(tmp_path: Path) -> None:
    path = _earlier_database(tmp_path / "home")

    with Store.open(tmp_path / "home") as store:
        assert store.caches.token_counts("t", ["a" * 64]) == {"a" * 64: 7}
        # The old snapshot has no manifest of its own: it is not read back (the pack is rebuilt).
        assert store.caches.pack_snapshot("slot", "state") is None
        store.caches.save_commit_times("key", {"a.py": 1})
        assert store.caches.commit_times("key") == {"a.py": 1}
        assert store.database.query("SELECT COUNT(*) AS n FROM pdf_texts")[0]["n"] == 0

    version = sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0]
    assert version == len(MIGRATIONS)


def test_a_database_of_version_5_gains_the_special_tokens_table_and_keeps_its_data(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = _database_at(
        home, 5, "INSERT INTO commit_times (key, times_json, created_at) VALUES ('k', '{\"a\": 1}', 0)"
    )

    with Store.open(home) as store:
        assert store.caches.commit_times("k") == {"a": 1}
        assert store.caches.special_tokens("server:vllm:tiny:0") is None
        store.caches.save_special_tokens("server:vllm:tiny:0", ["<|im_end|>"])
        assert store.caches.special_tokens("server:vllm:tiny:0") == ("<|im_end|>",)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def test_a_database_of_version_7_keeps_its_turns_and_gains_answer_keys_and_ids(tmp_path: Path) -> None:
    from longctx.store import RequestRecord, SessionRecord, TurnRecord
    from longctx.usage import Usage

    home = tmp_path / "home"
    path = _database_at(
        home,
        7,
        _SESSION_ROW,
        "INSERT INTO turns (session_id, position, question, answer, history_answer, created_at)"
        " VALUES ('s', 0, 'q?', 'a.', 'a.', 0)",
    )

    with Store.open(home) as store:
        (old,) = store.sessions.turns("s")
        assert old.answer == "a." and old.answer_ids is None
        usage = Usage(10, 0, None, 3, None, None)
        request = RequestRecord("r", "s", None, "turn", 0.0, "http://x/v1", "vllm", "m", usage, 1)
        turn = TurnRecord("s", 1, "q2?", "b.", "b.", None, "r", 0.0, answer_ids=(5, 6, 7))
        store.sessions.commit_turn(turn, request)
        assert [t.answer_ids for t in store.sessions.turns("s")] == [None, (5, 6, 7)]
        assert store.sessions.session("s") == SessionRecord("s", 0.0, "session", "t", None, None, None, {})
        assert store.sessions.answered(["job:x:0"]) == {}
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def test_counter_checks_stored_before_shared_windows_read_as_their_calls_own(tmp_path: Path) -> None:
    """Migration 10: an old check had its window alone (no others, no window id) and still combines."""
    from longctx.store import CounterCheckRecord
    from longctx.verification.counters import combine_checks

    home = tmp_path / "home"
    _database_at(
        home,
        9,
        _SESSION_ROW,
        "INSERT INTO counter_checks (session_id, base_url, counter, before, after, reported, requests,"
        " created_at) VALUES ('s', 'http://x/v1', 'c', 100, 150, 50, 1, 0)",
    )

    with Store.open(home) as store:
        (old,) = store.sessions.counter_checks(["s"])
        assert old.others_reported == 0 and old.window_id is None
        shared = CounterCheckRecord(
            "s", None, "http://x/v1", "c", 150, 190, 10, 1, others_reported=30, window_id="w"
        )
        store.sessions.record(shared)
        assert store.sessions.counter_checks(["s"]) == [old, shared]
        check = combine_checks(store.sessions.counter_checks(["s"]))
    assert check is not None and check.matches and (check.server_delta, check.reported) == (90, 60)
    assert check.others_reported == 30 and "other calls of this process" in check.note


def test_a_database_of_version_10_gains_the_tier_columns(tmp_path: Path) -> None:
    """Migration 11: old rows read with no tier split (None); new rows keep theirs."""
    from longctx.store import CounterCheckRecord, RequestRecord
    from longctx.usage import Usage

    home = tmp_path / "home"
    path = _database_at(
        home,
        10,
        _SESSION_ROW,
        "INSERT INTO requests (id, session_id, purpose, started_at, base_url, engine, model, prompt_tokens,"
        " cached_tokens, attempts) VALUES ('old', 's', 'turn', 0, 'http://x/v1', 'vllm', 'm', 100, 80, 1)",
        "INSERT INTO counter_checks (session_id, base_url, counter, before, after, reported, requests,"
        " created_at) VALUES ('s', 'http://x/v1', 'c', 0, 80, 80, 1, 0)",
    )
    with Store.open(home) as store:
        (old,) = store.sessions.requests(session_ids=["s"])
        assert old.usage.cached_tokens == 80 and old.usage.host_cached_tokens is None
        assert old.usage.device_cached_tokens is None
        (old_check,) = store.sessions.counter_checks(["s"])
        assert old_check.host_tokens is None and old_check.tier_source is None
        usage = Usage(100, 90, None, 3, None, None, host_cached_tokens=60, external_cached_tokens=10)
        new_request = RequestRecord("new", "s", None, "turn", 1.0, "http://x/v1", "sglang", "m", usage, 1)
        store.sessions.record(new_request)
        check = CounterCheckRecord(
            "s", None, "http://x/v1", "c", 80, 170, 90, 1,
            host_tokens=60, external_tokens=10, loaded_bytes=60 * 64, tier_source="cache_source",
        )  # fmt: skip
        store.sessions.record(check)
        new = next(r for r in store.sessions.requests(session_ids=["s"]) if r.id == "new")
        assert new.usage == usage and new.usage.device_cached_tokens == 20
        assert store.sessions.counter_checks(["s"])[-1] == check
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def test_a_database_of_version_11_gains_the_skipped_checks(tmp_path: Path) -> None:
    """Migration 12: why a call was not checked is kept, once per session and note, and goes with it."""
    from longctx.store import CounterSkip

    home = tmp_path / "home"
    path = _database_at(home, 11, _SESSION_ROW)
    with Store.open(home) as store:
        assert store.sessions.counter_skips(["s"]) == []
        router = CounterSkip("s", "no counter check: http://r/v1 is smg, which lists no healthy worker")
        restart = CounterSkip("s", "no counter check: http://x/v1 restarted")
        # Every turn behind the router says the same: kept once. Two batches' notes are each kept.
        first, second = CounterSkip("s", restart.note, "b1"), CounterSkip("s", restart.note, "b2")
        store.sessions.record(router, restart, first)
        store.sessions.record(router, second, first)
        assert store.sessions.counter_skips(["s"]) == [router, restart, first, second]
        store.sessions.delete_session("s")
        assert store.sessions.counter_skips(["s"]) == []
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def test_a_database_of_version_12_keeps_its_turns_and_gains_their_citations(tmp_path: Path) -> None:
    """Migration 13: an old turn had no instruction after its question and no citations asked for."""
    from longctx.store import RequestRecord, TurnRecord
    from longctx.usage import Usage

    home = tmp_path / "home"
    path = _database_at(
        home,
        12,
        _SESSION_ROW,
        "INSERT INTO turns (session_id, position, question, answer, history_answer, created_at)"
        " VALUES ('s', 0, 'q?', 'a.', 'a.', 0)",
    )
    with Store.open(home) as store:
        (old,) = store.sessions.turns("s")
        assert old.instruction == "" and old.citations is None
        usage = Usage(10, 0, None, 3, None, None)
        request = RequestRecord("r", "s", None, "turn", 0.0, "http://x/v1", "vllm", "m", usage, 1)
        cited = (
            {"path": "a.py", "start_line": 1, "end_line": 2, "quote": None, "verified": True, "reason": None},
        )
        turn = TurnRecord("s", 1, "q2?", "b.", "b.", None, "r", 0.0, instruction="\n\ncite", citations=cited)
        store.sessions.commit_turn(turn, request)
        assert store.sessions.turns("s")[1] == turn
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def test_a_database_of_version_13_keeps_its_requests_and_gains_prompt_ids(tmp_path: Path) -> None:
    """Migration 14: an old request went as text as asked (no prompt form); packs' ids get a table."""
    from longctx.store import StoredPackIds

    home = tmp_path / "home"
    path = _database_at(
        home,
        13,
        _SESSION_ROW,
        "INSERT INTO requests (id, session_id, purpose, started_at, base_url, engine, model, attempts)"
        " VALUES ('r', 's', 'turn', 0, 'http://x/v1', 'vllm', 'm', 1)",
    )
    with Store.open(home) as store:
        (old,) = store.sessions.requests(session_ids=["s"])
        assert old.usage.prompt_form is None
        assert store.caches.pack_ids("server:vllm:m:abc", "fp") is None
        ids = StoredPackIds((1, 2, 70_000, 2**31 - 1), (5, 6))
        store.caches.save_pack_ids("server:vllm:m:abc", "fp", ids)
        assert store.caches.pack_ids("server:vllm:m:abc", "fp") == ids
        assert store.caches.pack_ids("server:vllm:m:other", "fp") is None  # another tokenizer: none
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def test_a_database_of_version_14_gains_job_leases_and_keeps_its_answer_keys(tmp_path: Path) -> None:
    """Migration 15 (job leases): an old store's answers stay reusable, and items can be leased."""
    from longctx.store import LeaseHolder

    home = tmp_path / "home"
    path = _database_at(
        home,
        14,
        _SESSION_ROW,
        "INSERT INTO turns (session_id, position, question, answer, history_answer, created_at)"
        " VALUES ('s', 0, 'q?', 'a.', 'a.', 0)",
        "INSERT INTO answer_keys (key, session_id, position) VALUES ('job:j:0:d:n', 's', 0)",
    )
    with Store.open(home) as store:
        holder = LeaseHolder.this_process("run")
        claims = store.leases.take(["job:j:0:d", "job:j:1:d"], holder, 60)
        assert [claim.state for claim in claims] == ["answered", "taken"]
        assert list(store.leases.holders("job:j:")) == ["job:j:1:d"]
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def test_a_database_of_version_15_keeps_its_turns_and_gains_their_schema(tmp_path: Path) -> None:
    """Migration 16: an old turn was asked without a schema; a new one keeps its schema's stored form."""
    from longctx.store import RequestRecord, TurnRecord
    from longctx.usage import Usage

    home = tmp_path / "home"
    path = _database_at(
        home,
        15,
        _SESSION_ROW,
        "INSERT INTO turns (session_id, position, question, answer, history_answer, created_at)"
        " VALUES ('s', 0, 'q?', 'a.', 'a.', 0)",
    )
    with Store.open(home) as store:
        (old,) = store.sessions.turns("s")
        assert old.schema is None
        usage = Usage(10, 0, None, 3, None, None)
        request = RequestRecord("r", "s", None, "turn", 0.0, "http://x/v1", "vllm", "m", usage, 1)
        schema = {"name": "answer", "schema": {"type": "object"}, "multi": False}
        turn = TurnRecord("s", 1, "q2?", "{}", "{}", None, "r", 0.0, schema=schema)
        store.sessions.commit_turn(turn, request)
        assert store.sessions.turns("s")[1] == turn
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def test_a_database_from_a_later_longctx_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    connection = sqlite3.connect(home / DATABASE_NAME)
    connection.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    connection.commit()
    connection.close()

    with pytest.raises(StoreError, match="newer than this longctx understands"):
        Store.open(home)


def _open_fresh(home: str, start: Any, threads: int) -> list[str]:
    """Open ``home``'s store from ``threads`` threads at once; the errors they met."""
    errors: list[str] = []
    ready = threading.Barrier(threads)

    def one() -> None:
        ready.wait()
        start.wait()
        try:
            with Store.open(Path(home)) as store:
                store.caches.save_commit_times(f"key-{os.getpid()}-{threading.get_ident()}", {"a.py": 1})
        except Exception as error:  # noqa: BLE001 - every failure is the finding, whatever its type
            errors.append(f"{type(error).__name__}: {error}")

    workers = [threading.Thread(target=one) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return errors


def _process_main(home: str, start: Any, results: Any) -> None:
    results.put(_open_fresh(home, start, 8))


def test_threads_and_processes_opening_a_fresh_store_at_once_make_one_schema(tmp_path: Path) -> None:
    # 8 threads here and 8 in each of 4 processes, released together on a
    # store that does not exist yet: every one of them races to migrate it.
    home = tmp_path / "home"
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    results = context.Queue()
    processes = [context.Process(target=_process_main, args=(str(home), start, results)) for _ in range(4)]
    for process in processes:
        process.start()
    here: list[list[str]] = []
    local = threading.Thread(target=lambda: here.append(_open_fresh(str(home), start, 8)))
    local.start()
    time.sleep(3.0)  # let the spawned interpreters import longctx and reach the barrier
    start.set()
    local.join()
    errors = list(here[0])
    for _ in processes:
        errors += results.get(timeout=120)
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert errors == []

    connection = sqlite3.connect(home / DATABASE_NAME)
    assert connection.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    columns = [row[1] for row in connection.execute("PRAGMA table_info(pack_snapshots)")]
    assert columns.count("manifest_json") == 1
    # Every opener wrote its row: 8 + 4 * 8 distinct threads.
    assert connection.execute("SELECT COUNT(*) FROM commit_times").fetchone()[0] == 40
