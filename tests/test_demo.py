"""The README's demo, run against the test suite's vLLM server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from longctx.testing import LocalServer

ROOT = Path(__file__).resolve().parent.parent


def test_demo_shows_cached_tokens_for_the_batch_and_follow_ups(vllm_server: LocalServer) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LONGCTX_")}
    environment["LONGCTX_BASE_URL"] = vllm_server.api_base
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")],
        check=False,
        capture_output=True,
        text=True,
        env=environment,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = result.stdout
    for command in ("$ longctx ask .", "$ longctx batch .", "$ longctx chat .", "$ longctx report"):
        assert command in output
    batch, follow_ups = re.search(
        r"batch: ([\d,]+) cached tokens.*follow-ups: ([\d,]+) cached", output
    ).groups()  # type: ignore[union-attr]
    assert int(batch.replace(",", "")) > 0 and int(follow_ups.replace(",", "")) > 0
    assert "hit rate" in output
