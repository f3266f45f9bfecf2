"""The soak: many longctx clients at once against two CPU vLLM replicas, while faults land.

For ``SoakPlan.seconds``, ``SoakPlan.lanes`` clients run at once, each a
process as a user starts it: ``longctx ask`` and ``longctx chat`` (in a
pseudo-terminal) and MCP calls (the MCP SDK's stdio client and ``longctx
mcp``) through a real vllm-router (``consistent_hash``) in front of both
replicas, ``longctx batch`` and ``longctx job`` over both replica URLs (two
job processes at once over one job file), all writing one store. Meanwhile,
from one seeded random generator (so a run's schedule is reproducible):

- the second replica is killed (SIGKILL to its process group, as a crash)
  and restarted on its port, ``SoakPlan.replica_kills`` times;
- clients are sent SIGINT (a chat's Ctrl-C is typed into its terminal) or
  SIGKILL once they have something stored, or at a random point;
- one batch runs with its store on a small tmpfs that is filled once two of
  its answers are stored (where nothing can be mounted: SQLite's
  ``max_page_count`` makes the store full instead, and the run says so).

Then every batch and job that did not finish is resumed (``batch --session``,
the same ``job`` command again) and must complete, asking only what was
missing, and ``soak_check.py`` reads the stores and the clients' outputs:
every answer a client printed as stored is stored exactly once, no
half-written turn, ``PRAGMA integrity_check`` ok, no counter-check false
alarm; no client ran past its bound; every SIGINT to a CLI client with an
answer stored left within 2 s with the session id printed.

Run it (it starts the replicas and the router with ``longctx.testing``):

    python benchmarks/soak.py [--seconds 180] [--seed 39] [--write]

``--write`` puts the figures in docs/benchmarks.md (section ``soak``); a short
run of the same soak is ``tests/test_soak.py``.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import random
import sqlite3
import statistics
import subprocess
import threading
import time
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from soak_check import StoreFindings, check_store
from soak_clients import (
    ENTRY_POINT,
    EXIT_INTERRUPTED,
    ChatScript,
    ClientRun,
    Told,
    Trigger,
    api_command,
    client_env,
    parse_ask_or_batch,
    parse_job_lines,
    parse_json_lines,
    run_chat,
    run_process,
    stored_under,
    told_of_job,
)

CTRL_C_GOAL_SECONDS = 2.0
VICTIM = 1  # the fleet's second replica; the first is the harness's shared server


@dataclass(frozen=True)
class SoakPlan:
    """How long and how hard: the bounds of a soak run."""

    seed: int = 39
    seconds: float = 180.0  # clients are started until then
    lanes: int = 3  # clients at once (a job pair is one lane's two processes)
    max_clients: int = 60
    replica_kills: int = 3
    answer_tokens: int = 8
    bound_seconds: float = 240.0  # a client still running after this is killed and counted as hung
    batch_questions: int = 6


CI_PLAN = SoakPlan(
    seconds=30.0, lanes=2, max_clients=6, replica_kills=1, bound_seconds=180.0, batch_questions=4
)
"""The short soak of tests/test_soak.py: every kind of client and fault once."""

KINDS = ("ask", "batch", "chat", "job", "mcp")
# The first clients cover every kind and fault, so that a short run sees each; the rest are drawn.
OPENING = (("chat", "sigint"), ("batch", "sigint"), ("job", "sigkill"), ("mcp", "sigkill"), ("ask", "none"),
           ("batch", "sigkill"), ("chat", "none"), ("job", "sigint"), ("ask", "sigint"), ("mcp", "none"))  # fmt: skip


@dataclass(frozen=True)
class ClientSpec:
    """One client of the schedule: its kind, the fault it gets, when, and which folder it asks about."""

    name: str
    kind: str
    fault: str
    delay: float
    folder: int


def schedule(plan: SoakPlan, rng: random.Random) -> list[ClientSpec]:
    """The clients in the order they start: the opening, then kinds and faults drawn from ``rng``."""
    specs = []
    for number in range(plan.max_clients):
        if number < len(OPENING):
            kind, fault = OPENING[number]
        else:
            kind = rng.choice(KINDS)
            fault = rng.choices(("none", "sigint", "sigkill"), weights=(5, 3, 2))[0]
        if kind == "mcp" and fault == "sigint":
            fault = "sigkill"  # the MCP client is a script, not longctx's CLI: only a crash is a fault to it
        delay = rng.uniform(0.05, 0.6) if kind == "chat" else rng.uniform(0.0, 1.5)
        specs.append(ClientSpec(f"{kind}-{number}", kind, fault, delay, rng.randrange(3)))
    return specs


@dataclass
class Unfinished:
    """A batch or job to resume after the storm: its questions and how it is named."""

    client: str
    kind: str  # "batch" or "job"
    home: Path
    questions_file: Path
    questions: list[str]
    session_id: str | None = None


@dataclass
class Resumed:
    """A resume's outcome: what was stored before it, what it asked, whether it completed."""

    client: str
    kind: str
    stored_before: int
    total: int
    asked: int | None
    completed: bool
    note: str = ""

    @property
    def asked_only_missing(self) -> bool:
        return self.asked == self.total - self.stored_before


