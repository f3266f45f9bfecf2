"""Who is asking an item now: leases, so two runs of one job never ask one item twice.

A lease names an item (a job's answer key without its nonce: see
:mod:`longctx.jobs.keys`), the run holding it (its id, process id and host)
and when it lapses. A run takes its items' leases in one transaction before
it asks them, renews them while it asks, and gives each back once its answer
is stored (or the run ends). A lease lapses when its time is up without a
renewal; on the embedded store (one host) also at once when its process no
longer runs. On a server's store (many hosts) time alone ends a lease, by
the server's clock (:meth:`Database.clock <longctx.store.db.Database.clock>`):
a process check cannot see another machine. Either way a run killed by
SIGKILL or a power cut holds nothing for long. Taking a lease looks, in the
same transaction, for an answer already stored under the item's key, so an
item answered by a run that has just let go is not asked again.

A run that stalled (a machine suspended, a network cut longer than a
lease) may find its lease taken over when its answer comes back. So an
answer stored under a job item's key while a run of this store holds leases
is checked in the answer's own transaction (:meth:`ItemLeases.check_held`):
the item's lease must still be that run's, else nothing is stored and the
run is told (:class:`~longctx.errors.LeaseLost`); the run that took the item
over stores its answer, once.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any, Literal

from longctx.errors import LeaseLost
from longctx.recordtypes import record_type
from longctx.store.db import Database, key_range

__all__ = ["ItemLeases", "LeaseClaim", "LeaseHolder"]


@record_type
class LeaseHolder:
    """A run that may hold leases: its id, and the process and host it runs in."""

    run_id: str
    pid: int
    host: str

    @classmethod
    def this_process(cls, run_id: str) -> LeaseHolder:
        """The holder ``run_id`` of this process on this host."""
        return cls(run_id, os.getpid(), socket.gethostname())

    def describe(self) -> str:
        """``run RUN (pid PID on HOST)``: how a message names the other run."""
        return f"run {self.run_id} (pid {self.pid} on {self.host})"


@record_type
class LeaseClaim:
    """What became of one item's lease when a run tried to take it.

    ``state``: ``taken`` (the run holds it now: ask), ``held`` (another live
    run holds it: ``holder`` and ``expires_at`` say which and until when),
    ``answered`` (an answer is stored under the key: reuse it; no lease taken).
    """

    key: str
    state: Literal["taken", "held", "answered"]
    holder: LeaseHolder | None = None
    expires_at: float | None = None


class ItemLeases:
    """``store.leases``: the job items runs are asking now, one owner each (see the module docstring)."""

    def __init__(self, database: Database) -> None:
        # No I/O: the database opens on first use.
        self._database = database
        # The runs of this process asking through this store, and their lease time: their answers are checked.
        self._runs: dict[str, float] = {}

    def hold_for(self, run_id: str, seconds: float) -> None:
        """From now on, an answer stored under a job item's key must be under a lease of ``run_id``'s."""
        self._runs[run_id] = seconds

    def done_for(self, run_id: str) -> None:
        """``run_id`` stopped asking: its answers are no longer checked against its leases."""
        self._runs.pop(run_id, None)

    def check_held(self, connection: Any, answer_key: str) -> None:
        """In an answer's transaction: raise :class:`LeaseLost` unless a run of this store holds its item.

        Only job items' keys (``job:...``), and only while a run holds leases
        (:meth:`hold_for`): a plain keyed question has no lease. A lease of
        the run that lapsed but that no other run took is renewed here.
        """
        if not self._runs or not answer_key.startswith("job:"):
            return
        lease_key = answer_key.rsplit(":", 1)[0]
        self._database.serialize(connection)
        row = connection.execute("SELECT * FROM job_leases WHERE key = ?", (lease_key,)).fetchone()
        if row is not None and row["run_id"] in self._runs:
            now = self._database.clock(connection)
            if row["expires_at"] <= now:
                connection.execute(
                    "UPDATE job_leases SET expires_at = ? WHERE key = ?",
                    (now + self._runs[row["run_id"]], lease_key),
                )
            return
        other = "no run" if row is None else LeaseHolder(row["run_id"], row["pid"], row["host"]).describe()
        raise LeaseLost(
            f"the lease of {lease_key} lapsed while this run asked it and {other} holds it now: "
            "its answer was not stored (the run that holds the item stores it)"
        )

    def take(
        self, keys: Sequence[str], holder: LeaseHolder, seconds: float, *, answered_since: float = 0.0
    ) -> list[LeaseClaim]:
        """Take the lease of each of ``keys`` for ``seconds``, in one transaction; a claim per key, in order.

        A key whose lease another live run holds is not taken (``held``); one
        with an answer stored under ``KEY:...`` whose turn was made at or after
        ``answered_since`` is not taken either (``answered``). A lapsed lease,
        or one of a process of this host that no longer runs, is taken over.
        ``holder`` taking a lease it holds renews it.
        """
        claims: list[LeaseClaim] = []
        unique = list(dict.fromkeys(keys))
        with self._database.transaction() as connection:
            self._database.serialize(connection)
            now = self._database.clock(connection)
            # Read in a few statements, not three a key: on a server each statement is a round trip.
            answered = _answered(connection, unique, answered_since)
            leases = _lease_rows(connection, unique)
            taking: list[str] = []
            for key in keys:
                row = leases.get(key)
                if key in answered:
                    claims.append(LeaseClaim(key, "answered"))
                    continue
                if row is not None and row["run_id"] != holder.run_id:
                    other = LeaseHolder(row["run_id"], row["pid"], row["host"])
                    if row["expires_at"] > now and (not self._database.local or _running(other)):
                        claims.append(LeaseClaim(key, "held", other, row["expires_at"]))
                        continue
                taking.append(key)
                claims.append(LeaseClaim(key, "taken", holder, now + seconds))
            # A lapsed lease of a run that died after storing the answer: nobody else will give it back.
            lapsed = [(key,) for key in answered if key in leases and leases[key]["expires_at"] <= now]
            if lapsed:
                connection.executemany("DELETE FROM job_leases WHERE key = ?", lapsed)
            if taking:
                connection.executemany(
                    "INSERT OR REPLACE INTO job_leases (key, run_id, pid, host, expires_at, taken_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    [(key, holder.run_id, holder.pid, holder.host, now + seconds, now)
                     for key in dict.fromkeys(taking)],
                )  # fmt: skip
        return claims

    def renew(self, run_id: str, seconds: float) -> int:
        """Push back the lapse of every lease ``run_id`` holds to ``seconds`` from now; how many it holds."""
        with self._database.transaction() as connection:
            now = self._database.clock(connection)
            cursor = connection.execute(
                "UPDATE job_leases SET expires_at = ? WHERE run_id = ?", (now + seconds, run_id)
            )
            return int(cursor.rowcount)

    def release(self, run_id: str, keys: Sequence[str] | None = None) -> None:
        """Give back the leases of ``keys`` (all when None) that ``run_id`` holds; others' are left alone."""
        with self._database.transaction() as connection:
            if keys is None:
                connection.execute("DELETE FROM job_leases WHERE run_id = ?", (run_id,))
                return
            connection.executemany(
                "DELETE FROM job_leases WHERE key = ? AND run_id = ?", [(key, run_id) for key in keys]
            )

    def holders(self, prefix: str = "") -> dict[str, LeaseHolder]:
        """The live leases whose key starts with ``prefix``, by key (lapsed ones are left out)."""
        with self._database.transaction() as connection:
            rows = connection.execute(
                "SELECT * FROM job_leases WHERE substr(key, 1, ?) = ? AND expires_at > ?",
                (len(prefix), prefix, self._database.clock(connection)),
            ).fetchall()
        held = {row["key"]: LeaseHolder(row["run_id"], row["pid"], row["host"]) for row in rows}
        return {key: holder for key, holder in held.items() if not self._database.local or _running(holder)}


