"""Benchmark: how sibling questions should go out, on the test suite's CPU vLLM and SGLang servers.

Eight sibling questions over one repository near the CPU servers' limits
(a ~28k-token pack; both servers allow 32,768 tokens per request), sent by
``Session.ask_many`` with each dispatch strategy and concurrency. Every run
has its own ``cache_salt``, so each starts cold and the lead pays the one
prefill. Runs of one engine are interleaved (strategy A, B, C, A, B, C, ...)
so the machine's noise spreads over all of them; the table gives the median
wall time and each strategy's ratio to the fastest.

*cached share* is the siblings' cached tokens over the theoretical maximum:
the seven followers each reading the whole shared token prefix (two
siblings' prompts tokenized by the server, compared) from the cache,
rounded down to the server's cache block.

The ``auto`` row is what users get by default (the engine profile's ``dispatch`` rows, in
``longctx.backends.engines``);
the section says whether it is the fastest strategy measured.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx2

from longctx.backends.base import Backend, connect
from longctx.options.groups import RequestOptions
from longctx.sessions import RepoSession
from longctx.sessions.siblings import choose_dispatch
from longctx.store import Store
from longctx.testing import EngineHarness

QUESTIONS = tuple(
    f"Question {n}: which function of these files would you test first, and why?" for n in range(1, 9)
)
TARGET_TOKENS = 28_000
ANSWER_TOKENS = 16
# (dispatch, concurrency): None is the engine's measured default.
CONFIGS: tuple[tuple[str, int | None], ...] = (
    ("auto", None),
    ("together", 8),
    ("together", 4),
    ("lead", 8),
    ("lead", 4),
    ("admitted", 8),
)


def log(message: str) -> None:
    print(f"[benchmarks] siblings: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Run:
    dispatch: str
    concurrency: int | None
    chosen: str
    wall_seconds: float
    cached_tokens: int
    theoretical: int
    counter_matches: bool | None


def make_repository(root: Path, target_chars: int) -> Path:
    """Standard-library files in a git repository, about ``target_chars`` of text."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if total + len(text) > target_chars:
            continue
        (root / path.name).write_text(text)
        total += len(text)
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", "-C", str(root)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "fixture"], check=True)
    return root


def shared_prompt_tokens(backend: Backend, two: list[list[dict[str, str]]]) -> int:
    """How many leading tokens two siblings' prompts share, as the server's template and tokenizer make them."""
    info = backend.info
    # The profile's route: vLLM serves /tokenize at the root; SGLang 0.5 only /v1/tokenize.
    url = f"{info.root_url}{info.profile.tokenize_path}"
    ids = []
    for messages in two:
        body = {"model": info.model, "messages": messages, "add_generation_prompt": True}
        response = httpx2.post(url, json=body, timeout=120)
        response.raise_for_status()
        ids.append(response.json()["tokens"])
    length = 0
    for a, b in zip(ids[0], ids[1], strict=False):
        if a != b:
            break
        length += 1
    return length


def one_run(backend: Backend, store: Store, repo: Path, dispatch: str, concurrency: int | None) -> Run:
    request = RequestOptions(
        max_tokens=ANSWER_TOKENS, cache_salt=uuid.uuid4().hex, dispatch=dispatch, concurrency=concurrency
    )
    with RepoSession([repo], backend=backend, store=store, request=request) as session:
        session.full_pack  # noqa: B018 - packed and counted before the clock starts (a warm store)
        started = time.perf_counter()
        batch = session.ask_many(QUESTIONS)
        wall = time.perf_counter() - started
    block = backend.info.cache_block_tokens or 1
    shared = shared_prompt_tokens(backend, [session.messages(q) for q in QUESTIONS[:2]])
    theoretical = (len(QUESTIONS) - 1) * (shared - shared % block)
    check = batch.report.counter_check
    return Run(
        dispatch,
        concurrency,
        batch.report.dispatch or "",
        wall,
        batch.report.cached_tokens or 0,
        theoretical,
        None if check is None else check.matches,
    )


