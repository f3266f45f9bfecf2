"""The soak across two client machines sharing one PostgreSQL store: SIGINT, SIGKILL and a database restart.

Two "machines" (each its own ``HOME`` and ``LONGCTX_HOME``, its own process
tree, one ``LONGCTX_STORE``) run one job at once against one server, while
faults land: in the first round machine A is sent SIGINT and machine B
SIGKILL once each has stored some answers; in the second the database
server is stopped (every connection cut) for 3 s and started again mid-way;
in the third A is killed with SIGKILL and the database restarted once more.
Then both machines run the job again, round after round, until both finish. Item
leases last ``--lease`` seconds, so a killed machine's items are taken over
by time (the server's clock), never by a process check.

What is checked, reading the database and the clients' outputs:

- lost: items with no stored answer at the end, and answers a client printed
  as stored that the store lacks: 0;
- stored twice: items with more than one stored answer: 0;
- answered twice: items that two runs both asked and reported as theirs: 0;
- half written: turns without their request, answer keys without their turn: 0;
- leases left at the end: 0; the URL's password in any output or row: 0;
- while the database was down: what the clients said (one clear line), and
  that the next round went on from what was committed.

The server is a stand-in OpenAI-compatible engine (answers after
``--answer-seconds``): what is soaked is the store, not inference. Run it:

    python benchmarks/soak_shared.py [--items 48] [--seed 49] [--write]

``--write`` puts the figures in docs/benchmarks.md (section ``soak-shared``).
This file run as ``python soak_shared.py client JOB URL LEASE`` is one machine's run.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))  # the stand-in engine: tests/fake_engine.py

JOB_ID = "soak-shared"


# -- one machine's run -------------------------------------------------------------------


def client(job_file: str, url: str, lease: float) -> int:
    """Run the job as a user's script would, printing each item's result as a JSON line as it settles."""
    from longctx import Job, JobOptions, ServerOptions, read_job
    from longctx.errors import LongctxError

    printing = threading.Lock()  # results settle on several threads: one whole line at a time

    def told(result: object) -> None:
        line = {"index": result.index, "ok": result.ok, "resumed": result.resumed, "error": result.error}  # type: ignore[attr-defined]
        with printing:
            print(json.dumps(line), flush=True)

    job = Job(read_job(job_file), server=ServerOptions(base_url=url), on_result=told,
              options=JobOptions(job_id=JOB_ID, lease_seconds=lease, packs_in_flight=2))  # fmt: skip
    try:
        report = job.run()
    except LongctxError as error:
        print(f"longctx: {error.describe()}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("longctx: interrupted", file=sys.stderr, flush=True)
        return 130
    return 0 if all(result.ok for result in report.results) else 1


# -- the stand-in engine over HTTP --------------------------------------------------------


def serve(engine: object) -> tuple[http.server.ThreadingHTTPServer, str]:
    """``engine`` (a FakeEngine) on a loopback port; the server and its /v1 URL."""
    import httpx2

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            content = self.rfile.read(length) if length else b""
            request = httpx2.Request(self.command, f"http://fake-engine:8000{self.path}",
                                     headers=dict(self.headers), content=content)  # fmt: skip
            response = engine.handle(request)  # type: ignore[attr-defined]
            body = response.read()
            self.send_response(response.status_code)
            for name, value in response.headers.items():
                if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            pass  # a client killed mid-request resets its connection: expected here

    httpd = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/v1"


def slow_engine(seconds: float) -> object:
    from fake_engine import FakeEngine

    class Slow(FakeEngine):
        def chat(self, request: object) -> object:
            time.sleep(seconds)
            return super().chat(request)  # type: ignore[arg-type]

    return Slow(engine="generic", block=1)


# -- the machines and the faults ----------------------------------------------------------------


@dataclass
class Machine:
    """One client machine: its home, and each run's process, output lines and exit code."""

    name: str
    home: Path
    lines: list[dict[str, object]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    exits: list[int] = field(default_factory=list)
    process: subprocess.Popen[str] | None = None
    _reader: threading.Thread | None = None

    def start(self, job_file: Path, engine_url: str, store_url: str, lease: float) -> None:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("LONGCTX_")}
        environment |= {"HOME": str(self.home), "LONGCTX_HOME": str(self.home / "longctx"),
                        "LONGCTX_STORE": store_url, "LONGCTX_CONFIG": str(self.home / "none.toml")}  # fmt: skip
        command = [sys.executable, __file__, "client", str(job_file), engine_url, str(lease)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env=environment, cwd=self.home, start_new_session=True)  # fmt: skip
        self._reader = threading.Thread(target=self._read, args=(self.process,), daemon=True)
        self._reader.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("{"):  # a result; anything else a client prints is not counted
                self.lines.append({**json.loads(line), "run": len(self.exits)})

    def answered_now(self) -> int:
        return sum(1 for line in self.lines if line["run"] == len(self.exits) and line["ok"])

    def signal(self, number: int) -> bool:
        """Send ``number`` to the run's process group; whether it was still running to get it."""
        if self.process is None or self.process.poll() is not None:
            return False
        os.killpg(self.process.pid, number)
        return True

    def wait(self, bound: float = 300) -> int:
        assert self.process is not None and self._reader is not None
        try:
            _, err = self.process.communicate(timeout=bound)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            _, err = self.process.communicate()
            err += "\nHUNG: killed past its bound"
        self._reader.join()
        self.errors += [line for line in err.splitlines() if line.startswith(("longctx:", "HUNG"))]
        self.exits.append(self.process.returncode)
        return self.process.returncode