@dataclass
class Outage:
    killed_after: float  # seconds into the soak
    down_seconds: float


@dataclass
class SoakResult:
    """Everything a soak did and found (see :meth:`problems`)."""

    plan: SoakPlan
    seconds: float = 0.0
    runs: list[ClientRun] = field(default_factory=list)
    outages: list[Outage] = field(default_factory=list)
    resumed: list[Resumed] = field(default_factory=list)
    findings: list[StoreFindings] = field(default_factory=list)
    disk_full: str = ""  # how the full disk was made, and what the client saw
    resume_told: list[Told] = field(default_factory=list)

    @property
    def ctrl_c(self) -> list[ClientRun]:
        """CLI clients sent SIGINT (a chat's typed Ctrl-C) that still had it to handle."""
        return [
            run
            for run in self.runs
            if run.applied == "sigint" and run.kind in ("ask", "batch", "chat", "job")
        ]

    def problems(self) -> list[str]:
        """Every promise broken, one line each: empty when the soak passed."""
        found = [problem for findings in self.findings for problem in findings.problems]
        found += [
            f"{run.name} ran past its bound ({run.bound_seconds:.0f} s)" for run in self.runs if run.hung
        ]
        for resumed in self.resumed:
            if not resumed.completed:
                found.append(f"{resumed.client}: the resume did not complete: {resumed.note}")
            elif not resumed.asked_only_missing:
                found.append(f"{resumed.client}: the resume asked {resumed.asked}, "
                             f"not the {resumed.total - resumed.stored_before} missing")  # fmt: skip
        for run in self.ctrl_c:
            if _left_on_ctrl_c(run) and (run.signal_to_exit or 0) > CTRL_C_GOAL_SECONDS:
                found.append(f"{run.name}: Ctrl-C took {run.signal_to_exit:.2f} s to leave")
            if run.session_id_printed is False:
                found.append(f"{run.name}: Ctrl-C with answers stored, but no session id printed")
        return found


@dataclass
class Workload:
    """Where the clients point and what they ask about."""

    work: Path
    home: Path
    folders: list[Path]
    urls: list[str]
    router: str
    plan: SoakPlan
    unfinished: list[Unfinished] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def cli(self, *arguments: str) -> list[str]:
        return [str(ENTRY_POINT), *arguments, "--max-tokens", str(self.plan.answer_tokens)]

    def questions(self, name: str, count: int) -> list[str]:
        # The client's name in each question: every question is one client's, so the store's turns
        # with it are that client's, and "stored exactly once" is one turn per question.
        return [f"[{name}] What does f{number * 7 % 40} return, in one word?" for number in range(count)]


