"""Mutation-test named modules against their own unit tests (mutmut) and print the score table.

    .venv/bin/python scripts/mutants.py longctx/sources/secrets.py   # one module
    .venv/bin/python scripts/mutants.py --all                        # every module in [tool.longctx.mutants]
    .venv/bin/python scripts/mutants.py --read longctx/sources/secrets.py   # the last run's table again
    .venv/bin/python scripts/mutants.py --resume longctx/verification/counters.py  # go on with the last run

Needs the ``mutation`` extra (``pip install -e '.[mutation]'``). Not part of ``.ci/run``: a module
takes minutes (see docs/testing.md, "Mutation testing").

Each module runs alone, in a fresh scratch copy of the tree under ``.cache/mutants/<module>/``
(mutmut writes its mutated copy and results there), with the ``[tool.mutmut]`` settings of
pyproject.toml plus ``only_mutate`` set to that module and the test selection set to its tests from
``[tool.longctx.mutants]``. One worker by default, ``nice``d, and each module bounded by
``--budget`` seconds of wall time: mutants not reached by then are counted as not run, and the
table says so. ``--resume`` goes on with a module's last run: the tests as they are now, against the
mutants that run did not kill (survived or not reached), the killed ones kept.

A surviving mutant that a reader judged equivalent (no test can tell it from the original: a
changed log text, a cache size) is listed in ``scripts/mutants-equivalent.txt``, one line each:
``mutant name | the mutated line | why it is equivalent``. The script subtracts a survivor only
while its mutated line is still the one recorded, so an entry goes stale, and is reported, when the
function changes under it. The score is the killed (or timed out) mutants over all those run, less
the equivalent ones.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / ".cache" / "mutants"
EQUIVALENTS = ROOT / "scripts" / "mutants-equivalent.txt"
#: mutmut's statuses that count as a kill: a failing test, a hang stopped by the timeout, a crash.
KILLED = frozenset({"killed", "timeout", "segfault", "caught by type check"})
NOT_RUN = frozenset({"not checked", "check was interrupted by user", "skipped"})


@dataclass(frozen=True)
class Settings:
    """What pyproject.toml says: mutmut's own table, and each module's tests."""

    mutmut: dict[str, object]
    tests: dict[str, list[str]]
    pyproject: str


@dataclass(frozen=True)
class Equivalent:
    """A survivor judged equivalent: its mutated line as recorded, and why no test can tell."""

    name: str
    line: str
    reason: str


@dataclass
class Survivor:
    name: str
    diff: str

    @property
    def line(self) -> str:
        """The mutated line (the diff's first added line, stripped)."""
        added = [
            ln[1:].strip() for ln in self.diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")
        ]
        return added[0] if added else ""


@dataclass
class ModuleResult:
    """One module's run: counts by outcome, its survivors, and whether the budget cut it short."""

    module: str
    statuses: dict[str, str] = field(default_factory=dict)
    survivors: list[Survivor] = field(default_factory=list)
    equivalent: list[str] = field(default_factory=list)
    stale: list[Equivalent] = field(default_factory=list)
    seconds: float = 0.0
    cut_short: bool = False
    error: str = ""

    @property
    def killed(self) -> int:
        return sum(status in KILLED for status in self.statuses.values())

    @property
    def not_run(self) -> int:
        return sum(status in NOT_RUN for status in self.statuses.values())

    @property
    def survived(self) -> int:
        return len(self.statuses) - self.killed - self.not_run

    @property
    def score(self) -> float | None:
        judged = len(self.statuses) - self.not_run - len(self.equivalent)
        return 100.0 * self.killed / judged if judged else None


def load_settings() -> Settings:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    tool = tomllib.loads(text)["tool"]
    return Settings(dict(tool["mutmut"]), dict(tool["longctx"]["mutants"]), text)


def load_equivalents(path: Path = EQUIVALENTS) -> dict[str, Equivalent]:
    """``name | line | reason`` per line; blank lines and ``#`` comments skipped."""
    found: dict[str, Equivalent] = {}
    for raw in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        name, rest = raw.split(" | ", 1)
        line, reason = rest.rsplit(" | ", 1)
        found[name.strip()] = Equivalent(name.strip(), line.strip(), reason.strip())
    return found


def slug(module: str) -> str:
    return module.removeprefix("longctx/").removesuffix(".py").replace("/", ".")


def toml_value(value: object) -> str:
    # JSON's strings, numbers, booleans and lists are TOML's too (its \\u escapes included).
    return json.dumps(value)


def scratch_pyproject(settings: Settings, module: str) -> str:
    """pyproject.toml with its [tool.mutmut] table narrowed to ``module`` and its tests."""
    table = {
        **settings.mutmut,
        "only_mutate": [module],
        "pytest_add_cli_args_test_selection": settings.tests[module],
    }
    body = "\n".join(f"{key} = {toml_value(value)}" for key, value in table.items())
    # The table runs from its header to the next header.
    pattern = re.compile(r"^\[tool\.mutmut\]\n(?:(?!\[).*\n)*", re.MULTILINE)
    return pattern.sub(lambda _: f"[tool.mutmut]\n{body}\n\n", settings.pyproject, count=1)


def prepare(settings: Settings, module: str) -> Path:
    """A fresh scratch tree for ``module``: the package, the tests, the narrowed pyproject.toml."""
    where = SCRATCH / slug(module)
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    shutil.copytree(ROOT / "longctx", where / "longctx", ignore=ignore)
    shutil.copytree(ROOT / "tests", where / "tests", ignore=ignore)
    (where / "pyproject.toml").write_text(scratch_pyproject(settings, module), encoding="utf-8")
    return where


def refresh(settings: Settings, module: str, where: Path) -> list[str]:
    """The last run's tree with today's tests; the mutants it did not kill, to run again."""
    shutil.rmtree(where / "tests")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    shutil.copytree(ROOT / "tests", where / "tests", ignore=ignore)
    (where / "pyproject.toml").write_text(scratch_pyproject(settings, module), encoding="utf-8")
    meta = where / "mutants" / f"{module}.meta"
    if not meta.exists():
        return []
    from mutmut.stats import status_by_exit_code

    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return sorted(name for name, code in codes.items() if status_by_exit_code[code] not in KILLED)


def run_mutmut(
    where: Path, budget: float, workers: int, names: Sequence[str] = ()
) -> tuple[float, bool, int]:
    """mutmut in ``where`` (only ``names``, when given), stopped after ``budget`` seconds.

    Returns (seconds, cut short, exit code).
    """
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "MUTANT_UNDER_TEST"}}
    command = [
        "nice",
        "-n",
        "10",
        sys.executable,
        "-m",
        "mutmut",
        "run",
        "--max-children",
        str(workers),
        *names,
    ]
    start = time.monotonic()
    with (where / "mutmut.log").open("w") as log:
        process = subprocess.Popen(
            command, cwd=where, env=env, stdout=log, stderr=subprocess.STDOUT, process_group=0
        )
        try:
            code = process.wait(timeout=budget)
            return time.monotonic() - start, False, code
        except subprocess.TimeoutExpired:
            # Its workers are in its process group: end them all, then read what was saved.
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            return time.monotonic() - start, True, -1


