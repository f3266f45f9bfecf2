"""Stored reports read the same every time, and a session on a server without prefix caching says why.

Against the fake engine, through the CLI in process (``Runtime(backend=...)``);
doctor's exit code on a real engine with caching on: tests/test_cli.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from click.testing import CliRunner, Result
from fake_engine import FakeEngine

from longctx.backends.base import Backend, connect
from longctx.cli import EXIT_OK, Runtime, main
from longctx.cli.app import EXIT_NO_PREFIX_CACHE

FAKE = "http://fake-engine:8000/v1"


@dataclass
class TokenizingEngine(FakeEngine):
    """The fake with a tokenize route (a token a word), as vLLM and SGLang have one."""

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path in ("/tokenize", "/v1/tokenize"):
            body = json.loads(request.content)
            prompt = body.get("prompt")
            if isinstance(prompt, list):
                return httpx2.Response(200, json={"tokens": [self.ids(text) for text in prompt]})
            text = prompt if isinstance(prompt, str) else " ".join(m["content"] for m in body["messages"])
            return httpx2.Response(200, json={"tokens": self.ids(text)})
        return super().handle(request)

    @staticmethod
    def ids(text: Any) -> list[int]:
        return list(range(len(str(text).split())))


def invoke(backend: Backend | None, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), obj=Runtime(backend=backend))


def document(folder: Path, name: str, words: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(" ".join(f"{name}-word{i}" for i in range(words)) + "\n")
    return path


def session_id(result: Result) -> str:
    assert result.exit_code == EXIT_OK, result.output
    return str(json.loads(result.stdout)["session_id"])


def test_a_stored_report_reads_the_same_every_time(backend: Backend, tmp_path: Path) -> None:
    notes = document(tmp_path / "docs", "notes.md", 3000)
    # A cold session measures the prefill rate; a second over the same pack is all cached,
    # so its rate (and the time saved) is the one measured on the earlier requests.
    session_id(invoke(backend, "ask", str(notes), "first?", "--json"))
    cached = session_id(invoke(backend, "ask", str(notes), "second?", "--json"))
    views = [invoke(backend, "report", cached, "--json").stdout for _ in range(2)]
    text = invoke(backend, "report", cached).stdout
    assert "cold prefill rate" in text and "prefill time saved" in text, text
    # Another cold session on the same server and model, after it: not part of its figures.
    other = document(tmp_path / "other", "other.md", 5000)
    session_id(invoke(backend, "ask", str(other), "third?", "--json"))
    views.append(invoke(backend, "report", cached, "--json").stdout)
    assert views[0] == views[1] == views[2]
    assert invoke(backend, "report", cached).stdout == text


def test_doctor_exits_non_zero_when_prefix_caching_is_off() -> None:
    for engine in ("vllm", "sglang"):
        off = connect(FAKE, transport=FakeEngine(engine=engine, prefix_caching=False).transport())
        result = invoke(off, "doctor", "--no-probe")
        assert result.exit_code == EXIT_NO_PREFIX_CACHE, result.output
        assert "prefix caching: OFF" in result.stdout
        assert "prefix caching is OFF" in result.stderr
        assert json.loads(invoke(off, "doctor", "--no-probe", "--json").stdout)["ok"] is False
        on = connect(FAKE, transport=FakeEngine(engine=engine).transport())
        assert invoke(on, "doctor", "--no-probe").exit_code == EXIT_OK


def test_a_session_with_nothing_cached_on_a_server_without_caching_says_why(tmp_path: Path) -> None:
    notes = document(tmp_path / "docs", "notes.md", 500)
    for engine, fix in (("vllm", "--enable-prefix-caching"), ("sglang", "remove --disable-radix-cache")):
        off = connect(FAKE, transport=TokenizingEngine(engine=engine, prefix_caching=False).transport())
        first = session_id(invoke(off, "ask", str(notes), "first?", "--json"))
        invoke(off, "ask", str(notes), "again?", "--json")
        shown = invoke(off, "report", first).stdout
        assert "prefix caching OFF" in shown and fix in shown, shown
    # With caching on, no such note.
    on = connect(FAKE, transport=TokenizingEngine(engine="vllm").transport())
    fine = session_id(invoke(on, "ask", str(notes), "first?", "--json"))
    assert "prefix caching OFF" not in invoke(on, "report", fine).stdout
