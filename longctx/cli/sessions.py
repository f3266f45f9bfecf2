"""``longctx report`` and ``longctx sessions``: what the store holds."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import time
from typing import Any

import click

from longctx.cli.app import emit_json, main, note, runtime
from longctx.cli.terminal import shown
from longctx.errors import SessionNotFound
from longctx.outputs import save_text
from longctx.sessions import Session, resume
from longctx.store import PruneRule, SessionRecord, Store


@main.command()
@click.argument("session_id", metavar="[SESSION_ID | JOB_ID]", required=False)
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
@click.option("--markdown", is_flag=True, help="Markdown on stdout.")
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False, writable=True),
    help="Write a self-contained HTML page with the chart.",
)
def report(session_id: str | None, as_json: bool, markdown: bool, html_file: str | None) -> None:
    """The savings report of a session (default: the latest), its siblings included.

    SESSION_ID may be a job's id (as `longctx job` prints it): the report
    then sums every pack of the job; so does the default when the latest
    session is one of a job's packs.
    """
    from longctx.jobs import job_of_session, job_report  # a layer above the sessions

    with runtime().open_store() as store:
        if session_id is None:
            sessions = store.sessions.sessions()
            if not sessions:
                raise SessionNotFound(
                    "(latest)",
                    f"no session is stored yet in {store.location}: ask a question first (longctx ask)",
                )
            session_id = sessions[0].id
            job_id = job_of_session(store, session_id)
            result = job_report(store, job_id) if job_id else resume(session_id, store=store).report()
        else:
            try:
                result = resume(session_id, store=store).report()
            except SessionNotFound:
                result = job_report(store, session_id)  # a job's id, else no such session or job
    if html_file:
        save_text(html_file, result.to_page())
        note(f"wrote {html_file}")
    if as_json:
        emit_json(result.to_dict())
    elif markdown:  # questions and cited quotes are the user's and the model's: inert on a terminal
        click.echo(shown(result.to_markdown(), sys.stdout), color=True)
    elif not html_file:
        click.echo(shown(result.to_text(), sys.stdout), color=True)


@main.group()
def sessions() -> None:
    """List, show and delete stored sessions."""


_DEFAULT_LIMIT = 20


@sessions.command("list")
@click.option("--all", "show_all", is_flag=True, help="Include sibling branches, under their batch.")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=_DEFAULT_LIMIT,
    show_default=True,
    help="At most this many sessions, the newest (0: all).",
)
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
def sessions_list(show_all: bool, limit: int, as_json: bool) -> None:
    """Stored sessions, newest first: when, what kind, over what, how large, and their siblings.

    Each row's kind: session (ask, chat), batch (siblings under one
    prefix), fork, sibling (with --all), sharded (map-reduce) or job (a
    pack of `longctx job`, its title naming the job's id and the pack).
    """
    with runtime().open_store() as store:
        records = store.sessions.sessions()
        newest = records[:limit] if limit else records
        rows = [_listed(store, record) for record in newest]
        children = {
            row["id"]: [_listed(store, c) for c in store.sessions.children(row["id"])] for row in rows
        }
        for row in rows:
            row["kind"] = _kind(row, children[row["id"]])
        where = store.location
    if as_json:
        emit_json([{**row, "branches": children[row["id"]] if show_all else None} for row in rows])
        return
    if not rows:
        note(f"no sessions stored in {where}")
    if len(newest) < len(records):
        note(f"the newest {len(newest)} of {len(records)} sessions; --limit 0 lists them all")
    for row in rows:  # questions and titles are text from outside: inert on a terminal
        click.echo(shown(_list_line(row, len(children[row["id"]])), sys.stdout), color=True)
        if show_all:
            for child in children[row["id"]]:
                click.echo(shown("    " + _list_line(child, 0), sys.stdout), color=True)


def _listed(store: Store, record: SessionRecord) -> dict[str, Any]:
    """A session's facts for the listing: its time, source, pack size, turns and first question."""
    turns = store.sessions.turns(record.id)
    pack = store.sessions.pack(record.pack_fingerprint, images=False) if record.pack_fingerprint else None
    living = record.settings.get("living") or {}
    return {
        "id": record.id,
        "kind": record.kind,
        "title": record.title,
        "created_at": record.created_at,
        "parent_id": record.parent_id,
        "turns": len(turns),
        "source": ", ".join(living.get("paths") or []) or record.title,
        "pack_tokens": pack.summary.get("total_tokens") if pack is not None else None,
        "first_question": turns[0].question if turns else None,
        # A job names its pack sessions "job ID: pack": the id to find the job's results by.
        "job_id": record.title.split(":", 1)[0].removeprefix("job ")
        if record.title.startswith("job ")
        else None,
    }


def _kind(row: dict[str, Any], children: list[dict[str, Any]]) -> str:
    """What a listed session is: its stored kind, or for a plain one a batch or a job's pack."""
    if row["kind"] != "session":
        return str(row["kind"])  # fork, sibling, sharded
    if row["title"].startswith("job "):  # a job names its sessions "job ID: pack"
        return "job"
    if not row["turns"] and any(child["kind"] == "sibling" for child in children):
        return "batch"
    return "session"


def _list_line(row: dict[str, Any], branches: int) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(row["created_at"]))
    size = f"{row['pack_tokens']:,} tokens" if row["pack_tokens"] else "no pack"
    count = f"{branches} siblings" if branches and not row["turns"] else f"{row['turns']} turns"
    # A row without a question of its own (a job's pack, a batch) shows its title: the job id and pack.
    question = (row["first_question"] or row["title"] or "").replace("\n", " ")
    question = question if len(question) <= 60 else question[:57] + "..."
    source = _short_source(row["source"])
    return f"{row['id']}  {when}  {row['kind']:<7}  {count:>11}  {size:>14}  {source}  {question}"