@contextmanager
def inside(where: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(where)
    try:
        yield
    finally:
        os.chdir(before)


def read_results(where: Path, module: str, equivalents: dict[str, Equivalent]) -> ModuleResult:
    """The outcome of every mutant of ``module`` as mutmut saved it, survivors with their diffs."""
    from mutmut.configuration import reset_config
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    result = ModuleResult(module)
    meta = where / "mutants" / f"{module}.meta"
    if not meta.exists():
        result.error = f"no results: see {where / 'mutmut.log'}"
        return result
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    result.statuses = {name: status_by_exit_code[code] for name, code in codes.items()}
    with inside(where):
        reset_config()
        for name, status in sorted(result.statuses.items()):
            if status in KILLED or status in NOT_RUN:
                continue
            survivor = Survivor(name, get_diff_for_mutant(name, path=module))
            known = equivalents.get(name)
            if known is not None and known.line == survivor.line:
                result.equivalent.append(name)
            else:
                result.survivors.append(survivor)
    prefix = module.removesuffix(".py").replace("/", ".") + "."
    result.stale = [
        eq
        for name, eq in equivalents.items()
        if name.startswith(prefix)
        and name not in result.equivalent
        and result.statuses.get(name) not in KILLED
    ]
    return result


def table(results: Sequence[ModuleResult]) -> str:
    lines = [
        "| module | mutants | killed or timed out | survived | judged equivalent | not run | score |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        score = "n/a" if r.score is None else f"{r.score:.1f}%"
        lines.append(
            f"| {r.module.removeprefix('longctx/')} | {len(r.statuses)} | {r.killed} | {r.survived} |"
            f" {len(r.equivalent)} | {r.not_run} | {score} |"
        )
    return "\n".join(lines)


def report(result: ModuleResult, where: Path) -> None:
    """The module's survivors not judged equivalent, to stderr and to survivors.diff beside its run."""
    err = sys.stderr
    if result.error:
        print(f"{result.module}: {result.error}", file=err)
    if result.cut_short:
        print(f"{result.module}: stopped by the budget after {result.seconds:.0f} s", file=err)
    for eq in result.stale:
        print(f"{result.module}: stale equivalent entry (not a survivor with that line): {eq.name}", file=err)
    text = "\n\n".join(f"# {s.name}\n{s.diff}" for s in result.survivors)
    (where / "survivors.diff").write_text(text + "\n", encoding="utf-8")
    for s in result.survivors:
        print(f"survived: {s.name}: {s.line}", file=err)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", help="paths such as longctx/sources/secrets.py")
    parser.add_argument("--all", action="store_true", help="every module of [tool.longctx.mutants]")
    parser.add_argument("--budget", type=float, default=1200.0, help="wall seconds per module (default 1200)")
    parser.add_argument("--workers", type=int, default=1, help="mutants tested at once (default 1)")
    parser.add_argument("--read", action="store_true", help="only read the last run's results")
    parser.add_argument("--resume", action="store_true", help="run the last run's unkilled mutants again")
    args = parser.parse_args(argv)
    settings = load_settings()
    modules = list(settings.tests) if args.all else args.modules
    unknown = [m for m in modules if m not in settings.tests]
    if not modules or unknown:
        parser.error(f"name modules of [tool.longctx.mutants] in pyproject.toml: {', '.join(settings.tests)}")
    equivalents = load_equivalents()
    results = []
    for module in modules:
        where = SCRATCH / slug(module)
        seconds, cut_short, code = 0.0, False, 0
        if args.resume and where.exists():
            # Survivors judged equivalent would survive again: only the others are run.
            names = [name for name in refresh(settings, module, where) if name not in equivalents]
            print(f"{module}: {len(names)} mutants again", file=sys.stderr, flush=True)
            seconds, cut_short, code = run_mutmut(where, args.budget, args.workers, names)
        elif not args.read:
            print(
                f"{module}: mutating, tests {' '.join(settings.tests[module])}", file=sys.stderr, flush=True
            )
            where = prepare(settings, module)
            seconds, cut_short, code = run_mutmut(where, args.budget, args.workers)
        result = read_results(where, module, equivalents)
        result.seconds, result.cut_short = seconds, cut_short
        if code not in (0, -1) and not result.statuses:
            result.error = f"mutmut exited {code}: see {where / 'mutmut.log'}"
        report(result, where)
        results.append(result)
    print(table(results))
    return 0 if all(not r.error for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
