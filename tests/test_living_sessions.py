"""Living sessions and the CLI's interruption and saving paths, against the fake server.

The same behaviour against the real engines: test_session_engines.py
(a file edited between turns) and test_cli.py (chat, Ctrl-C, resume).
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from fake_engine import FakeEngine, Fault

from longctx.backends.base import Backend
from longctx.cli import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, Runtime, main
from longctx.cli.app import exit_code
from longctx.errors import OutputError, ServerError
from longctx.options.groups import RequestOptions
from longctx.retry import instant_retries
from longctx.sessions import RepoSession, Session
from longctx.sessions.answers import Answer
from longctx.store import Store

URL = "http://fake-engine:8000/v1"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "home")


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "a.py").write_text("def a():\n    return 1\n")
    (root / "b.py").write_text("def b():\n    return 2\n")
    (root / "README.md").write_text("# project\n")
    return root


def invoke(backend: Backend | None, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), obj=Runtime(backend=backend), input=stdin)


def last_user_message(fake: FakeEngine) -> str:
    content: str = fake.chat_bodies[-1]["messages"][-1]["content"]
    return content


def test_changed_added_deleted_and_renamed_files_are_appended_once(
    backend: Backend, fake: FakeEngine, store: Store, repository: Path
) -> None:
    session = RepoSession(repository, backend=backend, store=store)
    session.ask("first?")
    (repository / "a.py").write_text("def a():\n    return 'edited'\n")
    (repository / "c.py").write_text("NEW = True\n")
    (repository / "README.md").unlink()
    (repository / "b.py").rename(repository / "moved.py")
    answer = session.ask("second?")
    assert answer.appended is not None
    assert sorted(change.describe() for change in answer.appended.changes) == [
        "README.md deleted",
        "a.py changed",
        "b.py renamed to moved.py",
        "c.py added",
    ]
    sent = last_user_message(fake)
    assert sent.endswith("</files-changed>\nsecond?")
    assert "return 'edited'" in sent and "NEW = True" in sent
    assert "[deleted] README.md" in sent and "[renamed] b.py -> moved.py" in sent
    # The earlier messages went out unchanged: the cached prefix is intact.
    assert fake.chat_bodies[-1]["messages"][:2] == fake.chat_bodies[0]["messages"][:2]
    assert fake.chat_bodies[-1]["messages"][1]["content"].endswith("first?")
    # Seen once, never again; and the history keeps the block where it was sent.
    again = session.ask("third?")
    assert again.appended is None and last_user_message(fake) == "third?"
    assert fake.chat_bodies[-1]["messages"][3]["content"] == sent
    assert answer.to_dict()["appended"]


def test_follow_changes_off_appends_nothing(
    backend: Backend, fake: FakeEngine, store: Store, repository: Path
) -> None:
    session = RepoSession(
        repository, backend=backend, store=store, request=RequestOptions(follow_changes=False)
    )
    session.ask("first?")
    (repository / "a.py").write_text("changed\n")
    answer = session.ask("second?")
    assert answer.appended is None and last_user_message(fake) == "second?"


def test_changes_of_a_failed_turn_are_sent_with_the_next(
    backend: Backend, fake: FakeEngine, store: Store, repository: Path
) -> None:
    session = RepoSession(repository, backend=backend, store=store)
    session.ask("first?")
    (repository / "a.py").write_text("changed\n")
    fake.faults.extend([Fault(status=500)] * 10)
    with instant_retries(), pytest.raises(ServerError):
        session.ask("lost?")
    fake.faults.clear()
    answer = session.ask("second?")
    assert answer.appended is not None and "changed\n" in last_user_message(fake)


def test_a_resumed_session_renders_its_appended_turns_and_keeps_following(
    backend: Backend, fake: FakeEngine, store: Store, repository: Path
) -> None:
    with RepoSession(repository, backend=backend, store=store) as session:
        session.ask("first?")
        (repository / "a.py").write_text("changed\n")
        session.ask("second?")
        expected = session.messages("next")
    resumed = Session.resume(session.id, backend, store=store)
    assert resumed.messages("next") == expected
    (repository / "b.py").write_text("changed too\n")
    answer = resumed.ask("third?")
    assert answer.appended is not None
    assert [change.describe() for change in answer.appended.changes] == ["b.py changed"]
    assert any("appended 1 changed file(s): a.py" in note for note in resumed.report().notes)


def test_chat_says_what_was_appended_in_the_turn_line(
    backend: Backend, repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LONGCTX_HOME", str(tmp_path / "home"))
    original = Session.ask

    def edit_then_ask(self: Session, question: str, **kwargs: object) -> Answer:
        if question == "second?":
            (repository / "a.py").write_text("changed\n")
        return original(self, question, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Session, "ask", edit_then_ask)
    result = invoke(backend, "chat", str(repository), stdin="first?\nsecond?\n\n")
    assert result.exit_code == EXIT_OK, result.output
    assert "[turn 1: " in result.stderr and "appended 1 changed file (a.py changed)]" in result.stderr
    quiet = invoke(backend, "chat", str(repository), "--no-follow-changes", stdin="first?\nsecond?\n\n")
    assert quiet.exit_code == EXIT_OK and "appended" not in quiet.stderr


def test_ctrl_c_in_batch_prints_the_answers_done_and_exits_130(
    backend: Backend, repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LONGCTX_HOME", str(tmp_path / "home"))
    original = Session.ask_many

    def interrupted(self: Session, questions: list[str], **kwargs: object) -> None:
        on_answer = kwargs.pop("on_answer")

        def first_two(answer: Answer) -> None:
            on_answer(answer)  # type: ignore[operator]
            if answer.question == "q1?":
                raise KeyboardInterrupt

        original(self, questions[:2], on_answer=first_two, concurrency=1)

    monkeypatch.setattr(Session, "ask_many", interrupted)
    questions = tmp_path / "questions.txt"
    questions.write_text("q0?\nq1?\nq2?\n")
    result = invoke(backend, "batch", str(repository), "--questions", str(questions))
    assert result.exit_code == EXIT_INTERRUPTED, result.output
    assert result.stdout.count("## q") == 2
    assert "2 of 3 questions answered and stored in session" in result.stderr
    assert "Aborted" not in result.output


def test_pack_json_to_a_file_goes_through_the_saving_path(repository: Path, tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    result = invoke(None, "pack", str(repository), "--json", "-o", str(target), "--quiet")
    assert result.exit_code == EXIT_OK, result.output
    assert result.stdout == ""
    assert json.loads(target.read_text())["pack"]["document_count"] == 3
    again = invoke(None, "pack", str(repository), "--json", "-o", str(target))
    assert "already held this summary: left as it was" in again.stderr


def test_report_html_to_a_missing_folder_is_one_clear_error(
    backend: Backend, repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LONGCTX_HOME", str(tmp_path / "home"))
    assert invoke(backend, "ask", str(repository), "q?").exit_code == EXIT_OK
    target = tmp_path / "missing" / "report.html"
    result = invoke(backend, "report", "--html", str(target))
    assert result.exit_code == exit_code(OutputError("any", path=str(target)))
    assert "longctx: error:" in result.stderr and str(target) in result.stderr
    assert "Traceback" not in result.output


def test_resume_refuses_paths_and_pack_options_and_applies_max_tokens(
    backend: Backend, fake: FakeEngine, repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LONGCTX_HOME", str(tmp_path / "home"))
    assert invoke(backend, "ask", str(repository), "q?", "--cache-salt", "s1").exit_code == EXIT_OK
    session_id = Store.open(tmp_path / "home").sessions.sessions()[0].id
    refused = {
        "PATHS cannot be given with --session": [str(repository)],
        "--cache-salt cannot change on resume": ["--cache-salt", "s2"],
        "--include cannot be given with --session": ["--include", "*.py"],
        "--max-stale-share cannot be given with --session": ["--max-stale-share", "0"],
    }
    for message, extra in refused.items():
        result = invoke(backend, "chat", "--session", session_id, *extra, stdin="")
        assert result.exit_code == EXIT_USAGE and message in result.stderr, (extra, result.output)
    same_salt = invoke(backend, "chat", "--session", session_id, "--cache-salt", "s1", stdin="")
    assert same_salt.exit_code == EXIT_OK, same_salt.output
    applied = invoke(backend, "chat", "--session", session_id, "--max-tokens", "7", stdin="more?\n")
    assert applied.exit_code == EXIT_OK, applied.output
    assert "applying --max-tokens 7 to the resumed session" in applied.stderr
    assert fake.chat_bodies[-1]["max_tokens"] == 7 and fake.chat_bodies[-1].get("cache_salt") == "s1"


@pytest.fixture
def html_server() -> Iterator[str]:
    """A web server that is not an LLM server: every path is an HTML 404 page."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html><body><h1>Not Found</h1>" + b"x" * 5000 + b"</body></html>"
            self.send_response(404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_doctor_names_a_non_llm_server_in_one_line_and_reports_each_replica_in_json(
    html_server: str,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    result = invoke(None, "doctor", "--base-url", f"{html_server},{dead}", "--json", "--no-probe")
    assert result.exit_code != EXIT_OK
    data = json.loads(result.stdout)
    assert data["ok"] is False
    assert [replica["url"] for replica in data["replicas"]] == [html_server, dead]
    assert "not an OpenAI-compatible LLM server" in data["replicas"][0]["error"]
    assert "\n" not in data["replicas"][0]["error"] and "xxxx" not in data["replicas"][0]["error"]
    assert data["replicas"][1]["ok"] is False and data["replicas"][1]["error"]
    text = invoke(None, "doctor", "--base-url", html_server, "--no-probe")
    assert text.stdout.count("\n") == 1 and "<html" not in text.output


def test_sessions_list_shows_time_source_size_and_siblings_and_prune_removes_empties(
    backend: Backend, repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LONGCTX_HOME", str(tmp_path / "home"))
    assert invoke(backend, "ask", str(repository), "What is a?").exit_code == EXIT_OK
    questions = tmp_path / "questions.txt"
    questions.write_text("q0?\nq1?\n")
    assert invoke(backend, "batch", str(repository), "--questions", str(questions)).exit_code == EXIT_OK
    # An empty chat keeps nothing; an empty session stored some other way (a
    # fork's parent, an older longctx) is pruned.
    empty_chat = invoke(backend, "chat", str(repository), stdin="\n")
    assert empty_chat.exit_code == EXIT_OK and "not kept" in empty_chat.stderr
    home = Store.open(tmp_path / "home")
    empty = Session(backend, store=home)
    empty.persist()
    listing = invoke(backend, "sessions", "list", "--all")
    lines = listing.stdout.splitlines()
    assert listing.exit_code == EXIT_OK and len(lines) == 3 + 2, listing.stdout
    batch_line = next(line for line in lines if "2 siblings" in line)
    assert str(repository) in batch_line and "tokens" in batch_line
    assert any("What is a?" in line for line in lines)
    assert sum(line.startswith("    ") and "q" in line for line in lines) == 2
    data = json.loads(invoke(backend, "sessions", "list", "--json", "--all").stdout)
    assert {row["source"] for row in data if row["pack_tokens"]} == {str(repository)}

    dry = invoke(backend, "sessions", "prune", "--dry-run")
    assert dry.stdout.split() == [empty.id] and len(home.sessions.sessions()) == 3
    assert invoke(backend, "sessions", "prune").stdout.split() == [empty.id]
    assert len(home.sessions.sessions()) == 2
    # Just used: in use, unless told that nothing is.
    assert invoke(backend, "sessions", "prune", "--older-than", "0").stdout == ""
    old = invoke(backend, "sessions", "prune", "--older-than", "0", "--in-use-within", "0s")
    assert len(old.stdout.split()) == 2 + 2 and home.sessions.sessions() == []


def test_a_resumed_repo_session_is_a_repo_session_over_its_paths_and_stored_pack(
    backend: Backend, fake: FakeEngine, store: Store, repository: Path
) -> None:
    from longctx import resume

    session = RepoSession(repository, backend=backend, store=store)
    session.ask("first?")
    first_prompt = fake.chat_bodies[-1]["messages"]
    (repository / "a.py").write_text("def a():\n    return 'edited after the turn'\n")
    for resumed in (
        RepoSession.resume(session.id, backend, store=store),
        resume(session.id, backend, store=store),
    ):
        assert type(resumed) is RepoSession
        assert [str(path) for path in resumed.paths] == [str(repository.resolve())]
        assert resumed.pack == session.pack  # the pack its history was built on, not a re-pack
    answer = resumed.ask("second?")
    sent = fake.chat_bodies[-1]["messages"]
    assert sent[: len(first_prompt) - 1] == first_prompt[:-1]  # the cached prefix is kept
    assert answer.appended is not None and [c.describe() for c in answer.appended.changes] == ["a.py changed"]
