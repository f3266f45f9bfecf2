"""Several real CPU replicas and a real router from PyPI in front of them.

:class:`Fleet` reuses the harness's vLLM server as its first replica and
starts the others itself (same engine environment, tiny model and small KV
cache), so a test can stop and restart a replica it owns without touching
the server other tests share. Routers (``vllm-router``, ``smg``) come from
their own virtual environment (:data:`ROUTER_SPEC`), built from PyPI like the
engines'.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from longctx.testing.environments import ROUTER_SPEC, EngineEnvironment, ensure_environment
from longctx.testing.harness import EngineHarness
from longctx.testing.servers import (
    HOST,
    LocalServer,
    find_free_port,
    http_ok,
    port_is_free,
    start_server,
    start_vllm,
)

__all__ = ["ROUTER_POLICIES", "Fleet", "prepare_replicas", "replica_name"]

ROUTER_POLICIES: dict[str, tuple[str, ...]] = {
    "vllm-router": ("round_robin", "consistent_hash", "cache_aware", "kv_aware", "random", "power_of_two"),
    "smg": ("round_robin", "consistent_hashing", "cache_aware", "prefix_hash", "random", "power_of_two"),
}
"""The policies each router offers that a test may start it with."""


def replica_name(index: int) -> str:
    """The harness's name for the fleet's replica ``index`` (1, 2, ...; 0 is the shared vLLM server)."""
    return f"vllm-replica-{index}"


def _start_plain_replica(harness: EngineHarness) -> LocalServer:
    return start_vllm(harness.environment("vllm"), harness.model(), harness.base_dir)


def prepare_replicas(harness: EngineHarness, replicas: int = 2) -> None:
    """Boot the replicas a plain :class:`Fleet` of ``replicas`` will use, in the background."""
    for index in range(1, replicas):
        harness.prepare_extra(replica_name(index), _start_plain_replica)


class Fleet:
    """N vLLM replicas on the tiny model (the first is the harness's), and routers over them.

    ``replica_args`` are extra vLLM flags for the replicas the fleet starts
    (for example ``--num-gpu-blocks-override 128``: a KV cache of 16,384
    tokens, smaller than a job's packs); given any, every replica is the
    fleet's own, the harness's server included in none. The caller closes
    it: the replicas and routers it started are stopped; the harness's
    server is left running for the other tests.
    """

    def __init__(self, harness: EngineHarness, replicas: int = 2, replica_args: Sequence[str] = ()) -> None:
        # No I/O: servers start in start().
        self.harness = harness
        self.size = replicas
        self.replica_args = tuple(replica_args)
        self.replicas: list[LocalServer] = []
        self.routers: list[LocalServer] = []
        self._router_env: EngineEnvironment | None = None

    @property
    def _shares_harness_server(self) -> bool:
        return not self.replica_args

    def start(self) -> Fleet:
        """Start the replicas that are missing (the first is the harness's vLLM server, unless own).

        A plain fleet's other replicas are the harness's extra servers (see
        :func:`prepare_replicas`): booted in the background when prepared,
        and one boot serves every fleet of the session.
        """
        if not self.replicas and self._shares_harness_server:
            self.replicas.append(self.harness.server("vllm"))
        while len(self.replicas) < self.size:
            if self._shares_harness_server:
                index = len(self.replicas)
                replica = self.harness.extra_server(replica_name(index), _start_plain_replica)
                self.replicas.append(replica if replica.alive() else self._start_replica())
            else:
                self.replicas.append(self._start_replica())
        return self

    @property
    def urls(self) -> list[str]:
        """Each replica's API URL (``http://host:port/v1``)."""
        return [server.api_base for server in self.replicas]

    def _start_replica(self, port: int | None = None) -> LocalServer:
        env = self.harness.environment("vllm")
        return start_vllm(
            env, self.harness.model(), self.harness.base_dir, port=port, extra_args=self.replica_args
        )

    def kill(self, index: int) -> None:
        """Kill replica ``index`` at once (SIGKILL), as a crash would; not the harness's (index 0)."""
        if index == 0 and self._shares_harness_server:
            raise ValueError("replica 0 is the harness's shared server; kill another")
        server = self.replicas[index]
        if server.alive():
            os.killpg(server.pid, signal.SIGKILL)
            server.process.wait(timeout=30)
        server.stop(timeout=10)  # the rest of its process group, and the harness's bookkeeping

    def restart(self, index: int) -> LocalServer:
        """Start replica ``index`` again on the same port (so its URL is unchanged)."""
        old = self.replicas[index]
        if old.alive():
            raise ValueError(f"replica {index} is still running")
        deadline = time.monotonic() + 60
        # The engine's worker processes may hold the socket a moment after the leader died.
        while not port_is_free(old.port) and time.monotonic() < deadline:
            time.sleep(0.5)
        self.replicas[index] = self._start_replica(port=old.port)
        if self.replicas[index].port != old.port:
            raise RuntimeError(f"replica {index} could not get its port {old.port} back")
        return self.replicas[index]

    def router_environment(self) -> EngineEnvironment:
        if self._router_env is None:
            self._router_env = ensure_environment(ROUTER_SPEC, self.harness.base_dir)
        return self._router_env

    def start_router(self, router: str, policy: str, extra_args: Sequence[str] = ()) -> LocalServer:
        """A ``router`` (``"vllm-router"`` or ``"smg"``) with ``policy`` over every replica, ready."""
        if policy not in ROUTER_POLICIES.get(router, ()):
            raise ValueError(f"unknown router or policy: {router} {policy}")
        env = self.router_environment()
        roots = [server.base_url for server in self.replicas]
        metrics_port = find_free_port()
        command = [
            str(env.root / "bin" / router),
            *(["launch"] if router == "smg" else []),
            "--host",
            HOST,
            "--port",
            "{port}",
            "--worker-urls",
            *roots,
            "--policy",
            policy,
            "--prometheus-port",
            str(metrics_port),
            *extra_args,
        ]
        server = start_server(
            f"{router}-{policy}",
            command,
            log_dir=self.harness.base_dir / "logs",
            ready=lambda s: http_ok(f"{s.api_base}/models"),
            ready_timeout=120.0,
        )
        self.routers.append(server)
        return server

    def stop_routers(self) -> None:
        for router in self.routers:
            router.stop()
        self.routers.clear()

    def close(self) -> None:
        """Stop the routers and the replicas this fleet started."""
        self.stop_routers()
        own = self.replicas[1:] if self._shares_harness_server else self.replicas
        for server in own:
            server.stop()
        del self.replicas[len(self.replicas) - len(own) :]

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def router_log(server: LocalServer) -> Path:
    """Where a router writes (for a failing test's message)."""
    return server.log_path
