"""The longctx command through its installed entry point, as a subprocess.

stdout must hold only answers (or JSON); everything else goes to stderr.
Every documented exit code is reached here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from corpus_fixtures import committed_repo
from fault_proxy import FaultProxy

from longctx import cli
from longctx.backends.base import Backend, connect
from longctx.store import Store
from longctx.testing import LocalServer
from longctx.testing.servers import CONTEXT_LENGTH

STDLIB = Path(sysconfig.get_paths()["stdlib"])
ENTRY_POINT = Path(sys.executable).parent / "longctx"


def run(
    *args: str,
    home: Path,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LONGCTX_")}
    environment.update({"LONGCTX_HOME": str(home), "LONGCTX_INSTANT_RETRIES": "1", **(env or {})})
    return subprocess.run(
        [str(ENTRY_POINT), *args],
        check=False,
        capture_output=True,
        text=True,
        env=environment,
        input=stdin,
        cwd=cwd,
        timeout=600,
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    # About 6.6k tokens: a real pack of two files, one of them small, so a chat that appends the
    # edited file appends 1k tokens, not 7.6k (heapq.py, here before, cost that test 11 s on vLLM).
    files = {name: (STDLIB / name).read_text() for name in ("textwrap.py", "bisect.py")}
    return committed_repo(tmp_path / "project", {**files, "NOTES.md": f"# notes {uuid.uuid4()}\n"})


def test_the_entry_point_is_installed() -> None:
    assert ENTRY_POINT.exists(), "pip install -e . should have installed the longctx script"
    result = subprocess.run([str(ENTRY_POINT), "--help"], capture_output=True, text=True, check=True)
    for command in ("pack", "ask", "batch", "chat", "report", "doctor", "sessions", "recipe", "plan"):
        assert command in result.stdout


def test_pack_prints_the_pack_on_stdout_and_counts_on_stderr(repository: Path, home: Path) -> None:
    result = run("pack", str(repository), home=home)
    assert result.returncode == cli.EXIT_OK, result.stderr
    assert "textwrap.py" in result.stdout and "bisect.py" in result.stdout
    assert "packed 3 documents" in result.stderr and "(estimated)" in result.stderr
    assert "packed 3 documents" not in result.stdout
    again = run("pack", str(repository), home=home)
    assert again.stdout == result.stdout  # byte-identical for identical inputs


def test_pack_to_a_file_leaves_a_file_that_already_holds_it(
    repository: Path, home: Path, tmp_path: Path
) -> None:
    output = tmp_path / "pack.txt"
    first = run("pack", str(repository), "-o", str(output), home=home)
    assert first.returncode == cli.EXIT_OK, first.stderr
    on_stdout = run("pack", str(repository), home=home).stdout
    assert output.read_text() == on_stdout
    assert "already held" not in first.stderr
    os.utime(output, ns=(1_000_000_000, 1_000_000_000))

    again = run("pack", str(repository), "-o", str(output), home=home)

    assert again.returncode == cli.EXIT_OK, again.stderr
    assert f"{output} already held this pack: left as it was" in again.stderr
    assert output.stat().st_mtime_ns == 1_000_000_000
    missing = run("pack", str(repository), "-o", str(tmp_path / "nowhere" / "pack.txt"), home=home)
    assert missing.returncode == cli.EXIT_ERROR
    assert missing.stderr.startswith(f"longctx: error: {tmp_path / 'nowhere' / 'pack.txt'}: cannot write")


def test_pack_after_a_commit_reports_the_earlier_copies_and_can_turn_layers_off(
    repository: Path, home: Path
) -> None:
    before = run("pack", str(repository), home=home)
    notes = repository / "NOTES.md"
    notes.write_text(notes.read_text() + "more\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(repository)]
    subprocess.run([*git, "commit", "-qam", "edit the notes"], check=True)

    layered = run("pack", str(repository), home=home)
    plain = run("pack", str(repository), "--max-stale-share", "0", home=home)
    bad = run("pack", str(repository), "--max-stale-share", "1", home=home)

    assert layered.returncode == plain.returncode == cli.EXIT_OK, (layered.stderr, plain.stderr)
    assert "packed 3 documents (and 1 earlier copy of changed files" in layered.stderr
    # Everything before the listing survives the commit in the layered pack only.
    kept = before.stdout.rsplit("</documents>\n<listing>", 1)[0]
    assert layered.stdout.startswith(kept)
    assert not plain.stdout.startswith(kept)
    assert "earlier copies" not in plain.stderr
    assert bad.returncode == cli.EXIT_USAGE and "max-stale-share" in bad.stderr


def test_pack_json_is_only_json(repository: Path, home: Path) -> None:
    result = run("pack", str(repository), "--json", home=home)
    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert data["pack"]["document_count"] == 3
    paths = {entry["path"] for entry in data["manifest"]["entries"]}
    assert paths >= {"textwrap.py", "bisect.py", "NOTES.md"}


def test_exit_code_usage(home: Path) -> None:
    assert run("ask", home=home).returncode == cli.EXIT_USAGE  # click: missing arguments
    result = run("pack", ".", "--max-files", "0", home=home)
    assert result.returncode == cli.EXIT_USAGE
    assert "max_files" in result.stderr and result.stdout == ""


def test_exit_code_bad_input(tmp_path: Path, home: Path) -> None:
    result = run("pack", str(tmp_path / "does-not-exist"), home=home)
    assert result.returncode == cli.EXIT_BAD_INPUT
    assert "does-not-exist" in result.stderr and result.stdout == ""


def test_exit_code_unreachable(repository: Path, home: Path) -> None:
    result = run("ask", str(repository), "hello?", "--base-url", "http://127.0.0.1:9/v1", home=home)
    assert result.returncode == cli.EXIT_UNREACHABLE, result.stderr
    assert "cannot reach" in result.stderr and result.stdout == ""


def test_exit_code_no_session(home: Path) -> None:
    result = run("sessions", "show", "no-such-session", home=home)
    assert result.returncode == cli.EXIT_NO_SESSION
    assert "no-such-session" in result.stderr


def test_exit_code_other_longctx_error(tmp_path: Path) -> None:
    # A home that is a file: the store cannot be opened.
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    result = run("sessions", "list", home=blocker / "inside")
    assert result.returncode == cli.EXIT_ERROR
    assert "opening the longctx store" in result.stderr and "failed" in result.stderr


def test_ask_with_the_question_forgotten_or_a_second_path_as_question_says_so(
    repository: Path, tmp_path: Path, home: Path
) -> None:
    forgotten = run("ask", str(repository), home=home)
    assert forgotten.returncode == cli.EXIT_USAGE
    assert "the question is missing" in forgotten.stderr and "Missing argument" not in forgotten.stderr
    second = run("ask", str(repository), str(tmp_path), home=home)
    assert second.returncode == cli.EXIT_USAGE
    assert f"{str(tmp_path)!r} (a path) is an existing path" in second.stderr


def test_recipe_and_plan_need_no_server(tmp_path: Path, home: Path) -> None:
    recipe = run("recipe", "nvidia/Kimi-K3-NVFP4", "--engine", "vllm", home=home)
    assert recipe.returncode == 0
    assert "--kv-cache-dtype fp8" in recipe.stdout and "--enable-prefix-caching" in recipe.stdout
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "num_hidden_layers": 32,
                "max_position_embeddings": 131072,
                "torch_dtype": "bfloat16",
                "vocab_size": 128256,
                "intermediate_size": 14336,
            }
        )
    )
    plan = run("plan", "--config", str(config), "--gpu-memory", "80", "--weights", "16", "--json", home=home)
    assert plan.returncode == 0, plan.stderr
    # bf16: no KV scales beside this config, so `recipe` keeps the model's own KV type.
    assert json.loads(plan.stdout)["token_bytes_per_gpu"] == 131072
    assert "no calibrated KV scales" in plan.stderr
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    bad = run("plan", "--config", str(broken), home=home)
    assert bad.returncode == cli.EXIT_USAGE and "num_hidden_layers" in bad.stderr


# -- against the real vLLM server ----------------------------------------------------


@pytest.fixture
def server_env(vllm_server: LocalServer) -> dict[str, str]:
    return {"LONGCTX_BASE_URL": vllm_server.api_base}


def test_ask_prints_only_the_answer(repository: Path, home: Path, server_env: dict[str, str]) -> None:
    result = run(
        "ask", str(repository), "What does bisect provide?", "--max-tokens", "12", home=home, env=server_env
    )
    assert result.returncode == 0, result.stderr
    store = Store.open(home)
    session = store.sessions.sessions()[0]
    stored = store.sessions.turns(session.id)[0]
    assert result.stdout == stored.answer + "\n"
    assert f"session {session.id}" in result.stderr and "prompt tokens" in result.stderr


def test_ask_json(repository: Path, home: Path, server_env: dict[str, str]) -> None:
    result = run(
        "ask", str(repository), "Anything?", "--max-tokens", "4", "--json", home=home, env=server_env
    )
    data = json.loads(result.stdout)
    assert data["question"] == "Anything?" and data["usage"]["prompt_tokens"] > 1000
    assert data["report"]["requests"][0]["prompt_tokens"] == data["usage"]["prompt_tokens"]


def test_batch_and_report(repository: Path, tmp_path: Path, home: Path, server_env: dict[str, str]) -> None:
    questions = tmp_path / "questions.txt"
    questions.write_text("What is textwrap for?\nWhat is bisect for?\n\nWhich is longer?\nAny bugs?\n")
    result = run(
        "batch",
        str(repository),
        "--questions",
        str(questions),
        "--max-tokens",
        "8",
        home=home,
        env=server_env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("## ") == 4
    assert "cached" in result.stderr
    report = run("report", "--json", home=home)
    assert report.returncode == 0
    data = json.loads(report.stdout)
    assert len(data["requests"]) == 4
    assert data["cached_tokens"] > 0
    assert data["counter_check"]["matches"] is True


def test_exit_code_too_long(tmp_path: Path, home: Path, server_env: dict[str, str]) -> None:
    big = tmp_path / "big"
    big.mkdir()
    for name in ("argparse.py", "typing.py", "dataclasses.py"):
        (big / name).write_text((STDLIB / name).read_text())
    result = run("ask", str(big), "Too much?", home=home, env=server_env)
    assert result.returncode == cli.EXIT_TOO_LONG, result.stderr
    assert "budget" in result.stderr and "Largest files" in result.stderr


def test_exit_code_server_error(repository: Path, home: Path, vllm_server: LocalServer) -> None:
    proxy = FaultProxy("127.0.0.1", vllm_server.port)
    proxy.faults.extend(["503"] * 10)
    try:
        # --text-prompts: the faults are for the question's request, not the pack's /tokenize calls.
        result = run(
            "ask", str(repository), "overloaded?", "--base-url", proxy.base_url, "--text-prompts", home=home
        )
    finally:
        proxy.close()
    assert result.returncode == cli.EXIT_SERVER, result.stderr
    assert "503" in result.stderr and result.stdout == ""


def test_chat_from_a_script_and_resume(repository: Path, home: Path, server_env: dict[str, str]) -> None:
    result = run(
        "chat",
        str(repository),
        "--max-tokens",
        "8",
        home=home,
        env=server_env,
        stdin="First question?\nSecond question?\nThird question?\n",
    )
    assert result.returncode == 0, result.stderr
    store = Store.open(home)
    session = store.sessions.sessions()[0]
    turns = store.sessions.turns(session.id)
    assert [t.question for t in turns] == ["First question?", "Second question?", "Third question?"]
    # The output is read with universal newlines (text mode): a carriage return the model wrote comes back
    # as a newline, so the stored answers are read the same way.
    printed = "".join(t.answer + "\n" for t in turns).replace("\r\n", "\n").replace("\r", "\n")
    assert result.stdout == printed
    assert "turn 2:" in result.stderr and "cached" in result.stderr
    resumed = run("chat", "--session", session.id, home=home, env=server_env, stdin="Fourth?\n")
    assert resumed.returncode == 0, resumed.stderr
    assert len(store.sessions.turns(session.id)) == 4
    requests = store.sessions.requests(session_ids=[session.id])
    assert all((r.usage.cached_tokens or 0) > 0 for r in requests[1:])


def test_doctor_and_sessions(repository: Path, home: Path, server_env: dict[str, str]) -> None:
    doctor = run("doctor", "--json", home=home, env=server_env)
    assert doctor.returncode == 0, doctor.stderr
    data = json.loads(doctor.stdout)["replicas"][0]
    assert data["servers"][0]["engine"] == "vllm" and data["servers"][0]["cache_reporting"] is True
    suggested = {finding["flag"] for finding in data["findings"]}
    # The CPU build takes no fp8 KV cache, so none is suggested; chunked prefill is unreported, not claimed.
    assert not any("fp8" in flag for flag in suggested)
    assert not any("max-num-batched-tokens" in flag for flag in suggested)
    assert data["ok"] is True  # suggestions only: nothing that loses or hides savings
    run("ask", str(repository), "one?", "--max-tokens", "4", home=home, env=server_env)
    listed = json.loads(run("sessions", "list", "--json", home=home).stdout)
    assert len(listed) == 1 and listed[0]["turns"] == 1
    shown = run("sessions", "show", listed[0]["id"], home=home)
    assert "one?" in shown.stdout
    deleted = run("sessions", "delete", listed[0]["id"], home=home)
    assert deleted.returncode == 0
    assert json.loads(run("sessions", "list", "--json", home=home).stdout) == []


@pytest.fixture
def chromium() -> Iterator[str]:
    path = shutil.which("chromium")
    assert path is not None, "chromium is installed by scripts/setup (Debian's package)"
    yield path


def test_html_report_renders_in_headless_chromium(
    repository: Path, tmp_path: Path, home: Path, server_env: dict[str, str], chromium: str
) -> None:
    run("chat", str(repository), "--max-tokens", "8", home=home, env=server_env, stdin="One?\nTwo?\n")
    page = tmp_path / "report.html"
    result = run("report", "--html", str(page), home=home)
    assert result.returncode == 0, result.stderr
    profile = tmp_path / "chromium-profile"
    rendered = subprocess.run(  # noqa: PLW1510 - the return code is asserted below
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rendered.returncode == 0, rendered.stderr[-2000:]
    store = Store.open(home)
    session = store.sessions.sessions()[0]
    cached = sum(r.usage.cached_tokens or 0 for r in store.sessions.requests(session_ids=[session.id]))
    assert cached > 0
    assert f"{cached:,}" in rendered.stdout
    assert "longctx-chart" in rendered.stdout and "<rect" in rendered.stdout


def _popen(*args: str, home: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LONGCTX_")}
    environment.update({"LONGCTX_HOME": str(home), "LONGCTX_INSTANT_RETRIES": "1", **env})
    return subprocess.Popen(
        [str(ENTRY_POINT), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
        bufsize=1,
    )


def test_ctrl_c_stops_a_batch_prints_what_is_done_and_exits_130(
    repository: Path, tmp_path: Path, home: Path, server_env: dict[str, str]
) -> None:
    import signal
    import time

    questions = tmp_path / "questions.txt"
    questions.write_text("".join(f"Question {i}: what does line {i} do?\n" for i in range(24)))
    process = _popen(
        "batch", str(repository), "--questions", str(questions), "--max-tokens", "48",
        "--concurrency", "2", home=home, env=server_env,
    )  # fmt: skip
    assert process.stderr is not None and process.stdout is not None
    deadline = time.monotonic() + 300
    # Progress lines are for terminals: the store says when two answers are in.
    while _stored_siblings(home) < 2:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    interrupted_at = time.monotonic()
    stdout, stderr = process.communicate(timeout=60)
    elapsed = time.monotonic() - interrupted_at
    assert process.returncode == cli.EXIT_INTERRUPTED, stderr
    assert elapsed < 2.0, f"{elapsed:.1f} s to stop"
    store = Store.open(home)
    parent = next(s for s in store.sessions.sessions() if s.parent_id is None)
    stored = store.sessions.children(parent.id)
    assert 2 <= len(stored) < 24
    assert stdout.count("## Question ") == len(stored)
    assert f"answered and stored in session {parent.id}" in stderr


def _stored_siblings(home: Path) -> int:
    if not (home / "longctx.db").exists():
        return 0
    with Store.open(home) as store:
        return sum(1 for record in store.sessions.sessions(include_branches=True) if record.kind == "sibling")


def test_chat_appends_a_file_edited_between_turns(
    repository: Path, home: Path, server_env: dict[str, str]
) -> None:
    process = _popen("chat", str(repository), "--max-tokens", "4", home=home, env=server_env)
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    process.stdin.write("What does bisect do?\n")
    process.stdout.readline()  # the first answer
    marker = f"EDITED_{uuid.uuid4().hex}"
    (repository / "bisect.py").write_text((repository / "bisect.py").read_text() + f"# {marker}\n")
    process.stdin.write("What changed?\n\n")
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    assert "turn 1:" in stderr and "appended 1 changed file (bisect.py changed)" in stderr
    store = Store.open(home)
    session = store.sessions.sessions()[0]
    turns = store.sessions.turns(session.id)
    assert marker in turns[1].preamble and turns[1].file_changes
    first, second = [r for r in store.sessions.requests(session_ids=[session.id]) if r.purpose == "turn"]
    assert first.usage.prompt_tokens is not None and second.usage.cached_tokens is not None
    block = 128 if "vllm" in first.engine else 1
    # At least the previous prompt, rounded down to the cache block (vLLM's CPU build: 128).
    assert second.usage.cached_tokens >= 0.99 * (
        first.usage.prompt_tokens - first.usage.prompt_tokens % block
    )


def test_resume_applies_or_refuses_each_option(
    repository: Path, home: Path, server_env: dict[str, str]
) -> None:
    first = run("ask", str(repository), "Hi?", "--max-tokens", "4", home=home, env=server_env)
    assert first.returncode == 0, first.stderr
    session = Store.open(home).sessions.sessions()[0]
    with_paths = run("chat", str(repository), "--session", session.id, home=home, env=server_env, stdin="")
    assert (
        with_paths.returncode == cli.EXIT_USAGE
        and "PATHS cannot be given with --session" in with_paths.stderr
    )
    salt = run("chat", "--session", session.id, "--cache-salt", "other", home=home, env=server_env, stdin="")
    assert salt.returncode == cli.EXIT_USAGE and "--cache-salt cannot change on resume" in salt.stderr
    exclude = run("chat", "--session", session.id, "--exclude", "*.md", home=home, env=server_env, stdin="")
    assert (
        exclude.returncode == cli.EXIT_USAGE and "--exclude cannot be given with --session" in exclude.stderr
    )
    applied = run(
        "chat", "--session", session.id, "--max-tokens", "3", home=home, env=server_env, stdin="Again?\n"
    )
    assert applied.returncode == 0, applied.stderr
    assert "applying --max-tokens 3 to the resumed session" in applied.stderr
    request = Store.open(home).sessions.requests(session_ids=[session.id])[-1]
    assert request.usage.completion_tokens is not None and request.usage.completion_tokens <= 3


def test_doctor_reports_each_replica_and_suggests_only_what_it_sees(
    home: Path, vllm_server: LocalServer
) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    result = run("doctor", "--base-url", f"{vllm_server.api_base},{dead}", "--json", home=home)
    assert result.returncode == cli.EXIT_UNREACHABLE, result.stderr
    data = json.loads(result.stdout)
    live, down = data["replicas"]
    assert live["servers"][0]["engine"] == "vllm" and down["ok"] is False
    # The harness's vLLM reports neither chunked prefill nor the batch size: nothing is claimed.
    assert all("max-num-batched-tokens" not in finding["flag"] for finding in live["findings"])


def _queried(backend: Backend, url: str) -> int:
    """Prompt tokens the server has looked up in its cache (vLLM) or prefilled (SGLang)."""
    reading = backend.counters([url]).get(url)
    assert reading is not None and reading.queries is not None
    return reading.queries


def _wait_until_queried(
    backend: Backend, url: str, tokens: int, process: subprocess.Popen[str], timeout: float = 300
) -> None:
    """Until the server's query counter reaches ``tokens``, ``process`` still running."""
    import time

    deadline = time.monotonic() + timeout
    while _queried(backend, url) < tokens:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_chat_warms_its_pack_while_the_first_question_is_typed(
    repository: Path, home: Path, engine_server: LocalServer
) -> None:
    env = {"LONGCTX_BASE_URL": engine_server.api_base}
    with connect(engine_server.api_base) as backend:
        url = backend.servers[0].api_url
        before = _queried(backend, url)
        process = _popen("chat", str(repository), "--max-tokens", "4", "--json", home=home, env=env)
        assert process.stdin is not None and process.stdout is not None
        # The user types the first question while the warm request (the whole pack) is at the server.
        _wait_until_queried(backend, url, before + 2_000, process)
    process.stdin.write("What does bisect provide?\n")
    first = json.loads(process.stdout.readline())
    process.stdin.write("\n")
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    assert "[warm start: pack prefilled" in stderr
    store = Store.open(home)
    warm, turn = store.sessions.requests(session_ids=[first["session_id"]])
    assert (warm.purpose, turn.purpose) == ("warm", "turn")
    assert warm.usage.completion_tokens == 1 and warm.usage.prompt_tokens is not None
    pack = store.sessions.pack(store.sessions.session(first["session_id"]).pack_fingerprint or "")
    assert pack is not None
    # The pack is everything of the warm prompt but its stand-in question and
    # the template's tail (under 32 tokens); the question's cached tokens
    # cover it, rounded down to the cache block (vLLM's CPU build: 128).
    block = 128 if "vllm" in warm.engine else 1
    covered = warm.usage.prompt_tokens - 32
    assert first["usage"]["cached_tokens"] >= covered - covered % block
    assert first["usage"]["cached_tokens"] == turn.usage.cached_tokens
    # Its cost is in the report like any request's.
    report = run("report", first["session_id"], "--json", home=home)
    lines = json.loads(report.stdout)["requests"]
    assert [line["purpose"] for line in lines] == ["warm", "turn"]


