"""GPU benchmark: sibling dispatch, a 5-turn session and the CLI, against one running vLLM server.

Run by ``benchmarks/gpu/run.sh`` on a GPU machine (or by hand against any
server: ``--base-url``). For each context size (``--contexts 32000,105000,max``;
``max`` is the largest prompt the server's window takes), a repository of
standard-library files of about that many tokens is packed, then:

- ``ask_many default``: ``RepoSession.ask_many`` of 8 with default options;
- ``ask_many c8 lead``: the same with ``dispatch="lead"``, concurrency 8;
- ``ask_many c8``: concurrency 8, dispatch ``auto``;
- ``ask_many c8 together`` / ``ask_many c8 admitted``: the other strategies, when
  ``--dispatches`` names them (``lead`` is always run; the SGLang run names all three);
- ``plain lead then 7``: a plain HTTP client, one request, then 7 at once after its first token;
- ``plain all 8 doc-first``: the plain client sending all 8 at once, documents first;
- ``plain all 8 question-first``: all 8 at once, the question before the documents;
- ``session 5 turns``: five turns of one session, TTFT and cached tokens per turn;
- ``api batch`` / ``cli batch``: the same 8 through the API (from constructing the
  session, warm store) and through ``longctx batch`` as a new process;
- ``api batch new process``: the API's batch as a new process too (``benchmarks/batch_one.py``):
  what ``cli batch`` is held against (the in-process row has its imports and caches warm);
- ``first question cold`` / ``first question warm``: a new session's first
  question, its TTFT, without and with a warm start (``RequestOptions(warm_start=True)``,
  as ``longctx chat`` opens; the question asked ``--warm-wait`` seconds after
  opening, as a person types).

The engine is whatever answers at ``--base-url`` (vLLM or SGLang, read from the
server); the scenarios are the same for both. ``--deadline`` stops starting new
scenarios after that many seconds, so a run under a time limit keeps what it
measured (results are written after every scenario). ``--only`` runs the named
rows alone (a context's rows split over calls under a time limit; ``report.py``
merges the files).

Every scenario runs under its own ``cache_salt``, so each starts cold. The
plain client uses only the standard library (``http.client``), so it pays
no import. Raw results go to ``OUT/results.json``; ``report.py`` turns them
into the docs/benchmarks.md section.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

QUESTIONS = tuple(
    f"Question {n}: name one function of these files worth testing first, and say why." for n in range(1, 9)
)
TURNS = (
    "Summarise what the first file does.",
    "Now compare it with the second file.",
    "Which of the two is harder to test?",
    "What would you refactor first?",
    "Write the first test you would add.",
)
# What the report shows of a server's own settings (SGLang's /get_server_info; vLLM's cache_config_info).
SETTINGS_SHOWN = (
    "schedule_policy", "page_size", "chunked_prefill_size", "attention_backend", "kv_cache_dtype",
    "max_total_num_tokens", "enable_hierarchical_cache", "hicache_ratio", "hicache_size",
    "disable_radix_cache", "sampling_backend", "block_size", "cache_dtype", "enable_prefix_caching",
)  # fmt: skip
# The rows every run has (beside one ``ask_many c8 STRATEGY`` per dispatch strategy), for --only.
ROWS = (
    "ask_many default", "plain all 8 doc-first", "ask_many c8", "plain lead then 7",
    "plain all 8 question-first", "session 5 turns", "first question cold", "first question warm",
    "api batch", "cli batch", "api batch new process",
)  # fmt: skip
# Room left in the window for the chat template, the question and the answer.
WINDOW_ROOM = 4096


def log(message: str) -> None:
    print(f"[gpu-bench] {message}", file=sys.stderr, flush=True)


# -- the corpus ---------------------------------------------------------------------


def make_repository(root: Path, target_tokens: int, chars_per_token: float) -> Path:
    """Standard-library files in a git repository, about ``target_tokens`` tokens of text."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    budget = int(target_tokens * chars_per_token)
    total = 0
    sources = sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py"))
    for path in sources:
        text = path.read_text(encoding="utf-8", errors="replace")
        if total + len(text) > budget or not text.strip():
            continue
        target = root / path.relative_to(stdlib)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        total += len(text)
        if total > budget * 0.995:
            break
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", "-C", str(root)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "fixture"], check=True)
    return root


