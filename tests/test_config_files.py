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


def _reads_of_settings() -> list[str]:
    """Each ``LONGCTX_*`` name the library reads itself (``os.environ.get("LONGCTX_...")``) in its source."""
    import re

    package = Path(__file__).resolve().parent.parent / "longctx"
    return sorted(
        {
            name
            for path in package.rglob("*.py")
            if "testing" not in path.parts
            for name in re.findall(r"environ\.get\(\"(LONGCTX_\w+)\"", path.read_text())
        }
    )


def test_every_setting_is_read_by_one_rule_from_every_source(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the variables that say where the files and the store are, and the tests' switch, are read
    # outside settings.setting: they cannot come from a file they locate.
    assert _reads_of_settings() == ["LONGCTX_CONFIG", "LONGCTX_HOME", "LONGCTX_INSTANT_RETRIES"]
    keys = settable_keys()
    assert {"base_url", "model", "api_key", "affinity_headers", "max_tokens"} <= set(keys)
    user = Path(str(project.parent / "user.toml"))
    for name, (env_text, toml_text, value) in {
        "affinity_headers": ("x-a, x-b", "['x-a', 'x-b']", ("x-a", "x-b")),
        "model": ("m-1", "'m-1'", "m-1"),
        "base_url": ("http://h:1/v1", "'http://h:1/v1'", "http://h:1/v1"),
    }.items():
        options = keys[name]
        monkeypatch.setenv(f"LONGCTX_{name.upper()}", env_text)
        assert setting(options, name).value == value  # type: ignore[union-attr]
        monkeypatch.delenv(f"LONGCTX_{name.upper()}")
        (project / ".longctx.toml").write_text(f"{name} = {toml_text}\n")
        assert setting(options, name).value == value, name  # type: ignore[union-attr]
        (project / ".longctx.toml").unlink()
        user.write_text(f"{name} = {toml_text}\n")
        assert setting(options, name).value == value, name  # type: ignore[union-attr]
        user.unlink()


def test_affinity_headers_from_a_file_add_or_replace_as_the_variable_does(project: Path) -> None:
    from longctx.options.groups import DEFAULT_AFFINITY_HEADERS

    (project / ".longctx.toml").write_text("affinity_headers = ['+x-mine']\n")
    assert ServerOptions().resolved_affinity_headers() == (*DEFAULT_AFFINITY_HEADERS, "x-mine")
    (project / ".longctx.toml").write_text("affinity_headers = ['x-only']\n")
    assert ServerOptions().resolved().affinity_headers == ("x-only",)
    assert ServerOptions(affinity_headers=("x-given",)).resolved().affinity_headers == ("x-given",)


def test_resolved_reads_the_settings_once_and_then_nothing(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LONGCTX_BASE_URL", "http://a:1/v1,http://b:2/v1")
    monkeypatch.setenv("LONGCTX_MODEL", "m")
    monkeypatch.setenv("LONGCTX_API_KEY", "k")
    resolved = ServerOptions(timeout=5).resolved()
    assert resolved.base_url == ("http://a:1/v1", "http://b:2/v1") and resolved.timeout == 5
    assert (resolved.model, resolved.api_key) == ("m", "k")
    for name in ("LONGCTX_BASE_URL", "LONGCTX_MODEL", "LONGCTX_API_KEY"):
        monkeypatch.setenv(name, "http://changed:9/v1")
    # Nothing is read again: the backend is made from what was resolved.
    assert resolved.resolved() is resolved and resolved.base_urls() == ("http://a:1/v1", "http://b:2/v1")
    assert (resolved.resolved_model(), resolved.resolved_api_key()) == ("m", "k")


@pytest.mark.parametrize(
    "given",
    [
        {"argument": "ftp://x/v1"},
        {"LONGCTX_BASE_URL": "ftp://x/v1"},
        {".longctx.toml": "base_url = 'ftp://x/v1'"},
    ],
)
def test_one_url_rule_and_one_message_wherever_the_url_comes_from(
    given: dict[str, str], project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ((where, value),) = given.items()
    if where == "LONGCTX_BASE_URL":
        monkeypatch.setenv(where, value)
    elif where == ".longctx.toml":
        (project / where).write_text(value + "\n")
    with pytest.raises(ConfigError, match=r"base_url must be http:// or https:// URLs, not 'ftp://x/v1'"):
        if where == "argument":
            ServerOptions(base_url=value)
        else:
            ServerOptions().resolved()
    with pytest.raises(ConfigError, match=r"base_url must be http:// or https:// URLs, not 'ftp://x/v1'"):
        resolve_base_urls("ftp://x/v1")


def test_the_process_state_forgets_parsed_files_and_counter_threads() -> None:
    from longctx.options.settings import _ParsedFiles
    from longctx.process_state import PROCESS
    from longctx.verification.counters import _CounterThreads

    threads, files = PROCESS.get(_CounterThreads), PROCESS.get(_ParsedFiles)
    assert PROCESS.get(_CounterThreads) is threads and PROCESS.get(_ParsedFiles) is files
    PROCESS.reset()
    assert PROCESS.get(_CounterThreads) is not threads and PROCESS.get(_ParsedFiles) is not files
    with pytest.raises(RuntimeError):  # the forgotten threads were let go
        threads.waiters.submit(print)