def make_folders(root: Path, count: int = 3) -> list[Path]:
    """Small plain folders to pack (about 2,000 tokens each)."""
    folders = []
    for number in range(count):
        folder = root / f"code{number}"
        folder.mkdir(parents=True, exist_ok=True)
        body = "".join(f"def f{line}(x):\n    return x * {line} + {number}\n" for line in range(40))
        (folder / "code.py").write_text(body)
        folders.append(folder)
    return folders


# -- the clients ---------------------------------------------------------------------------------


def run_ask(spec: ClientSpec, load: Workload) -> list[ClientRun]:
    run = ClientRun(spec.name, "ask", spec.fault, load.plan.bound_seconds)
    (question,) = load.questions(spec.name, 1)
    command = load.cli("ask", str(load.folders[spec.folder]), "--question", question, "--json",
                       "--base-url", load.router)  # fmt: skip
    run_process(run, command, client_env(load.home), load.work, Trigger(lambda: True, 0.5 + spec.delay))
    parse_ask_or_batch(run)
    return [run]


def run_batch(spec: ClientSpec, load: Workload) -> list[ClientRun]:
    run = ClientRun(spec.name, "batch", spec.fault, load.plan.bound_seconds)
    questions = load.questions(spec.name, load.plan.batch_questions)
    path = load.work / f"{spec.name}.questions"
    path.write_text("\n".join(questions) + "\n")
    command = load.cli("batch", str(load.folders[spec.folder]), "--questions", str(path), "--json",
                       "--concurrency", "2", "--base-url", ",".join(load.urls))  # fmt: skip
    ready = Trigger(lambda: stored_under(load.home, f"[{spec.name}]") >= 1, spec.delay)
    run_process(run, command, client_env(load.home), load.work, ready)
    session_id = parse_ask_or_batch(run)
    if run.applied == "sigint" and run.exit_code == EXIT_INTERRUPTED and run.told:
        run.session_id_printed = session_id is not None and f"stored in session {session_id}" in run.stderr
    with load.lock:
        load.unfinished.append(Unfinished(spec.name, "batch", load.home, path, questions, session_id))
    return [run]


def run_chat_client(spec: ClientSpec, load: Workload) -> list[ClientRun]:
    run = ClientRun(spec.name, "chat", spec.fault, load.plan.bound_seconds)
    questions = tuple(load.questions(spec.name, 2))
    script = ChatScript(
        questions,
        ctrl_c_after=spec.delay if spec.fault == "sigint" else None,
        kill_after=spec.delay if spec.fault == "sigkill" else None,
    )
    command = load.cli("chat", str(load.folders[spec.folder]), "--json", "--base-url", load.router)
    run_chat(run, command, client_env(load.home), script)
    # A chat's terminal: the second Ctrl-C ends it as /quit does (exit 0), with the resume line.
    if run.applied == "sigint" and run.exit_code in (0, EXIT_INTERRUPTED) and run.told:
        session_id = run.told[0].session_id
        run.session_id_printed = f"longctx chat --session {session_id}" in run.stdout
    return [run]


def run_job_pair(spec: ClientSpec, load: Workload) -> list[ClientRun]:
    """Two ``longctx job`` processes at once over one job file; the first gets the fault."""
    questions = load.questions(spec.name, 6)
    items = [
        {"paths": [str(load.folders[(spec.folder + n) % 3])], "question": q} for n, q in enumerate(questions)
    ]
    path = load.work / f"{spec.name}.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    runs = [ClientRun(f"{spec.name}{side}", "job", spec.fault if side == "a" else "none", load.plan.bound_seconds)
            for side in ("a", "b")]  # fmt: skip
    threads = []
    for run in runs:
        output = load.work / f"{run.name}.results"
        command = load.cli("job", str(path), "-o", str(output), "--base-url", ",".join(load.urls), "--quiet")
        ready = Trigger(lambda output=output: bool(parse_job_lines("", output)), spec.delay)
        thread = threading.Thread(
            target=run_process, args=(run, command, client_env(load.home), load.work, ready)
        )
        thread.start()
        threads.append(thread)
    for thread, run in zip(threads, runs, strict=True):
        thread.join()
        run.told.extend(told_of_job(run.name, parse_job_lines(run.name, load.work / f"{run.name}.results")))
    with load.lock:
        load.unfinished.append(Unfinished(spec.name, "job", load.home, path, questions))
    return runs


