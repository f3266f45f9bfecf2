"""Benchmark: the instructions one new ``longctx batch`` process runs, counted by callgrind, against a baseline.

Wall time on a shared 2-core machine moves by half between hours; an instruction count of the same
work does not. Each row runs the batch of ``benchmarks/cli_inprocess.py`` (textwrap.py and its eight
questions, a fresh store, bytecode cached by an untimed run first) against the test suite's fake
engine over real HTTP (``tests/fake_http.py``, in this process) under ``valgrind --tool=callgrind``,
and reads the total it collected: for this tree, and for the tree of git revision REF (``--baseline``,
extracted with ``git archive`` and put ahead on ``PYTHONPATH``); ``python -c pass`` is the floor.
``--write`` puts the section ``process-instructions`` into docs/benchmarks.md.

Usage: python benchmarks/process_instructions.py [--baseline REF] [--write]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "tests")]

from cli_inprocess import QUESTIONS, STDLIB, _commands, _tree_at  # noqa: E402 - after the path
from fake_engine import FakeEngine  # noqa: E402
from fake_http import FakeHttpServer  # noqa: E402

_COLLECTED = re.compile(rb"Collected : (\d+)")


def instructions(command: list[str], env: dict[str, str], work: Path, home: Path) -> int:
    """The instructions ``command`` ran (every thread), by callgrind, with a fresh store at ``home``."""
    out = work / "callgrind.out"
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *command],
        env={**env, "LONGCTX_HOME": str(home)},
        cwd=work,
        capture_output=True,
        check=False,
    )
    if run.returncode != 0:
        raise RuntimeError(f"{command[:3]} failed under callgrind: {run.stderr.decode()[-2000:]}")
    found = _COLLECTED.search(run.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no total: {run.stderr.decode()[-500:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="REF", help="also count the CLI of this git revision")
    parser.add_argument("--write", action="store_true", help="write the section into docs/benchmarks.md")
    options = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    fake = FakeHttpServer(FakeEngine(engine="generic", block=1, answer="ok"))
    counts: dict[str, int] = {}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            work = Path(scratch)
            baseline = (options.baseline, _tree_at(options.baseline, work)) if options.baseline else None
            (work / "corpus").mkdir()
            shutil.copy(STDLIB / "textwrap.py", work / "corpus" / "textwrap.py")
            questions = work / "questions.txt"
            questions.write_text("\n".join(QUESTIONS) + "\n")
            commands = _commands(work / "corpus", questions, fake.base_url, baseline, bytecode=True)
            for number, (name, (command, env)) in enumerate(commands.items()):
                # Untimed first: the bytecode caches written, as an installed package has them.
                subprocess.run(command, env={**env, "LONGCTX_HOME": str(work / f"warm-{number}")}, cwd=work,
                               capture_output=True, check=True)  # fmt: skip
                counts[name] = instructions(command, env, work, work / f"home-{number}")
                print(f"{name}: {counts[name] / 1e6:,.0f} M", file=sys.stderr, flush=True)
    finally:
        fake.close()
    section = _section(options.baseline, counts)
    print(section)
    if options.write:
        from bench import write_section

        write_section("process-instructions", section)


def _section(baseline: str | None, counts: dict[str, int]) -> str:
    floor = counts.get("python -c pass", 0)
    rows = [
        f"| {name} | {count / 1e6:,.0f} M | {(count - floor) / 1e6:,.0f} M |"
        for name, count in counts.items()
    ]
    compared = ""
    if baseline is not None:
        now, before = counts["cli"], counts[f"cli at {baseline}"]
        compared = (
            f"\n\nThis tree's CLI runs {(before - now) / 1e6:,.0f} M instructions fewer than at {baseline}"
            f" ({100 * (before - now) / before:.1f}% of its process)."
        )
    version = platform.python_version()
    return (
        "## Instructions of one new `longctx batch` process (callgrind)\n\n"
        f"Run {datetime.date.today().isoformat()} on {platform.machine()}, Python {version}, by "
        "`benchmarks/process_instructions.py`: the batch of the CLI benchmark (8 questions over "
        "textwrap.py, a fresh store) against the test suite's fake engine over HTTP, each process under "
        "callgrind once (the count does not move with the machine's load).\n\n"
        "| process | instructions | over `python -c pass` |\n|---|---:|---:|\n" + "\n".join(rows) + compared
    )


if __name__ == "__main__":
    main()
