"""Benchmark: a job larger than the KV cache, longctx's job runner against a plain client.

Two vLLM replicas whose KV caches together hold less than all the packs; a
job of PACKS packs (folders of standard-library files, about PACK_TOKENS
tokens each) with QUESTIONS questions each, given in a shuffled order (the
order a script collecting questions would produce). Two clients do the
same (pack, question) pairs:

- *longctx*: ``longctx.Job`` with both replica URLs: each pack's questions
  together, packs spread by rendezvous over the replicas, no more packs in
  flight per replica than its KV cache (which the replica reports) holds.
  Its time includes reading, packing and counting every pack.
- *plain client*: the byte-identical prompts (longctx's own pack text, so
  only the scheduling differs), sent in the given order, CONCURRENCY in
  flight, alternating between the two replicas (what a load balancer with
  no affinity does), with prompts built before the clock starts.

Each run has its own ``cache_salt``, so it starts cold and cannot use
another run's blocks. *prefilled* is the prompt tokens the servers computed
(prompt less cached, from the responses); *minimum* is one cold prefill per
pack (each pack's first request, less nothing). Goals: longctx
prefills at most 1.2x the minimum and finishes at least 2x faster than the
plain client.

Run by ``benchmarks/run --only jobs`` (it starts two CPU vLLM replicas with
``longctx.testing``), or on servers already running:

    python benchmarks/jobs.py --urls http://a:8000/v1,http://b:8000/v1 --work /tmp/jobs
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from longctx import Job, JobItem, JobOptions
from longctx.backends.base import connect
from longctx.backends.chat import ChatRequest
from longctx.backends.http import HttpEndpoint
from longctx.backends.metrics import parse_metrics
from longctx.options.groups import RequestOptions, ServerOptions
from longctx.sessions import RepoSession
from longctx.store import Store
from longctx.usage import Usage

PACKS = 8
QUESTIONS = 4
PACK_TOKENS = 12_000
ANSWER_TOKENS = 16
CONCURRENCY = 8
# The CPU replicas' KV cache: 264 blocks of 128 tokens (33,792 tokens, about the
# least vLLM accepts for the model's 32,768-token window), so the two hold
# about 5 of the 8 packs.
KV_BLOCKS = 264
REPLICA_ARGS = ("--num-gpu-blocks-override", str(KV_BLOCKS))
SEED = 14


def log(message: str) -> None:
    print(f"[benchmarks] jobs: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Run:
    client: str
    wall_seconds: float
    prompt_tokens: int
    cached_tokens: int
    minimum: int
    #: Cached tokens loaded from a host tier, as the responses said (None: no response said).
    host_reported: int | None = None
    #: The same, as the job's counter check read the servers' counters (longctx only).
    host_checked: int | None = None
    #: The engine's own host-tier counter over the run, summed over the replicas, read raw here
    #: (SGLang's ``sglang:cached_tokens_total{cache_source="host"}``; None: not exported).
    host_counter: int | None = None

    @property
    def prefilled(self) -> int:
        return self.prompt_tokens - self.cached_tokens


def make_packs(root: Path, count: int = PACKS, tokens: int = PACK_TOKENS) -> list[Path]:
    """``count`` folders of distinct standard-library modules, about ``tokens`` tokens each."""
    if root.exists():
        shutil.rmtree(root)
    modules = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    target = int(tokens * 3.3)  # characters: the CPU servers' tokenizer makes about 3.3 per token
    folders: list[Path] = []
    sources = iter(modules)
    for number in range(count):
        folder = root / f"pack{number}"
        folder.mkdir(parents=True)
        size = 0
        for module in sources:
            text = module.read_text(encoding="utf-8", errors="replace")
            if len(text) > target - size:
                continue
            (folder / module.name).write_text(text)
            size += len(text)
            if size > 0.9 * target:
                break
        folders.append(folder)
    return folders


def job_items(folders: list[Path], questions: int = QUESTIONS, seed: int = SEED) -> list[JobItem]:
    """Every folder's questions, shuffled across the folders."""
    items = [
        JobItem((str(folder),), f"Question {q}: which function in these files would you test first?")
        for folder in folders
        for q in range(questions)
    ]
    random.Random(seed).shuffle(items)
    return items


