"""``longctx sessions prune`` (store.sessions.prune): by age, count or size, a dry run, never one in use."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from longctx.cli import main
from longctx.errors import StoreError
from longctx.store import (
    DATABASE_NAME,
    CounterSkip,
    PruneResult,
    PruneRule,
    RequestRecord,
    SessionRecord,
    Store,
    StoredPack,
    TurnRecord,
)
from longctx.store.records import CounterCheckRecord, Opening
from longctx.usage import Usage

# Each test on both stores: the SQLite file, and a PostgreSQL server (tests/store_backends.py).
pytestmark = pytest.mark.usefixtures("store_backend")
# A test of the database file's size: SQLite's alone (a server's tables shrink on its own schedule).
SQLITE_FILE = pytest.mark.parametrize("store_backend", ["sqlite"], indirect=True)

DAY = 86400.0


def add_session(
    store: Store, session_id: str, *, age_days: float, turns: int = 2, answer_bytes: int = 1000,
    parent: str | None = None, pack: str | None = None,
) -> None:  # fmt: skip
    """A session used ``age_days`` ago: ``turns`` turns, their requests and answer keys, a counter check."""
    when = time.time() - age_days * DAY
    stored_pack = StoredPack(pack, "1", "system", "p" * 20_000, {}) if pack else None
    record = SessionRecord(session_id, when, "sibling" if parent else "session", session_id, pack, parent, 0)
    store.sessions.record_opening(Opening(stored_pack, record))
    for position in range(turns):
        request = RequestRecord(
            f"{session_id}-{position}", session_id, None, "turn", when, "http://x/v1", "vllm", "m",
            Usage(100, 0, None, 10, None, None), 1,
        )  # fmt: skip
        answer = "y" * answer_bytes
        turn = TurnRecord(session_id, position, f"q{position}?", answer, answer, None, request.id, when)
        store.sessions.commit_turn(turn, request, key=f"job:j:{session_id}:{position}:d:n")
    store.sessions.record(CounterCheckRecord(session_id, None, "http://x/v1", "c", 0, 1, 1, 1))


def count(home: Path, table: str) -> int:
    connection = sqlite3.connect(home / DATABASE_NAME)
    try:
        return int(connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        connection.close()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    with Store.open(home) as store:
        add_session(store, "old-batch", age_days=60, turns=0, pack="fp-old")
        add_session(store, "old-sibling", age_days=60, parent="old-batch")
        add_session(store, "month", age_days=40, pack="fp-shared")
        add_session(store, "week", age_days=7, pack="fp-shared")
        add_session(store, "now", age_days=0)  # in use: asked a moment ago
        add_session(store, "empty", age_days=0, turns=0)
    return home


@SQLITE_FILE
def test_by_age_a_tree_goes_whole_with_its_rows_and_unused_packs_and_the_file_shrinks(home: Path) -> None:
    with Store.open(home) as store:
        result = store.sessions.prune(PruneRule(older_than_seconds=30 * DAY))
        remaining = {record.id for record in store.sessions.sessions(include_branches=True)}
    assert [tree.root_id for tree in result.pruned] == ["empty", "old-batch", "month"]
    assert result.pruned[1].session_ids == ("old-batch", "old-sibling") and result.pruned[1].turns == 2
    assert remaining == {"week", "now"}
    # Turns, requests, counter checks and answer keys went with their sessions; the shared pack stays.
    assert count(home, "turns") == count(home, "requests") == count(home, "answer_keys") == 4
    assert count(home, "counter_checks") == 2
    connection = sqlite3.connect(home / DATABASE_NAME)
    assert [row[0] for row in connection.execute("SELECT fingerprint FROM packs")] == ["fp-shared"]
    assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert result.file_bytes_after < result.file_bytes_before
    assert result.freed_bytes > 20_000  # the old batch's pack was its own


def test_by_count_and_by_size_never_a_session_in_use(home: Path) -> None:
    with Store.open(home) as store:
        kept_one = store.sessions.prune(PruneRule(keep=1), dry_run=True)
        # Only the session in use is kept: it is the newest, and counts among the one kept.
        assert [tree.root_id for tree in kept_one.pruned] == ["empty", "old-batch", "month", "week"]
        assert kept_one.in_use == 1 and kept_one.kept == 0
        none_left = store.sessions.prune(PruneRule(max_bytes=0), dry_run=True)
        assert "now" not in [tree.root_id for tree in none_left.pruned]
        sized = store.sessions.prune(PruneRule(max_bytes=12_000, empty=False))
        assert [tree.root_id for tree in sized.pruned] == ["old-batch", "month"]
        assert {record.id for record in store.sessions.sessions()} == {"week", "now", "empty"}


@SQLITE_FILE
def test_a_dry_run_deletes_nothing(home: Path) -> None:
    before = (home / DATABASE_NAME).read_bytes()
    with Store.open(home) as store:
        result = store.sessions.prune(PruneRule(older_than_seconds=0, in_use_seconds=0), dry_run=True)
        assert len(result.pruned) == 5 and result.dry_run
        assert len(store.sessions.sessions(include_branches=True)) == 6
    assert count(home, "turns") == 8 and len(before) > 0


@SQLITE_FILE
def test_the_command_takes_durations_and_sizes_and_prints_the_ids(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LONGCTX_HOME", str(home))
    runner = CliRunner()
    dry = runner.invoke(main, ["sessions", "prune", "--older-than", "30d", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.split() == ["empty", "old-batch", "old-sibling", "month"]
    assert "would delete 3 session(s)" in dry.stderr and "1 in use" in dry.stderr
    data = json.loads(runner.invoke(main, ["sessions", "prune", "--keep", "2", "--json"]).stdout)
    assert [tree["root_id"] for tree in data["pruned"]] == ["empty", "old-batch", "month"]
    assert data["file_bytes_after"] < data["file_bytes_before"]
    sized = runner.invoke(main, ["sessions", "prune", "--max-size", "1kB", "--in-use-within", "0"])
    assert sized.stdout.split() == ["week", "now"] and "the store went from" in sized.stderr
    bad = runner.invoke(main, ["sessions", "prune", "--older-than", "a month"])
    assert bad.exit_code == 2 and "not a duration" in bad.output
    assert runner.invoke(main, ["sessions", "prune", "--max-size", "lots"]).exit_code == 2


# -- the rules one at a time, on trees of known age and size ------------------------------


def add_tree(store: Store, root: str, *, age_days: float, answer_bytes: int = 100, branches: int = 0) -> None:
    add_session(store, root, age_days=age_days, turns=1, answer_bytes=answer_bytes)
    for number in range(branches):
        add_session(store, f"{root}-b{number}", age_days=age_days, turns=1, parent=root)


def pruned(result: PruneResult) -> list[tuple[str, str]]:
    return [(tree.root_id, tree.reason) for tree in result.pruned]


def test_a_tree_is_measured_by_its_rows_text_and_its_own_packs(tmp_path: Path) -> None:
    with Store.open(tmp_path / "home") as store:
        add_session(store, "s", age_days=10, turns=2, answer_bytes=1000, pack="own")
        add_session(store, "b", age_days=12, turns=1, answer_bytes=10, parent="s")
        store.sessions.record(CounterSkip("s", "no check: a router"))
        add_session(store, "t", age_days=10, turns=0, pack="shared")
        add_session(store, "u", age_days=10, turns=0, pack="shared")
        (tree, *_) = store.sessions.prune(PruneRule(older_than_seconds=0, empty=False), dry_run=True).pruned
    # Sessions: title + 200 each; turns: question, answer twice, + 80 each; requests 220, checks 160,
    # skips 120 each; the pack's system, prefix and summary ("{}"): its own.
    sessions = (1 + 200) * 2
    turns = (3 + 1000 + 1000 + 80) * 2 + (3 + 10 + 10 + 80)
    rows = 3 * 220 + 2 * 160 + 1 * 120
    assert tree.root_id == tree.title == "s" and tree.session_ids == ("s", "b") and tree.turns == 3
    assert tree.bytes == sessions + turns + rows + (6 + 20_000 + 2)
    # A pack two trees use is counted in neither.
    with Store.open(tmp_path / "home") as store:
        result = store.sessions.prune(PruneRule(older_than_seconds=0, empty=False), dry_run=True)
    assert {tree.root_id: tree.bytes for tree in result.pruned[1:]} == {"t": 201 + 160, "u": 201 + 160}


def test_a_trees_last_use_is_its_latest_session_turn_or_request_not_its_counter_checks(
    tmp_path: Path,
) -> None:
    with Store.open(tmp_path / "home") as store:
        add_session(store, "root", age_days=50, turns=1)
        add_session(store, "branch", age_days=20, turns=1, parent="root")
        add_session(store, "asked", age_days=50, turns=1)
        asked_at = time.time() - 5 * DAY
        late = TurnRecord("asked", 1, "q?", "a", "a", None, None, asked_at)
        usage = Usage(1, 0, None, 1, None, None)
        store.sessions.commit_turn(
            late, RequestRecord("late", "asked", None, "turn", asked_at - 60, "u", "vllm", "m", usage, 1)
        )
        add_session(store, "warm", age_days=50, turns=1)
        warm_at = time.time() - 3 * DAY
        store.sessions.record(RequestRecord("w", "warm", None, "warm", warm_at, "u", "vllm", "m", usage, 1))
        result = store.sessions.prune(PruneRule(older_than_seconds=0), dry_run=True)
    last = {tree.root_id: round((time.time() - tree.last_used) / DAY) for tree in result.pruned}
    assert last == {"root": 20, "asked": 5, "warm": 3}
    assert [tree.root_id for tree in result.pruned] == ["root", "asked", "warm"]  # oldest first


def test_an_empty_session_goes_whatever_its_age_unless_told_and_a_tree_with_branches_is_not_empty(
    tmp_path: Path,
) -> None:
    with Store.open(tmp_path / "home") as store:
        add_session(store, "fresh-empty", age_days=0, turns=0)
        add_session(store, "parent", age_days=0, turns=0)
        add_session(store, "child", age_days=0, turns=0, parent="parent")
        result = store.sessions.prune(PruneRule(), dry_run=True)
        assert pruned(result) == [("fresh-empty", "empty")]
        assert (result.kept, result.in_use) == (0, 1)
        kept = store.sessions.prune(PruneRule(empty=False), dry_run=True)
        assert pruned(kept) == [] and (kept.kept, kept.in_use) == (0, 2)


def test_in_use_is_activity_within_the_window_and_stays_whatever_the_rules(tmp_path: Path) -> None:
    with Store.open(tmp_path / "home") as store:
        add_tree(store, "hour-ago", age_days=1.1 / 24)
        add_tree(store, "minutes-ago", age_days=0.5 / 24)
        result = store.sessions.prune(PruneRule(older_than_seconds=0, keep=0, max_bytes=0), dry_run=True)
        assert pruned(result) == [("hour-ago", "older than the limit")] and result.in_use == 1
        wider = store.sessions.prune(PruneRule(older_than_seconds=0, in_use_seconds=2 * 3600), dry_run=True)
        assert pruned(wider) == [] and wider.in_use == 2 and wider.kept == 0


def test_by_age_only_the_trees_older_than_the_limit_go(tmp_path: Path) -> None:
    with Store.open(tmp_path / "home") as store:
        for root, days in [("d40", 40), ("d31", 31), ("d29", 29), ("d2", 2)]:
            add_tree(store, root, age_days=days)
        result = store.sessions.prune(PruneRule(older_than_seconds=30 * DAY), dry_run=True)
    assert pruned(result) == [("d40", "older than the limit"), ("d31", "older than the limit")]
    assert (result.kept, result.in_use) == (2, 0)


def test_by_count_the_newest_are_kept_counting_those_in_use(tmp_path: Path) -> None:
    with Store.open(tmp_path / "home") as store:
        for root, days in [("d4", 4), ("d3", 3), ("d2", 2), ("d1", 1), ("now", 0)]:
            add_tree(store, root, age_days=days)
        keep3 = store.sessions.prune(PruneRule(keep=3), dry_run=True)
        assert pruned(keep3) == [("d4", "beyond the 3 newest"), ("d3", "beyond the 3 newest")]
        assert (keep3.kept, keep3.in_use) == (2, 1)
        assert pruned(store.sessions.prune(PruneRule(keep=5), dry_run=True)) == []
        nothing = store.sessions.prune(PruneRule(keep=0), dry_run=True)
        assert [root for root, _ in pruned(nothing)] == ["d4", "d3", "d2", "d1"]
        # Age first: a tree both older and beyond the count is named for its age.
        both = store.sessions.prune(PruneRule(older_than_seconds=3.5 * DAY, keep=3), dry_run=True)
        assert pruned(both) == [("d4", "older than the limit"), ("d3", "beyond the 3 newest")]


def test_by_size_the_newest_fill_the_limit_and_every_older_tree_goes(tmp_path: Path) -> None:
    with Store.open(tmp_path / "home") as store:
        add_tree(store, "now", age_days=0, answer_bytes=1000)
        add_tree(store, "d1", age_days=1, answer_bytes=1000)
        add_tree(store, "d2", age_days=2, answer_bytes=5000)
        add_tree(store, "d3", age_days=3, answer_bytes=10)  # small, but older than one that did not fit
        every = store.sessions.prune(PruneRule(max_bytes=0, in_use_seconds=0), dry_run=True)
        sizes = {tree.root_id: tree.bytes for tree in every.pruned}
        fits_two = sizes["now"] + sizes["d1"]
        exact = store.sessions.prune(PruneRule(max_bytes=fits_two), dry_run=True)
        assert pruned(exact) == [("d3", "over the size limit"), ("d2", "over the size limit")]
        one_less = store.sessions.prune(PruneRule(max_bytes=fits_two - 1), dry_run=True)
        assert [root for root, _ in pruned(one_less)] == ["d3", "d2", "d1"]
        # Trees taken by another rule do not count against the size.
        aged = store.sessions.prune(PruneRule(older_than_seconds=1.5 * DAY, max_bytes=fits_two), dry_run=True)
        assert pruned(aged) == [("d3", "older than the limit"), ("d2", "older than the limit")]


@SQLITE_FILE
def test_a_thousand_trees_are_deleted_and_the_file_compacted_or_a_note_says_why_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    with Store.open(home) as store:
        for number in range(1003):
            store.sessions.create_session(
                SessionRecord(f"e{number:04}", 0.0, "session", "t", None, None, None)
            )
        add_tree(store, "kept", age_days=0)
        result = store.sessions.prune(PruneRule())
        assert len(result.pruned) == 1003 and result.notes == () and not result.dry_run
        assert [record.id for record in store.sessions.sessions()] == ["kept"]
        assert result.file_bytes_after == (home / DATABASE_NAME).stat().st_size + _wal_bytes(home)
        add_tree(store, "old", age_days=40)

        def full(self: object) -> None:
            raise StoreError("the disk is full")

        monkeypatch.setattr(type(store.database), "vacuum", full)
        noted = store.sessions.prune(PruneRule(older_than_seconds=DAY))
        assert [tree.root_id for tree in noted.pruned] == ["old"]
        assert noted.notes == (
            "the sessions are deleted, but the file was not compacted (the disk is full); "
            "later writes reuse the space",
        )
        assert [record.id for record in store.sessions.sessions()] == ["kept"]


def _wal_bytes(home: Path) -> int:
    wal = home / f"{DATABASE_NAME}-wal"
    return wal.stat().st_size if wal.exists() else 0


@SQLITE_FILE
def test_a_dry_run_measures_the_file_with_its_write_ahead_log(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with Store.open(home) as store:
        add_tree(store, "old", age_days=40)
        wal = _wal_bytes(home)
        assert wal > 0  # the writes are still in the log
        result = store.sessions.prune(PruneRule(older_than_seconds=DAY), dry_run=True)
        assert (
            result.file_bytes_before == result.file_bytes_after == (home / DATABASE_NAME).stat().st_size + wal
        )


def test_a_session_that_names_itself_as_its_parent_is_its_own_tree(tmp_path: Path) -> None:
    """A damaged row (no longctx writes one) must not hang the walk up the tree."""
    with Store.open(tmp_path / "home") as store:
        store.sessions.create_session(SessionRecord("loop", 0.0, "fork", "loop", None, "loop", 0))
        add_tree(store, "kept", age_days=0)
        result = store.sessions.prune(PruneRule(older_than_seconds=DAY, empty=False))
        assert [(tree.root_id, tree.session_ids) for tree in result.pruned] == [("loop", ("loop",))]
