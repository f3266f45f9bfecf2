"""A real PostgreSQL server for tests and benchmarks: initdb into a folder, started on a free loopback port.

Debian's ``postgresql`` package provides the programs (``initdb``,
``pg_ctl``); nothing is installed here. The server refuses to run as root,
so under root it runs as the package's ``postgres`` user (the folder is
given to it). One server serves many tests: each gets a schema of its own
(:meth:`PostgresServer.fresh_url`), owned by a role that may use its schema
and nothing else, reached with a password over TCP (so the password's
redaction is tested on the real thing)::

    server = PostgresServer.start()
    url = server.fresh_url()   # postgresql://longctx:...@127.0.0.1:PORT/longctx?options=-csearch_path%3Ds_1
    server.restart()           # every client's connection is cut, as in a server restart
    server.stop()
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import field
from itertools import count
from pathlib import Path
from typing import Final

from longctx.recordtypes import record_type
from longctx.testing.errors import HarnessError

__all__ = ["ROLE", "ROLE_PASSWORD", "PostgresServer", "postgres_programs"]

ROLE: Final = "longctx"
"""The role the store connects as: it owns its schemas, and is no superuser."""
ROLE_PASSWORD: Final = "pw-7Q2-not-for-logs"
"""Its password: a test looks for it in every output (it must never appear)."""
DATABASE: Final = "longctx"


def postgres_programs() -> Path | None:
    """The folder of Debian's PostgreSQL programs (the newest version installed), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path else None


@record_type(frozen=False)
class PostgresServer:
    """A PostgreSQL server this process started (see the module docstring); :meth:`stop` ends it."""

    folder: Path
    port: int
    programs: Path
    user: str | None
    _schemas: count[int] = field(default_factory=lambda: count(1))

    @classmethod
    def start(cls) -> PostgresServer:
        """initdb into a new temporary folder, start the server on a free loopback port; raises HarnessError.

        The folder is made here, under the system's temporary folder, so that
        the server's own user can reach it (a test's ``tmp_path`` is private to root).
        """
        programs = postgres_programs()
        if programs is None:
            raise HarnessError("PostgreSQL is not installed: apt-get install postgresql (scripts/setup does)")
        user = "postgres" if os.geteuid() == 0 else None
        folder = Path(tempfile.mkdtemp(prefix="longctx-pg-"))
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(folder, entry.pw_uid, entry.pw_gid)
        server = cls(folder, _free_port(), programs, user)
        server._run(
            "initdb", "-D", str(server.data), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"
        )
        with (server.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {server.port}\n"
                f"unix_socket_directories = '{folder}'\n"
                "fsync = on\nmax_connections = 200\nshared_buffers = 32MB\n"
            )
        # Local (socket) as the superuser without a password; over TCP, the password.
        (server.data / "pg_hba.conf").write_text(
            "local all postgres trust\nhost all all 127.0.0.1/32 scram-sha-256\n", encoding="utf-8"
        )
        server._own(server.data / "pg_hba.conf")
        server.begin()
        server.sql(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{ROLE_PASSWORD}'")
        server.sql(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
        return server

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def url(self) -> str:
        """The database's URL as the role (the ``public`` schema)."""
        return f"postgresql://{ROLE}:{ROLE_PASSWORD}@127.0.0.1:{self.port}/{DATABASE}"

    def fresh_url(self) -> str:
        """The URL of a new, empty schema of the database, owned by the role: one test's store."""
        schema = f"s_{os.getpid()}_{next(self._schemas)}"
        self.sql(f"CREATE SCHEMA {schema} AUTHORIZATION {ROLE}", database=DATABASE)
        return f"{self.url}?options=-csearch_path%3D{schema}"

    def begin(self) -> None:
        """Start the server (again) and wait until it answers."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.folder / "server.log"), "-w", "-t", "60", "start"
        )

    def halt(self) -> None:
        """Stop the server at once (every connection cut, as a crash or restart would), keeping its data."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def restart(self) -> None:
        """Stop and start again: every client's connection is cut."""
        self.halt()
        self.begin()

    def stop(self) -> None:
        """Stop the server and remove its folder."""
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def sql(self, statement: str, *, database: str = "postgres") -> str:
        """Run ``statement`` as the superuser over the socket; its output."""
        connection = ["-h", str(self.folder), "-p", str(self.port), "-U", "postgres", "-d", database]
        return self._run("psql", *connection, "-v", "ON_ERROR_STOP=1", "-qAtc", statement)

    def _own(self, path: Path) -> None:
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _run(self, program: str, *arguments: str) -> str:
        command = [str(self.programs / program), *arguments]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd="/")
        if done.returncode != 0:
            raise HarnessError(
                f"{program} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
            )
        return done.stdout


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
