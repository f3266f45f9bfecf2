"""``longctx lint`` offline (a model folder) and ``longctx proxy``'s recording, without a real engine."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

from longctx.cli.app import EXIT_BAD_INPUT, EXIT_LINT_FINDINGS, EXIT_OK, EXIT_USAGE, main
from longctx.lint import ModelFolderRenderer, read_log, requests_from_lines
from longctx.lint.proxy import RecordingProxy
from longctx.testing.model import TinyModel

DOC = "".join(f"Line {n}: the cache keeps block {n}.\n" for n in range(80))


def body(system: str, user: str) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }


@pytest.fixture
def logs(tmp_path: Path) -> dict[str, Path]:
    clean = tmp_path / "clean.jsonl"
    clean.write_text("".join(json.dumps(body("You help.", DOC + q)) + "\n" for q in ("Q1?", "Q2?", "Q3?")))
    broken = tmp_path / "broken.jsonl"
    broken.write_text(
        "".join(
            json.dumps(body(f"You help. Today is 2026-12-0{day}.", DOC + "Q?")) + "\n" for day in (1, 2, 3)
        )
    )
    return {"clean": clean, "broken": broken}


def lint(*args: str) -> Any:
    return CliRunner().invoke(main, ["lint", *args])


def test_lint_offline_prints_a_table_and_gates_ci(tiny_model: TinyModel, logs: dict[str, Path]) -> None:
    model = str(tiny_model.path)
    result = lint(str(logs["clean"]), "--model-dir", model)
    assert result.exit_code == EXIT_OK, result.output
    assert "question" in result.output and "hit" not in result.output.split("findings")[0].lower()
    assert lint(str(logs["clean"]), "--model-dir", model, "--fail-on", "break").exit_code == EXIT_OK
    failed = lint(str(logs["broken"]), "--model-dir", model, "--fail-on", "timestamp")
    assert failed.exit_code == EXIT_LINT_FINDINGS
    assert "timestamp" in failed.output and "fix:" in failed.output
    assert (
        lint(str(logs["broken"]), "--model-dir", model, "--min-hit-rate", "0.5").exit_code
        == EXIT_LINT_FINDINGS
    )
    assert lint(str(logs["clean"]), "--model-dir", model, "--min-hit-rate", "0.5").exit_code == EXIT_OK


def test_lint_writes_json_and_html(tiny_model: TinyModel, logs: dict[str, Path], tmp_path: Path) -> None:
    model = str(tiny_model.path)
    out = tmp_path / "report.json"
    assert lint(str(logs["broken"]), "--model-dir", model, "--format", "json", "-o", str(out)).exit_code == 0
    data = json.loads(out.read_text())
    assert data["summary"]["requests"] == 3 and data["summary"]["causes"] == {"timestamp": 2}
    page = tmp_path / "report.html"
    assert lint(str(logs["broken"]), "--model-dir", model, "--format", "html", "-o", str(page)).exit_code == 0
    assert page.read_text().startswith("<!doctype html>")


def test_lint_takes_the_kv_budget_from_a_plan(
    tiny_model: TinyModel, logs: dict[str, Path], tmp_path: Path
) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"kv_memory_per_gpu_bytes": 64 * 1024, "token_bytes_per_gpu": 1024}))
    result = lint(
        str(logs["clean"]), "--model-dir", str(tiny_model.path), "--plan-json", str(plan), "--format", "json"
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["models"][0]["kv_tokens"] == 64


def test_lint_refuses_bad_arguments(tiny_model: TinyModel, logs: dict[str, Path], tmp_path: Path) -> None:
    model = str(tiny_model.path)
    assert lint(str(logs["clean"]), "--model-dir", model, "--fail-on", "nonsense").exit_code == EXIT_USAGE
    assert lint(str(logs["clean"]), "--model-dir", model, "--replay").exit_code == EXIT_USAGE
    assert lint(str(tmp_path / "missing.jsonl"), "--model-dir", model).exit_code == EXIT_BAD_INPUT
    empty_plan = tmp_path / "plan.json"
    empty_plan.write_text(json.dumps({"kv_memory_per_gpu_bytes": None, "token_bytes_per_gpu": 1024}))
    assert (
        lint(str(logs["clean"]), "--model-dir", model, "--plan-json", str(empty_plan)).exit_code == EXIT_USAGE
    )


def test_offline_rendering_is_the_chat_template(tiny_model: TinyModel) -> None:
    renderer = ModelFolderRenderer(tiny_model.path)
    (request,) = requests_from_lines([json.dumps(body("S", "U"))])
    text = renderer.chat_text(request.messages)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert renderer.tokens(request)


# -- the proxy against a stand-in upstream --------------------------------------------------------


class Upstream(BaseHTTPRequestHandler):
    """Answers chat completions plainly or as an event stream, and remembers what it was sent."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[tuple[dict[str, str], dict[str, Any]]]] = []

    def do_POST(self) -> None:
        sent = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Upstream.seen.append((dict(self.headers.items()), sent))
        usage = {"prompt_tokens": 10, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 8}}
        if sent.get("stream"):
            events: list[dict[str, Any]] = [{"choices": [{"delta": {"content": "hi"}}]}]
            if (sent.get("stream_options") or {}).get("include_usage"):
                events.append({"choices": [], "usage": usage})
            payload = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload.encode())
            return
        answer = json.dumps({"choices": [{"message": {"content": "hi"}}], "usage": usage}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_GET(self) -> None:
        answer = b'{"data": []}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[str]:
    Upstream.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_the_proxy_records_bodies_and_usage_never_headers(upstream: str, tmp_path: Path) -> None:
    import urllib.request

    log = tmp_path / "recorded.jsonl"
    proxy = RecordingProxy(upstream, log).start()
    try:

        def post(data: dict[str, Any]) -> bytes:
            request = urllib.request.Request(
                proxy.url + "/v1/chat/completions",
                data=json.dumps(data).encode(),
                headers={"Content-Type": "application/json", "Authorization": "Bearer sk-very-secret"},
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                return bytes(response.read())

        plain = json.loads(post(body("s", "u")))
        assert plain["choices"][0]["message"]["content"] == "hi"
        streamed = post({**body("s", "v"), "stream": True, "api_key": "sk-in-body"})
        assert b"data: [DONE]" in streamed and b'"usage"' in streamed
        with urllib.request.urlopen(proxy.url + "/v1/models", timeout=10) as response:
            assert json.loads(response.read()) == {"data": []}
    finally:
        proxy.close()
    headers, _ = Upstream.seen[0]
    assert headers["Authorization"] == "Bearer sk-very-secret"  # the server still gets the key
    assert Upstream.seen[1][1]["stream_options"] == {"include_usage": True}
    raw = log.read_text()
    assert "sk-very-secret" not in raw and "sk-in-body" not in raw
    recorded = read_log(log)
    assert len(recorded) == 2  # /v1/models is forwarded, not recorded
    assert [r.reported.cached_tokens for r in recorded] == [8, 8]
    assert all(r.reported.status == 200 and r.reported.ttft_seconds is not None for r in recorded)


def test_the_proxy_can_forward_bodies_untouched(upstream: str, tmp_path: Path) -> None:
    import urllib.request

    proxy = RecordingProxy(upstream, tmp_path / "log.jsonl", inject_usage=False).start()
    try:
        request = urllib.request.Request(
            proxy.url + "/v1/chat/completions",
            data=json.dumps({**body("s", "u"), "stream": True}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
    finally:
        proxy.close()
    assert "stream_options" not in Upstream.seen[0][1]
    (recorded,) = read_log(tmp_path / "log.jsonl")
    assert recorded.reported.cached_tokens is None


def test_the_proxy_refuses_an_upstream_that_is_no_url(tmp_path: Path) -> None:
    from longctx.errors import ConfigError

    with pytest.raises(ConfigError, match="upstream"):
        RecordingProxy("localhost:8000", tmp_path / "log.jsonl")


def test_the_proxy_command_records_until_ctrl_c(upstream: str, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import urllib.request

    log = tmp_path / "app.jsonl"
    command = [
        sys.executable,
        "-m",
        "longctx",
        "proxy",
        "--upstream",
        upstream,
        "--port",
        "0",
        "--log",
        str(log),
    ]
    process = subprocess.Popen([*command, "--no-counter-check"], stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert "point the application at" in line, line
        base = line.split("point the application at ")[1].split()[0]
        request = urllib.request.Request(
            base + "/chat/completions",
            data=json.dumps(body("s", "u")).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert json.loads(response.read())["choices"][0]["message"]["content"] == "hi"
    finally:
        process.send_signal(signal.SIGINT)
        _, rest = process.communicate(timeout=30)
    assert process.returncode == 0, rest
    assert "recorded 1 request(s)" in rest
    assert len(read_log(log)) == 1
