"""How long the CLI takes to start: ``longctx --help`` against ``python -c pass``, as fresh processes.

Usage: cli_startup.py [--runs N] [--python PATH]. Both commands run N times
in turn (A B A B ...) after one warm-up each, so bytecode is cached and a
drift of the machine's speed touches both; each run's wall time is read
around ``subprocess.run``. Prints the medians, their difference and ratio,
and the same for ``longctx pack --help`` (which imports the pack command's
module). The goal: ``longctx --help`` within 80 ms of
``python -c pass``. On a machine others load, quote the difference of the
medians, not single runs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _wall(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def compare(a: list[str], b: list[str], runs: int) -> tuple[float, float]:
    """The median wall seconds of ``a`` and of ``b``, run in turn ``runs`` times after a warm-up."""
    _wall(a), _wall(b)
    times_a, times_b = [], []
    for _ in range(runs):
        times_a.append(_wall(a))
        times_b.append(_wall(b))
    return statistics.median(times_a), statistics.median(times_b)


GOAL_MS = 80


def table(python: str, runs: int) -> tuple[list[str], float]:
    """The markdown rows of both commands against ``python -c pass``, and ``--help``'s difference in ms."""
    longctx = str(Path(python).parent / "longctx")
    bare = [python, "-c", "pass"]
    rows = ["| command | median wall | python -c pass | difference | ratio |", "|---|---:|---:|---:|---:|"]
    help_difference = 0.0
    for label, command in (
        ("longctx --help", [longctx, "--help"]),
        ("longctx pack --help", [longctx, "pack", "--help"]),
    ):
        a, b = compare(command, bare, runs)
        help_difference = help_difference or (a - b) * 1000
        rows.append(
            f"| `{label}` | {a * 1000:.0f} ms | {b * 1000:.0f} ms | +{(a - b) * 1000:.0f} ms | {a / b:.2f} |"
        )
    return rows, help_difference


def section(python: str, runs: int) -> str:
    """The markdown of docs/benchmarks.md's ``cli-startup`` section (``benchmarks/run --only startup``)."""
    rows, difference = table(python, runs)
    return "\n".join(
        [
            "## CLI start-up: `longctx --help` against `python -c pass`",
            "",
            "The top of `longctx/cli/app.py` imports only click and the error tree: the option objects, their"
            " flags, the store and `json` come with a command's module when it is looked up"
            " (`tests/test_cli_app.py` holds `--help` free of them). Both commands from the benchmark's"
            " environment (longctx installed as a user installs it, bytecode cached), run in turn"
            f" {runs} times after a warm-up each; medians, on the shared machine: read the differences.",
            "",
            *rows,
            "",
            f"- `longctx --help`: +{difference:.0f} ms over `python -c pass` (goal: within {GOAL_MS} ms)"
            f" {'(met)' if difference <= GOAL_MS else '(not met)'}.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--python", default=sys.executable)
    arguments = parser.parse_args()
    rows, _ = table(arguments.python, arguments.runs)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
