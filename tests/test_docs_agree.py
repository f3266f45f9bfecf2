"""docs/cli.md and the CLI agree: every exit code its table names comes from its case, every flag exists.

Each documented exit code is produced here by the case it describes (the
fake engine in process), and each ``--flag`` the reference's prose names
is an option of some command (a help text naming a flag no command has,
as ``job --help`` once named ``--temperature``, fails).
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable
from pathlib import Path

import click
import httpx2
import pytest
from click.testing import CliRunner, Result
from fake_engine import FakeEngine, Fault

from longctx.backends.base import Backend, connect
from longctx.cli import Runtime, main
from longctx.cli.app import COMMAND_MODULES, EXIT_CODES
from longctx.store import Store
from longctx.testing.model import TinyModel

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "cli.md"
URL = "http://fake-engine:8000/v1"


def documented_codes() -> dict[int, str]:
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", REFERENCE.read_text(), re.MULTILINE)
    return {int(code): meaning for code, meaning in rows}


def invoke(tmp_path: Path, fake: FakeEngine | None, *args: str, stdin: str | None = None) -> Result:
    backend = connect(URL, transport=fake.transport()) if fake is not None else None
    runtime = Runtime(backend=backend, open_store=lambda: Store.open(tmp_path / "home"))
    return CliRunner().invoke(main, list(args), obj=runtime, input=stdin)


def project(tmp_path: Path) -> str:
    root = tmp_path / "project"
    root.mkdir(exist_ok=True)
    (root / "main.py").write_text("def main():\n    return 0\n")
    return str(root)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def interrupting(tmp_path: Path) -> Result:
    """A server whose answer never comes: the user's Ctrl-C (a KeyboardInterrupt in the request)."""
    fake = FakeEngine(engine="generic", block=1)

    def handler(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/chat/completions"):
            raise KeyboardInterrupt
        return fake.handle(request)

    backend: Backend = connect(URL, transport=httpx2.MockTransport(handler))
    runtime = Runtime(backend=backend, open_store=lambda: Store.open(tmp_path / "home"))
    return CliRunner().invoke(main, ["ask", project(tmp_path), "What?", "--no-stream"], obj=runtime)


def job_with_a_failed_item(tmp_path: Path) -> Result:
    job = tmp_path / "job.jsonl"
    job.write_text(json.dumps({"paths": str(tmp_path / "gone"), "question": "q?"}) + "\n")
    return invoke(tmp_path, FakeEngine(engine="generic", block=1), "job", str(job))


def flipped_canary(tmp_path: Path) -> Result:
    fake = FakeEngine(block=1, answer="record 0000 sensor A0 read")
    fake.flip_cached_token = True
    return invoke(tmp_path, fake, "doctor", "--canary")


CASES: dict[int, Callable[[Path], Result]] = {
    0: lambda tmp: invoke(tmp, FakeEngine(engine="generic", block=1), "ask", project(tmp), "What?"),
    # The fake vLLM has no /tokenize: the tokenizer's error, another longctx error.
    1: lambda tmp: invoke(tmp, FakeEngine(engine="vllm", block=1), "ask", project(tmp), "What?"),
    2: lambda tmp: invoke(tmp, None, "ask", "--no-such-flag"),
    3: lambda tmp: invoke(
        tmp, None, "ask", project(tmp), "What?", "--base-url", f"http://127.0.0.1:{closed_port()}/v1"
    ),
    4: lambda tmp: invoke(
        tmp,
        FakeEngine(engine="generic", block=1, context_length=500),
        "ask",
        project(tmp),
        "Q?",
        "--max-tokens",
        "16",
        "--reserved-question-tokens",
        "16",
    ),
    5: lambda tmp: invoke(tmp, None, "ask", str(tmp / "missing"), "What?"),
    6: lambda tmp: invoke(
        tmp,
        FakeEngine(
            engine="generic", block=1, faults=__import__("collections").deque([Fault(status=500)] * 10)
        ),
        "ask",
        project(tmp),
        "What?",
    ),
    7: lambda tmp: invoke(tmp, FakeEngine(engine="generic"), "chat", "--session", "nosuchsession", stdin=""),
    8: lambda tmp: invoke(tmp, None, "ask", str((tmp / "empty").mkdir() or tmp / "empty"), "What?"),
    9: job_with_a_failed_item,
    10: flipped_canary,
    11: lambda tmp: invoke(tmp, FakeEngine(engine="vllm", prefix_caching=False), "doctor", "--no-probe"),
    12: lambda tmp: invoke(
        tmp,
        FakeEngine(engine="generic", block=1, answer="not JSON"),
        "ask",
        project(tmp),
        "Who?",
        "--schema",
        "name",
    ),
    13: lambda tmp: invoke(
        tmp, FakeEngine(engine="generic", block=1), "ask", project(tmp), "What?", "--require-citations"
    ),
    130: interrupting,
}

# Cases that need more than the fake engine, and where they are produced instead.
MODEL_CASES: dict[int, Callable[[Path, Path], Result]] = {
    14: lambda tmp, model: CliRunner().invoke(
        main, ["lint", _timestamped_log(tmp), "--model-dir", str(model), "--fail-on", "timestamp"]
    ),
}
ENGINE_CASES = {15: "tests/test_traffic_engines.py::test_lint_command_exits_on_a_failed_replay"}


def _timestamped_log(tmp: Path) -> str:
    """Three requests whose system prompts differ only by their date: a timestamp finding each."""
    log = tmp / "requests.jsonl"
    rows = [
        {"model": "m", "messages": [{"role": "system", "content": f"Today is 2026-12-0{day}."},
                                    {"role": "user", "content": "Line.\n" * 60 + "Q?"}]}
        for day in (1, 2, 3)
    ]  # fmt: skip
    log.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(log)


def test_the_table_is_the_exit_codes_and_every_one_has_a_case() -> None:
    assert documented_codes() == EXIT_CODES
    assert sorted([*CASES, *MODEL_CASES, *ENGINE_CASES]) == sorted(EXIT_CODES)
    for code, where in ENGINE_CASES.items():
        path, name = where.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(), (code, where)


@pytest.mark.parametrize("code", sorted(set(EXIT_CODES) - set(ENGINE_CASES) - set(MODEL_CASES)))
def test_each_documented_exit_code_is_what_its_case_gives(
    code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LONGCTX_INSTANT_RETRIES", "1")
    result = CASES[code](tmp_path)
    assert result.exit_code == code, (code, documented_codes()[code], result.output)
    assert "Traceback" not in result.output


# The tiny model as a fixture, not looked up inside the test: the test then carries the vLLM marker
# and runs once the harness has built the environment the model is made with (a fresh clone's run
# waited 59 s for it among the tests that need no engine).
@pytest.mark.parametrize("code", sorted(MODEL_CASES))
def test_each_documented_exit_code_with_a_model_folder_is_what_its_case_gives(
    code: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model: TinyModel
) -> None:
    monkeypatch.setenv("LONGCTX_INSTANT_RETRIES", "1")
    result = MODEL_CASES[code](tmp_path, tiny_model.path)
    assert result.exit_code == code, (code, documented_codes()[code], result.output)
    assert "Traceback" not in result.output


def _all_options() -> set[str]:
    options = {"--help", "--version"}
    context = click.Context(main)
    for name in COMMAND_MODULES:
        command = main.get_command(context, name)
        assert command is not None
        commands = [command, *getattr(command, "commands", {}).values()]
        for each in commands:
            for parameter in each.params:
                options.update(o for o in [*parameter.opts, *parameter.secondary_opts] if o.startswith("--"))
    return options


def test_every_flag_the_reference_names_is_an_option_of_a_command() -> None:
    # The flags of the engines (vLLM's, SGLang's), which doctor and recipe print, are not longctx's.
    text = REFERENCE.read_text()
    joined = re.sub(r"(--[a-z0-9-]*-)\n\s+", r"\1", text)  # a flag the help wrapped at its dash
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])(?!-)", joined))
    known = _all_options()
    engines = {flag for flag in named - known if _is_engine_flag(flag, text)}
    assert named - known - engines == set()


def _is_engine_flag(flag: str, text: str) -> bool:
    """A flag named as an engine's (``vllm serve ... --enable-prefix-caching``) or a script's."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        # A help text's flag may be wrapped onto the line after the engine's name.
        around = " ".join(lines[max(0, index - 1) : index + 1])
        if flag in line and re.search(r"vllm|sglang|vLLM|SGLang|scripts/", around):
            return True
    return False