@dataclass
class Fault:
    """A fault of a round: whom (a machine, or the database), what, once how many answers are stored."""

    target: str
    what: str
    after_answers: int


def run_round(machines: list[Machine], faults: list[Fault], start: object, server: object) -> list[str]:
    """Start every machine, land the faults as their triggers come, wait for all; what was done, in words."""
    for machine in machines:
        start(machine)  # type: ignore[operator]
    done: list[str] = []
    pending = list(faults)
    while any(m.process is not None and m.process.poll() is None for m in machines) and pending:
        for fault in list(pending):
            if fault.target == "database":
                stored = sum(m.answered_now() for m in machines)
                if stored >= fault.after_answers:
                    server.halt()  # type: ignore[attr-defined]
                    time.sleep(3.0)  # down for 3 s while the clients ask
                    server.begin()  # type: ignore[attr-defined]
                    done.append(f"database restarted after {stored} answers this round (down 3 s)")
                    pending.remove(fault)
                continue
            machine = next(m for m in machines if m.name == fault.target)
            if machine.answered_now() >= fault.after_answers:
                landed = machine.signal(signal.SIGINT if fault.what == "sigint" else signal.SIGKILL)
                what = "" if landed else " (it had already stopped: not sent)"
                done.append(
                    f"{fault.what} to machine {machine.name} after {machine.answered_now()} answers{what}"
                )
                pending.remove(fault)
        time.sleep(0.05)
    for machine in machines:
        machine.wait()
    return done


# -- the checks ----------------------------------------------------------------------------------------


@dataclass
class Findings:
    items: int
    lost: list[int]
    stored_twice: list[int]
    answered_twice: list[int]
    half_written: int
    leases_left: int
    password_seen: list[str]
    server_asks: int
    outage_lines: list[str]

    @property
    def ok(self) -> bool:
        return not (self.lost or self.stored_twice or self.answered_twice or self.half_written
                    or self.leases_left or self.password_seen)  # fmt: skip


def check(store_url: str, password: str, machines: list[Machine], items: int, asks: int) -> Findings:
    """Read the database and the clients' outputs (see the module docstring)."""
    import psycopg

    with psycopg.connect(store_url) as connection:
        keys = [row[0] for row in connection.execute("SELECT key FROM answer_keys WHERE key LIKE %s",
                                                      [f"job:{JOB_ID}:%"])]  # fmt: skip
        per_item = Counter(int(key.split(":")[2]) for key in keys)
        half = connection.execute(
            "SELECT (SELECT count(*) FROM turns t LEFT JOIN requests r ON r.id = t.request_id WHERE r.id IS NULL)"
            " + (SELECT count(*) FROM answer_keys k LEFT JOIN turns t ON t.session_id = k.session_id"
            " AND t.position = k.position WHERE t.session_id IS NULL)"
        ).fetchone()[0]
        leases = connection.execute(  # live ones: a lapsed row of a killed run holds nothing
            "SELECT count(*) FROM job_leases WHERE expires_at > extract(epoch FROM clock_timestamp())"
        ).fetchone()[0]
        tables = [row[0] for row in connection.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]  # fmt: skip
        rows = "".join(str(connection.execute(f"SELECT * FROM {table}").fetchall()) for table in tables)
    told = {int(line["index"]) for m in machines for line in m.lines if line["ok"]}  # type: ignore[call-overload]
    asked = Counter(int(line["index"]) for m in machines for line in m.lines  # type: ignore[call-overload]
                    if line["ok"] and not line["resumed"])  # fmt: skip
    seen = [f"machine {m.name}" for m in machines if password in json.dumps(m.lines) + "".join(m.errors)]
    seen += ["the database rows"] if password in rows else []
    outage = list(dict.fromkeys(e for m in machines for e in m.errors))  # what the clients said on stderr
    return Findings(
        items=items,
        lost=sorted(set(range(items)) - set(per_item)) + sorted(told - set(per_item)),
        stored_twice=sorted(index for index, n in per_item.items() if n > 1),
        answered_twice=sorted(index for index, n in asked.items() if n > 1),
        half_written=int(half),
        leases_left=int(leases),
        password_seen=seen,
        server_asks=asks,
        outage_lines=outage,
    )