# The host-tier counters this benchmark reads itself, apart from longctx's registry: metric name,
# the label that names the tier and its value for host memory.
HOST_COUNTERS = (("sglang:cached_tokens_total", "cache_source", "host"),)


def host_counter(urls: list[str]) -> int | None:
    """The replicas' host-tier cached-token counters, summed; None when none exports one.

    A labelled counter has no sample for a label value until it first counts one (SGLang's
    ``cache_source="host"`` before the first host hit), so a metric whose family is declared
    (``# TYPE``) or has any sample counts as exported, its host sample absent as 0."""
    found, count = False, 0.0
    for url in urls:
        endpoint = HttpEndpoint(url, timeout=30.0)
        try:
            text = endpoint.get_text("/metrics")
        finally:
            endpoint.close()
        samples = parse_metrics(text)
        for name, label, value in HOST_COUNTERS:
            # prometheus_client declares a counter's family without its _total suffix.
            declared = {f"# TYPE {name} ", f"# TYPE {name.removesuffix('_total')} "}
            if any(line in text for line in declared) or any(sample.name == name for sample in samples):
                found = True
            count += sum(s.value for s in samples if s.name == name and s.labels.get(label) == value)
    return int(count) if found else None


def grown(before: int | None, after: int | None) -> int | None:
    """How much a counter grew; None when either reading is missing."""
    return None if before is None or after is None else after - before


def _host_reported(usages: list[Usage]) -> int | None:
    said = [usage.host_cached_tokens for usage in usages if usage.host_cached_tokens is not None]
    return sum(said) if said else None


def run_longctx(urls: list[str], items: list[JobItem], home: Path) -> Run:
    request = RequestOptions(max_tokens=ANSWER_TOKENS, temperature=0.0, cache_salt=uuid.uuid4().hex)
    before = host_counter(urls)
    with Store.open(home) as store, connect(ServerOptions(base_url=urls)) as backend:
        started = time.perf_counter()
        report = Job(items, backend=backend, store=store, request=request, options=JobOptions()).run()
        wall = time.perf_counter() - started
    time.sleep(1.0)  # engines publish their counters a moment after the last response
    after = host_counter(urls)
    if report.failed:
        raise RuntimeError(f"longctx job failed: {report.failed[0].error}")
    firsts: dict[tuple[str, ...], int] = {}
    usages = []
    for result in report.results:
        assert result.usage is not None
        firsts.setdefault(result.item.paths, result.usage.prompt_tokens or 0)
        usages.append(result.usage)
    check = report.counter_check
    return Run(
        "longctx job", wall, report.prompt_tokens, report.cached_tokens, sum(firsts.values()),
        _host_reported(usages), None if check is None else check.host_tokens, grown(before, after),
    )  # fmt: skip


def plain_prompts(urls: list[str], items: list[JobItem], home: Path) -> list[list[dict[str, str]]]:
    """The messages longctx sends for each item (its pack text), built before any clock starts."""
    by_paths: dict[tuple[str, ...], RepoSession] = {}
    messages = []
    with Store.open(home) as store, connect(ServerOptions(base_url=urls[0])) as backend:
        for item in items:
            session = by_paths.get(item.paths)
            if session is None:
                session = by_paths[item.paths] = RepoSession(list(item.paths), backend=backend, store=store)
            messages.append(session.messages(item.question))
    return messages