# -- a plain client: the standard library only ----------------------------------------


class PlainClient:
    """Streaming chat completions over http.client, as a hand-written client would send them."""

    def __init__(self, api_url: str, model: str) -> None:
        parts = urlsplit(api_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.path = parts.path.rstrip("/") + "/chat/completions"
        self.model = model

    def send(
        self, messages: list[dict[str, str]], salt: str, max_tokens: int, on_first: Callable[[], None] | None
    ) -> dict[str, Any]:
        body = json.dumps(
            {
                "model": self.model,
                "messages": messages,
                "max_tokens": max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
                "cache_salt": salt,
            }
        )
        started = time.perf_counter()
        connection = http.client.HTTPConnection(self.host, self.port, timeout=3600)
        connection.request("POST", self.path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {response.read()[:500]!r}")
        first: float | None = None
        usage: dict[str, Any] = {}
        for raw in response:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                if first is None and (choice.get("delta") or {}).get("content"):
                    first = time.perf_counter() - started
                    if on_first is not None:
                        on_first()
        connection.close()
        if not usage.get("prompt_tokens"):  # a stream that broke, or a refusal inside it: no timing
            raise RuntimeError(f"the stream ended without its usage ({usage!r}): not recorded as a time")
        if first is None and on_first is not None:
            on_first()
        details = usage.get("prompt_tokens_details") or {}
        return {
            "prompt": usage.get("prompt_tokens"),
            "cached": details.get("cached_tokens"),
            "ttft": first,
            "total": time.perf_counter() - started,
        }


def plain_batch(
    client: PlainClient,
    messages: Sequence[list[dict[str, str]]],
    max_tokens: int,
    *,
    lead_first: bool,
) -> dict[str, Any]:
    salt = uuid.uuid4().hex
    lead_ready = threading.Event()
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(messages)) as pool:
        lead = pool.submit(client.send, messages[0], salt, max_tokens, lead_ready.set if lead_first else None)
        if lead_first:
            lead_ready.wait()
        rest = [pool.submit(client.send, m, salt, max_tokens, None) for m in messages[1:]]
        results = [lead.result(), *(future.result() for future in rest)]
    return {"wall_s": time.perf_counter() - started, "requests": results}


# -- longctx scenarios --------------------------------------------------------------------


def usage_row(usage: Any) -> dict[str, Any]:
    return {
        "prompt": usage.prompt_tokens,
        "cached": usage.cached_tokens,
        "ttft": usage.ttft_seconds,
        "total": usage.total_seconds,
    }


def api_batch(repo: Path, base_url: str, home: Path, max_tokens: int, **request: Any) -> dict[str, Any]:
    """``ask_many`` from constructing the session (warm store): what ``longctx batch`` does, in process."""
    from longctx.options.groups import RequestOptions, ServerOptions
    from longctx.sessions import RepoSession
    from longctx.store import Store

    options = RequestOptions(max_tokens=max_tokens, cache_salt=uuid.uuid4().hex, **request)
    started = time.perf_counter()
    with (
        Store.open(home) as store,
        RepoSession([repo], server=ServerOptions(base_url=base_url), store=store, request=options) as session,
    ):
        batch = session.ask_many(QUESTIONS)
    wall = time.perf_counter() - started
    return {
        "wall_s": wall,
        "dispatch": batch.report.dispatch,
        "counter_matches": None if batch.report.counter_check is None else batch.report.counter_check.matches,
        "requests": [usage_row(answer.usage) for answer in batch],
    }


def cli_batch(repo: Path, base_url: str, home: Path, max_tokens: int, work: Path) -> dict[str, Any]:
    """``longctx batch`` as a new process, end to end (start, imports, pack on a warm store, answers)."""
    questions = work / "questions.txt"
    questions.write_text("\n".join(QUESTIONS) + "\n")
    executable = shutil.which("longctx")
    command = [executable] if executable else [sys.executable, "-m", "longctx"]
    # Where the new process's time goes, for reading later.
    if profiles := os.environ.get("BENCH_CLI_PROFILES"):
        target = Path(profiles) / f"cli-batch-{uuid.uuid4().hex[:8]}.prof"
        command = [sys.executable, "-m", "cProfile", "-o", str(target), "-m", "longctx"]
    command += [
        "batch", str(repo), "--questions", str(questions), "--max-tokens", str(max_tokens),
        "--cache-salt", uuid.uuid4().hex, "--json", "--quiet",
    ]  # fmt: skip
    env = {**os.environ, "LONGCTX_HOME": str(home), "LONGCTX_BASE_URL": base_url}
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"longctx batch failed ({done.returncode}): {done.stderr[-2000:]}")
    data = json.loads(done.stdout)
    return {
        "wall_s": wall,
        "dispatch": data["report"].get("dispatch"),
        "requests": [
            {
                "prompt": a["usage"].get("prompt_tokens"),
                "cached": a["usage"].get("cached_tokens"),
                "ttft": a["usage"].get("ttft_seconds"),
                "total": a["usage"].get("total_seconds"),
            }
            for a in data["answers"]
        ],
    }