# -- the soak --------------------------------------------------------------------------------------------


def make_job(root: Path, items: int, packs: int) -> Path:
    lines = []
    for number in range(packs):
        folder = root / f"pack{number}"
        folder.mkdir(parents=True)
        (folder / "main.py").write_text(f"def answer():\n    return {number}\n" + "# filler\n" * 40)
    for index in range(items):
        lines.append(
            json.dumps({"paths": [str(root / f"pack{index % packs}")], "question": f"question {index}?"})
        )
    job_file = root / "job.jsonl"
    job_file.write_text("\n".join(lines) + "\n")
    return job_file


def soak(items: int, seed: int, lease: float, answer_seconds: float) -> tuple[Findings, list[str], float]:
    from longctx.testing.postgres import ROLE_PASSWORD, PostgresServer

    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="longctx-soak-shared-"))
    server = PostgresServer.start()
    engine = slow_engine(answer_seconds)
    httpd, engine_url = serve(engine)
    started = time.monotonic()
    try:
        store_url = server.fresh_url()
        job_file = make_job(work, items, packs=6)
        machines = [Machine(name, work / name) for name in ("A", "B")]
        for machine in machines:
            machine.home.mkdir()

        def start(machine: Machine) -> None:
            machine.start(job_file, engine_url, store_url, lease)

        plan = [
            [Fault("A", "sigint", rng.randint(3, 5)), Fault("B", "sigkill", rng.randint(2, 5))],
            [Fault("database", "restart", rng.randint(5, 8))],
            [Fault("A", "sigkill", rng.randint(2, 4)), Fault("database", "restart", rng.randint(6, 9))],
        ]  # fmt: skip
        log: list[str] = []
        for number in range(1, 8):
            faults = plan[number - 1] if number <= len(plan) else []
            done = run_round(machines, faults, start, server)
            exits = [m.exits[-1] for m in machines]
            log.append(f"round {number}: {'; '.join(done) or 'no fault'}; exits A {exits[0]}, B {exits[1]}")
            if number > len(plan) and exits == [0, 0]:
                break
        findings = check(store_url, ROLE_PASSWORD, machines, items, len(engine.chat_bodies))  # type: ignore[attr-defined]
        return findings, log, time.monotonic() - started
    finally:
        httpd.shutdown()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def section(findings: Findings, log: list[str], seconds: float, args: argparse.Namespace) -> str:
    rows = [
        ("items", str(findings.items)),
        ("lost", str(len(findings.lost))),
        ("stored twice", str(len(findings.stored_twice))),
        ("answered twice (asked by two runs)", str(len(findings.answered_twice))),
        ("half-written rows", str(findings.half_written)),
        ("live leases left at the end", str(findings.leases_left)),
        ("the URL's password in an output or row", str(len(findings.password_seen))),
        ("requests the server answered", f"{findings.server_asks} (the excess: answers in flight when a"
                                          " client was killed or the database was down, never stored)"),
    ]  # fmt: skip
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    rounds = "\n".join(f"- {line}" for line in log)
    said = [line for line in findings.outage_lines if "cannot be reached" in line] or findings.outage_lines
    first = said[0] if said else "(nothing)"
    others = [
        line for line in findings.outage_lines if line.split(" failed: ")[-1] != first.split(" failed: ")[-1]
    ]
    outage = first + "".join(f"\n    (also: {line[:160]})" for line in others[:3])
    return (
        f"Two client machines (own HOME and LONGCTX_HOME, own process trees), one PostgreSQL store, "
        f"{findings.items} job items, leases of {args.lease:g} s, seed {args.seed}; {seconds:.0f} s in all.\n\n"
        f"| check | result |\n|---|---|\n{table}\n\n{rounds}\n\nWhile the database was down, a client said:\n\n"
        f"    {outage}\n"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        sys.exit(client(sys.argv[2], sys.argv[3], float(sys.argv[4])))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=48)
    parser.add_argument("--seed", type=int, default=49)
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--answer-seconds", type=float, default=0.15)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    findings, log, seconds = soak(args.items, args.seed, args.lease, args.answer_seconds)
    text = section(findings, log, seconds, args)
    print(text)
    if args.write:
        from bench import write_section  # type: ignore[import-not-found]

        write_section("soak-shared", text)
    sys.exit(0 if findings.ok else 1)


if __name__ == "__main__":
    main()
