"""``longctx report`` and ``longctx sessions``: what the store holds."""

from __future__ import annotations

import os
import time
from typing import Any

import click

from longctx.cli.app import emit_json, main, note, runtime
from longctx.errors import SessionNotFound
from longctx.outputs import save_text
from longctx.sessions import Session, resume
from longctx.store import SessionRecord, Store


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
    from longctx.jobs.stored import job_of_session, job_report  # a layer above the sessions

    with runtime().open_store() as store:
        if session_id is None:
            sessions = store.sessions.sessions()
            if not sessions:
                raise SessionNotFound(
                    "(latest)",
                    f"no session is stored yet in {store.path}: ask a question first (longctx ask)",
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
    elif markdown:
        click.echo(result.to_markdown())
    elif not html_file:
        click.echo(result.to_text())


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
    pack of `longctx job`).
    """
    with runtime().open_store() as store:
        records = store.sessions.sessions()
        shown = records[:limit] if limit else records
        rows = [_listed(store, record) for record in shown]
        children = {
            row["id"]: [_listed(store, c) for c in store.sessions.children(row["id"])] for row in rows
        }
        for row in rows:
            row["kind"] = _kind(row, children[row["id"]])
        where = store.path
    if as_json:
        emit_json([{**row, "branches": children[row["id"]] if show_all else None} for row in rows])
        return
    if not rows:
        note(f"no sessions stored in {where}")
    if len(shown) < len(records):
        note(f"the newest {len(shown)} of {len(records)} sessions; --limit 0 lists them all")
    for row in rows:
        click.echo(_list_line(row, len(children[row["id"]])))
        if show_all:
            for child in children[row["id"]]:
                click.echo("    " + _list_line(child, 0))


def _listed(store: Store, record: SessionRecord) -> dict[str, Any]:
    """A session's facts for the listing: its time, source, pack size, turns and first question."""
    turns = store.sessions.turns(record.id)
    pack = store.sessions.pack(record.pack_fingerprint) if record.pack_fingerprint else None
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
    question = (row["first_question"] or "").replace("\n", " ")
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
    shown = [
        os.path.relpath(path, here) if os.path.isabs(path) and path.startswith(here + os.sep) else path
        for path in paths
    ]
    if len(shown) > 2:
        return f"{', '.join(shown[:2])} (+{len(shown) - 2} more)"
    return ", ".join(shown)


@sessions.command("prune")
@click.option(
    "--older-than",
    "days",
    type=click.FloatRange(min=0),
    help="Also delete sessions created more than this many days ago.",
)
@click.option("--dry-run", is_flag=True, help="Only list what would be deleted.")
def sessions_prune(days: float | None, dry_run: bool) -> None:
    """Delete empty sessions (no turn, no branch), and with --older-than DAYS the old ones."""
    cutoff = time.time() - days * 86400 if days is not None else None
    with runtime().open_store() as store:
        doomed = [
            record
            for record in store.sessions.sessions(include_branches=True)
            if (cutoff is not None and record.created_at < cutoff)
            or (not store.sessions.turns(record.id) and not store.sessions.children(record.id))
        ]
        if not dry_run:
            for record in doomed:
                store.sessions.delete_session(record.id)
    for record in doomed:
        click.echo(record.id)
    note(f"{'would delete' if dry_run else 'deleted'} {len(doomed)} session(s)")


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
    if as_json:
        emit_json(
            {
                "id": session.id,
                "title": session.title,
                "turns": [{"question": t.question, "answer": t.answer} for t in session.turns],
                "siblings": [
                    {"session_id": child.id, "after_turns": child.parent_turns, "question": turn.question,
                     "answer": turn.answer}
                    for child, turn in siblings
                ],
            }
        )  # fmt: skip
        return
    click.echo(f"session {session.id}: {session.title}")
    for index, turn in enumerate(session.turns):
        click.echo(f"\n[{index}] > {turn.question}\n{turn.answer}")
    points = sorted({child.parent_turns or 0 for child, _ in siblings})
    for point in points:
        batch = [(child, turn) for child, turn in siblings if (child.parent_turns or 0) == point]
        click.echo(f"\n-- batch of {len(batch)} sibling answers after {point} turns --")
        for child, turn in batch:
            click.echo(f"\n[{child.id}] > {turn.question}\n{turn.answer}")


@sessions.command("delete")
@click.argument("session_id")
def sessions_delete(session_id: str) -> None:
    """Delete a session, its turns and its requests."""
    with runtime().open_store() as store:
        store.sessions.delete_session(session_id)
    note(f"deleted session {session_id}")
