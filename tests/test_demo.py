"""The README's demo, run against the test suite's vLLM server."""

from __future__ import annotations

import os
import re
import signal
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
    # The suite's server is the random-weight tiny model: every answer shown is labelled as noise.
    assert "random weights" in output
    assert output.count("this answer is noise") == 4  # the server line, then under the ask, batch and chat
    assert "Next: ask about your own repository" in output


def test_the_demo_builds_under_the_harness_dir_and_stops_on_ctrl_c_with_one_line(tmp_path: Path) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LONGCTX_")}
    environment["LONGCTX_HARNESS_DIR"] = str(tmp_path / "harness")
    demo = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "demo.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
        start_new_session=True,  # its own process group: Ctrl-C reaches the group, as in a terminal
    )
    try:
        assert demo.stdout is not None
        first = demo.stdout.readline()
        assert f"from {tmp_path / 'harness'}" in first, first
        os.killpg(demo.pid, signal.SIGINT)
        stdout, stderr = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
    assert demo.returncode == 130, (stdout, stderr)
    assert stderr == "demo: interrupted\n"
    assert "Traceback" not in stdout
