"""``longctx serve --cpu-demo --port``: a fixed port across restarts, and SIGTERM or SIGHUP stop its server.

The engine runs in a session of its own, so a signal to ``longctx serve``
alone (a service manager's SIGTERM, a closed terminal's SIGHUP) reaches
only longctx: each must stop the server as Ctrl-C does, leaving no process
and a free port. A session asked on the first run is resumed on the second,
on the same port, with the URL it stored.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from corpus_fixtures import committed_repo

from longctx.testing import EngineHarness, find_free_port

ROOT = Path(__file__).resolve().parent.parent
ENTRY_POINT = Path(sys.executable).parent / "longctx"


def _processes_on(port: int) -> list[int]:
    """The pids whose command line names ``port`` as the engine's own (``--port N``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--port" in argv and str(port).encode() in argv and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


def _serve(environment: dict[str, str], port: int) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [str(ENTRY_POINT), "serve", "--cpu-demo", "--tiny", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment,
        start_new_session=True,  # only the signal sent to its pid reaches it
    )  # fmt: skip
    assert process.stdout is not None
    url_line = process.stdout.readline()
    noise = "the random-weight tiny model (its answers are noise)"
    assert url_line == f"serving {noise} at http://127.0.0.1:{port}/v1\n", url_line
    assert process.stdout.readline() == f"export LONGCTX_BASE_URL=http://127.0.0.1:{port}/v1\n"
    return process, f"http://127.0.0.1:{port}/v1"


def _stopped_by(process: subprocess.Popen[str], number: signal.Signals, port: int) -> str:
    engines = _processes_on(port)
    assert engines, "no engine process found for the port"
    process.send_signal(number)  # to longctx alone, not its group
    try:
        _, stderr = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, stderr
    assert "the model served: tiny-llama" in stderr
    assert stderr.rstrip().endswith("server stopped") and "Traceback" not in stderr, stderr
    for pid in engines:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text(), pid
    assert _processes_on(port) == []
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0, "the server still listens"
    return stderr


@pytest.mark.vllm
def test_sigterm_and_sighup_stop_the_server_and_a_session_resumes_on_the_same_port(
    longctx_harness: EngineHarness, tmp_path: Path
) -> None:
    longctx_harness.model()  # built (or found) before the timed starts
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LONGCTX_")}
    environment.update({"LONGCTX_HARNESS_DIR": str(longctx_harness.base_dir), "PYTHONPATH": str(ROOT),
                        "LONGCTX_HOME": str(tmp_path / "home")})  # fmt: skip
    repository = committed_repo(tmp_path / "project", {"main.py": "def main():\n    return 0\n"})
    port = find_free_port()
    process, base_url = _serve(environment, port)
    try:
        asked = subprocess.run(
            [str(ENTRY_POINT), "ask", str(repository), "What does main return?", "--max-tokens", "2",
             "--json", "--base-url", base_url],
            env=environment, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert asked.returncode == 0, asked.stderr
    finally:
        _stopped_by(process, signal.SIGTERM, port)
    import json

    session_id = json.loads(asked.stdout)["session_id"]
    process, _ = _serve(environment, port)  # the same port again
    try:
        # Resumed with the URL the session stored: no server option given.
        resumed = subprocess.run(
            [str(ENTRY_POINT), "chat", "--session", session_id, "--max-tokens", "2", "--no-warm-start"],
            env=environment, input="And now?\n", capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        assert "[turn 2: " in resumed.stderr
    finally:
        _stopped_by(process, signal.SIGHUP, port)


@pytest.mark.vllm
def test_serve_vision_serves_the_tiny_qwen2_vl_and_a_scanned_page_goes_to_it_as_an_image(
    longctx_harness: EngineHarness, tmp_path: Path
) -> None:
    import json
    import urllib.request

    from longctx.testing.pdfs import write_scanned_pdf

    environment = {k: v for k, v in os.environ.items() if not k.startswith("LONGCTX_")}
    environment.update({"LONGCTX_HARNESS_DIR": str(longctx_harness.base_dir), "PYTHONPATH": str(ROOT),
                        "LONGCTX_HOME": str(tmp_path / "home")})  # fmt: skip
    port = find_free_port()
    process = subprocess.Popen(
        [str(ENTRY_POINT), "serve", "--cpu-demo", "--vision", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment, start_new_session=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        vision = "the tiny vision model (Qwen2-VL, random weights: its answers are noise)"
        assert process.stdout.readline() == f"serving {vision} at http://127.0.0.1:{port}/v1\n"
        process.stdout.readline()
        base_url = f"http://127.0.0.1:{port}/v1"
        with urllib.request.urlopen(f"{base_url}/models", timeout=30) as models:
            assert [model["id"] for model in json.load(models)["data"]] == ["tiny-qwen2-vl"]
        scans = tmp_path / "scans"
        scans.mkdir()
        write_scanned_pdf(scans / "invoice.pdf", ["Invoice 42: total 17 EUR"])
        asked = subprocess.run(
            [str(ENTRY_POINT), "ask", str(scans), "What is the total?", "--max-tokens", "2", "--json",
             "--base-url", base_url],
            env=environment, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert asked.returncode == 0, asked.stderr
        # The default (--pdf-pages server) asked the model card or a probe: the page went as an image.
        assert "pages without text" not in asked.stderr
        report = json.loads(asked.stdout)["report"]
        assert report["prompt_tokens"] > 100, report
    finally:
        _stopped_by_vision(process, port)


def _stopped_by_vision(process: subprocess.Popen[str], port: int) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, stderr
    assert "the model served: tiny-qwen2-vl (text and images)" in stderr
    assert _processes_on(port) == []