def run_mcp(spec: ClientSpec, load: Workload) -> list[ClientRun]:
    run = ClientRun(spec.name, "mcp", spec.fault, load.plan.bound_seconds)
    questions = load.questions(spec.name, 3)
    command = api_command("mcp", load.home, folder=load.folders[spec.folder], base_url=load.router,
                          questions=questions, max_tokens=load.plan.answer_tokens)  # fmt: skip
    run_process(run, command, client_env(load.home), load.work, Trigger(lambda: True, 1.0 + 2 * spec.delay))
    parse_json_lines(run)
    return [run]


RUNNERS = {"ask": run_ask, "batch": run_batch, "chat": run_chat_client, "job": run_job_pair, "mcp": run_mcp}


# -- the faults that are not a client's ----------------------------------------------------------


def replica_faults(fleet: object, plan: SoakPlan, rng: random.Random, started: float) -> list[Outage]:
    """Kill the victim replica and restart it, ``plan.replica_kills`` times spread over the run."""
    outages: list[Outage] = []
    for number in range(plan.replica_kills):
        at = started + plan.seconds * (number + rng.uniform(0.1, 0.5)) / plan.replica_kills
        while time.monotonic() < at:
            time.sleep(0.1)
        killed = time.monotonic()
        fleet.kill(VICTIM)  # type: ignore[attr-defined]
        time.sleep(rng.uniform(1.0, 4.0))
        fleet.restart(VICTIM)  # type: ignore[attr-defined]
        outages.append(Outage(killed - started, time.monotonic() - killed))
    return outages


class SmallDisk:
    """A small tmpfs for one store, filled on demand; or, where mounting fails, nothing (see ``mounted``)."""

    def __init__(self, path: Path, megabytes: int = 16) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(path)],
                              capture_output=True, text=True, check=False)  # fmt: skip
        self.mounted = done.returncode == 0
        self.why_not = done.stderr.strip() or f"mount exited {done.returncode}"
        self.filled = False

    def fill(self) -> None:
        """Write a ballast file until the filesystem says it is full (ENOSPC)."""
        with (self.path / "ballast").open("wb", buffering=0) as ballast:
            for size in (1 << 20, 1 << 12, 1):
                try:
                    while True:
                        ballast.write(b"\0" * size)
                except OSError as error:
                    if error.errno != errno.ENOSPC:
                        raise
        self.filled = True

    def free(self) -> None:
        (self.path / "ballast").unlink(missing_ok=True)

    def close(self) -> None:
        """Unmount it; a file still open in it (a client's) makes that lazy, never leaves it mounted."""
        if (
            self.mounted
            and subprocess.run(["umount", str(self.path)], capture_output=True, check=False).returncode
        ):
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)