def test_a_chat_killed_after_its_warm_start_and_before_a_question_leaves_no_session(
    repository: Path, home: Path, engine_server: LocalServer
) -> None:
    import signal
    import time

    env = {"LONGCTX_BASE_URL": engine_server.api_base}
    with connect(engine_server.api_base) as backend:
        url = backend.servers[0].api_url
        before = _queried(backend, url)
        process = _popen("chat", str(repository), "--max-tokens", "4", home=home, env=env)
        assert process.stdin is not None
        # The warm request (the whole pack, thousands of tokens) has reached the server.
        _wait_until_queried(backend, url, before + 2_000, process)
        time.sleep(1.0)  # a one-token request: done by now, and its answer read
        process.send_signal(signal.SIGKILL)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    session_id = stderr.split("session ", 1)[1].split()[0]
    listing = run("sessions", "list", "--all", "--json", home=home)
    assert listing.returncode == 0, listing.stderr
    assert json.loads(listing.stdout) == []
    with Store.open(home) as store:
        assert store.sessions.sessions(include_branches=True) == [] and store.sessions.requests() == []
    missing = run("report", session_id, home=home)
    assert missing.returncode != 0 and session_id in missing.stderr


RESERVED = 18_000


def test_ask_and_batch_with_shard_answer_a_repository_over_the_window(
    tmp_path: Path, home: Path, engine_server: LocalServer
) -> None:
    root = tmp_path / "big"
    root.mkdir()
    # About 18k tokens, over the prompt budget the project's config leaves: the server's 32k-token
    # window less 18,000 tokens kept for questions and turns. The budget is longctx's rule, the
    # window and the counts are the server's: the paths are those of a repository over the whole
    # window, at half its prefill (37k tokens took SGLang's CPU build 31 s here). Two shards that
    # fit SGLang's 40k-token pool together, so the batch finds both cached.
    for name in ("textwrap.py", "heapq.py", "shlex.py", "fnmatch.py"):
        (root / name).write_text((STDLIB / name).read_text())
    (root / "NOTES.md").write_text(f"# notes {uuid.uuid4()}\n")
    # The project's file, read from the folder the commands run in, as a user's would be.
    (root / ".longctx.toml").write_text(f"reserved_question_tokens = {RESERVED}\n")
    env = {"LONGCTX_BASE_URL": engine_server.api_base}
    refused = run("ask", ".", "What is defined here?", "--max-tokens", "8", home=home, env=env, cwd=root)
    assert refused.returncode == cli.EXIT_TOO_LONG, refused.stderr
    assert "--shard" in refused.stderr
    answered = run(
        "ask", ".", "What is defined here?", "--max-tokens", "8", "--shard", "--json",
        home=home, env=env, cwd=root,
    )  # fmt: skip
    assert answered.returncode == cli.EXIT_OK, answered.stderr
    data = json.loads(answered.stdout)
    shards = len(data["shard_answers"])
    assert shards >= 2 and f"map-reduce over {shards} shards" in answered.stderr
    # Each shard within the budget (the window less the answer and the reserve), with its question.
    budget = CONTEXT_LENGTH - 8 - RESERVED
    assert all(answer["usage"]["prompt_tokens"] < budget + 64 for answer in data["shard_answers"]), data
    purposes = [line["purpose"] for line in data["report"]["requests"]]
    assert purposes.count("reduce") == 1 and len(purposes) == shards + 1
    # The server's counter agrees with every map and reduce request (the maps share a window).
    assert data["report"]["counter_check"]["matches"] is True, data["report"]
    questions = tmp_path / "questions.txt"
    questions.write_text("What is defined here?\nWhat is exported?\n")
    batch = run(
        "batch", ".", "--questions", str(questions), "--max-tokens", "8", "--shard", "--json",
        home=home, env=env, cwd=root,
    )  # fmt: skip
    assert batch.returncode == cli.EXIT_OK, batch.stderr
    result = json.loads(batch.stdout)
    answers = result["answers"]
    assert [answer["question"] for answer in answers] == ["What is defined here?", "What is exported?"]
    check = result["report"]["counter_check"]
    assert check["matches"] is True and check["reported"] == result["report"]["cached_tokens"], check
    # The same shards as the ask: each shard's prefix is read from the cache.
    for answer in answers:
        for shard_answer in answer["shard_answers"]:
            assert shard_answer["usage"]["cached_tokens"] > 0.9 * shard_answer["usage"]["prompt_tokens"] - 256