def engine_table(engine: str, harness: EngineHarness, work: Path, repetitions: int) -> tuple[str, bool]:
    server = harness.server(engine)
    repo = make_repository(work / "siblings-repo", target_chars=int(TARGET_TOKENS * 3.3))
    with connect(server.api_base) as backend, Store.open(work / f"siblings-home-{engine}") as store:
        # One warm-up batch: the pack is counted and stored, the server's first-request costs paid.
        warm = one_run(backend, store, repo, "lead", 8)
        log(f"{engine}: warm-up {warm.wall_seconds:.2f} s")
        runs: list[Run] = []
        for repetition in range(repetitions):
            for dispatch, concurrency in CONFIGS:
                run = one_run(backend, store, repo, dispatch, concurrency)
                log(
                    f"{engine} #{repetition + 1} {dispatch}/{concurrency}: {run.wall_seconds:.2f} s,"
                    f" cached {run.cached_tokens:,} of {run.theoretical:,}"
                )
                runs.append(run)
        info = backend.info
        auto = choose_dispatch(info, RequestOptions())
        with RepoSession([repo], backend=backend, store=store) as session:
            prefix_tokens = session.full_pack.prefix_tokens
    medians = {
        config: statistics.median(r.wall_seconds for r in runs if (r.dispatch, r.concurrency) == config)
        for config in CONFIGS
    }
    explicit = {config: wall for config, wall in medians.items() if config[0] != "auto"}
    fastest_config = min(explicit, key=lambda config: explicit[config])
    fastest = explicit[fastest_config]
    auto_config = (auto.strategy, auto.concurrency)
    auto_is_fastest = auto_config == fastest_config or medians[("auto", None)] <= fastest * 1.05
    rows = []
    for config in CONFIGS:
        mine = [r for r in runs if (r.dispatch, r.concurrency) == config]
        share = min(r.cached_tokens / r.theoretical for r in mine)
        matches = all(r.counter_matches for r in mine)
        label = f"auto ({auto.strategy}, {auto.concurrency})" if config[0] == "auto" else config[0]
        concurrency = auto.concurrency if config[1] is None else config[1]
        rows.append(
            f"| {label} | {concurrency} | {medians[config]:.2f} | {medians[config] / fastest:.2f}"
            f" | {share:.1%} | {'yes' if matches else 'NO'} |"
        )
    verdict = (
        f"auto chose {auto.strategy} with {auto.concurrency} in flight; the fastest explicit strategy measured"
        f" was {fastest_config[0]} with {fastest_config[1]} ({fastest:.2f} s)."
        f" Auto is the fastest measured (within 5%): {'yes' if auto_is_fastest else 'NO'}."
    )
    lines = [
        f"### {engine} {info.version or ''} (CPU build), pack of {prefix_tokens:,} tokens,"
        f" cache block {info.cache_block_tokens or 'unknown'}",
        "",
        "| dispatch | in flight | median wall s | vs fastest | min cached share | counter check |",
        "|---|---:|---:|---:|---:|---|",
        *rows,
        "",
        verdict,
        "",
    ]
    return "\n".join(lines), auto_is_fastest


def section(work: Path, harness_dir: Path, repetitions: int = 3) -> str:
    harness = EngineHarness(harness_dir, on_progress=lambda message: log(f"harness: {message}"))
    tables = []
    try:
        for engine in ("vllm", "sglang"):
            table, _ = engine_table(engine, harness, work, repetitions)
            tables.append(table)
            # One engine at a time: the two CPU servers together do not fit this machine's memory.
            for server in harness.started_servers():
                server.stop()
    finally:
        harness.close()
    return "\n".join(
        [
            "## Sibling dispatch on the CPU engines",
            "",
            f"`Session.ask_many` of {len(QUESTIONS)} siblings, {ANSWER_TOKENS} answer tokens each, over a"
            " repository of standard-library files near the CPU servers' 32,768-token limit; each run its own"
            f" `cache_salt` (cold), {repetitions} interleaved runs per row (`benchmarks/siblings.py`). *min"
            " cached share*: the worst run's cached tokens over seven times the siblings' shared token prefix"
            " (server-tokenized), rounded down to the cache block. *counter check*: the server's own counter matched the responses in every run.",
            "",
            *tables,
        ]
    )
