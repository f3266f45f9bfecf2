"""``longctx sessions prune`` (store.sessions.prune): by age, count or size, a dry run, never one in use."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from longctx.cli import main
from longctx.store import (
    DATABASE_NAME,
    PruneRule,
    RequestRecord,
    SessionRecord,
    Store,
    StoredPack,
    TurnRecord,
)
from longctx.store.records import CounterCheckRecord, Opening
from longctx.usage import Usage

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


def test_a_dry_run_deletes_nothing(home: Path) -> None:
    before = (home / DATABASE_NAME).read_bytes()
    with Store.open(home) as store:
        result = store.sessions.prune(PruneRule(older_than_seconds=0, in_use_seconds=0), dry_run=True)
        assert len(result.pruned) == 5 and result.dry_run
        assert len(store.sessions.sessions(include_branches=True)) == 6
    assert count(home, "turns") == 8 and len(before) > 0


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
