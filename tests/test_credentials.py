"""An API key goes to the server in the Authorization header, and nowhere else.

Given as ``ServerOptions(api_key=...)``, ``--api-key`` or ``LONGCTX_API_KEY``,
it must not reach the store (every table of it dumped, and the files beside
it), a report (text, JSON, HTML), a log record, an exception (its message,
its body, its traceback with the causes) or an MCP tool error, even from a
server whose error answers echo the request's headers.

The server is :class:`FakeEngine` behind a real socket, so the CLI and the
MCP server (subprocesses) reach it as they reach any server.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import pytest
from corpus_fixtures import committed_repo
from fake_engine import FakeEngine
from test_mcp import mcp_client, text_of

from longctx.errors import LongctxError
from longctx.options.groups import ServerOptions
from longctx.sessions import RepoSession
from longctx.store import Store

KEY = "sk-longctx-test-4f7d0c2e9b1a6e83"
ENTRY_POINT = Path(sys.executable).parent / "longctx"


@dataclass
class SocketFake:
    """A :class:`FakeEngine` on a local port; ``echo`` ("all" or "chat") answers 500 echoing the headers."""

    fake: FakeEngine
    url: str = ""
    echo: str | None = None
    authorizations: list[str] = field(default_factory=list)


@pytest.fixture
def server() -> Iterator[SocketFake]:
    served = SocketFake(FakeEngine(engine="generic", block=1, answer="an answer"))

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            content = self.rfile.read(length) if length else b""
            served.authorizations.append(self.headers.get("Authorization", ""))
            echoing = served.echo == "all" or (served.echo == "chat" and "completions" in self.path)
            if echoing:
                echoed = json.dumps(dict(self.headers.items()))
                status, headers, body = (
                    500,
                    {"Content-Type": "application/json"},
                    json.dumps(
                        {"error": {"message": f"cannot serve this request, its headers were {echoed}"}}
                    ).encode(),
                )
            else:
                request = httpx2.Request(
                    self.command,
                    f"http://fake-engine:8000{self.path}",
                    headers=dict(self.headers),
                    content=content,
                )
                response = served.fake.handle(request)
                status, headers, body = response.status_code, dict(response.headers), response.read()
            self.send_response(status)
            for name, value in headers.items():
                if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    served.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    yield served
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    return committed_repo(
        tmp_path / "repo", {"app.py": "def main():\n    return 42\n", "README.md": "# app\n"}
    )


def store_dump(home: Path) -> str:
    """Every row of every table of the store, and every file beside the database, as one text."""
    parts: list[str] = []
    connection = sqlite3.connect(home / "longctx.db")
    try:
        tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        assert {"sessions", "turns", "requests"} <= set(tables), tables
        for table in tables:
            parts += [repr(row) for row in connection.execute(f'SELECT * FROM "{table}"')]
    finally:
        connection.close()
    parts += [path.read_bytes().decode("utf-8", "replace") for path in home.rglob("*") if path.is_file()]
    return "\n".join(parts)


def assert_sent_and_kept_nowhere(server: SocketFake, *texts: str) -> None:
    assert f"Bearer {KEY}" in server.authorizations, "the key was not sent: this test would prove nothing"
    for text in texts:
        assert KEY not in text


def test_a_key_in_server_options_reaches_only_the_server(
    server: SocketFake, repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "home"
    options = ServerOptions(base_url=server.url, api_key=KEY)
    assert KEY not in repr(options) and KEY not in json.dumps(options.to_dict())
    with caplog.at_level(logging.DEBUG), Store.open(home) as store:
        with RepoSession(str(repository), server=options, store=store) as session:
            session.ask("What does main return?", max_tokens=4)
            session.ask_many(["One?", "Two?"], max_tokens=4)
            report = session.report()
        renderings = (report.to_text(), report.to_json(), report.to_markdown(), report.to_page())
    assert_sent_and_kept_nowhere(server, store_dump(home), *renderings, caplog.text)


@pytest.mark.parametrize("echo", ["all", "chat"])
def test_an_error_that_echoes_the_request_headers_has_the_key_redacted(
    server: SocketFake, repository: Path, tmp_path: Path, echo: str, caplog: pytest.LogCaptureFixture
) -> None:
    server.echo = echo
    options = ServerOptions(base_url=server.url, api_key=KEY)
    with (
        caplog.at_level(logging.DEBUG),
        Store.open(tmp_path / "home") as store,
        RepoSession(str(repository), server=options, store=store) as session,
        pytest.raises(LongctxError) as caught,
    ):
        session.ask("What does main return?", max_tokens=4)
    error = caught.value
    shown = "".join(traceback.format_exception(error))
    # The server did echo the header, and the error says so without the key.
    assert "[redacted]" in str(error), str(error)
    kept = [str(getattr(error, name, "")) for name in ("body", "url", "request_id")]
    assert_sent_and_kept_nowhere(server, str(error), repr(error), shown, *kept, caplog.text)


def run_cli(*args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LONGCTX_")}
    environment |= {"LONGCTX_HOME": str(home), "LONGCTX_INSTANT_RETRIES": "1", **(env or {})}
    return subprocess.run(
        [str(ENTRY_POINT), *args], capture_output=True, text=True, env=environment, check=False, timeout=300
    )


def test_a_key_given_to_the_cli_by_flag_or_environment_reaches_only_the_server(
    server: SocketFake, repository: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    flagged = run_cli(
        "ask", str(repository), "What?", "--base-url", server.url, "--api-key", KEY, "--json", home=home
    )
    assert flagged.returncode == 0, flagged.stderr
    environment = {"LONGCTX_API_KEY": KEY, "LONGCTX_BASE_URL": server.url}
    by_environment = run_cli("ask", str(repository), "And?", "--max-tokens", "4", home=home, env=environment)
    assert by_environment.returncode == 0, by_environment.stderr
    page = tmp_path / "report.html"
    reports = [run_cli("report", *how, home=home) for how in ((), ("--json",), ("--html", str(page)))]
    assert all(result.returncode == 0 for result in reports), [result.stderr for result in reports]
    server.echo = "chat"
    failed = run_cli("ask", str(repository), "Again?", "--base-url", server.url, "--api-key", KEY, home=home)
    assert failed.returncode != 0 and "[redacted]" in failed.stderr, failed.stderr
    failed_too = run_cli("ask", str(repository), "Again?", home=home, env=environment)
    assert failed_too.returncode != 0 and "[redacted]" in failed_too.stderr, failed_too.stderr
    outputs = [
        part
        for result in (flagged, by_environment, *reports, failed, failed_too)
        for part in (result.stdout, result.stderr)
    ]
    assert_sent_and_kept_nowhere(server, store_dump(home), page.read_text(), *outputs)


def test_mcp_errors_carry_no_key(server: SocketFake, repository: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    server.echo = "chat"

    async def scenario() -> list[str]:
        texts: list[str] = []
        environments = ({"LONGCTX_API_KEY": KEY}, {})
        for environment, flags in zip(environments, ((), ("--api-key", KEY)), strict=True):
            env = {"LONGCTX_HOME": str(home), "LONGCTX_BASE_URL": server.url, **environment}
            async with mcp_client(env, *flags, cwd=tmp_path) as client:
                result = await client.call_tool("ask", {"path": str(repository), "question": "What?"})
                assert result.is_error and "[redacted]" in text_of(result), text_of(result)
                texts.append(text_of(result))
                shown = await client.call_tool("show_pack", {"path": str(repository)})
                texts.append(text_of(shown))
        return texts

    texts = asyncio.run(scenario())
    assert_sent_and_kept_nowhere(server, *texts, store_dump(home))
