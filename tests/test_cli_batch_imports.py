"""``longctx batch`` as a new process loads only what a batch uses.

Each new process pays for every module its command imports and for the CA
bundle its HTTP clients read: the gap to the API called in a warm process
(docs/benchmarks.md, ``cli-inprocess``). A real ``longctx batch`` against
the fake engine over HTTP, in a subprocess, then the modules it loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_engine import FakeEngine
from fake_http import FakeHttpServer, batch_over_one_file

# What a batch never uses: the chat's loop, a streamed answer's printing, typed answers' schemas
# (without --schema), asyncio (the CLI's batch runs its requests in threads), rich (a terminal's
# live line only), tenacity (the retry policy's library, loaded at a request's first failure),
# tornado (tenacity imports it where installed; the test extras install it), and httpx2 with its
# network (httpcore2, h11, anyio) and importlib.metadata (httpx2 reads its version there): the
# batch's requests go through longctx's own client over its pool.
UNUSED = (
    "longctx.cli.chat",
    "longctx.cli.streaming",
    "longctx.schemas",
    "asyncio",
    "rich",
    "tenacity",
    "tornado",
    "httpx2",
    "longctx.backends.httpx2_bridge",
    "httpcore2",
    "h11",
    "anyio",
    "importlib.metadata",
)

SCRIPT = """
import gc, json, sys
from longctx.cli import main
try:
    main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
from longctx.backends.http import tls_context
print(json.dumps({"code": code, "loaded": sorted(m for m in %r if m in sys.modules),
                  "ca_read": tls_context()._built is not None,
                  "collector": gc.isenabled(), "frozen": gc.get_freeze_count()}))
"""


@pytest.fixture
def served() -> Iterator[FakeHttpServer]:
    server = FakeHttpServer(FakeEngine(engine="generic", block=1, answer="fine"))
    yield server
    server.close()


def test_batch_imports_nothing_it_does_not_use_and_reads_no_ca_bundle(
    served: FakeHttpServer, tmp_path: Path
) -> None:
    questions = ["What does first return?", "What is the file?"]
    args, env = batch_over_one_file(tmp_path, served.base_url, questions)
    done = subprocess.run([sys.executable, "-c", SCRIPT % (UNUSED,), *args], env=env, capture_output=True,
                          text=True, check=False, timeout=120)  # fmt: skip
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert last["code"] in (0, None), done.stderr
    assert done.stdout.count("## ") == 2  # both answers printed: the command ran through
    assert "requests" in done.stderr  # the savings summary
    assert last["loaded"] == [], f"batch imported what it does not use: {last['loaded']}"
    assert last["ca_read"] is False  # a plain-HTTP server: no CA bundle read
    # The command's imports ran with the collector paused, then were frozen; it collects again after.
    assert last["collector"] is True and last["frozen"] > 10_000
