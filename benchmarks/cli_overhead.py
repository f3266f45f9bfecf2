"""Benchmark: the CLI against the same work through the API, on the test suite's real CPU vLLM.

Two measures, each a fresh process per run (the installed console script and
``python``, bytecode cached), against one vLLM server of
:class:`longctx.testing.EngineHarness` (its 32k window):

- ``longctx batch DIR --questions FILE --base-url URL --max-tokens 2`` against
  ``benchmarks/batch_one.py``, which does the same through
  :class:`longctx.RepoSession` and ``ask_many``; few answer tokens, so what
  the CLI adds shows. The two run in turn (A B A B ...) after one warm-up each,
  every run with a fresh store, so both find the server's prefix cache warm
  and neither finds stored answers. Goal: the CLI within 0.3 s of the API.
- ``longctx ask DIR "q" --max-file-bytes 60000000`` over a folder with one
  50 MB text file: exit 4 (the budget), and the server's request counter
  unchanged (no chat request reached it). Goal: within 2 s.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

from longctx.testing import EngineHarness

HERE = Path(__file__).resolve().parent
STDLIB = Path(sysconfig.get_paths()["stdlib"])
QUESTIONS = [f"In one word: what does function number {number} of the file do?" for number in range(8)]
ANSWER_TOKENS = 2
BATCH_GOAL_SECONDS = 0.3
REFUSAL_GOAL_SECONDS = 2.0
EXIT_TOO_LONG = 4  # longctx.cli.app.EXIT_TOO_LONG; not imported, so this process never loads the CLI


def _run(command: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    return time.perf_counter() - started, done


def _requests_served(base_url: str) -> float:
    """vLLM's count of finished requests (``vllm:request_success_total``, every label summed)."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    found = re.findall(r"^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    if not found:
        raise RuntimeError("the server's /metrics has no vllm:request_success_total")
    return sum(float(value) for value in found)


def _batch(work: Path, api_base: str, repetitions: int) -> tuple[list[float], list[float], str]:
    corpus = work / "cli-batch-corpus"
    shutil.rmtree(corpus, ignore_errors=True)
    corpus.mkdir(parents=True)
    shutil.copy(STDLIB / "textwrap.py", corpus / "textwrap.py")
    questions = work / "cli-batch-questions.txt"
    questions.write_text("\n".join(QUESTIONS) + "\n")
    python = sys.executable
    longctx = str(Path(python).with_name("longctx"))
    cli = [longctx, "batch", str(corpus), "--questions", str(questions), "--base-url", api_base]
    cli += ["--max-tokens", str(ANSWER_TOKENS)]
    api = [python, str(HERE / "batch_one.py"), str(corpus), str(questions), api_base, str(ANSWER_TOKENS)]
    base_env = {key: value for key, value in os.environ.items() if not key.startswith("LONGCTX_")}
    times: dict[str, list[float]] = {"cli": [], "api": []}
    outputs: dict[str, str] = {}
    for repetition in range(repetitions + 1):  # the first round warms the server's cache, untimed
        for name, command in (("cli", cli), ("api", api)):
            home = work / f"cli-batch-home-{name}"
            shutil.rmtree(home, ignore_errors=True)
            seconds, done = _run(command, {**base_env, "LONGCTX_HOME": str(home)})
            if done.returncode != 0:
                raise RuntimeError(f"{name} batch failed ({done.returncode}):\n{done.stderr[-3000:]}")
            if repetition:
                times[name].append(seconds)
            outputs[name] = done.stdout
    if outputs["cli"].count("## ") != len(QUESTIONS) or outputs["api"].count("## ") != len(QUESTIONS):
        raise RuntimeError("a batch did not print an answer under every question")
    return times["cli"], times["api"], corpus.name


