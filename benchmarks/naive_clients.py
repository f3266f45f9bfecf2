"""Benchmark: longctx sessions against naive clients, on the real engines.

Every client runs the same workload over the same repository: four sibling
questions, then a three-turn conversation. The clients differ only in how
they build their prompts:

- longctx: a RepoSession-style pack (fixed header, documents in stability
  order, listing, boundary, question) and an append-only history; siblings
  sent after the lead sibling's first token;
- question first: the question, then the documents;
- timestamp: a system prompt that carries the current time;
- filesystem order: documents in the order a directory listing returns
  them, which differs between machines and processes (each request gets a
  different order here, as separate worker processes on different hosts
  would);
- rewritten history: each turn keeps only the last exchange and a one-line
  summary of the earlier ones, so the conversation's start changes every turn.

Each client gets its own ``cache_salt``, so no client profits from another's
cache and each starts cold. Cached tokens are the server's own report; the
prefill time is the sum of the requests' times to first token.
"""

from __future__ import annotations

import datetime
import random
import shutil
import statistics
import subprocess
import sys
import sysconfig
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from longctx.backends.base import Backend, connect
from longctx.backends.chat import ChatRequest
from longctx.options.groups import RequestOptions
from longctx.packing import build_pack
from longctx.sessions import Session
from longctx.sources.corpus import load_corpus
from longctx.store import Store
from longctx.testing import EngineHarness
from longctx.usage import Usage

FILES = ("textwrap.py", "heapq.py", "shlex.py", "fnmatch.py", "bisect.py", "colorsys.py", "keyword.py")
SIBLINGS = (
    "Which public names does this code define?",
    "Where are errors raised, and why?",
    "What would you test first?",
    "Which parts depend on each other?",
)
TURNS = ("Summarise the first file.", "Now compare it with the second.", "What should be refactored?")
MAX_TOKENS = 16
SYSTEM = "You answer questions about the files below. Quote paths when you refer to code."


@dataclass(frozen=True)
class ClientResult:
    name: str
    usages: tuple[Usage, ...]

    @property
    def prompt_tokens(self) -> int:
        return sum(u.prompt_tokens or 0 for u in self.usages)

    @property
    def cached_tokens(self) -> int:
        return sum(u.cached_tokens or 0 for u in self.usages)

    @property
    def prefill_seconds(self) -> float:
        return sum(u.ttft_seconds or 0.0 for u in self.usages)


def make_repository(root: Path) -> Path:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for name in FILES:
        (root / name).write_text((stdlib / name).read_text())
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    subprocess.run([*git, "init", "-q", str(root)], check=True)
    subprocess.run([*git, "-C", str(root), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(root), "commit", "-qm", "fixture"], check=True)
    return root


def documents_text(root: Path, order: list[str]) -> str:
    return "\n\n".join(f"### {name}\n{(root / name).read_text()}" for name in order)


def send(backend: Backend, messages: list[dict[str, str]], salt: str) -> Usage:
    request = ChatRequest(messages=tuple(messages), max_tokens=MAX_TOKENS, cache_salt=salt)
    return backend.complete(request).completion.usage


def naive_client(
    name: str,
    backend: Backend,
    first_user: Callable[[str], str],
    system: Callable[[], str],
    rewrite_history: bool = False,
) -> ClientResult:
    salt = uuid.uuid4().hex
    with ThreadPoolExecutor(max_workers=len(SIBLINGS)) as pool:
        sibling_messages = [
            [{"role": "system", "content": system()}, {"role": "user", "content": first_user(question)}]
            for question in SIBLINGS
        ]
        usages = list(pool.map(lambda messages: send(backend, messages, salt), sibling_messages))
    history: list[tuple[str, str]] = []
    for asked_now in TURNS:
        messages = [{"role": "system", "content": system()}]
        kept = history[-1:] if rewrite_history else history
        question = asked_now
        if rewrite_history and len(history) > 1:
            question = f"(Earlier we discussed {len(history) - 1} other questions.) {asked_now}"
        for turn_index, (asked, answered) in enumerate(kept):
            content = first_user(asked) if turn_index == 0 else asked
            messages += [{"role": "user", "content": content}, {"role": "assistant", "content": answered}]
        messages.append({"role": "user", "content": first_user(question) if not kept else question})
        request = ChatRequest(messages=tuple(messages), max_tokens=MAX_TOKENS, cache_salt=salt)
        sent = backend.complete(request)
        usages.append(sent.completion.usage)
        history.append((question, sent.completion.text))
    return ClientResult(name, tuple(usages))