def run_full_disk(load: Workload, disk: SmallDisk) -> tuple[ClientRun, str]:
    """A batch whose store's disk fills once two answers are stored; then the disk is freed."""
    name = "full-disk-batch"
    home = disk.path / "home"
    run = ClientRun(name, "batch", "disk-full", load.plan.bound_seconds)
    questions = load.questions(name, 10)
    path = load.work / f"{name}.questions"
    path.write_text("\n".join(questions) + "\n")
    if disk.mounted:
        command = load.cli("batch", str(load.folders[0]), "--questions", str(path), "--json",
                           "--concurrency", "1", "--base-url", ",".join(load.urls))  # fmt: skip
        ready = Trigger(lambda: stored_under(home, f"[{name}]") >= 2, 0.0, fire=disk.fill)
        run_process(run, command, client_env(home), load.work, ready)
        parse_ask_or_batch(run)
        disk.free()
        how = f"a {16} MiB tmpfs, filled by a ballast file once 2 answers were stored"
    else:
        command = api_command("full-batch", home, folder=load.folders[0], base_url=",".join(load.urls),
                              questions=questions, max_tokens=load.plan.answer_tokens)  # fmt: skip
        run_process(run, command, client_env(home), load.work, Trigger(lambda: False, 0.0))
        parse_json_lines(run)
        run.applied = "disk-full"
        how = f"no tmpfs ({disk.why_not}): SQLite's max_page_count set to the store's size after 1 answer"
    saw = [line for line in run.stderr.splitlines() if "full" in line.lower()][-1:]
    said = f"exit {run.exit_code}" + (f", said: {saw[0].strip()[:160]}" if saw else "")
    with load.lock:
        load.unfinished.append(Unfinished(name, "batch", home, path, questions))
    return run, f"{how}; the client: {said}"


# -- after the storm: resume, then check -----------------------------------------------------------


def _batch_session(item: Unfinished) -> str | None:
    """The batch's stored session: the one it printed, else the parent of its stored answers."""
    if item.session_id:
        return item.session_id
    database = item.home / "longctx.db"
    if not database.exists():
        return None
    prefix = f"[{item.client}]"
    with closing(sqlite3.connect(database)) as connection, connection:
        row = connection.execute(
            "SELECT s.parent_id FROM turns t JOIN sessions s ON s.id = t.session_id"
            " WHERE substr(t.question, 1, ?) = ? LIMIT 1",
            (len(prefix), prefix),
        ).fetchone()
    return row[0] if row else None


def stored_questions(home: Path, prefix: str) -> int:
    """Distinct questions starting with ``prefix`` that have a stored turn (a job item answered twice counts once)."""
    database = home / "longctx.db"
    if not database.exists():
        return 0
    with closing(sqlite3.connect(database)) as connection, connection:
        row = connection.execute(
            "SELECT COUNT(DISTINCT question) FROM turns WHERE substr(question, 1, ?) = ?",
            (len(prefix), prefix),
        ).fetchone()
    return int(row[0])


def _batch_session(item: Unfinished) -> str | None:
    """The batch's stored session: the one it printed, else the parent of its stored answers."""
    if item.session_id:
        return item.session_id
    database = item.home / "longctx.db"
    if not database.exists():
        return None
    prefix = f"[{item.client}]"
    with closing(sqlite3.connect(database)) as connection, connection:
        row = connection.execute(
            "SELECT s.parent_id FROM turns t JOIN sessions s ON s.id = t.session_id"
            " WHERE substr(t.question, 1, ?) = ? LIMIT 1",
            (len(prefix), prefix),
        ).fetchone()
    return row[0] if row else None


def resume_batch(item: Unfinished, load: Workload) -> tuple[Resumed | None, list[Told]]:
    """``longctx batch --session`` for a batch with answers missing; None if it has none or none stored."""
    stored = stored_questions(item.home, f"[{item.client}]")
    session_id = _batch_session(item)
    if session_id is None or stored == len(item.questions):
        return None, []  # nothing stored (the client said: run it again), or nothing missing
    run = ClientRun(f"{item.client}-resume", "resume", "none", load.plan.bound_seconds)
    command = [
        str(ENTRY_POINT),
        "batch",
        "--session",
        session_id,
        "--questions",
        str(item.questions_file),
        "--json",
    ]
    run_process(run, command, client_env(item.home), load.work, Trigger(lambda: False, 0.0))
    total = len(item.questions)
    if run.exit_code != 0 or run.hung:
        return Resumed(item.client, "batch", stored, total, None, False, run.stderr.strip()[-300:]), []
    data = json.loads(run.stdout)
    asked = sum(1 for line in data["report"]["requests"] if line.get("purpose") == "sibling")
    complete = [answer["question"] for answer in data["answers"]] == item.questions
    said = f"{stored} of {total} answers from an earlier run" in run.stderr
    note = "" if complete and said else f"answers complete: {complete}; said what was reused: {said}"
    parse_ask_or_batch(run)
    return Resumed(item.client, "batch", stored, total, asked, complete and said, note), run.told


