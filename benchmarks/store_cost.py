"""What the store costs on each backend: the embedded SQLite file against a PostgreSQL server, side by side.

Two figures, each measured on both stores on the same machine in one run:

The two stores take turns (a commit each, a pack each), so a load on the
machine meanwhile weighs on both alike.

- per-turn write latency: one ``commit_turn`` (a turn, its request and its
  answer key, one transaction), ``--turns`` times; median and 95th percentile;
- a 10,000-item job's store overhead: the store calls a job makes, replayed
  without a server (``--items`` items in packs of ``--per-pack``): the answers
  stored before (one read by job prefix), each pack's leases taken in one
  transaction, each answer committed under its key with its sibling session
  and request (the lease checked in that transaction), each lease given
  back, a renewal per pack; total seconds and per item.

The PostgreSQL server is local (loopback TCP, started here with
``longctx.testing.postgres``, fsync on): a server across a network adds its
round trip to every statement. Run it:

    python benchmarks/store_cost.py [--turns 500] [--items 10000] [--write]

``--write`` puts the figures in docs/benchmarks.md (section ``store-backends``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from longctx.store import LeaseHolder, RequestRecord, SessionRecord, Store, TurnRecord
from longctx.testing.postgres import PostgresServer
from longctx.usage import Usage

USAGE = Usage(50_000, 49_000, None, 120, 0.05, 0.9)


def request_of(session_id: str, position: int) -> RequestRecord:
    return RequestRecord(f"r-{session_id}-{position}", session_id, None, "turn", time.time(), "http://h/v1",
                         "vllm", "model", USAGE, 1)  # fmt: skip


def turn_of(session_id: str, position: int, request: RequestRecord) -> TurnRecord:
    answer = "An answer of a few sentences, as a model gives it. " * 6
    return TurnRecord(
        session_id, position, f"question {position}?", answer, answer, None, request.id, time.time()
    )


def turn_latencies(stores: dict[str, Store], turns: int) -> dict[str, list[float]]:
    """Seconds per commit_turn of one session's turns on each store, each with its request and key.

    The stores take turns, one commit each, so a load on the machine meanwhile weighs on both alike.
    """
    seconds: dict[str, list[float]] = {name: [] for name in stores}
    for store in stores.values():
        store.sessions.create_session(
            SessionRecord("chat", time.time(), "session", "t", None, None, None, {})
        )
    for position in range(turns):
        for name, store in stores.items():
            request = request_of("chat", position)
            started = time.perf_counter()
            store.sessions.commit_turn(turn_of("chat", position, request), request, key=f"chat:{position}")
            seconds[name].append(time.perf_counter() - started)
    return seconds


def job_pack(store: Store, holder: LeaseHolder, number: int, indices: range) -> None:
    """The store calls of one pack of a job's run (see the module docstring)."""
    pack = f"pack{number}"
    lease_keys = [f"job:bench:{index}:facts" for index in indices]
    store.leases.take(lease_keys, holder, 60)
    store.sessions.create_session(SessionRecord(pack, time.time(), "session", pack, None, None, None, {}))
    for index, lease_key in zip(indices, lease_keys, strict=True):
        sibling = f"{pack}-{index}"
        request = request_of(sibling, 0)
        branch = SessionRecord(sibling, time.time(), "sibling", pack, None, pack, 0, {})
        store.sessions.commit_turn(turn_of(sibling, 0, request), request, new_session=branch,
                                   key=f"{lease_key}:nonce")  # fmt: skip
        store.leases.release(holder.run_id, [lease_key])
    store.leases.renew(holder.run_id, 60)