def run_plain(urls: list[str], items: list[JobItem], prompts: list[list[dict[str, str]]]) -> Run:
    salt = uuid.uuid4().hex
    backends = [connect(ServerOptions(base_url=url)) for url in urls]

    def send(index: int) -> Usage:
        request = ChatRequest(
            messages=tuple(prompts[index]),
            max_tokens=ANSWER_TOKENS,
            temperature=0.0,
            cache_salt=salt,
        )
        return backends[index % len(backends)].complete(request).completion.usage

    before = host_counter(urls)
    try:
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
            usages = list(pool.map(send, range(len(items))))
        wall = time.perf_counter() - started
    finally:
        for backend in backends:
            backend.close()
    time.sleep(1.0)
    after = host_counter(urls)
    firsts: dict[tuple[str, ...], int] = {}
    for item, usage in zip(items, usages, strict=True):
        firsts.setdefault(item.paths, usage.prompt_tokens or 0)
    return Run(
        "plain client, given order",
        wall,
        sum(usage.prompt_tokens or 0 for usage in usages),
        sum(usage.cached_tokens or 0 for usage in usages),
        sum(firsts.values()),
        _host_reported(usages),
        None,
        grown(before, after),
    )


@dataclass(frozen=True)
class Workload:
    packs: int = PACKS
    pack_tokens: int = PACK_TOKENS
    questions: int = QUESTIONS


def measure(urls: list[str], work: Path, repetitions: int, workload: Workload = Workload()) -> list[Run]:
    folders = make_packs(work / "job-packs", workload.packs, workload.pack_tokens)
    items = job_items(folders, workload.questions)
    prompts = plain_prompts(urls, items, work / "job-home-prompts")
    runs: list[Run] = []
    for number in range(repetitions):
        # Taking turns, so the machine's noise falls on both alike.
        order = ("longctx", "plain") if number % 2 == 0 else ("plain", "longctx")
        for client in order:
            if client == "longctx":
                with tempfile.TemporaryDirectory(dir=work) as home:
                    run = run_longctx(urls, items, Path(home))
            else:
                run = run_plain(urls, items, prompts)
            log(
                f"#{number + 1} {run.client}: {run.wall_seconds:.2f} s, prefilled {run.prefilled:,}"
                f" of {run.prompt_tokens:,} (minimum {run.minimum:,})"
            )
            runs.append(run)
    return runs