def resume_job(item: Unfinished, load: Workload) -> tuple[Resumed, list[Told]]:
    """The same ``longctx job`` command again: it must answer every item, asking only the missing."""
    stored = stored_questions(item.home, f"[{item.client}]")
    run = ClientRun(f"{item.client}-resume", "resume", "none", load.plan.bound_seconds)
    output = load.work / f"{run.name}.results"
    command = load.cli(
        "job", str(item.questions_file), "-o", str(output), "--base-url", ",".join(load.urls), "--quiet"
    )
    run_process(run, command, client_env(item.home), load.work, Trigger(lambda: False, 0.0))
    total = len(item.questions)
    lines = parse_job_lines(run.name, output)
    if run.exit_code != 0 or run.hung:
        return Resumed(item.client, "job", stored, total, None, False, run.stderr.strip()[-300:]), []
    asked = sum(1 for line in lines if not line.get("resumed"))
    complete = len(lines) == total and all(line.get("answer") is not None for line in lines)
    return Resumed(item.client, "job", stored, total, asked, complete), told_of_job(run.name, lines)


# -- the run ---------------------------------------------------------------------------------------


def _lane(specs: list[ClientSpec], load: Workload, deadline: float, result: SoakResult) -> None:
    for spec in specs:
        if time.monotonic() >= deadline:
            return
        runs = RUNNERS[spec.kind](spec, load)
        with load.lock:
            result.runs.extend(runs)


def _full_disk_lane(load: Workload, disk: SmallDisk, result: SoakResult) -> None:
    run, said = run_full_disk(load, disk)
    with load.lock:
        result.runs.append(run)
        result.disk_full = said


def _storm(load: Workload, fleet: object, disk: SmallDisk, result: SoakResult) -> None:
    """The clients in their lanes, the full-disk batch and the replica kills, all at once, to the deadline."""
    plan = load.plan
    specs = schedule(plan, random.Random(plan.seed))
    started = time.monotonic()
    deadline = started + plan.seconds
    errors: list[BaseException] = []

    def guarded(target: object, *args: object) -> threading.Thread:
        def body() -> None:
            try:
                outcome = target(*args)  # type: ignore[operator]
                if isinstance(outcome, list):
                    result.outages.extend(outcome)
            except BaseException as error:  # noqa: BLE001 - re-raised once every thread has ended
                errors.append(error)

        thread = threading.Thread(target=body)
        thread.start()
        return thread

    threads = [
        guarded(_lane, specs[lane :: plan.lanes], load, deadline, result) for lane in range(plan.lanes)
    ]
    threads.append(guarded(_full_disk_lane, load, disk, result))
    threads.append(guarded(replica_faults, fleet, plan, random.Random(plan.seed + 1), started))
    for thread in threads:
        thread.join()
    result.seconds = time.monotonic() - started
    if errors:
        raise errors[0]