def job_overhead(stores: dict[str, Store], items: int, per_pack: int) -> dict[str, float]:
    """Seconds of the store calls of an ``items``-item job on each store, the stores taking turns by pack."""
    holder = LeaseHolder.this_process("bench-run")
    seconds = dict.fromkeys(stores, 0.0)
    for name, store in stores.items():
        started = time.perf_counter()
        store.sessions.answered_under("job:bench:")
        store.leases.hold_for(holder.run_id, 60)
        seconds[name] += time.perf_counter() - started
    for first in range(0, items, per_pack):
        for name, store in stores.items():
            started = time.perf_counter()
            job_pack(store, holder, first // per_pack, range(first, min(first + per_pack, items)))
            seconds[name] += time.perf_counter() - started
    for name, store in stores.items():
        started = time.perf_counter()
        store.leases.release(holder.run_id)
        store.leases.done_for(holder.run_id)
        seconds[name] += time.perf_counter() - started
    return seconds


def real_jobs(stores: dict[str, Store], items: int, per_pack: int, work: Path) -> dict[str, float]:
    """Wall seconds of a real ``Job`` of ``items`` items on each store, against an in-process stand-in server.

    Everything but the store is the same on both (the packs read and counted, the requests
    answered at once by ``tests/fake_engine.py``): the difference is the store's.
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from fake_engine import FakeEngine

    from longctx import Job, JobItem
    from longctx.backends.base import connect

    folders = []
    for number in range(-(-items // per_pack)):
        folder = work / "packs" / f"pack{number}"
        folder.mkdir(parents=True)
        (folder / "main.py").write_text(f"def answer():\n    return {number}\n" + "# filler\n" * 30)
        folders.append(folder)
    job_items = [JobItem((str(folders[i // per_pack]),), f"question {i}?") for i in range(items)]
    seconds = {}
    for name, store in stores.items():
        fake = FakeEngine(engine="generic", block=1)
        with connect("http://fake-engine:8000/v1", transport=fake.transport()) as backend:
            started = time.perf_counter()
            Job(job_items, backend=backend, store=store).run()
            seconds[name] = time.perf_counter() - started
    return seconds


def measure(stores: dict[str, Store], turns: int, items: int, per_pack: int) -> dict[str, dict[str, float]]:
    latencies = turn_latencies(stores, turns)
    jobs = job_overhead(stores, items, per_pack)
    figures: dict[str, dict[str, float]] = {}
    for name in stores:
        ordered = sorted(latencies[name])
        figures[name] = {
            "median_ms": statistics.median(ordered) * 1000,
            "p95_ms": ordered[int(len(ordered) * 0.95)] * 1000,
            "job_s": jobs[name],
            "per_item_ms": jobs[name] / items * 1000,
        }
        print(name, {k: round(v, 3) for k, v in figures[name].items()}, file=sys.stderr, flush=True)
    return figures


_MEASURES = (
    ("per-turn write, median", "median_ms", "{:.2f} ms"),
    ("per-turn write, 95th percentile", "p95_ms", "{:.2f} ms"),
    ("job items, store calls in all", "job_s", "{:.1f} s"),
    ("the same, per item", "per_item_ms", "{:.2f} ms"),
    ("a real `Job`, stand-in server, wall time", "real_job_s", "{:.1f} s"),
)


def section(figures: dict[str, dict[str, float]], args: argparse.Namespace, machine: str) -> str:
    """The figures as a table: a column per store, and each server column's ratio to SQLite's."""
    names = list(figures)
    servers = names[1:]
    header = "| what | " + " | ".join(names) + " | " + " | ".join(f"{n} / SQLite" for n in servers) + " |"
    lines = [header, "|---" * (1 + len(names) + len(servers)) + "|"]
    for measure, key, form in _MEASURES:
        if key not in figures["SQLite"]:
            continue
        label = measure.replace("job items", f"{args.items:,}-item job").replace(
            "`Job`", f"`Job` of {args.real_job:,} items"
        )
        values = [form.format(figures[name][key]) for name in names]
        ratios = [f"{figures[name][key] / figures['SQLite'][key]:.1f}x" for name in servers]
        lines.append(f"| {label} | " + " | ".join(values + ratios) + " |")
    table = "\n".join(lines)
    return (
        f"The store on each backend, {time.strftime('%Y-%m-%d')}, {machine}; PostgreSQL {args.version} on "
        f"loopback TCP (fsync on), SQLite in WAL mode (`synchronous = NORMAL`), both on the same disk "
        f"({args.disk}); load average {args.load[0]:.1f} when it began and {args.load[1]:.1f} when it ended; "
        f"{args.turns} turns, {args.items:,} job items in packs of {args.per_pack} (`benchmarks/store_cost.py`).\n\n"
        f"{table}\n\n"
        "A job's store calls are a small part of an item's time either way: an answer takes seconds of "
        "decoding, the store a few milliseconds. A server across a network adds its round trip to each "
        "statement.\n" + (f"\n{args.note}\n" if args.note else "")
    )


def _filesystem(folder: Path) -> str:
    """The type of the filesystem holding ``folder`` (tmpfs makes every fsync free: say so)."""
    best = ("", "unknown")
    for line in Path("/proc/mounts").read_text().splitlines():
        _, point, kind, *_ = line.split()
        if str(folder).startswith(point) and len(point) > len(best[0]):
            best = (point, kind)
    return best[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--per-pack", type=int, default=10)
    parser.add_argument(
        "--real-job", type=int, default=0, help="also time a real Job of this many items on each"
    )
    parser.add_argument("--write", action="store_true")
    parser.add_argument(
        "--note", default="", help="a sentence added to the section (an earlier run's figures)"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="longctx-store-cost-"))
    server = PostgresServer.start()
    try:
        url = server.fresh_url()
        args.version = server.sql("SHOW server_version").strip().split()[0]
        args.disk = _filesystem(work)
        started_load = os.getloadavg()[0]
        # As durable as SQLite's WAL with synchronous = NORMAL: a commit is not waited for on disk.
        relaxed = server.fresh_url() + "%20-csynchronous_commit%3Doff"
        with (
            Store.open(work / "sqlite") as sqlite,
            Store.open(work / "pg", database_url=url) as postgres,
            Store.open(work / "pg-relaxed", database_url=relaxed) as postgres_relaxed,
        ):
            stores = {
                "SQLite": sqlite,
                "PostgreSQL": postgres,
                "PostgreSQL, synchronous_commit off": postgres_relaxed,
            }
            figures = measure(stores, args.turns, args.items, args.per_pack)
            if args.real_job:
                for name, seconds in real_jobs(stores, args.real_job, args.per_pack, work).items():
                    figures[name]["real_job_s"] = seconds
        args.load = (started_load, os.getloadavg()[0])
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench import machine, write_section

    text = section(figures, args, machine())
    print(text)
    if args.write:
        write_section("store-backends", text)


if __name__ == "__main__":
    main()
