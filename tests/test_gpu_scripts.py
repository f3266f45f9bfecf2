"""The GPU benchmark's shell scripts, where they can run without a GPU: host-tiers.sh's end."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

FINISH = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu" / "tiers-finish.sh"


def test_the_tiers_end_stops_the_server_and_keeps_the_logs_when_curl_fails(tmp_path: Path) -> None:
    """No LMCache server (native and none variants): curl fails, and every step still runs."""
    bin_dir, out, logs = tmp_path / "bin", tmp_path / "out", tmp_path / "logs"
    for folder in (bin_dir, out, logs):
        folder.mkdir()
    (bin_dir / "curl").write_text("#!/bin/sh\nexit 7\n")  # what curl does with no server on the port
    (bin_dir / "curl").chmod(0o755)
    (logs / "vllm-8780.log").write_text("server log\n")
    # A stand-in for the server: a process group of its own, its parent gone, as serve.sh leaves it.
    started = subprocess.run(
        ["bash", "-c", "setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo $!"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    pid = int(started.stdout)
    try:
        script = f'set -eu\n. "{FINISH}"\ntrap tiers_finish EXIT\nPIDS=" {pid}"\nexit 5\n'
        environment = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out),
                       "VARIANT": "native", "PORT": "8780", "LOG_DIR": str(logs)}  # fmt: skip
        finished = subprocess.run(["bash", "-c", script], env=environment, timeout=60, check=False)
        assert finished.returncode == 5  # the script's own status, not curl's 7
        assert not _alive(pid), "the server was left running"
        assert (out / "tiers-native-metrics.txt").exists()
        assert (out / "vllm-tiers-native.log").read_text() == "server log\n"
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
