"""The server helpers of longctx.testing, on real (small) processes."""

from __future__ import annotations

import os
import signal
import socket
import sys
import textwrap
import time
from pathlib import Path

import pytest

from longctx.testing.errors import ServerDiedError, ServerStartError
from longctx.testing.servers import LocalServer, find_free_port, http_ok, port_is_free, start_server

# A stand-in HTTP server: prints a recognisable line, serves 200 on /health,
# and (when asked) starts a child in its process group.
DUMMY_SERVER = textwrap.dedent(
    """
    import http.server, subprocess, sys
    port = int(sys.argv[1])
    mode = sys.argv[2] if len(sys.argv) > 2 else ""
    print("dummy server log line: booting on", port, flush=True)
    if mode == "child":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("child pid", child.pid, flush=True)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """
)


@pytest.fixture
def dummy(tmp_path: Path) -> Path:
    script = tmp_path / "dummy_server.py"
    script.write_text(DUMMY_SERVER)
    return script


def health(server: LocalServer) -> bool:
    return http_ok(server.base_url + "/health")


def test_find_free_port_avoids_a_busy_port() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        assert not port_is_free(taken)
        chosen = find_free_port(preferred=taken)
        assert chosen != taken
        assert port_is_free(chosen)


def test_server_starts_on_another_port_when_the_preferred_one_is_busy(dummy: Path, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        with start_server(
            "dummy", [sys.executable, str(dummy), "{port}"], log_dir=tmp_path, ready=health, port=taken
        ) as server:
            assert server.port != taken
            assert http_ok(server.base_url + "/health")
            assert "dummy server log line" in server.log_tail()


def test_lost_port_race_is_retried_on_a_new_port(tmp_path: Path) -> None:
    # The first launch fails the way an engine does when another process took
    # its port between our check and its bind; the second launch works.
    flaky = tmp_path / "flaky.py"
    flaky.write_text(
        textwrap.dedent(
            f"""
            import os, sys
            flag = {str(tmp_path / "first-attempt-done")!r}
            if not os.path.exists(flag):
                open(flag, "w").close()
                print("OSError: [Errno 98] Address already in use", flush=True)
                sys.exit(1)
            """
        )
        + DUMMY_SERVER
    )
    with start_server(
        "flaky", [sys.executable, str(flaky), "{port}"], log_dir=tmp_path, ready=health
    ) as server:
        assert health(server)
    assert len(list(tmp_path.glob("flaky-*.log"))) == 2


def test_server_exiting_at_start_raises_with_log_tail(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "print('fatal: no model weights here'); raise SystemExit(3)", "{port}"]
    with pytest.raises(ServerStartError) as raised:
        start_server("broken", argv, log_dir=tmp_path, ready=health, ready_timeout=60)
    assert "exited with code 3" in str(raised.value)
    assert "fatal: no model weights here" in raised.value.log_tail
    assert "fatal: no model weights here" in str(raised.value)


def test_server_not_ready_in_time_raises_with_log_tail_and_is_stopped(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-c",
        "import time; print('still loading', flush=True); time.sleep(600)",
        "{port}",
    ]
    started = time.monotonic()
    with pytest.raises(ServerStartError) as raised:
        start_server("slow", argv, log_dir=tmp_path, ready=health, ready_timeout=3)
    assert time.monotonic() - started < 30
    assert "not ready after 3 s" in str(raised.value)
    assert "still loading" in raised.value.log_tail


def test_stop_kills_the_whole_process_group(dummy: Path, tmp_path: Path) -> None:
    server = start_server(
        "dummy", [sys.executable, str(dummy), "{port}", "child"], log_dir=tmp_path, ready=health
    )
    child_pid = int(server.log_tail().split("child pid")[1].split()[0])
    os.kill(child_pid, 0)  # the child is alive
    server.stop(timeout=10)
    assert not server.alive()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"child {child_pid} survived stop()")


def test_check_alive_reports_a_dead_server_with_its_log(dummy: Path, tmp_path: Path) -> None:
    with start_server(
        "dummy", [sys.executable, str(dummy), "{port}"], log_dir=tmp_path, ready=health
    ) as server:
        server.check_alive()
        os.kill(server.pid, signal.SIGKILL)
        server.process.wait(timeout=10)
        with pytest.raises(ServerDiedError) as raised:
            server.check_alive()
    assert raised.value.returncode == -signal.SIGKILL
    assert "dummy server log line" in str(raised.value)