def api_batch_process(repo: Path, base_url: str, home: Path, max_tokens: int, work: Path) -> dict[str, Any]:
    """``benchmarks/batch_one.py`` as a new process: the API's batch paying the start the CLI pays."""
    questions = work / "questions.txt"
    questions.write_text("\n".join(QUESTIONS) + "\n")
    script = Path(__file__).resolve().parent.parent / "batch_one.py"
    command = [
        sys.executable,
        str(script),
        str(repo),
        str(questions),
        base_url,
        str(max_tokens),
        uuid.uuid4().hex,
    ]
    started = time.perf_counter()
    done = subprocess.run(
        command, env={**os.environ, "LONGCTX_HOME": str(home)}, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"batch_one.py failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"wall_s": wall}


def five_turns(repo: Path, base_url: str, home: Path, max_tokens: int) -> dict[str, Any]:
    from longctx.options.groups import RequestOptions, ServerOptions
    from longctx.sessions import RepoSession
    from longctx.store import Store

    options = RequestOptions(max_tokens=max_tokens, cache_salt=uuid.uuid4().hex)
    turns = []
    started = time.perf_counter()
    with (
        Store.open(home) as store,
        RepoSession([repo], server=ServerOptions(base_url=base_url), store=store, request=options) as session,
    ):
        for question in TURNS:
            turns.append(usage_row(session.ask(question).usage))
        check = session.report().counter_check
    return {
        "wall_s": time.perf_counter() - started,
        "counter_matches": None if check is None else check.matches,
        "turns": turns,
    }


def first_question(
    repo: Path, base_url: str, home: Path, max_tokens: int, *, warm: bool, wait: float
) -> dict[str, Any]:
    """A new session's first question after ``wait`` seconds, with or without a warm start."""
    from longctx.options.groups import RequestOptions, ServerOptions
    from longctx.sessions import RepoSession
    from longctx.store import Store

    options = RequestOptions(max_tokens=max_tokens, cache_salt=uuid.uuid4().hex, warm_start=warm)
    with Store.open(home) as store:
        session = RepoSession([repo], server=ServerOptions(base_url=base_url), store=store, request=options)
        session.full_pack  # noqa: B018 - packed before the session opens, as chat does
        with session:  # opening starts the warm request in the background
            time.sleep(wait)
            started = time.perf_counter()
            answer = session.ask(QUESTIONS[0])
            wall = time.perf_counter() - started
            warming = session.warming.result if session.warming is not None else None
    return {
        "wall_s": wall,
        "warm": warm,
        "wait_s": wait,
        "warm_summary": None if warming is None else warming.summary_line(),
        "requests": [usage_row(answer.usage)],
    }


class Deadline(Exception):
    """No time left to start another scenario."""


def run_context(
    target: int,
    base_url: str,
    work: Path,
    *,
    max_tokens: int,
    repeats: int,
    warm_wait: float,
    dispatches: Sequence[str] = ("lead",),
    deadline: float | None = None,
    only: frozenset[str] | None = None,
    into: dict[str, Any] | None = None,
    on_record: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Every scenario at one context size (those in ``only``, if given), into ``into`` as they finish."""
    from longctx.backends.base import connect
    from longctx.errors import BudgetError
    from longctx.options.groups import RequestOptions, ServerOptions
    from longctx.sessions import RepoSession
    from longctx.store import Store

    home = work / f"home-{target}"
    ratio = 3.3
    for attempt in range(6):
        repo = make_repository(work / f"repo-{target}", target, ratio)
        try:
            with Store.open(home) as store, RepoSession(
                [repo], server=ServerOptions(base_url=base_url), store=store,
                request=RequestOptions(max_tokens=max_tokens),
            ) as session:  # fmt: skip
                pack = session.full_pack
                prefix_tokens = pack.prefix_tokens
                messages_doc_first = [list(pack.messages(q)) for q in QUESTIONS]
        except BudgetError:
            ratio *= 0.95
            continue
        if prefix_tokens <= target * 1.02 or attempt == 5:
            break
        ratio *= target / prefix_tokens
    log(f"context {target}: pack of {prefix_tokens:,} tokens")
    context = {} if into is None else into
    context.update({"target_tokens": target, "prefix_tokens": prefix_tokens})
    scenarios: dict[str, list[dict[str, Any]]] = context.setdefault("scenarios", {})
    pack_text = messages_doc_first[0][1]["content"].removesuffix(QUESTIONS[0])
    system = messages_doc_first[0][0]["content"]
    question_first = [
        [{"role": "system", "content": system}, {"role": "user", "content": f"{q}\n\n{pack_text}"}]
        for q in QUESTIONS
    ]
    with connect(base_url) as backend:
        client = PlainClient(backend.info.api_url, backend.info.model)

    def record(name: str, run: Callable[[], dict[str, Any]]) -> None:
        if only is not None and name not in only:
            return
        if deadline is not None and time.monotonic() > deadline:
            raise Deadline(name)
        result = run()
        scenarios.setdefault(name, []).append(result)
        log(f"context {target}: {name}: {result['wall_s']:.2f} s")
        if on_record is not None:
            on_record()

    # One untimed batch first: the first batch after packing paid extra on the CPU smoke run
    # (the server's first requests of this length), which no scenario should carry.
    if only is None or any(name.startswith(("ask_many", "plain")) for name in only):
        api_batch_scenario(repo, base_url, home, max_tokens)
    for _ in range(repeats):
        # The two headline rows side by side, repeated: the machine's noise lands on both.
        record("ask_many default", lambda: api_batch_scenario(repo, base_url, home, max_tokens))
        record(
            "plain all 8 doc-first",
            lambda: plain_batch(client, messages_doc_first, max_tokens, lead_first=False),
        )
    record("ask_many c8", lambda: api_batch_scenario(repo, base_url, home, max_tokens, concurrency=8))
    for strategy in ("lead", *(d for d in dispatches if d != "lead")):
        record(
            f"ask_many c8 {strategy}",
            lambda strategy=strategy: api_batch_scenario(
                repo, base_url, home, max_tokens, concurrency=8, dispatch=strategy
            ),
        )
    record("plain lead then 7", lambda: plain_batch(client, messages_doc_first, max_tokens, lead_first=True))
    record(
        "plain all 8 question-first",
        lambda: plain_batch(client, question_first, max_tokens, lead_first=False),
    )
    record("session 5 turns", lambda: five_turns(repo, base_url, home, max_tokens))
    for _ in range(repeats):
        for warm in (False, True):
            record(
                f"first question {'warm' if warm else 'cold'}",
                lambda warm=warm: first_question(repo, base_url, home, max_tokens, warm=warm, wait=warm_wait),
            )
    for _ in range(repeats):
        record("api batch", lambda: api_batch(repo, base_url, home, max_tokens))
        record("cli batch", lambda: cli_batch(repo, base_url, home, max_tokens, work))
        record("api batch new process", lambda: api_batch_process(repo, base_url, home, max_tokens, work))
    return context


def api_batch_scenario(
    repo: Path, base_url: str, home: Path, max_tokens: int, **request: Any
) -> dict[str, Any]:
    """``ask_many`` timed from the call alone (the session and its pack ready before the clock)."""
    from longctx.options.groups import RequestOptions, ServerOptions
    from longctx.sessions import RepoSession
    from longctx.store import Store

    options = RequestOptions(max_tokens=max_tokens, cache_salt=uuid.uuid4().hex, **request)
    with (
        Store.open(home) as store,
        RepoSession([repo], server=ServerOptions(base_url=base_url), store=store, request=options) as session,
    ):
        session.full_pack  # noqa: B018 - packed before the clock starts
        started = time.perf_counter()
        batch = session.ask_many(QUESTIONS)
        wall = time.perf_counter() - started
    return {
        "wall_s": wall,
        "dispatch": batch.report.dispatch,
        "counter_matches": None if batch.report.counter_check is None else batch.report.counter_check.matches,
        "requests": [usage_row(answer.usage) for answer in batch],
    }


def gpu_name() -> str:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, check=True, timeout=30,
        )  # fmt: skip
        return done.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "no NVIDIA GPU (" + platform.processor() + ")"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument(
        "--contexts", default="32000,105000,max", help="token targets; max: the largest that fits"
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json")
    parser.add_argument("--answer-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="runs of the headline and CLI rows")
    parser.add_argument("--flags", default="", help="the server's launch flags, for the report")
    parser.add_argument("--label", default="gpu", help="a name for this run (results-LABEL.json)")
    parser.add_argument(
        "--dispatches",
        default="lead",
        help="comma-separated dispatch strategies run at concurrency 8 beside auto (lead always)",
    )
    parser.add_argument(
        "--deadline", type=float, default=None, help="seconds after which no new scenario starts"
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated row names (e.g. 'session 5 turns,api batch'): run only these",
    )
    parser.add_argument(
        "--warm-wait",
        type=float,
        default=10.0,
        help="seconds between opening a session and its first question",
    )
    args = parser.parse_args()
    deadline = None if args.deadline is None else time.monotonic() + args.deadline
    only = frozenset(name.strip() for name in args.only.split(",") if name.strip()) or None
    strategies = [d for d in args.dispatches.split(",") if d]
    known = {*ROWS, *(f"ask_many c8 {d}" for d in ("lead", *strategies))}
    if only is not None and not only <= known:
        parser.error(
            f"--only names no row {', '.join(sorted(only - known))!r}; rows: {', '.join(sorted(known))}"
        )

    from longctx.backends.base import connect

    with connect(args.base_url) as backend:
        info = backend.info
    window = info.context_length or 32768
    targets = [
        window - WINDOW_ROOM if part == "max" else int(part) for part in args.contexts.split(",") if part
    ]
    targets = [min(target, window - WINDOW_ROOM) for target in targets]
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "meta": {
            "gpu": gpu_name(),
            "engine": info.engine,
            "version": info.version,
            "model": info.model,
            "context_length": info.context_length,
            "cache_block_tokens": info.cache_block_tokens,
            "schedule_policy": info.schedule_policy,
            "kv_cache_tokens": info.kv_cache_tokens,
            "server_settings": {k: info.settings[k] for k in SETTINGS_SHOWN if k in info.settings},
            "flags": args.flags,
            "dispatches": ["lead", *(d for d in args.dispatches.split(",") if d and d != "lead")],
            "answer_tokens": args.answer_tokens,
            "only": sorted(only) if only else None,
            "python": platform.python_version(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
        "contexts": [],
    }
    path = args.out / f"results-{args.label}.json"

    def save() -> None:
        # Written after every scenario, so a run cut short keeps what it measured.
        path.write_text(json.dumps(results, indent=2))

    with tempfile.TemporaryDirectory(prefix="longctx-gpu-") as scratch:
        for target in targets:
            context: dict[str, Any] = {"target_tokens": target, "scenarios": {}}
            results["contexts"].append(context)
            try:
                run_context(
                    target,
                    args.base_url,
                    Path(scratch),
                    max_tokens=args.answer_tokens,
                    repeats=args.repeats,
                    warm_wait=args.warm_wait,
                    dispatches=[d for d in args.dispatches.split(",") if d],
                    deadline=deadline,
                    only=only,
                    into=context,
                    on_record=save,
                )
            except Deadline as stop:
                context["stopped_before"] = str(stop)
                log(f"context {target}: deadline reached before {stop}")
                save()
                break
            save()
    log(f"results in {path}")


if __name__ == "__main__":
    main()