def run_soak(fleet: object, router: str, work: Path, plan: SoakPlan) -> SoakResult:
    """Run the soak on ``fleet`` (its replicas' URLs) and ``router``, in ``work``; resume; check."""
    work.mkdir(parents=True, exist_ok=True)
    load = Workload(work, work / "home", make_folders(work / "folders"), list(fleet.urls), router, plan)  # type: ignore[attr-defined]
    result = SoakResult(plan)
    disk = SmallDisk(work / "small-disk")
    try:
        _storm(load, fleet, disk, result)
        told_again: list[Told] = []
        for item in load.unfinished:
            resumed, told = resume_batch(item, load) if item.kind == "batch" else resume_job(item, load)
            if resumed is not None:
                result.resumed.append(resumed)
            told_again.extend(told)
        result.resume_told = told_again
        told = [answer for run in result.runs for answer in run.told] + told_again
        full_home = disk.path / "home"
        in_full = {answer for answer in told if answer.client.startswith("full-disk")}
        jobs = [q for item in load.unfinished if item.kind == "job" for q in item.questions]
        result.findings.append(check_store(load.home, [a for a in told if a not in in_full], jobs))
        if (full_home / "longctx.db").exists():
            result.findings.append(check_store(full_home, list(in_full)))
    finally:
        disk.close()
    return result


# -- the figures -------------------------------------------------------------------------------------


def _faults(result: SoakResult) -> str:
    applied = Counter(run.applied for run in result.runs if run.applied != "none")
    typed = sum(1 for run in result.runs if run.applied == "sigint" and run.kind == "chat")
    downs = [outage.down_seconds for outage in result.outages]
    down = f" (down {min(downs):.0f}-{max(downs):.0f} s each, restart included)" if downs else ""
    return (
        f"{len(result.outages)} replica kills{down}; {applied['sigint']} SIGINT ({typed} a Ctrl-C typed into a "
        f"chat's terminal); {applied['sigkill']} SIGKILL; {applied['disk-full']} run with its store's disk full"
    )


def _left_on_ctrl_c(run: ClientRun) -> bool:
    """Whether ``run`` left as Ctrl-C makes it: exit 130, or a chat's terminal ended by its second Ctrl-C."""
    return run.exit_code == EXIT_INTERRUPTED or (run.kind == "chat" and run.exit_code == 0)


def _ctrl_c(result: SoakResult) -> str:
    left = [run for run in result.ctrl_c if _left_on_ctrl_c(run) and run.signal_to_exit is not None]
    if not left:
        return "no SIGINT landed while a client was working"
    times = [run.signal_to_exit or 0.0 for run in left]
    asked = [run for run in left if run.session_id_printed is not None]
    printed = sum(1 for run in asked if run.session_id_printed)
    return (
        f"{len(left)} clients left on Ctrl-C (exit 130; a chat's terminal: its second Ctrl-C, exit 0): median {statistics.median(times):.2f} s, "
        f"max {max(times):.2f} s (goal: under {CTRL_C_GOAL_SECONDS:.0f} s); session id printed by "
        f"{printed} of the {len(asked)} with an answer stored"
    )


def _resumes(result: SoakResult) -> str:
    parts = []
    for kind in ("batch", "job"):
        mine = [r for r in result.resumed if r.kind == kind]
        done = sum(1 for r in mine if r.completed)
        only = sum(1 for r in mine if r.completed and r.asked_only_missing)
        again = sum((r.asked or 0) for r in mine)
        parts.append(f"{len(mine)} {kind}es" if kind == "batch" else f"{len(mine)} jobs")
        parts[-1] += f" ({done} completed, {only} asked only what was missing: {again} questions)"
    return "; ".join(parts)


