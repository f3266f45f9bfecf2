"""The command line in process (click's CliRunner), against a fake server given through ``Runtime``.

The subprocess tests in test_cli.py keep the installed entry point and the
real engines honest; these reach what a subprocess cannot: an injected
backend, and the one error boundary, with every exit code from one place.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from fake_engine import FakeEngine

from longctx.backends.base import Backend
from longctx.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, Runtime, main
from longctx.cli.app import COMMAND_MODULES, COMMAND_SUMMARIES
from longctx.retry import instant_retries
from longctx.store import SessionLog

URL = "http://fake-engine:8000/v1"


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "a.py").write_text("def a():\n    return 1\n")
    (root / "README.md").write_text("# project\n")
    return root


def invoke(backend: Backend | None, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), obj=Runtime(backend=backend), input=stdin)


def test_ask_prints_the_answer_and_the_summary_apart(
    backend: Backend, fake: FakeEngine, repository: Path
) -> None:
    result = invoke(backend, "ask", str(repository), "What is a?", "--quiet")
    assert result.exit_code == EXIT_OK, result.output
    assert result.stdout == fake.answer + "\n"
    assert fake.prompts and "def a():" in fake.prompts[-1]

    loud = invoke(backend, "ask", str(repository), "And again?")
    assert loud.stdout == fake.answer + "\n"
    assert "session " in loud.stderr and "prompt tokens" in loud.stderr


def test_ask_json_is_the_answer_and_its_report(backend: Backend, repository: Path) -> None:
    result = invoke(backend, "ask", str(repository), "What is a?", "--json")
    assert result.exit_code == EXIT_OK, result.output
    data = json.loads(result.stdout)
    assert data["question"] == "What is a?"
    assert set(data["usage"]) >= {"prompt_tokens", "cached_tokens", "ttft_seconds", "cached_reason"}
    assert data["report"]["requests"][0]["id"]


def test_batch_answers_every_question_as_siblings(
    backend: Backend, fake: FakeEngine, repository: Path
) -> None:
    result = invoke(
        backend, "batch", str(repository), "--questions", "-", "-q", stdin="one?\ntwo?\n\nthree?\n"
    )
    assert result.exit_code == EXIT_OK, result.output
    assert [line for line in result.stdout.splitlines() if line.startswith("## ")] == [
        "## one?",
        "## two?",
        "## three?",
    ]
    assert len(fake.chat_bodies) == 3


def test_an_empty_questions_file_is_a_usage_error(backend: Backend, repository: Path) -> None:
    result = invoke(backend, "batch", str(repository), "--questions", "-", stdin="\n\n")
    assert result.exit_code == EXIT_USAGE
    assert result.stderr == "longctx: error: the questions file holds no questions\n"


def test_chat_then_report_and_sessions_from_the_store(
    backend: Backend, repository: Path, tmp_path: Path
) -> None:
    chat = invoke(backend, "chat", str(repository), "--json", stdin="first?\nsecond?\n")
    assert chat.exit_code == EXIT_OK, chat.output
    turns = [json.loads(line) for line in chat.stdout.splitlines()]
    assert [turn["turn"] for turn in turns] == [1, 2]  # numbered as the chat numbers them
    session_id = turns[0]["session_id"]

    report = invoke(None, "report", session_id, "--json")
    assert report.exit_code == EXIT_OK, report.output
    # chat warms its pack first: that request is in the report like the two turns.
    purposes = [line["purpose"] for line in json.loads(report.stdout)["requests"]]
    assert purposes == ["warm", "turn", "turn"]

    listed = json.loads(invoke(None, "sessions", "list", "--json").stdout)
    assert [row["id"] for row in listed] == [session_id]
    assert listed[0]["turns"] == 2


def test_a_session_resumed_by_chat_keeps_its_turns(backend: Backend, repository: Path) -> None:
    first = invoke(backend, "ask", str(repository), "first?", "--json")
    session_id = json.loads(first.stdout)["session_id"]
    resumed = invoke(backend, "chat", "--session", session_id, "--json", stdin="then?\n")
    assert resumed.exit_code == EXIT_OK, resumed.output
    assert json.loads(resumed.stdout.splitlines()[0])["turn"] == 2


def test_pack_json_in_process(repository: Path) -> None:
    result = invoke(None, "pack", str(repository), "--json")
    assert result.exit_code == EXIT_OK, result.output
    data = json.loads(result.stdout)
    assert {entry["path"] for entry in data["manifest"]["entries"]} >= {"a.py", "README.md"}
    assert data["reused"] is False
    assert "packed 2 documents" in result.stderr


def test_doctor_uses_the_given_backend_and_leaves_it_open(backend: Backend, fake: FakeEngine) -> None:
    result = invoke(backend, "doctor", "--json", "--no-probe")
    assert result.exit_code == EXIT_OK, result.output
    assert json.loads(result.stdout)["replicas"][0]["servers"][0]["model"] == fake.model
    assert backend.info.model == fake.model  # still usable: a given backend is not closed


def test_every_error_leaves_through_one_boundary(repository: Path, tmp_path: Path) -> None:
    missing = invoke(None, "pack", str(tmp_path / "nowhere"))
    assert missing.exit_code == EXIT_BAD_INPUT
    assert missing.stderr.startswith("longctx: error: ") and "Traceback" not in missing.output

    with instant_retries():
        unreachable = invoke(None, "ask", str(repository), "q?", "--base-url", "http://127.0.0.1:9/v1", "-q")
    assert unreachable.exit_code == EXIT_UNREACHABLE
    assert unreachable.stderr.count("\n") == 1 and "127.0.0.1:9" in unreachable.stderr

    bad_option = invoke(None, "pack", str(repository), "--max-files", "0")
    assert bad_option.exit_code == EXIT_USAGE and "max_files" in bad_option.stderr


def test_a_bug_is_not_swallowed_by_the_boundary(
    backend: Backend, repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: SessionLog, *, include_branches: bool = False) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(SessionLog, "sessions", broken)
    result = invoke(backend, "report")
    assert isinstance(result.exception, RuntimeError)


def test_commands_load_their_module_on_demand() -> None:
    listed = CliRunner().invoke(main, ["--help"])
    assert listed.exit_code == EXIT_OK
    for name in COMMAND_MODULES:
        assert f"  {name}" in listed.stdout


def test_help_lists_every_command_without_importing_command_modules() -> None:
    """`longctx --help` shows each command's own summary, and imports no command module (nor openai)."""
    import importlib

    assert set(COMMAND_SUMMARIES) == set(COMMAND_MODULES)
    for name, module in COMMAND_MODULES.items():
        importlib.import_module(module)
        assert main.commands[name].get_short_help_str(limit=500) == COMMAND_SUMMARIES[name], name
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from longctx.cli import main\n"
        "result = CliRunner().invoke(main, ['--help'])\n"
        "assert result.exit_code == 0, result.output\n"
        "assert 'Ask every question of a file about PATHS' in result.output\n"
        "loaded = [m for m in ('openai', 'longctx.sessions', 'longctx.cli.questions') if m in sys.modules]\n"
        "print(','.join(loaded))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


