"""The first day against real engines: the warm start's cached share, and `longctx serve --cpu-demo`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

import pytest

from longctx.backends.base import connect
from longctx.options.groups import RequestOptions
from longctx.sessions import Session
from longctx.store import Store, StoredPack
from longctx.testing import EngineHarness, LocalServer

STDLIB = Path(sysconfig.get_paths()["stdlib"])
ROOT = Path(__file__).resolve().parent.parent


def _pack() -> StoredPack:
    """About 2,500 tokens of standard-library text, unique per call (its first request is cold)."""
    nonce = uuid.uuid4().hex
    return StoredPack(
        fingerprint=nonce + nonce,
        format_version="test/1",
        system=f"Answer questions about the documents. [{nonce}]",
        prefix=f"<documents>\n{(STDLIB / 'argparse.py').read_text()[:10_000]}\n</documents>\n\n",
        summary={"title": "stdlib text"},
    )


def test_a_warm_start_says_how_much_of_the_pack_the_server_had_cached(
    engine_server: LocalServer, tmp_path: Path
) -> None:
    """The pack was computed for another store's session: the warm request reads it from the cache."""
    backend = connect(engine_server.api_base)
    pack = _pack()
    with Store.open(tmp_path / "first") as store:
        Session(backend, pack, store=store, request=RequestOptions(max_tokens=2)).ask("Warm the prefix.")
    with Store.open(tmp_path / "second") as store:
        request = RequestOptions(max_tokens=2, warm_start=True)
        with Session(backend, pack, store=store, request=request) as session:
            assert session.warming is not None
            result = session.warming.wait(timeout=120)
    assert result is not None and result.usage is not None, result
    assert result.usage.cached_tokens is not None and result.usage.cached_tokens > 2000, result.usage
    assert "unknown" not in result.summary_line()


@pytest.mark.sglang
def test_a_warm_start_on_a_server_that_reports_no_cached_tokens_says_which_switch_is_missing(
    sglang_without_cache_report: LocalServer, tmp_path: Path
) -> None:
    backend = connect(sglang_without_cache_report.api_base)
    request = RequestOptions(max_tokens=2, warm_start=True)
    with (
        Store.open(tmp_path / "home") as store,
        Session(backend, _pack(), store=store, request=request) as session,
    ):
        assert session.warming is not None
        result = session.warming.wait(timeout=120)
    assert result is not None and result.usage is not None and result.usage.cached_tokens is None
    assert result.summary_line().startswith("warm start: pack prefilled (unknown of ")
    assert "start it with --enable-cache-report" in result.summary_line()


@pytest.mark.vllm
def test_serve_cpu_demo_prints_its_url_answers_and_stops_on_ctrl_c(longctx_harness: EngineHarness) -> None:
    """The command a new user starts a server with: built from the harness, stopped by Ctrl-C, port freed."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LONGCTX_")}
    environment["LONGCTX_HARNESS_DIR"] = str(longctx_harness.base_dir)
    environment["PYTHONPATH"] = str(ROOT)
    process = subprocess.Popen(
        [sys.executable, "-m", "longctx", "serve", "--cpu-demo", "--tiny"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
        start_new_session=True,  # its own group: Ctrl-C reaches the group, as in a terminal
    )
    try:
        assert process.stdout is not None
        url_line = process.stdout.readline()
        # --tiny: the random-weight model, and the line a person reads says its answers are noise.
        assert url_line.startswith(
            "serving the random-weight tiny model (its answers are noise) at http://127.0.0.1:"
        ), url_line
        export = process.stdout.readline().strip()
        base_url = export.removeprefix("export LONGCTX_BASE_URL=")
        assert export != base_url and base_url == url_line.split(" at ")[1].strip()
        with Session(connect(base_url), _pack(), request=RequestOptions(max_tokens=2)) as session:
            answer = session.ask("What is this?")
        assert (answer.usage.prompt_tokens or 0) > 0
        port = int(base_url.rsplit(":", 1)[1].split("/")[0])
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, stderr
    assert stderr.rstrip().endswith("server stopped") and "Traceback" not in stderr
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0, "the server still listens"