def longctx_client(backend: Backend, root: Path, store: Store) -> ClientResult:
    corpus = load_corpus(root)
    pack = build_pack(corpus, tokenizer=backend.tokenizer(), store=store)
    session = Session(
        backend,
        pack,
        store=store,
        request=RequestOptions(max_tokens=MAX_TOKENS, cache_salt=uuid.uuid4().hex, concurrency=4),
    )
    batch = session.ask_many(list(SIBLINGS))
    usages = [answer.usage for answer in batch]
    for question in TURNS:
        usages.append(session.ask(question).usage)
    return ClientResult("longctx", tuple(usages))


def run_engine(engine: str, harness: EngineHarness, work: Path) -> list[ClientResult]:
    server = harness.server(engine)
    backend = connect(server.api_base)
    root = make_repository(work / f"naive-repo-{engine}")
    store = Store.open(work / f"naive-home-{engine}")
    names = sorted(FILES)
    rng = random.Random(20261130)

    def docs_in_order(question: str) -> str:
        return f"{documents_text(root, names)}\n\nQuestion: {question}"

    def question_first(question: str) -> str:
        return f"Question: {question}\n\n{documents_text(root, names)}"

    def filesystem_order(question: str) -> str:
        order = names[:]
        rng.shuffle(order)
        return f"{documents_text(root, order)}\n\nQuestion: {question}"

    def timestamp() -> str:
        return f"{SYSTEM} Current time: {datetime.datetime.now().isoformat(timespec='microseconds')}"

    results = [
        longctx_client(backend, root, store),
        naive_client("question first", backend, question_first, lambda: SYSTEM),
        naive_client("timestamp in system prompt", backend, docs_in_order, timestamp),
        naive_client("filesystem order", backend, filesystem_order, lambda: SYSTEM),
        naive_client(
            "history rewritten each turn", backend, docs_in_order, lambda: SYSTEM, rewrite_history=True
        ),
    ]
    backend.close()
    return results


def section(work: Path, harness_dir: Path) -> str:
    """Run on both engines; return the Markdown section for docs/benchmarks.md."""
    harness = EngineHarness(
        harness_dir, on_progress=lambda message: print(f"[naive] {message}", file=sys.stderr)
    )
    lines = [
        "## Sessions against naive clients",
        "",
        f"Same engine, same repository ({len(FILES)} standard-library files), same workload for "
        "every client: 4 sibling questions, then a 3-turn conversation; 16 answer tokens per request. "
        "Each client has its own `cache_salt` and starts cold. *Cached share* is the server's cached "
        "tokens over all prompt tokens; *prefill time* is the sum of the requests' times to first token. "
        "Produced by `benchmarks/run --only sessions`.",
        "",
    ]
    try:
        for engine in ("vllm", "sglang"):
            results = run_engine(engine, harness, work)
            baseline = results[0].prefill_seconds
            lines += [
                f"### {engine} (CPU, tiny model)",
                "",
                "| client | requests | prompt tokens | cached tokens | cached share "
                "| prefill time (s) | vs longctx |",
                "|---|---:|---:|---:|---:|---:|---:|",
            ]
            for result in results:
                share = result.cached_tokens / result.prompt_tokens if result.prompt_tokens else 0.0
                ratio = result.prefill_seconds / baseline if baseline else float("nan")
                lines.append(
                    f"| {result.name} | {len(result.usages)} | {result.prompt_tokens:,} "
                    f"| {result.cached_tokens:,} | "
                    f"{share:.1%} | {result.prefill_seconds:.2f} | {ratio:.1f}x |"
                )
            median_naive = statistics.median(r.prefill_seconds for r in results[1:])
            first = results[0].usages[0].prompt_tokens or 0
            ceiling = 1 - first / results[0].prompt_tokens if results[0].prompt_tokens else 0.0
            lines += [
                "",
                f"Median naive client: {median_naive / baseline:.1f}x longctx's prefill time. Every client's "
                f"first request is cold, so no client can cache more than about {ceiling:.1%} here.",
                "",
            ]
    finally:
        harness.close()
    return "\n".join(lines)


if __name__ == "__main__":
    work = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / ".work"
    root = Path(__file__).resolve().parent.parent
    print(section(work, root / ".cache" / "harness"))
