"""Pruning the store: old sessions go, by age, by count or by size, never one in use.

The unit is a session *tree*: a session and every branch made from it
(siblings of a batch, forks), since a branch's history starts with its
parent's turns. A tree's age is its latest activity (a session made, a turn
stored, a request sent); its size is what its rows hold (turns, requests,
counter checks, and its packs' text where no other tree uses them). A tree
active within :attr:`PruneRule.in_use_seconds` is in use (a chat waiting for
its next question, a job asking) and is never pruned. Deleting a tree
deletes its turns, requests, counter checks and answer keys with it (the
schema's ``ON DELETE CASCADE``), then the packs no session uses any more,
in one transaction; the file is then vacuumed so the space goes back to
the disk.
"""

from __future__ import annotations

import time
from dataclasses import field

from longctx.errors import StoreError
from longctx.recordtypes import record_type
from longctx.store.db import Database

__all__ = ["PruneResult", "PruneRule", "PrunedTree", "prune_sessions"]

# What a request, counter check or skip row takes besides its text, measured
# as a typical row's bytes in the file (longctx 0.x, SQLite 3.40).
_ROW_BYTES = {"requests": 220, "counter_checks": 160, "counter_skips": 120}


@record_type
class PruneRule:
    """Which session trees go: older than ``older_than_seconds``, beyond the ``keep`` newest, or
    the oldest until the rest fit in ``max_bytes``; any one rule given is enough to prune.

    Trees active within ``in_use_seconds`` stay whatever the rules say; but
    ``empty`` trees (one session, no turn: nothing a resume could use) go
    whatever their age.
    """

    empty: bool = True
    older_than_seconds: float | None = None
    keep: int | None = None
    max_bytes: int | None = None
    in_use_seconds: float = 3600.0


@record_type
class PrunedTree:
    """A session tree pruned (or, in a dry run, to be): its root, size and latest activity."""

    root_id: str
    title: str
    session_ids: tuple[str, ...]
    turns: int
    last_used: float
    bytes: int
    reason: str


@record_type
class PruneResult:
    """What a prune took (or would take), and the database file's size before and after."""

    pruned: tuple[PrunedTree, ...]
    kept: int
    in_use: int
    file_bytes_before: int
    file_bytes_after: int
    dry_run: bool
    notes: tuple[str, ...] = field(default=())

    @property
    def freed_bytes(self) -> int:
        """The estimated size of the pruned trees' rows (what a vacuum gives back, about)."""
        return sum(tree.bytes for tree in self.pruned)


@record_type(frozen=False)
class _Tree:
    root_id: str
    title: str
    ids: list[str] = field(default_factory=list)
    turns: int = 0
    last_used: float = 0.0
    bytes: int = 0
    packs: set[str] = field(default_factory=set)


def prune_sessions(database: Database, rule: PruneRule, *, dry_run: bool = False) -> PruneResult:
    """Delete the session trees ``rule`` selects (none in use), then vacuum; ``dry_run`` only says which."""
    trees = _trees(database)
    now = time.time()
    empty = [tree for tree in trees if rule.empty and tree.turns == 0 and len(tree.ids) == 1]
    in_use = [tree for tree in trees if tree.last_used > now - rule.in_use_seconds and tree not in empty]
    others = [tree for tree in trees if tree not in in_use and tree not in empty]
    chosen = [(tree, "empty") for tree in empty] + _select(others, in_use, rule, now)
    before = _file_bytes(database)
    notes: list[str] = []
    pruned = tuple(
        PrunedTree(tree.root_id, tree.title, tuple(tree.ids), tree.turns, tree.last_used, tree.bytes, reason)
        for tree, reason in chosen
    )
    if not dry_run and chosen:
        ids = [session_id for tree, _ in chosen for session_id in tree.ids]
        with database.transaction() as connection:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                connection.execute(f"DELETE FROM sessions WHERE id IN ({','.join('?' * len(chunk))})", chunk)
            connection.execute(
                "DELETE FROM packs WHERE fingerprint NOT IN"
                " (SELECT pack_fingerprint FROM sessions WHERE pack_fingerprint IS NOT NULL)"
            )
            # The bytes of images no kept pack places any more.
            connection.execute("DELETE FROM image_blobs WHERE sha256 NOT IN (SELECT sha256 FROM pack_images)")
        try:
            database.vacuum()
        except StoreError as error:
            notes.append(
                f"the sessions are deleted, but the file was not compacted ({error}); "
                "later writes reuse the space"
            )
    after = before if dry_run else _file_bytes(database)
    kept = len(trees) - len(chosen) - len(in_use)
    return PruneResult(pruned, kept, len(in_use), before, after, dry_run, tuple(notes))