def _refusal(
    work: Path, api_base: str, base_url: str, repetitions: int
) -> tuple[list[float], tuple[float, float], str]:
    folder = work / "cli-refusal-corpus"
    big = folder / "big.txt"
    if not big.exists():
        folder.mkdir(parents=True, exist_ok=True)
        big.write_text("lorem ipsum dolor sit amet\n" * (50 * 1024 * 1024 // 27))
    longctx = str(Path(sys.executable).with_name("longctx"))
    command = [
        longctx,
        "ask",
        str(folder),
        "What is it?",
        "--max-file-bytes",
        "60000000",
        "--base-url",
        api_base,
    ]
    base_env = {key: value for key, value in os.environ.items() if not key.startswith("LONGCTX_")}
    env = {**base_env, "LONGCTX_HOME": str(work / "cli-refusal-home")}
    served_before = _requests_served(base_url)
    times, message = [], ""
    _run(command, env)  # warm-up: bytecode, the store, the page cache of the file
    for _ in range(repetitions):
        seconds, done = _run(command, env)
        if done.returncode != EXIT_TOO_LONG:
            raise RuntimeError(f"the 50 MB ask exited {done.returncode}, not {EXIT_TOO_LONG}:\n{done.stderr}")
        times.append(seconds)
        message = done.stderr.strip()
    return times, (served_before, _requests_served(base_url)), message


def section(work: Path, harness_dir: Path, repetitions: int) -> str:
    """The markdown of the ``cli-overhead`` section."""
    harness = EngineHarness(harness_dir)
    try:
        server = harness.server("vllm")
        cli, api, corpus = _batch(work, server.api_base, max(repetitions, 5))
        refusals, served, message = _refusal(work, server.api_base, server.base_url, max(repetitions, 5))
    finally:
        harness.close()
    difference = statistics.median(cli) - statistics.median(api)
    refusal = statistics.median(refusals)
    machine = f"{os.cpu_count()} cores, Python {sys.version.split()[0]}"
    return "\n".join(
        [
            "## The CLI against the API, on the real CPU vLLM",
            "",
            "Each run a fresh process (the installed `longctx` console script, or `python` running a script;"
            " bytecode cached), against the test suite's CPU vLLM server and tiny model (a 32k window), on the"
            f" shared machine ({machine}) while other work ran on it: read the differences, not the absolute times.",
            "",
            f"*batch*: `longctx batch {corpus}/ --questions FILE --base-url URL --max-tokens {ANSWER_TOKENS}` with"
            f" {len(QUESTIONS)} questions over one file of the standard library (`textwrap.py`), against"
            " `benchmarks/batch_one.py`, the same work through the API (`RepoSession(...).ask_many`, the answers"
            " and the report's line printed alike). The two run in turn after an untimed round, each run with a"
            " fresh store (no answer to reuse) and the server's prefix cache warm for both; medians of"
            f" {len(cli)} runs each.",
            "",
            "| command | median wall (s) | min (s) | max (s) |",
            "|---|---:|---:|---:|",
            f"| `longctx batch` (CLI) | {statistics.median(cli):.2f} | {min(cli):.2f} | {max(cli):.2f} |",
            f"| `batch_one.py` (API) | {statistics.median(api):.2f} | {min(api):.2f} | {max(api):.2f} |",
            "",
            f"- The CLI takes {difference:+.2f} s over the API (goal: within {BATCH_GOAL_SECONDS} s)"
            f" {'(met)' if difference <= BATCH_GOAL_SECONDS else '(not met)'}.",
            "",
            '*refusal*: `longctx ask DIR "What is it?" --max-file-bytes 60000000 --base-url URL`, DIR holding'
            f" one 50 MB text file; median of {len(refusals)} runs after a warm-up. Every run exited"
            f" {EXIT_TOO_LONG} (the budget's code); the server's finished requests"
            f" (`vllm:request_success_total`, {served[0]:,.0f} after the batches) were {served[1]:,.0f}"
            f" after them: {'no request reached it' if served[1] == served[0] else 'requests reached it'}.",
            "",
            f"- Refused in {refusal:.2f} s (min {min(refusals):.2f} s, max {max(refusals):.2f} s; goal: within"
            f" {REFUSAL_GOAL_SECONDS:.0f} s) {'(met)' if refusal <= REFUSAL_GOAL_SECONDS else '(not met)'}.",
            "",
            "```text",
            re.sub(r"/\S*/cli-refusal-corpus", "DIR", message),
            "```",
        ]
    )
