"""The store's two backends for tests: the embedded SQLite file and one real PostgreSQL server.

A test module runs on both with ``pytestmark = pytest.mark.usefixtures("store_backend")``:
each of its tests runs twice, once as a user who set nothing (the SQLite file in
``LONGCTX_HOME``) and once with ``LONGCTX_STORE`` naming a fresh schema of the one
server this test session starts (:class:`longctx.testing.postgres.PostgresServer`,
Debian's package; started at the first test that needs it, stopped at the end).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from longctx.testing.postgres import PostgresServer


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The one PostgreSQL server of the test session (each test takes a schema of its own)."""
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A fresh, empty store on the server: the URL of a new schema, with the role's password in it."""
    return postgres_server.fresh_url()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``sqlite`` (nothing set), or ``postgresql`` (``LONGCTX_STORE`` names a new schema)."""
    if request.param == "postgresql":
        monkeypatch.setenv("LONGCTX_STORE", request.getfixturevalue("postgres_url"))
    return str(request.param)
