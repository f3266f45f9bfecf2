"""The GPU benchmark's shell scripts, where they can run without a GPU: host-tiers.sh's end."""

from __future__ import annotations

import os
import signal
import subprocess
import time
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
        _until_a_group_leader(pid)
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


def _until_a_group_leader(pid: int) -> None:
    """Until ``pid`` leads its own process group, as the server does by the time a script ends.

    ``$!`` names the child before it has run setsid: on a loaded machine the script's ``kill -- -PID``
    could come first, find no such group, and leave the stand-in running (a race of the test, not the script).
    """
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        if int(fields[2]) == pid:  # after the state: the parent, then the process group
            return
        time.sleep(0.01)
    raise AssertionError(f"the stand-in {pid} never led a process group of its own")


def _alive(pid: int) -> bool:
    """Running: a zombie (exited, not yet reaped by whichever process adopted it) is not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        # /proc/PID/stat: "pid (comm) state ...", the state after the last parenthesis.
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False  # gone meanwhile
    return state != "Z"


# -- the offline bundles: no package in two folders (install-sglang.sh's one pip call refuses it) ------

GPU = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu"


def _wheels(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"PK")
    return folder


def _bundle(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["python3", str(GPU / "bundle_wheels.py"), *args], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


def test_prepare_sglang_leaves_no_package_in_both_the_bundle_and_lx(tmp_path: Path) -> None:
    """What prepare-sglang.sh did: jsonschema & co downloaded for SGLang and again for longctx."""
    image = tmp_path / "image-packages.txt"
    image.write_text("# the GPU image\ntorch\nnumpy\ntransformers\n")
    shared = (
        "jsonschema-4.26.0-py3-none-any.whl",
        "jsonschema_specifications-2025.9.1-py3-none-any.whl",
        "referencing-0.37.0-py3-none-any.whl",
        "rpds_py-0.30.0-cp312-cp312-manylinux_2_17_x86_64.whl",
    )
    sglang = _wheels(tmp_path / "whl", "sglang-0.5.17-py3-none-any.whl", "numpy-2.2.6-cp312.whl",
                     "transformers-5.12.1-py3-none-any.whl", *shared)  # fmt: skip
    lx = _wheels(tmp_path / "lx", "longctx_sdk-0.1.0-py3-none-any.whl", "httpx2-1.0-py3-none-any.whl",
                 *shared)  # fmt: skip
    # Before: the install-time check names every package in both folders.
    before = _bundle("--check", str(sglang), str(lx))
    assert before.returncode != 0
    assert "jsonschema-specifications" in before.stderr and "rpds-py" in before.stderr
    prepared = _bundle(str(image), "--keep", "longctx", "--keep", "transformers-", "--keep", "tokenizers-",
                       str(sglang), str(lx))  # fmt: skip
    assert prepared.returncode == 0, prepared.stderr
    names = {folder.name: sorted(p.name for p in folder.iterdir()) for folder in (sglang, lx)}
    assert names["lx"] == ["httpx2-1.0-py3-none-any.whl", "longctx_sdk-0.1.0-py3-none-any.whl"]
    assert "numpy-2.2.6-cp312.whl" not in names["whl"]  # the image has it
    assert "transformers-5.12.1-py3-none-any.whl" in names["whl"]  # pinned: travels anyway
    assert set(shared) <= set(names["whl"])
    assert _bundle("--check", str(sglang), str(lx)).returncode == 0


def test_two_versions_of_one_package_stop_the_preparation(tmp_path: Path) -> None:
    image = tmp_path / "image-packages.txt"
    image.write_text("torch\n")
    first = _wheels(tmp_path / "whl", "jsonschema-4.26.0-py3-none-any.whl")
    second = _wheels(tmp_path / "lx", "jsonschema-4.25.0-py3-none-any.whl")
    refused = _bundle(str(image), str(first), str(second))
    assert refused.returncode != 0 and "two versions of jsonschema" in refused.stderr


def test_the_scripts_run_the_bundle_check() -> None:
    """The prepare scripts drop duplicates across folders; install-sglang.sh checks before pip."""
    assert 'bundle_wheels.py "$HERE/image-packages.txt"' in (GPU / "prepare-sglang.sh").read_text()
    assert '"$W"/whl "$DEST"/lx' in (GPU / "prepare-sglang.sh").read_text()
    assert 'bundle_wheels.py "$HERE/image-packages.txt"' in (GPU / "prepare-wheels.sh").read_text()
    install = (GPU / "install-sglang.sh").read_text()
    assert install.index("bundle_wheels.py --check") < install.index("pip install")
    for script in ("prepare-sglang.sh", "prepare-wheels.sh", "install-sglang.sh"):
        assert subprocess.run(["bash", "-n", str(GPU / script)], check=False).returncode == 0, script
