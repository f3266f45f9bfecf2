"""One rule per option, however its value arrives: option object, per-call keyword, flag, environment."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_engine import FakeEngine

from longctx.backends.base import Backend
from longctx.cli import main
from longctx.cli.app import EXIT_USAGE, Runtime
from longctx.drivers import run
from longctx.errors import ConfigError
from longctx.options.groups import RequestOptions
from longctx.sessions import Session
from longctx.store import Store, StoredPack

PACK = StoredPack(
    fingerprint="e" * 64, format_version="test/1", system="You answer.", prefix="<documents>x</documents>\n",
    summary={"title": "fixture"},
)  # fmt: skip

BAD = [("max_tokens", 0), ("max_tokens", -5), ("max_tokens", True), ("concurrency", 0), ("concurrency", -1)]


def _message(name: str, value: object) -> str:
    with pytest.raises(ConfigError) as raised:
        RequestOptions(**{name: value})
    return str(raised.value)


@pytest.fixture
def session(backend: Backend, tmp_path: Path) -> Session:
    return Session(backend, PACK, store=Store.open(tmp_path / "home"))


@pytest.mark.parametrize(("name", "value"), BAD)
def test_a_per_call_keyword_is_refused_as_the_option_object_refuses_it(
    name: str, value: object, session: Session, fake: FakeEngine
) -> None:
    expected = _message(name, value)
    calls = [lambda: session.ask_many(["a", "b"], **{name: value})]  # type: ignore[misc]
    if name == "max_tokens":
        calls += [
            lambda: session.ask("hi", max_tokens=value),  # type: ignore[arg-type]
            lambda: run(session.plan_ask("hi", max_tokens=value)),  # type: ignore[arg-type]
        ]
    for call in calls:
        with pytest.raises(ConfigError) as raised:
            call()
        assert str(raised.value) == expected
    assert fake.chat_bodies == []  # nothing reached the server


def test_a_valid_per_call_bound_is_sent_and_none_means_the_sessions(
    session: Session, fake: FakeEngine
) -> None:
    session.ask("hi", max_tokens=1)
    session.ask("again")
    assert [body["max_tokens"] for body in fake.chat_bodies] == [1, RequestOptions().max_tokens]


def _ask(backend: Backend, tmp_path: Path, *flags: str) -> tuple[int, str]:
    (tmp_path / "doc.md").write_text("a document\n")
    args = ["ask", str(tmp_path / "doc.md"), "hi", *flags]
    result = CliRunner().invoke(main, args, obj=Runtime(backend=backend))
    return result.exit_code, result.stderr


@pytest.mark.parametrize(("name", "value"), [("max_tokens", 0), ("max_tokens", -5), ("concurrency", 0)])
def test_a_flag_and_the_environment_give_the_same_error(
    name: str,
    value: int,
    *,
    backend: Backend,
    tmp_path: Path,
    fake: FakeEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    expected = _message(name, value)
    command = "batch" if name == "concurrency" else "ask"
    flag = "--" + name.replace("_", "-")
    if command == "batch":
        (tmp_path / "questions.txt").write_text("one\ntwo\n")
        (tmp_path / "doc.md").write_text("a document\n")
        invoke = lambda *extra: CliRunner().invoke(  # noqa: E731
            main, ["batch", str(tmp_path / "doc.md"), "--questions", str(tmp_path / "questions.txt"), *extra],
            obj=Runtime(backend=backend),
        )  # fmt: skip
        by_flag = invoke(flag, str(value))
        monkeypatch.setenv(f"LONGCTX_{name.upper()}", str(value))
        by_env = invoke()
        codes, errors = (by_flag.exit_code, by_env.exit_code), (by_flag.stderr, by_env.stderr)
    else:
        code_flag, error_flag = _ask(backend, tmp_path, flag, str(value))
        monkeypatch.setenv(f"LONGCTX_{name.upper()}", str(value))
        code_env, error_env = _ask(backend, tmp_path)
        codes, errors = (code_flag, code_env), (error_flag, error_env)
    assert codes == (EXIT_USAGE, EXIT_USAGE)
    assert errors[0] == f"longctx: error: {flag}: {expected}\n"
    assert errors[1] == f"longctx: error: LONGCTX_{name.upper()}: {expected}\n"
    assert "Traceback" not in errors[0] + errors[1]
    assert fake.chat_bodies == []


def test_the_environment_sets_an_option_the_command_line_overrides(
    backend: Backend, tmp_path: Path, fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LONGCTX_MAX_TOKENS", "7")
    assert _ask(backend, tmp_path)[0] == 0
    assert _ask(backend, tmp_path, "--max-tokens", "9")[0] == 0
    assert [body["max_tokens"] for body in fake.chat_bodies] == [7, 9]
    monkeypatch.setenv("LONGCTX_MAX_TOKENS", "seven")
    code, error = _ask(backend, tmp_path)
    assert (code, error) == (
        EXIT_USAGE,
        "longctx: error: LONGCTX_MAX_TOKENS: max_tokens must be an integer, not 'seven'\n",
    )
