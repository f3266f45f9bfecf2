"""Benchmark: ``longctx batch`` (a new process) against the same batch through the API in this process.

On the test suite's CPU engines (:class:`longctx.testing.EngineHarness`: vLLM, SGLang), three rows
taken in turn, round after round, after an untimed round that warms the server's prefix cache and
this process's imports:

- ``cli``: ``longctx batch DIR --questions FILE --base-url URL --max-tokens 2`` (the console script);
- ``api process``: ``benchmarks/batch_one.py``, the same through ``RepoSession(...).ask_many``, a new process;
- ``api in process``: that ``ask_many`` called here, where longctx is imported already.

Each run has a fresh store (no answer to reuse). Goal: the CLI within 0.3 s of the in-process API.
Also prints the import time of the batch command's modules (``python -X importtime``, summed by
package), the profile that chose what to import lazily.

With ``--engines fake`` the server is the test suite's fake engine over HTTP
(``tests/fake_http.py``, in this process): no engine competes for the CPU, so the rows differ by the
client's work alone (the process's start, its imports, the CLI's own work).

Usage: python benchmarks/cli_inprocess.py [--engines vllm,sglang,fake] [--rounds 7]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from longctx import RepoSession, RequestOptions
from longctx.store import Store
from longctx.testing import EngineHarness, harness_dir

HERE = Path(__file__).resolve().parent
STDLIB = Path(sysconfig.get_paths()["stdlib"])
QUESTIONS = [f"In one word: what does function number {number} of the file do?" for number in range(8)]
ANSWER_TOKENS = 2
GOAL_SECONDS = 0.3


def _in_process(corpus: Path, base_url: str, home: Path) -> float:
    started = time.perf_counter()
    request = RequestOptions(max_tokens=ANSWER_TOKENS)
    with (
        Store.open(home) as store,
        RepoSession(str(corpus), server=base_url, request=request, store=store) as s,
    ):
        result = s.ask_many(QUESTIONS, reuse_answered=True)
        for answer in result:
            print(f"## {answer.question}\n\n{answer.text}\n", file=open(os.devnull, "w"))  # noqa: SIM115
    return time.perf_counter() - started


def rounds(engine: str, api_base: str, work: Path, count: int) -> dict[str, list[float]]:
    corpus = work / "corpus"
    corpus.mkdir(exist_ok=True)
    shutil.copy(STDLIB / "textwrap.py", corpus / "textwrap.py")
    questions = work / "questions.txt"
    questions.write_text("\n".join(QUESTIONS) + "\n")
    python = sys.executable
    cli = [str(Path(python).with_name("longctx")), "batch", str(corpus), "--questions", str(questions)]
    cli += ["--base-url", api_base, "--max-tokens", str(ANSWER_TOKENS)]
    api = [python, str(HERE / "batch_one.py"), str(corpus), str(questions), api_base, str(ANSWER_TOKENS)]
    env = {key: value for key, value in os.environ.items() if not key.startswith("LONGCTX_")}
    times: dict[str, list[float]] = collections.defaultdict(list)
    for number in range(count + 1):  # the first round warms the server's cache and the imports, untimed
        for name in ("cli", "api process", "api in process"):
            home = work / f"home-{engine}-{name.replace(' ', '-')}-{number}"
            if name == "api in process":
                seconds = _in_process(corpus, api_base, home)
            else:
                command = cli if name == "cli" else api
                started = time.perf_counter()
                done = subprocess.run(command, env={**env, "LONGCTX_HOME": str(home)}, capture_output=True,
                                      text=True, check=False)  # fmt: skip
                seconds = time.perf_counter() - started
                if done.returncode != 0 or done.stdout.count("## ") != len(QUESTIONS):
                    raise RuntimeError(f"{name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
            if number:
                times[name].append(seconds)
    return times


def import_profile() -> dict[str, float]:
    """Milliseconds of import (self time) of what ``longctx batch`` loads, by package; the total."""
    code = "import longctx.cli.app, longctx.cli.questions, longctx.cli.waiting"
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          check=True)  # fmt: skip
    totals: collections.Counter[str] = collections.Counter()
    for line in done.stderr.splitlines():
        found = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
        if found:
            name = found.group(2)
            parts = name.split(".")
            key = ".".join(parts[:2]) if parts[0] == "longctx" and len(parts) > 1 else parts[0]
            totals[key] += int(found.group(1))
    return {key: value / 1000 for key, value in totals.most_common()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="vllm")
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args()
    base = harness_dir(HERE.parent)
    if os.environ.get("LONGCTX_HARNESS_DIR"):
        base = Path(os.environ["LONGCTX_HARNESS_DIR"])
    harness = EngineHarness(base)
    lines = [f"{os.cpu_count()} cores, Python {sys.version.split()[0]}, {options.rounds} rounds", ""]
    try:
        for engine in options.engines.split(","):
            fake = None
            if engine == "fake":
                sys.path.insert(0, str(HERE.parent / "tests"))
                from fake_engine import FakeEngine
                from fake_http import FakeHttpServer

                fake = FakeHttpServer(FakeEngine(engine="generic", block=1, answer="ok"))
                api_base = fake.base_url
            else:
                api_base = harness.server(engine).api_base
            with tempfile.TemporaryDirectory() as work:
                times = rounds(engine, api_base, Path(work), options.rounds)
            if fake is not None:
                fake.close()
            medians = {name: statistics.median(values) for name, values in times.items()}
            gap = medians["cli"] - medians["api in process"]
            lines += [f"| {engine} | row | median wall (s) | rounds |", "|---|---|---:|---|"]
            for name, values in times.items():
                lines.append(
                    f"| {engine} | {name} | {medians[name]:.2f} | {', '.join(f'{v:.2f}' for v in values)} |"
                )
            verdict = "met" if gap <= GOAL_SECONDS else "not met"
            lines += ["", f"- {engine}: the CLI {gap:+.2f} s over the in-process API (goal {GOAL_SECONDS} s: {verdict});"
                      f" {medians['cli'] - medians['api process']:+.2f} s over the API as a new process", ""]  # fmt: skip
            print("\n".join(lines[-len(times) - 5 :]), file=sys.stderr, flush=True)
    finally:
        harness.close()
    profile = import_profile()
    total = sum(profile.values())
    top = ", ".join(f"{name} {ms:.0f}" for name, ms in list(profile.items())[:12])
    lines += [f"- import (self time, ms) of the batch command's modules: total {total:.0f}; {top}"]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