# Keys per statement: two parameters each, far below every SQLite build's limit.
_CHUNK = 200


def _answered(connection: Any, keys: Sequence[str], since: float) -> set[str]:
    """Those of ``keys`` with an answer stored under ``KEY:...`` whose turn was made at or after ``since``."""
    found: set[str] = set()
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start : start + _CHUNK]
        bounds = [bound for key in chunk for bound in key_range(key + ":")]
        rows = connection.execute(
            "SELECT DISTINCT wanted.column1 AS low"
            f" FROM (VALUES {', '.join(['(?, ?)'] * len(chunk))}) AS wanted"
            " JOIN answer_keys ON answer_keys.key COLLATE BINARY >= wanted.column1"
            " AND answer_keys.key COLLATE BINARY < wanted.column2"
            " JOIN turns ON turns.session_id = answer_keys.session_id"
            " AND turns.position = answer_keys.position WHERE turns.created_at >= ?",
            (*bounds, since),
        ).fetchall()
        found.update(row["low"][:-1] for row in rows)  # the key without the ":" its range starts with
    return found


def _lease_rows(connection: Any, keys: Sequence[str]) -> dict[str, Any]:
    """The lease rows of ``keys`` (those that have one), by key."""
    rows: dict[str, Any] = {}
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start : start + _CHUNK]
        marks = ", ".join("?" * len(chunk))
        for row in connection.execute(f"SELECT * FROM job_leases WHERE key IN ({marks})", tuple(chunk)):
            rows[row["key"]] = row
    return rows


def _running(holder: LeaseHolder) -> bool:
    """Whether ``holder``'s process may still run: always true of another host's (it cannot be asked)."""
    if holder.host != socket.gethostname():
        return True
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process of that id runs
    return True