def _select(
    candidates: list[_Tree], in_use: list[_Tree], rule: PruneRule, now: float
) -> list[tuple[_Tree, str]]:
    """The trees to prune, oldest first, each with the rule that took it."""
    newest_first = sorted(candidates, key=lambda tree: tree.last_used, reverse=True)
    in_use_bytes = sum(tree.bytes for tree in in_use)
    chosen: dict[str, tuple[_Tree, str]] = {}
    if rule.older_than_seconds is not None:
        for tree in newest_first:
            if tree.last_used < now - rule.older_than_seconds:
                chosen.setdefault(tree.root_id, (tree, "older than the limit"))
    if rule.keep is not None:
        # Trees in use count among those kept: they are the newest.
        for tree in newest_first[max(rule.keep - len(in_use), 0) :]:
            chosen.setdefault(tree.root_id, (tree, f"beyond the {rule.keep} newest"))
    if rule.max_bytes is not None:
        # The newest trees (those in use first) fill the limit; every older one goes.
        total, over = in_use_bytes, False
        for tree in newest_first:
            if tree.root_id in chosen:
                continue
            total += tree.bytes
            over = over or total > rule.max_bytes
            if over:
                chosen[tree.root_id] = (tree, "over the size limit")
    return sorted(chosen.values(), key=lambda pair: pair[0].last_used)


def _trees(database: Database) -> list[_Tree]:
    """Every session tree with its activity and size, read in a few grouped queries."""
    sessions = database.query("SELECT id, parent_id, created_at, title, pack_fingerprint FROM sessions")
    parent = {row["id"]: row["parent_id"] for row in sessions}

    def root_of(session_id: str) -> str:
        seen = set()
        while parent.get(session_id) and session_id not in seen:
            seen.add(session_id)
            session_id = parent[session_id]
        return session_id

    trees: dict[str, _Tree] = {}
    for row in sessions:
        root = root_of(row["id"])
        tree = trees.setdefault(root, _Tree(root, ""))
        tree.ids.append(row["id"])
        tree.last_used = max(tree.last_used, row["created_at"])
        tree.bytes += len(row["title"]) + 200
        if row["id"] == root:
            tree.title = row["title"]
        if row["pack_fingerprint"]:
            tree.packs.add(row["pack_fingerprint"])
    tree_of = {session_id: tree for tree in trees.values() for session_id in tree.ids}
    for row in database.query(
        "SELECT session_id, count(*) AS n, max(created_at) AS last, sum(length(question) + length(answer)"
        " + length(history_answer) + ifnull(length(reasoning), 0) + length(preamble) + length(instruction)"
        " + ifnull(length(answer_ids_json), 0) + ifnull(length(citations_json), 0) + 80) AS size"
        " FROM turns GROUP BY session_id"
    ):
        tree = tree_of[row["session_id"]]
        tree.turns += row["n"]
        tree.last_used = max(tree.last_used, row["last"])
        tree.bytes += row["size"]
    for table, bytes_per_row in _ROW_BYTES.items():
        # A request is activity; a counter check or skip is written beside one, when it is.
        last = "max(started_at)" if table == "requests" else "0"
        for row in database.query(
            f"SELECT session_id, count(*) AS n, {last} AS last FROM {table}"
            " WHERE session_id IS NOT NULL GROUP BY session_id"
        ):
            owner = tree_of.get(row["session_id"])
            if owner is not None:
                owner.bytes += row["n"] * bytes_per_row
                owner.last_used = max(owner.last_used, row["last"])
    users: dict[str, int] = {}
    for tree in trees.values():
        for fingerprint in tree.packs:
            users[fingerprint] = users.get(fingerprint, 0) + 1
    pack_bytes = {
        row["fingerprint"]: row["size"]
        for row in database.query(
            "SELECT fingerprint, length(system) + length(prefix) + length(summary_json) AS size FROM packs"
        )
    }
    for tree in trees.values():
        # A pack shared by trees goes only with the last of them: counted where it is alone.
        tree.bytes += sum(pack_bytes.get(fp, 0) for fp in tree.packs if users[fp] == 1)
    return list(trees.values())


def _file_bytes(database: Database) -> int:
    """What the store takes: the database file and its log, or the server's tables."""
    return database.size_bytes()
