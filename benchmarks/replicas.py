"""Per-ask overhead of replicas: one URL, two replica URLs, and a router in front of two.

Each ask is one question from a new session over one small pack on warm
servers (the pack cached), one answer token: what is left is longctx's own
cost per ask (routing, the counter reading before the call, the store; the
reading after it settles off the answer's path and is not timed). The
configurations take turns, so load on the machine falls on all alike; the
median of 20 asks each is reported.

Run by ``benchmarks/run --only replicas`` (it starts two CPU vLLM replicas
and a vllm-router with ``longctx.testing``), or against servers already
running:

    python benchmarks/replicas.py --urls http://a:8000/v1,http://b:8000/v1 [--router http://r:9000/v1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from longctx.backends.base import connect, rendezvous_order
from longctx.options.groups import RequestOptions, ServerOptions
from longctx.sessions import Session
from longctx.sessions.session import affinity_key
from longctx.store import Store, StoredPack

ASKS = 20
PACK = StoredPack(
    fingerprint="b" * 64,
    format_version="bench/1",
    system="You answer questions about the repository.",
    prefix="<repository>\n"
    + "".join(f"def f{n}(x): return x * {n}\n" for n in range(60))
    + "</repository>\n\n",
    summary={"title": "overhead"},
)


def measure(configurations: dict[str, ServerOptions], asks: int = ASKS) -> dict[str, float]:
    """Median seconds per ask for each configuration (turns taken, one warm-up ask each)."""
    request = RequestOptions(max_tokens=1, temperature=0.0)
    times: dict[str, list[float]] = {name: [] for name in configurations}
    with tempfile.TemporaryDirectory() as home:
        store = Store.open(Path(home))
        backends = {name: connect(options) for name, options in configurations.items()}
        try:
            for round_number in range(asks + 1):
                for name, backend in backends.items():
                    session = Session(backend=backend, pack=PACK, store=store, request=request)
                    started = time.perf_counter()
                    session.ask("What does f7 return?")
                    elapsed = time.perf_counter() - started
                    # Outside the clock, as for a user who reads the answer: the turn's
                    # counter check settles off the answer's path (verification/counters.py).
                    session.close()
                    if round_number:  # the first round warms the caches
                        times[name].append(elapsed)
        finally:
            for backend in backends.values():
                backend.close()
            store.close()
    return {name: statistics.median(values) for name, values in times.items()}


def table(medians: dict[str, float]) -> str:
    base = medians["1 URL"]
    rows = [
        f"| {name} | {seconds * 1000:.1f} | {(seconds - base) * 1000:+.1f} | {seconds / base:.2f}x |"
        for name, seconds in medians.items()
    ]
    return "\n".join(
        [
            "| configuration | median ask (ms) | vs 1 URL (ms) | ratio |",
            "|---|---:|---:|---:|",
            *rows,
        ]
    )


def configurations(urls: list[str], router: str | None) -> dict[str, ServerOptions]:
    # "1 URL" is the replica the rendezvous over all URLs sends the pack to, so
    # every configuration is served by the same replica and only longctx differs.
    home = rendezvous_order(affinity_key(PACK.fingerprint, "unused"), urls)[0]
    chosen = {"1 URL": ServerOptions(base_url=home), f"{len(urls)} URLs": ServerOptions(base_url=urls)}
    if router:
        # Declared, as doctor asks: behind a router no per-call counter check is made.
        chosen["router"] = ServerOptions(base_url=router, router_policy="vllm-router:consistent_hash")
    return chosen


def section(harness_dir: Path) -> str:
    """The docs/benchmarks.md section, on two CPU vLLM replicas and vllm-router (consistent_hash)."""
    from longctx.testing.fleet import Fleet
    from longctx.testing.harness import EngineHarness

    harness = EngineHarness(harness_dir)
    try:
        with Fleet(harness, replicas=2) as fleet:
            router = fleet.start_router("vllm-router", "consistent_hash")
            medians = measure(configurations(fleet.urls, router.api_base))
    finally:
        harness.close()
    return "\n".join(
        [
            "## Per-ask overhead of replicas and routers",
            "",
            f"Median of {ASKS} asks (a new session over one small cached pack, one answer token) on",
            "two CPU vLLM replicas of the tiny test model, configurations taking turns:",
            "one replica URL (the one the rendezvous picks for the pack), both URLs (longctx's",
            "rendezvous routing), and vllm-router 0.1.17 (`consistent_hash`, declared with",
            "`router_policy`) in front of both. Each ask is timed to its answer; the session is",
            "closed after the clock stops (the turn's counter check settles off the answer's path).",
            "Behind a declared router no counter is read at all (its `/metrics` is some replica's),",
            "hence its lead.",
            "Goal: within 10 ms of one URL.",
            "",
            table(medians),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--urls", required=True, help="comma-separated replica URLs (the first alone is '1 URL')"
    )
    parser.add_argument("--router", help="a router's URL in front of the same replicas")
    parser.add_argument("--asks", type=int, default=ASKS)
    args = parser.parse_args()
    urls = [url for url in args.urls.split(",") if url]
    print(table(measure(configurations(urls, args.router), args.asks)))


if __name__ == "__main__":
    main()
