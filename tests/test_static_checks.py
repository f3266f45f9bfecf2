"""The code passes the project's lint, format and type rules (pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TREES = ("longctx", "tests", "benchmarks", "examples", "scripts")


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False, timeout=600)


def test_ruff_lint() -> None:
    result = run(str(BIN / "ruff"), "check", *TREES)
    assert result.returncode == 0, result.stdout[-4000:]


def test_ruff_format() -> None:
    result = run(str(BIN / "ruff"), "format", "--check", "longctx", "tests", "benchmarks", "scripts")
    assert result.returncode == 0, result.stdout[-4000:]


def test_mypy_strict() -> None:
    result = run(str(BIN / "mypy"), "longctx")
    assert result.returncode == 0, result.stdout[-4000:]
