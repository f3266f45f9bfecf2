"""Shared test setup: a clean environment for every test, and the real engines."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from counter_settling import settle_counter_checks
from fake_engine import FakeEngine
from hypothesis import settings

from longctx.backends.base import Backend, connect

pytest_plugins = ["longctx.testing.pytest_plugin", "pytester", "store_backends"]

# Property tests check results, not speed: hypothesis's default 200 ms deadline per example turned a
# correct example into a failure on this shared 2-core machine under load (speed lives in benchmarks/).
settings.register_profile("longctx", deadline=None)
settings.load_profile("longctx")


def pytest_configure(config: pytest.Config) -> None:
    # A shell without job control starts a background job with SIGINT ignored, and children inherit
    # an ignored signal through exec: run that way (`scripts/test &` in a script, a CI step), the
    # Ctrl-C tests (a CLI batch, a job, the demo) saw no Ctrl-C at all and failed. A terminal's user
    # has Python's default handler.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _clean_longctx_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No test sees the developer's LONGCTX_* settings or touches their data folder."""
    for name in list(os.environ):
        if name.startswith("LONGCTX_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("LONGCTX_HOME", str(tmp_path / "longctx-home"))
    # Nor their config file: a user file of their own would set options in every test.
    monkeypatch.setenv("LONGCTX_CONFIG", str(tmp_path / "no-user-config.toml"))
    yield
    # The next test starts with no counter window or residency of this one's; one whose counter
    # checks never settle fails here, not at the global timeout.
    settle_counter_checks()


FAKE_URL = "http://fake-engine:8000/v1"


@pytest.fixture
def fake() -> FakeEngine:
    """A fake server without a tokenize route ("generic": packs are counted with the estimate).

    A test module that needs another fake (an engine, a window) defines its own ``fake``.
    """
    return FakeEngine(engine="generic", block=1)


@pytest.fixture
def backend(fake: FakeEngine) -> Backend:
    """A connection to ``fake`` (a module's own ``backend``, a real engine's, takes precedence)."""
    return connect(FAKE_URL, transport=fake.transport(), async_transport=fake.transport())
