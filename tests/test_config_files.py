"""Config files: a user file and a project file, below the environment and the flags."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_engine import FakeEngine

from longctx.backends.base import Backend
from longctx.cli import main
from longctx.cli.app import EXIT_USAGE, Runtime
from longctx.errors import ConfigError
from longctx.options.groups import RequestOptions, ServerOptions, resolve_api_key, resolve_base_urls
from longctx.options.settings import project_config_file, settable_keys, setting


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git repository with a sub-folder as the current folder, and a user file."""
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    (root / "src" / "deep").mkdir(parents=True)
    monkeypatch.chdir(root / "src" / "deep")
    user = tmp_path / "user.toml"
    monkeypatch.setenv("LONGCTX_CONFIG", str(user))
    return root


def _ask(backend: Backend, folder: Path, *flags: str) -> tuple[int, str]:
    (folder / "doc.md").write_text("a document\n")
    result = CliRunner().invoke(
        main, ["ask", str(folder / "doc.md"), "hi", *flags], obj=Runtime(backend=backend)
    )
    return result.exit_code, result.stderr


def test_precedence_is_flag_then_environment_then_project_then_user(
    project: Path, backend: Backend, fake: FakeEngine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "user.toml").write_text("max_tokens = 11\nmodel = 'user-model'\n")
    assert setting(RequestOptions, "max_tokens").value == 11  # type: ignore[union-attr]
    assert _ask(backend, tmp_path)[0] == 0
    (project / ".longctx.toml").write_text("max_tokens = 22\n")
    assert project_config_file() == project / ".longctx.toml"
    assert _ask(backend, tmp_path)[0] == 0
    monkeypatch.setenv("LONGCTX_MAX_TOKENS", "33")
    assert _ask(backend, tmp_path)[0] == 0
    assert _ask(backend, tmp_path, "--max-tokens", "44")[0] == 0
    assert [body["max_tokens"] for body in fake.chat_bodies] == [11, 22, 33, 44]
    # A key the project file leaves out still comes from the user file.
    assert setting(ServerOptions, "model").value == "user-model"  # type: ignore[union-attr]


def test_server_settings_from_a_file_reach_the_api_too(project: Path) -> None:
    (project / ".longctx.toml").write_text(
        "base_url = ['http://a:1/v1', 'http://b:2/v1']\napi_key = 'secret'\n"
    )
    assert resolve_base_urls(None) == ("http://a:1/v1", "http://b:2/v1")
    assert resolve_api_key(None) == "secret" and ServerOptions().names_a_server()


def test_the_search_stops_at_the_repository_root(project: Path, tmp_path: Path) -> None:
    (tmp_path / ".longctx.toml").write_text("max_tokens = 5\n")  # above the repository: not read
    assert project_config_file() is None
    assert setting(RequestOptions, "max_tokens") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max_tokenz = 5\n", "unknown key 'max_tokenz'"),
        ("max_tokens = 0\n", "max_tokens: max_tokens must be at least 1, not 0"),
        ("max_tokens = '5'\n", "max_tokens: must be an integer, not '5'"),
        ("ordering = 'fast'\n", "unknown ordering 'fast'"),
        ("include = '*.py'\n", "include: must be a list of strings"),
        ("max_tokens = \n", "not a valid TOML file"),
    ],
)
def test_a_bad_file_names_the_file_and_the_key(
    text: str, message: str, project: Path, backend: Backend, tmp_path: Path
) -> None:
    path = project / ".longctx.toml"
    path.write_text(text)
    code, error = _ask(backend, tmp_path)
    assert code == EXIT_USAGE
    assert error.startswith(f"longctx: error: {path}: ") and message in error, error
    key = text.split("=", maxsplit=1)[0].strip()
    keys = settable_keys()
    with pytest.raises(ConfigError, match=str(path)):  # the API reads the file the same way
        setting(keys.get(key, RequestOptions), key if key in keys else "max_tokens")