def test_every_exit_code_is_distinct_and_documented() -> None:
    from longctx.cli import app

    constants = {
        name: value
        for name, value in vars(app).items()
        if name.startswith("EXIT_") and isinstance(value, int)
    }
    assert len(set(constants.values())) == len(constants), f"two outcomes share an exit code: {constants}"
    assert set(app.EXIT_CODES) == set(constants.values()), "every exit code has its meaning in EXIT_CODES"
    documented = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    table = dict(re.findall(r"^\| (\d+) \| (.+) \|$", documented, flags=re.MULTILINE))
    assert {int(code) for code in table} == set(app.EXIT_CODES)
    assert all(table[str(code)] == meaning for code, meaning in app.EXIT_CODES.items())


def test_the_server_settings_come_from_the_environment_through_config(
    repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from longctx.options.groups import ServerOptions

    assert not ServerOptions().names_a_server()
    monkeypatch.setenv("LONGCTX_BASE_URL", "http://127.0.0.1:9/v1")
    assert ServerOptions().names_a_server() and ServerOptions().base_urls() == ("http://127.0.0.1:9/v1",)
    # `pack` counts with the server LONGCTX_BASE_URL names (none answers there: exit 3).
    with instant_retries():
        result = invoke(None, "pack", str(repository), "--json")
    assert result.exit_code == EXIT_UNREACHABLE, result.output
    assert "127.0.0.1:9" in result.stderr


def test_help_imports_neither_the_options_nor_the_store() -> None:
    """`longctx --help` starts at once: the option objects, the store and JSON load with a command."""
    import subprocess
    import sys

    script = (
        "import sys\nfrom longctx.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('longctx.options.groups', 'longctx.store', 'longctx.cli.flags',"
        " 'json', 'sqlite3') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout


def test_version_names_the_installed_distribution_from_the_project_root() -> None:
    # From the project's root an editable install is found twice (the build's egg-info beside the
    # site-packages dist-info), so the import name maps to two distributions: --version asks for
    # the distribution by its own name (it crashed with click's "maps to multiple" error).
    from importlib.metadata import version

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "longctx", "--version"], cwd=root, capture_output=True, text=True, check=False
    )
    assert done.returncode == EXIT_OK, done.stderr
    assert done.stdout.strip() == f"longctx, version {version('longctx-sdk')}"
