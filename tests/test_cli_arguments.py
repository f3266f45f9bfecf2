"""``ask``'s arguments as a person types them, and the distribution's name; no server is contacted.

A forgotten question, or a second repository taken for the question, is a
usage error naming what to type; --question takes a question that is
also a path. The same through the installed entry point: test_cli.py.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from fake_engine import FakeEngine

from longctx.backends.base import connect
from longctx.cli import EXIT_OK, EXIT_USAGE, Runtime, main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "a.py").write_text("def a():\n    return 1\n")
    return root


def invoke(*args: str, fake: FakeEngine | None = None) -> Result:
    backend = None if fake is None else connect("http://fake:8000/v1", transport=fake.transport())
    return CliRunner().invoke(main, list(args), obj=Runtime(backend=backend))


def test_ask_with_the_question_forgotten_says_so(repository: Path) -> None:
    result = invoke("ask", str(repository))
    assert result.exit_code == EXIT_USAGE
    assert "the question is missing" in result.stderr and "existing path" in result.stderr
    assert "Missing argument" not in result.stderr


def test_ask_with_two_paths_and_no_question_refuses_to_take_a_path_for_the_question(
    repository: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    result = invoke("ask", str(repository), str(other))
    assert result.exit_code == EXIT_USAGE
    assert f"{str(other)!r} (a path) is an existing path" in result.stderr
    assert "--question" in result.stderr


def test_ask_with_only_a_question_asks_for_paths() -> None:
    result = invoke("ask", "What does it do?")
    assert result.exit_code == EXIT_USAGE
    assert 'give PATHS before the question: longctx ask PATHS... "What does it do?"' in result.stderr


def test_ask_takes_several_paths_then_the_question_and_question_takes_a_path_like_question(
    repository: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "b.py").write_text("B = 2\n")
    fake = FakeEngine(engine="generic", block=1)
    result = invoke("ask", str(repository), str(other), "What is defined?", fake=fake)
    assert result.exit_code == EXIT_OK, result.output
    question = fake.chat_bodies[-1]["messages"][-1]["content"]
    assert question.endswith("What is defined?") and "b.py" in question and "a.py" in question
    as_option = invoke("ask", str(repository), "--question", str(other), fake=fake)
    assert as_option.exit_code == EXIT_OK, as_option.output
    assert fake.chat_bodies[-1]["messages"][-1]["content"].endswith(str(other))


def test_the_distribution_name_is_not_the_taken_longctx_and_the_import_name_is() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # `longctx` on PyPI is another project (checked with `pip download --no-deps longctx`).
    assert project["name"] == "longctx-sdk"
    assert project["scripts"]["longctx"] == "longctx.cli:main"
    readme = (ROOT / "README.md").read_text()
    assert "pip install longctx-sdk" in readme and "pip install longctx\n" not in readme
    assert "pip install longctx-sdk" in (ROOT / "docs" / "quickstart.md").read_text()
