"""``longctx report`` and ``longctx sessions``: what the store holds."""

from __future__ import annotations

import click

from longctx.cli.app import emit_json, main, note, runtime
from longctx.errors import SessionNotFound
from longctx.outputs import save_text
from longctx.sessions import Session, resume


@main.command()
@click.argument("session_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
@click.option("--markdown", is_flag=True, help="Markdown on stdout.")
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False, writable=True),
    help="Write a self-contained HTML page with the chart.",
)
def report(session_id: str | None, as_json: bool, markdown: bool, html_file: str | None) -> None:
    """The savings report of a session (default: the latest), its siblings included."""
    with runtime().open_store() as store:
        if session_id is None:
            sessions = store.sessions()
            if not sessions:
                raise SessionNotFound("(latest)")
            session_id = sessions[0].id
        result = resume(session_id, store=store).report()
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


@sessions.command("list")
@click.option("--all", "show_all", is_flag=True, help="Include sibling branches.")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
def sessions_list(show_all: bool, as_json: bool) -> None:
    """Stored sessions, newest first."""
    with runtime().open_store() as store:
        rows = [(record, len(store.turns(record.id))) for record in store.sessions(include_branches=show_all)]
    if as_json:
        emit_json(
            [
                {
                    "id": record.id,
                    "kind": record.kind,
                    "title": record.title,
                    "created_at": record.created_at,
                    "parent_id": record.parent_id,
                    "turns": turns,
                }
                for record, turns in rows
            ]
        )
        return
    for record, turns in rows:
        click.echo(f"{record.id}  {record.kind:<7}  {turns:>3} turns  {record.title}")


@sessions.command("show")
@click.argument("session_id")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
def sessions_show(session_id: str, as_json: bool) -> None:
    """A session's turns."""
    with runtime().open_store() as store:
        session = Session.resume(session_id, store=store)
    if as_json:
        emit_json(
            {
                "id": session.id,
                "title": session.title,
                "turns": [{"question": t.question, "answer": t.answer} for t in session.turns],
            }
        )
        return
    click.echo(f"session {session.id}: {session.title}")
    for index, turn in enumerate(session.turns):
        click.echo(f"\n[{index}] > {turn.question}\n{turn.answer}")


@sessions.command("delete")
@click.argument("session_id")
def sessions_delete(session_id: str) -> None:
    """Delete a session, its turns and its requests."""
    with runtime().open_store() as store:
        store.delete_session(session_id)
    note(f"deleted session {session_id}")