def _short_source(source: str) -> str:
    """The listing's source: paths under the current folder relative to it, at most two, then a count.

    The JSON listing keeps every path; a document session over forty PDFs
    would otherwise fill the line with their absolute paths.
    """
    paths = [part for part in source.split(", ") if part]
    if not paths or not all(os.path.isabs(path) for path in paths):
        return source  # a title, not paths
    here = os.getcwd()
    named = [
        os.path.relpath(path, here) if os.path.isabs(path) and path.startswith(here + os.sep) else path
        for path in paths
    ]
    if len(named) > 2:
        return f"{', '.join(named[:2])} (+{len(named) - 2} more)"
    return ", ".join(named)


@sessions.command("prune")
@click.option(
    "--older-than",
    help="Delete sessions last used longer ago than this: 30d, 12h, 90m, 2w (a bare number: days).",
)
@click.option(
    "--keep", type=click.IntRange(min=0), help="Keep the N most recently used sessions, delete the rest."
)
@click.option(
    "--max-size",
    help="Delete the least recently used sessions until the rest hold at most this: 100MB, 1.5GB, 500KiB.",
)
@click.option(
    "--in-use-within",
    default="1h",
    show_default=True,
    help="Sessions used this recently count as in use (a chat, a job) and are never deleted.",
)
@click.option("--dry-run", is_flag=True, help="Only list what would be deleted.")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
def sessions_prune(
    older_than: str | None,
    keep: int | None,
    max_size: str | None,
    in_use_within: str,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Delete empty sessions, and old ones by age, count or size; then compact the store.

    A session goes with its branches (a batch's siblings, forks), its turns,
    requests and counter checks; packs no session uses any more go too, and
    the file is vacuumed. Always deleted: empty sessions (no turn, no
    branch). Never deleted: a session used within --in-use-within. Prints
    the ids deleted, one a line; the summary goes to stderr.
    """
    rule = PruneRule(
        older_than_seconds=None if older_than is None else _seconds(older_than, "--older-than"),
        keep=keep,
        max_bytes=None if max_size is None else _bytes(max_size),
        in_use_seconds=_seconds(in_use_within, "--in-use-within"),
    )
    with runtime().open_store() as store:
        result = store.sessions.prune(rule, dry_run=dry_run)
    if as_json:
        emit_json(dataclasses.asdict(result) | {"freed_bytes": result.freed_bytes})
        return
    for tree in result.pruned:
        click.echo("\n".join(tree.session_ids))
    verb = "would delete" if dry_run else "deleted"
    sessions_count = sum(len(tree.session_ids) for tree in result.pruned)
    summary = (
        f"{verb} {len(result.pruned)} session(s) ({sessions_count} with their branches, "
        f"{sum(tree.turns for tree in result.pruned)} turns, about {_size(result.freed_bytes)}); "
        f"kept {result.kept}, {result.in_use} in use"
    )
    if not dry_run:
        summary += (
            f"; the store went from {_size(result.file_bytes_before)} to {_size(result.file_bytes_after)}"
        )
    note(summary)
    for line in result.notes:
        note(line)


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def _seconds(text: str, flag: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` in seconds; a bare number is days."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if match is None:
        raise click.BadParameter(f"{text!r} is not a duration such as 30d, 12h, 90m", param_hint=flag)
    return float(match[1]) * _DURATION_UNITS[match[2] or "d"]


def _bytes(text: str) -> int:
    """``100MB``, ``1.5GB``, ``500KiB`` in bytes; a bare number is bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match[2].upper() if match else ""
    if match is None or unit not in _SIZE_UNITS:
        raise click.BadParameter(
            f"{text!r} is not a size such as 100MB, 1.5GB, 500KiB", param_hint="--max-size"
        )
    return int(float(match[1]) * _SIZE_UNITS[unit])


def _size(count: int) -> str:
    return f"{count / 10**6:.1f} MB" if count >= 10**5 else f"{count / 10**3:.1f} kB"


@sessions.command("show")
@click.argument("session_id")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
def sessions_show(session_id: str, as_json: bool) -> None:
    """A session's turns, then the answers of its batches (sibling questions), by the turn they follow."""
    with runtime().open_store() as store:
        session = Session.resume(session_id, store=store)
        siblings = [
            (child, turns[0])
            for child in store.sessions.children(session.id)
            if child.kind == "sibling" and (turns := store.sessions.turns(child.id))
        ]
        siblings = _in_question_order(store, siblings)
    if as_json:
        emit_json(
            {
                "id": session.id,
                "title": session.title,
                "turns": [{"question": t.question, "answer": t.answer} for t in session.turns],
                "siblings": [
                    {
                        "session_id": child.id,
                        "after_turns": child.parent_turns,
                        "question": turn.question,
                        "answer": turn.answer,
                    }
                    for child, turn in siblings
                ],
            }
        )
        return
    click.echo(f"session {session.id}: {session.title}")
    for number, turn in enumerate(session.turns, start=1):  # numbered as the chat and the report number them
        click.echo(shown(f"\n[turn {number}] > {turn.question}\n{turn.answer}", sys.stdout), color=True)
    points = sorted({child.parent_turns or 0 for child, _ in siblings})
    for point in points:
        batch = [(child, turn) for child, turn in siblings if (child.parent_turns or 0) == point]
        click.echo(f"\n-- batch of {len(batch)} sibling answers after {point} turns --")
        for child, turn in batch:
            click.echo(shown(f"\n[{child.id}] > {turn.question}\n{turn.answer}", sys.stdout), color=True)


def _in_question_order(
    store: Store, siblings: list[tuple[SessionRecord, Any]]
) -> list[tuple[SessionRecord, Any]]:
    """``siblings`` batch by batch (the first answered first), each batch in its questions' order.

    Each sibling keeps its place among its batch's questions (``batch_index``,
    set since longctx 0.1.x); older ones keep the order they were stored in.
    """
    batch_of = {
        request.session_id: request.batch_id
        for request in store.sessions.requests(session_ids=[child.id for child, _ in siblings])
    } if siblings else {}  # fmt: skip
    started: dict[str | None, float] = {}
    for child, _ in siblings:
        batch = batch_of.get(child.id)
        started[batch] = min(started.get(batch, child.created_at), child.created_at)

    def place(pair: tuple[SessionRecord, Any]) -> tuple[float, int, float]:
        child = pair[0]
        return (started[batch_of.get(child.id)], int(child.settings.get("batch_index", 0)), child.created_at)

    return sorted(siblings, key=place)


@sessions.command("delete")
@click.argument("session_id")
def sessions_delete(session_id: str) -> None:
    """Delete a session, its turns and its requests."""
    with runtime().open_store() as store:
        store.sessions.delete_session(session_id)
    note(f"deleted session {session_id}")
