"""The soak (benchmarks/soak.py), short: every kind of client and fault once, then the checker.

On the shared ``vllm_fleet`` (two CPU vLLM replicas) and a real vllm-router:
``ask``, ``chat`` (in a pseudo-terminal), MCP calls, ``batch`` and two ``job``
processes over one job file run at once against one store, while the second
replica is killed and restarted, clients get SIGINT (a chat's Ctrl-C typed
into its terminal) or SIGKILL, and one batch's store fills its disk. Then
every unfinished batch and job is resumed, and the checker proves nothing
was lost (benchmarks/soak_check.py). The full soak, minutes long, writes
its figures to docs/benchmarks.md.

The checker itself is tested first, without an engine, on stores with a
lost answer, an answer stored twice, a session stored without its turn and
a counter check that found more hits than its responses reported.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from soak import CI_PLAN, VICTIM, figures, run_soak
from soak_check import check_store
from soak_clients import Told

from longctx.store import CounterCheckRecord, CounterSkip, Store
from longctx.testing.fleet import Fleet


def _store_with(home: Path, turns: list[tuple[str, int, str, str]], empty_session: str | None = None) -> None:
    """A store holding ``turns`` (session, position, question, answer), each with its request."""
    Store.open(home).close()
    with closing(sqlite3.connect(home / "longctx.db")) as connection, connection:
        for session in {turn[0] for turn in turns} | ({empty_session} if empty_session else set()):
            connection.execute(
                "INSERT INTO sessions (id, created_at, kind, title, settings_json)"
                " VALUES (?, 0, 'session', '', '{}')",
                (session,),
            )
        for number, (session, position, question, answer) in enumerate(turns):
            connection.execute(
                "INSERT INTO requests (id, session_id, purpose, started_at, base_url, engine, model,"
                " attempts) VALUES (?, ?, 'turn', 0, 'http://x/v1', 'vllm', 'm', 1)",
                (f"r{number}", session),
            )
            connection.execute(
                "INSERT INTO turns (session_id, position, question, answer, history_answer, request_id,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?, 0)",
                (session, position, question, answer, answer, f"r{number}"),
            )


def test_the_checker_finds_a_lost_answer_one_stored_twice_and_a_session_without_its_turn(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    _store_with(
        home,
        [("s1", 0, "[ask-0] q", "yes"), ("s2", 0, "[chat-1] q", "a"), ("s3", 0, "[chat-1] q", "a"),
         ("s4", 0, "[job-2a] q", "b"), ("s5", 0, "[job-2b] q", "b"), ("s5", 1, "[job-2b] q", "b")],
        empty_session="s9",
    )  # fmt: skip
    told = [
        Told("ask-0", "[ask-0] q", "yes", "s1", 0),  # stored
        Told("ask-3", "[ask-3] q", "no"),  # never stored: lost
        Told("ask-0", "[ask-0] q", "other", "s1", 0),  # another answer than the one stored: lost
        Told("chat-1", "[chat-1] q", "a", "s2", 0),  # stored, and a second time in s3
    ]
    findings = check_store(home, told, job_questions=["[job-2a] q"])
    assert findings.integrity == "ok"
    assert findings.told == 4 and len(findings.lost) == 2, findings.lost
    assert [line.split(":")[0] for line in findings.stored_twice] == ["'[chat-1] q'", "'[job-2b] q'"]
    assert findings.duplicate_items == []  # one turn of the job's question: no duplicate
    assert findings.half_written == ["session s9 is stored without a turn or a branch"]
    assert len(findings.problems) == 5


def test_the_checker_counts_a_job_item_answered_twice_apart_and_finds_a_gap_and_an_orphan_key(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    _store_with(home, [("s1", 0, "[job-0a] q", "x"), ("s2", 0, "[job-0a] q", "y"), ("s3", 0, "a", "b"),
                       ("s3", 2, "c", "d")])  # fmt: skip
    with closing(sqlite3.connect(home / "longctx.db")) as connection, connection:
        connection.execute("INSERT INTO answer_keys (key, session_id, position) VALUES ('job:j:0', 's3', 5)")
    findings = check_store(home, [Told("job-0a", "[job-0a] q", "y", "s2")], job_questions=["[job-0a] q"])
    assert findings.lost == [] and findings.stored_twice == []
    assert findings.duplicate_items == ["'[job-0a] q': 2 turns"]
    assert "job item answered by two runs: '[job-0a] q': 2 turns" in findings.problems
    assert sorted(findings.half_written) == [
        "answer key job:j:0 has no turn",
        "session s3 has gaps in its turns (0..2)",
    ]


def test_the_checker_reads_a_damaged_store_as_broken(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _store_with(home, [(f"s{n}", 0, f"question {n}", "answer " * 200) for n in range(40)])
    with closing(sqlite3.connect(home / "longctx.db")) as connection, connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        root = connection.execute("SELECT rootpage FROM sqlite_schema WHERE name = 'turns'").fetchone()[0]
        page = connection.execute("PRAGMA page_size").fetchone()[0]
    # A torn write: the turns table's first page overwritten in the middle.
    with (home / "longctx.db").open("r+b") as database:
        database.seek((root - 1) * page + 8)
        database.write(b"\xff" * 64)
    findings = check_store(home, [Told("ask-0", "question 1", "answer " * 200, "s1", 0)])
    assert findings.integrity != "ok"
    assert findings.problems[0].startswith(f"{home}: integrity_check said")


def test_the_checker_counts_any_counter_mismatch_as_a_false_alarm_and_a_skip_with_its_reason_apart(
    tmp_path: Path,
) -> None:
    """A check that found "more" hits is a false alarm too: a window other clients reached is skipped."""
    home = tmp_path / "home"
    _store_with(home, [(f"s{n}", 0, f"question {n}", "answer") for n in range(3)])
    counter, url = "vllm:prefix_cache_hits_total", "http://x/v1"
    with Store.open(home) as store:
        store.sessions.record(
            CounterCheckRecord("s0", None, url, counter, before=1000, after=1100, reported=100, requests=1),
            CounterCheckRecord("s1", None, url, counter, before=1000, after=6220, reported=100, requests=1),
            CounterSkip("s2", f"no counter check on {url}: other clients' requests reached it in the window"),
        )
    findings = check_store(home, [])
    assert (findings.checks_matching, findings.checks_skipped) == (1, 1)
    (alarm,) = findings.false_alarms
    assert alarm.startswith("session s1:") and "5,120 tokens more" in alarm, alarm
    assert findings.problems == [f"counter check false alarm: {alarm}"]


@pytest.mark.vllm
def test_a_short_soak_loses_nothing_and_every_ctrl_c_leaves_in_time(
    vllm_fleet: Fleet, tmp_path: Path
) -> None:
    router = vllm_fleet.start_router("vllm-router", "consistent_hash")
    started = time.monotonic()
    try:
        result = run_soak(vllm_fleet, router.api_base, tmp_path / "soak", CI_PLAN)
    finally:
        vllm_fleet.stop_routers()
        if not vllm_fleet.replicas[VICTIM].alive():
            vllm_fleet.restart(VICTIM)
    print(f"\nsoak: {time.monotonic() - started:.0f} s in all")
    for name, value in figures(result):
        print(f"  {name}: {value}")
    print(f"  full disk: {result.disk_full}")
    assert result.problems() == []
    # Every fault landed: a replica killed, SIGINT and SIGKILL sent, a store's disk full.
    applied = {run.applied for run in result.runs}
    assert result.outages and {"sigint", "sigkill", "disk-full"} <= applied, applied
    assert {run.kind for run in result.runs} == {"ask", "batch", "chat", "job", "mcp"}
    # Ctrl-C typed into a chat's terminal mid-answer: it left in time, saying its session.
    chats = [run for run in result.ctrl_c if run.kind == "chat"]
    assert chats and all(run.session_id_printed for run in chats), [run.stdout[-500:] for run in chats]
    assert all(finding.told for finding in result.findings)
    assert all(finding.integrity == "ok" for finding in result.findings)