def table(runs: list[Run]) -> tuple[str, dict[str, float]]:
    clients = list(dict.fromkeys(run.client for run in runs))
    rows, medians = [], {}
    for client in clients:
        mine = [run for run in runs if run.client == client]
        wall = statistics.median(run.wall_seconds for run in mine)
        prefilled = statistics.median(run.prefilled for run in mine)
        minimum = statistics.median(run.minimum for run in mine)
        prompt = statistics.median(run.prompt_tokens for run in mine)
        medians[client] = wall
        medians[f"{client} prefill ratio"] = prefilled / minimum
        rows.append(
            f"| {client} | {len(mine)} | {wall:.2f} | {prompt:,.0f} | {prefilled:,.0f} | {minimum:,.0f}"
            f" | {prefilled / minimum:.2f}x |"
        )
    header = [
        "| client | runs | median wall s | prompt tokens | prefilled tokens | minimum (one prefill per pack)"
        " | prefilled vs minimum |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    return "\n".join([*header, *rows]), medians


def section(work: Path, harness_dir: Path, repetitions: int) -> str:
    """The docs/benchmarks.md section, on two CPU vLLM replicas with small KV caches."""
    from longctx.testing.fleet import Fleet
    from longctx.testing.harness import EngineHarness

    harness = EngineHarness(harness_dir)
    try:
        with Fleet(harness, replicas=2, replica_args=REPLICA_ARGS) as fleet:
            with connect(ServerOptions(base_url=fleet.urls)) as backend:
                kv = [server.kv_cache_tokens for server in backend.servers]
            runs = measure(fleet.urls, work, repetitions)
    finally:
        harness.close()
    where = f"two CPU vLLM replicas of the tiny test model (`--num-gpu-blocks-override {KV_BLOCKS}`)"
    return render(runs, kv, Workload(), where, "## A job larger than the KV cache: two CPU replicas")


def render(runs: list[Run], kv: list[int | None], workload: Workload, where: str, title: str) -> str:
    rows, medians = table(runs)
    speedup = medians["plain client, given order"] / medians["longctx job"]
    ratio = medians["longctx job prefill ratio"]
    kv_text = " and ".join(f"{tokens:,}" for tokens in kv if tokens)
    kv_total = sum(tokens for tokens in kv if tokens)
    all_packs = int(statistics.median(run.minimum for run in runs))
    fits = "less than" if kv_total < all_packs else "NOT less than"
    packs, questions = workload.packs, workload.questions
    return "\n".join(
        [
            title,
            "",
            f"{packs} packs (folders of standard-library modules, about {workload.pack_tokens:,} tokens each)"
            f" with {questions} questions each, {packs * questions} (pack, question) pairs in a shuffled order"
            f" (seed {SEED}), {ANSWER_TOKENS} answer tokens each, on {where}, whose KV caches hold {kv_text}"
            f" tokens ({kv_total:,} together, {fits} the {all_packs:,} tokens of all the packs)."
            " *longctx job*: `longctx.Job` over both replica URLs"
            " (reading, packing"
            " and counting every pack included). *plain client*: the byte-identical prompts, built before"
            f" the clock starts, sent in the given order, {CONCURRENCY} in flight, alternating between the"
            " replicas. Every run under its own `cache_salt` (cold); runs take turns"
            " (`benchmarks/jobs.py`).",
            "",
            rows,
            "",
            f"- longctx prefilled {ratio:.2f}x the minimum (goal: at most 1.2x)"
            f" ({'met' if ratio <= 1.2 else 'not met'}).",
            f"- longctx finished {speedup:.1f}x faster than the plain client (goal: at least 2x)"
            f" ({'met' if speedup >= 2 else 'not met'}).",
            *host_table(runs),
        ]
    )


def host_table(runs: list[Run]) -> list[str]:
    """Each run's host-tier tokens as longctx reported them beside the engine's own counter.

    Nothing when no run saw a host tier (no response said, no counter exported)."""
    if all(run.host_reported is None and run.host_counter is None for run in runs):
        return []

    def shown(value: int | None) -> str:
        return "n/a" if value is None else f"{value:,}"

    rows = [
        "",
        "Cached tokens loaded from the host tier, per run: as the responses said (longctx's report),"
        " as the job's counter check read them, and the engine's own counter over the run (read raw"
        " from each replica's `/metrics`, summed).",
        "",
        "| run | client | host tokens, responses | host tokens, counter check | engine's host counter | equal |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for number, run in enumerate(runs, start=1):
        said = [v for v in (run.host_reported, run.host_checked) if v is not None]
        equal = "n/a" if run.host_counter is None or not said else (
            "yes" if all(v == run.host_counter for v in said) else "NO"
        )  # fmt: skip
        rows.append(
            f"| {number} | {run.client} | {shown(run.host_reported)} | {shown(run.host_checked)}"
            f" | {shown(run.host_counter)} | {equal} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--urls", required=True, help="comma-separated replica URLs")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--packs", type=int, default=PACKS)
    parser.add_argument("--pack-tokens", type=int, default=PACK_TOKENS)
    parser.add_argument("--questions", type=int, default=QUESTIONS)
    parser.add_argument("--json", type=Path, help="also write the runs here")
    parser.add_argument("--where", default="two vLLM replicas", help="the servers, for the section's text")
    args = parser.parse_args()
    urls = [url for url in args.urls.split(",") if url]
    args.work.mkdir(parents=True, exist_ok=True)
    workload = Workload(args.packs, args.pack_tokens, args.questions)
    with connect(ServerOptions(base_url=urls)) as backend:
        kv = [server.kv_cache_tokens for server in backend.servers]
    runs = measure(urls, args.work, args.repetitions, workload)
    text = render(runs, kv, workload, args.where, "## A job larger than the KV cache: two replicas on a GPU")
    if args.json:
        raw = {"kv": kv, "workload": asdict(workload), "where": args.where, "runs": [asdict(r) for r in runs]}
        args.json.write_text(json.dumps({**raw, "section": text}, indent=2))
    print(text)


if __name__ == "__main__":
    main()
