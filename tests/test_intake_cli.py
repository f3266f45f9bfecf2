"""The first day on the command line: skipped files said, one-line errors, help without markup, listings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from longctx.backends.base import Backend
from longctx.cli import EXIT_BAD_INPUT, EXIT_OK, Runtime, main
from longctx.cli.app import COMMAND_MODULES
from longctx.sessions import resume
from longctx.store import Store


def invoke(backend: Backend | None, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), obj=Runtime(backend=backend), input=stdin)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A plain folder (no git) with a virtual environment, compiled files and a file over the limit."""
    root = tmp_path / "project"
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("def mod():\n    return 1\n")
    (root / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\x00\x01")
    (root / ".venv" / "lib").mkdir(parents=True)
    (root / ".venv" / "lib" / "site.py").write_text("SITE = 1\n")
    (root / "huge.log").write_text("x" * 20_000)  # over the --max-file-bytes the tests pass
    return root


def test_one_document_is_one_document(tmp_path: Path) -> None:
    (tmp_path / "only.md").write_text("# only\n")
    result = invoke(None, "pack", str(tmp_path), "--tokenizer", "estimate", "-o", str(tmp_path / "p.txt"))
    assert result.exit_code == EXIT_OK, result.output
    assert result.stderr.startswith("packed 1 document: ")


def test_pack_leaves_out_tool_folders_outside_git_unless_asked(folder: Path, tmp_path: Path) -> None:
    default = invoke(None, "pack", str(folder), "--tokenizer", "estimate", "--json")
    assert default.exit_code == EXIT_OK, default.output
    entries = {entry["path"]: entry for entry in json.loads(default.stdout)["manifest"]["entries"]}
    assert entries[".venv/"]["reason"] == entries["pkg/__pycache__/"]["reason"] == "ignored-by-default"
    assert ".venv/lib/site.py" not in entries
    everything = invoke(
        None, "pack", str(folder), "--tokenizer", "estimate", "--json", "--no-default-ignores"
    )
    entries = {entry["path"]: entry for entry in json.loads(everything.stdout)["manifest"]["entries"]}
    assert entries[".venv/lib/site.py"]["status"] == "included"


def test_pack_json_prints_an_error_as_json(tmp_path: Path) -> None:
    result = invoke(None, "pack", str(tmp_path / "missing"), "--json")
    assert result.exit_code == EXIT_BAD_INPUT
    error = json.loads(result.stdout)["error"]
    assert error["type"] == "InputError" and error["exit_code"] == EXIT_BAD_INPUT
    assert "no such file or folder" in error["message"]


@pytest.mark.parametrize(
    ("choice", "words"),
    [("/nonexistent/model", "does not exist"), ("no_such_encoding", "no tiktoken encoding is named")],
)
def test_a_tokenizer_that_cannot_be_had_is_one_line(tmp_path: Path, choice: str, words: str) -> None:
    (tmp_path / "a.md").write_text("a\n")
    result = invoke(None, "pack", str(tmp_path), "--tokenizer", choice, "-o", str(tmp_path / "p.txt"))
    assert result.exit_code != EXIT_OK
    assert result.stderr.count("\n") == 1 and words in result.stderr, result.stderr
    assert "are you on latest" not in result.stderr


def _help_texts() -> dict[str, str]:
    texts = {name: invoke(None, name, "--help").stdout for name in sorted(COMMAND_MODULES)}
    for sub in ("list", "show", "delete", "prune"):
        texts[f"sessions {sub}"] = invoke(None, "sessions", sub, "--help").stdout
    return texts


def test_no_help_text_shows_docstring_markup() -> None:
    for name, text in _help_texts().items():
        assert text, name
        assert "``" not in text and ":mod:`" not in text and ":class:`" not in text, (name, text)


def test_ask_says_how_many_paths_were_skipped_and_how_to_list_them(backend: Backend, folder: Path) -> None:
    result = invoke(backend, "ask", str(folder), "What does mod return?", "--max-file-bytes", "10000")
    assert result.exit_code == EXIT_OK, result.output
    line = next(line for line in result.stderr.splitlines() if line.startswith("skipped "))
    assert line == (
        f"skipped 3 paths (2 ignored-by-default, 1 too-large); list them: longctx pack {folder} --json"
    )
    quiet = invoke(backend, "ask", str(folder), "Again?", "-q", "--max-file-bytes", "10000")
    assert "skipped" not in quiet.stderr


def test_chat_says_so_too(backend: Backend, folder: Path) -> None:
    result = invoke(backend, "chat", str(folder), "--max-file-bytes", "10000", stdin="What is mod?\n\n")
    assert result.exit_code == EXIT_OK, result.output
    assert "skipped 3 paths (2 ignored-by-default, 1 too-large)" in result.stderr


def test_sessions_list_names_each_kind_and_takes_a_limit(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("LONGCTX_HOME", str(home))
    source = tmp_path / "docs"
    source.mkdir()
    (source / "a.md").write_text("# a\n")
    assert invoke(backend, "ask", str(source), "first?").exit_code == EXIT_OK
    assert (
        invoke(backend, "batch", str(source), "--questions", "-", stdin="one?\ntwo?\n").exit_code == EXIT_OK
    )
    with Store.open(home) as store:
        asked = store.sessions.sessions()[-1].id  # the oldest: the ask
        with resume(asked, store=store, backend=backend) as session:
            session.fork(at=1)
    listed = json.loads(invoke(None, "sessions", "list", "--json").stdout)
    assert sorted(row["kind"] for row in listed) == ["batch", "fork", "session"]
    lines = invoke(None, "sessions", "list").stdout.splitlines()
    assert [line.split()[3] for line in lines] == [row["kind"] for row in listed]
    limited = invoke(None, "sessions", "list", "--limit", "1")
    assert len(limited.stdout.splitlines()) == 1
    assert "the newest 1 of 3 sessions; --limit 0 lists them all" in limited.stderr
    assert len(invoke(None, "sessions", "list", "--limit", "0").stdout.splitlines()) == 3
