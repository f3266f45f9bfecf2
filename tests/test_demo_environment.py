"""scripts/demo leaves a user's environment alone: it reuses .venv only when it imports this longctx."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _checkout(tmp_path: Path) -> Path:
    """A copy of what scripts/demo needs, and a user's .venv holding a file of their own."""
    copy = tmp_path / "checkout"
    for name in ("scripts", "examples", "longctx"):
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    (copy / ".venv" / "bin").mkdir(parents=True)
    (copy / ".venv" / "mine.txt").write_text("the user's\n")
    return copy


def _user_python(checkout: Path, pythonpath: str) -> None:
    """The user's .venv/bin/python: this interpreter, seeing longctx from ``pythonpath`` first."""
    python = checkout / ".venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={pythonpath} exec {sys.executable} "$@"\n')
    python.chmod(0o755)


def _demo(checkout: Path) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("LONGCTX_", "PYTHON"))}
    # Nothing listens there: the demo stops at its first question, which is all this needs.
    environment |= {"LONGCTX_BASE_URL": "http://127.0.0.1:9/v1", "PIP_NO_INDEX": "1"}
    return subprocess.run(
        [str(checkout / "scripts" / "demo")],
        check=False,
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )


def test_the_demo_runs_with_a_venv_that_imports_this_longctx_and_leaves_it_as_it_was(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path)
    _user_python(checkout, str(checkout))
    before = sorted(path.name for path in (checkout / ".venv").rglob("*"))
    result = _demo(checkout)
    assert "Server: http://127.0.0.1:9/v1" in result.stdout, result.stdout + result.stderr
    assert sorted(path.name for path in (checkout / ".venv").rglob("*")) == before
    assert not (checkout / ".cache" / "demo-venv").exists()


def test_the_demo_never_deletes_a_venv_without_this_longctx(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path)
    _user_python(
        checkout, str(tmp_path / "elsewhere")
    )  # imports the main environment's longctx, not this one
    result = _demo(checkout)
    assert "making its own environment in .cache/demo-venv" in result.stderr, result.stderr
    assert (checkout / ".venv" / "mine.txt").read_text() == "the user's\n"
    assert (checkout / ".cache" / "demo-venv" / "bin" / "python").exists()
