"""The soak's checker: the store and the clients' outputs, read after the storm.

What it proves of a store, and of every answer a client printed as stored
(:class:`~soak_clients.Told`), each question being asked by one client only
(the soak puts the client's name in its questions):

- ``PRAGMA integrity_check`` says ok and ``PRAGMA foreign_key_check`` finds nothing;
- every told answer is stored: a turn with that question and that answer
  (in that session, at that turn, where the client said which); a missing
  one is an item lost;
- stored exactly once: one turn per question; a job's item answered by two
  runs at once (:attr:`StoreFindings.duplicate_items`) breaks the job's leases'
  promise of one owner per item;
- no half-written turn: every turn has its request, every answer key its
  turn, every session's positions are contiguous, and no session is stored
  without a turn or a branch;
- no counter-check false alarm: every session's check matches, or it was
  skipped and says why, and no figure of it is negative. The soak's other
  clients use the same replicas; a window another process's requests
  reached is skipped, saying so (the engines' query counters tell it,
  ``longctx.verification.counters``), so any mismatch, "more" or "fewer",
  is a false alarm.
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from collections.abc import Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from soak_clients import Told

from longctx.sessions import resume
from longctx.store import Store


@dataclass
class StoreFindings:
    """What the checker found in one store; :attr:`problems` empty means every promise held."""

    home: Path
    integrity: str = ""
    told: int = 0
    lost: list[str] = field(default_factory=list)
    stored_twice: list[str] = field(default_factory=list)
    duplicate_items: list[str] = field(default_factory=list)
    half_written: list[str] = field(default_factory=list)
    checks_matching: int = 0
    checks_skipped: int = 0
    false_alarms: list[str] = field(default_factory=list)
    turns: int = 0
    requests: int = 0

    @property
    def problems(self) -> list[str]:
        """Every broken promise, one line each."""
        found = [] if self.integrity == "ok" else [f"{self.home}: integrity_check said {self.integrity!r}"]
        found += [f"lost: {item}" for item in self.lost]
        found += [f"stored twice: {item}" for item in self.stored_twice]
        found += [f"job item answered by two runs: {item}" for item in self.duplicate_items]
        found += [f"half-written: {item}" for item in self.half_written]
        found += [f"counter check false alarm: {item}" for item in self.false_alarms]
        return found


def integrity(home: Path) -> str:
    """``PRAGMA integrity_check`` and ``foreign_key_check`` of the store at ``home``: "ok" or what they said."""
    try:
        with closing(sqlite3.connect(home / "longctx.db")) as connection, connection:
            said = [row[0] for row in connection.execute("PRAGMA integrity_check")]
            broken = connection.execute("PRAGMA foreign_key_check").fetchall()
    except sqlite3.DatabaseError as error:  # too damaged to be checked at all
        return str(error)
    if said != ["ok"]:
        return "; ".join(said)
    return "ok" if not broken else f"foreign keys broken: {broken[:5]}"


def check_store(home: Path, told: Sequence[Told], job_questions: Iterable[str] = ()) -> StoreFindings:
    """Check the store at ``home`` against the answers its clients printed (see the module docstring).

    ``job_questions`` are the questions of job items, which two job runs at
    once may both answer: a second turn of one is counted as a duplicate
    item, not as stored twice.
    """
    findings = StoreFindings(home, integrity=integrity(home), told=len(told))
    if findings.integrity != "ok":
        return findings  # nothing else it holds can be trusted (or read)
    jobs = set(job_questions)
    with Store.open(home) as store:
        rows = store.database.query(
            "SELECT t.session_id, t.position, t.question, t.answer, t.request_id, r.id AS request"
            " FROM turns t LEFT JOIN requests r ON r.id = t.request_id"
        )
        findings.turns = len(rows)
        findings.requests = store.database.query("SELECT COUNT(*) AS n FROM requests")[0]["n"]
        by_question: dict[str, list[sqlite3.Row]] = {}
        for row in rows:
            by_question.setdefault(row["question"], []).append(row)
        _find_told(findings, told, by_question)
        for question, turns in by_question.items():
            if len(turns) > 1:
                where = f"{question!r}: {len(turns)} turns"
                (findings.duplicate_items if question in jobs else findings.stored_twice).append(where)
        findings.half_written = _half_written(store, rows)
        _check_counters(findings, store)
    return findings


def _find_told(
    findings: StoreFindings, told: Sequence[Told], by_question: dict[str, list[sqlite3.Row]]
) -> None:
    for answer in told:
        turns = by_question.get(answer.question, [])
        matching = [
            row
            for row in turns
            if row["answer"] == answer.answer
            and (answer.session_id is None or row["session_id"] == answer.session_id)
            and (answer.turn is None or row["position"] == answer.turn)
        ]
        if not matching:
            seen = f"{len(turns)} turns with that question" if turns else "no turn with that question"
            findings.lost.append(f"{answer.client}: {answer.question!r} ({seen})")


def _half_written(store: Store, turns: Sequence[sqlite3.Row]) -> list[str]:
    """Turns without their request, keys without their turn, gaps, sessions with nothing in them."""
    found = [
        f"turn {row['position']} of {row['session_id']} has no request {row['request_id']}"
        for row in turns
        if row["request"] is None
    ]
    orphans = store.database.query(
        "SELECT k.key FROM answer_keys k LEFT JOIN turns t"
        " ON t.session_id = k.session_id AND t.position = k.position WHERE t.session_id IS NULL"
    )
    found += [f"answer key {row['key']} has no turn" for row in orphans]
    sessions = store.database.query(
        "SELECT s.id, s.parent_turns, COUNT(t.position) AS turns, MIN(t.position) AS first,"
        " MAX(t.position) AS last, (SELECT COUNT(*) FROM sessions c WHERE c.parent_id = s.id) AS branches"
        " FROM sessions s LEFT JOIN turns t ON t.session_id = s.id GROUP BY s.id"
    )
    for row in sessions:
        if not row["turns"] and not row["branches"]:
            found.append(f"session {row['id']} is stored without a turn or a branch")
        elif row["turns"] and row["last"] - row["first"] + 1 != row["turns"]:
            found.append(f"session {row['id']} has gaps in its turns ({row['first']}..{row['last']})")
    return found


_NEGATIVE = re.compile(r"(?<![\w.])-\d")


def _check_counters(findings: StoreFindings, store: Store) -> None:
    """Each stored session's counter check: it matches, or it was not made and says why."""
    for record in store.sessions.sessions():
        check = resume(record.id, store=store).report().counter_check
        if check is None:
            continue
        figures = [str(value) for value in vars(check).values()]
        if check.matches is True and not any(_NEGATIVE.search(text) for text in figures):
            findings.checks_matching += 1
        elif check.matches is None and check.note:
            findings.checks_skipped += 1
        else:
            findings.false_alarms.append(f"session {record.id}: {check}")


def count_by_kind(told: Iterable[Told]) -> Counter[str]:
    """Told answers by client kind (the part of the client's name before its number)."""
    return Counter(answer.client.rsplit("-", 1)[0] for answer in told)
