"""Shared test setup: a clean environment for every test, and the real engines."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["longctx.testing.pytest_plugin", "pytester"]


@pytest.fixture(autouse=True)
def _clean_longctx_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No test sees the developer's LONGCTX_* settings or touches their data folder."""
    for name in list(os.environ):
        if name.startswith("LONGCTX_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("LONGCTX_HOME", str(tmp_path / "longctx-home"))
    yield