def figures(result: SoakResult) -> list[tuple[str, str]]:
    """The soak's figures, as (name, value) rows."""
    findings = result.findings
    kinds = Counter(run.kind for run in result.runs)
    told = sum(len(run.told) for run in result.runs) + len(result.resume_told)
    return [
        ("wall time of the storm", f"{result.seconds:.0f} s"),
        ("clients", f"{len(result.runs)}: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))),
        ("requests stored", f"{sum(f.requests for f in findings):,}"),
        ("faults injected", _faults(result)),
        ("answers printed as stored (resumes included)", f"{told:,}"),
        ("turns stored", f"{sum(f.turns for f in findings):,}"),
        ("items lost", str(sum(len(f.lost) for f in findings))),
        ("answers stored twice", str(sum(len(f.stored_twice) for f in findings))),
        ("job items answered by two runs at once", str(sum(len(f.duplicate_items) for f in findings))),
        ("half-written turns or sessions", str(sum(len(f.half_written) for f in findings))),
        ("`PRAGMA integrity_check`", ", ".join(f.integrity for f in findings)),
        ("resumed", _resumes(result)),
        (
            "counter checks",
            f"{sum(f.checks_matching for f in findings)} matched, "
            f"{sum(f.checks_skipped for f in findings)} skipped with the reason, "
            f"{sum(len(f.false_alarms) for f in findings)} false alarms",
        ),
        ("clients past their bound", str(sum(run.hung for run in result.runs))),
        ("Ctrl-C under load", _ctrl_c(result)),
    ]


def section(result: SoakResult, machine: str) -> str:
    """The docs/benchmarks.md section of a soak run."""
    plan = result.plan
    problems = result.problems()
    rows = [f"| {name} | {value} |" for name, value in figures(result)]
    return "\n".join([
        "## Soak: many clients, killed replicas, Ctrl-C and a full disk",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M')} on {machine} by `benchmarks/soak.py --seconds "
        f"{plan.seconds:.0f} --seed {plan.seed}`: two CPU vLLM replicas of the tiny test model (the test "
        "harness's), vllm-router (`consistent_hash`) in front; "
        f"{plan.lanes} clients at once (a job pair is two processes), started until {plan.seconds:.0f} s or "
        f"{plan.max_clients} clients, each bounded to {plan.bound_seconds:.0f} s, "
        f"{plan.answer_tokens} answer tokens; `ask`, `chat` (in a pseudo-terminal) and MCP calls through the router, "
        "`batch` and `job` (two processes at once over one job file) over both replica URLs, one store. "
        "Faults from the seeded schedule; then every unfinished batch and job resumed, and the stores and the "
        "clients' outputs checked (`benchmarks/soak_check.py`). A short run of the same soak: `tests/test_soak.py`.",
        "",
        "| figure | value |",
        "|---|---|",
        *rows,
        "",
        f"- The full disk: {result.disk_full or 'not run'}.",
        "- Two `longctx job` runs over one job file at once: the store's leases give each item one owner, "
        "and an item answered by both is a broken promise.",
        f"- Broken promises: {'none' if not problems else '; '.join(problems[:10])}.",
    ])  # fmt: skip


def main() -> None:
    import platform
    import sys
    import tempfile

    from bench import write_section

    from longctx.testing.fleet import Fleet
    from longctx.testing.harness import EngineHarness

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=SoakPlan.seconds)
    parser.add_argument("--seed", type=int, default=SoakPlan.seed)
    parser.add_argument("--lanes", type=int, default=SoakPlan.lanes)
    parser.add_argument("--kills", type=int, default=SoakPlan.replica_kills)
    parser.add_argument("--write", action="store_true", help="write the section soak of docs/benchmarks.md")
    args = parser.parse_args()
    plan = SoakPlan(seed=args.seed, seconds=args.seconds, lanes=args.lanes, replica_kills=args.kills)
    base = os.environ.get("LONGCTX_HARNESS_DIR") or str(
        Path(__file__).resolve().parent.parent / ".cache" / "harness"
    )
    harness = EngineHarness(Path(base))
    try:
        with Fleet(harness, replicas=2) as fleet, tempfile.TemporaryDirectory(prefix="longctx-soak-") as work:
            router = fleet.start_router("vllm-router", "consistent_hash")
            result = run_soak(fleet, router.api_base, Path(work), plan)
    finally:
        harness.close()
    for name, value in figures(result):
        print(f"{name}: {value}")
    problems = result.problems()
    print("problems:", *problems or ["none"], sep="\n  ")
    if args.write:
        machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        write_section("soak", section(result, machine))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
