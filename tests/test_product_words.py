"""The product speaks of what it does, never of how its own work was tracked.

Code, docs, tests, benchmarks and their results name a measurement by its
date, hardware and engine version (or by what it is), not by the project's
own tracker: no numbered issue or stop, no stop or issue pointed at ("this"
one, "the last" one) or owning something, no result file named after a
stop. Another project's tracker is fine where the project or its URL comes
right before the word: "tiktoken", then the word and the number (a bare
``#N``, as in "vLLM #31210", is never flagged). The planted examples below
show each kind.

Every text file under the scanned roots is read (Python, Markdown, JSON,
shell, notebooks, scripts without a suffix); a file that is not UTF-8 text
(an archive) is passed over. File names are checked too.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("longctx", "docs", "tests", "benchmarks", "examples", "scripts", "README.md")
SKIPPED_DIRS = {
    "__pycache__",
    ".venv",
    ".cache",
    ".ipynb_checkpoints",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
}

#: The project's own tracker words: a numbered issue or stop (in a file name too), a stop or
#: issue pointed at, or one owning something ("...'s"). A plural stop is a verb ("stops 2 servers").
PROCESS_WORDS = re.compile(
    r"\b(?:issues?|stop)[ _-]?#?\d+"
    r"|\b(?:this|that|previous|last|next|earlier|later)\s+(?:stop|issue)\b"
    r"|\b(?:issue|stop)'s\b",
    re.IGNORECASE,
)
#: Other projects whose trackers the product may cite, by the name written right before the number.
UPSTREAM = frozenset({
    "vllm", "sglang", "lmcache", "tiktoken", "transformers", "tokenizers", "torch", "pytorch",
    "cpython", "python", "pip", "aider", "repomix", "gitingest", "flashinfer", "click", "httpx",
    "openai", "pytest", "mypy", "ruff", "llm", "mcp", "github",
})  # fmt: skip
_BEFORE = re.compile(r"(?:(?P<project>[\w.-]+)|(?P<url>https?://\S+))\s+$")


def process_words(text: str) -> list[str]:
    """Each tracker word of the project's own in ``text``, with a little context; upstream ones left out."""
    found = []
    for match in PROCESS_WORDS.finditer(text):
        before = _BEFORE.search(text, max(0, match.start() - 200), match.start())
        if before and (before["url"] or (before["project"] or "").lower() in UPSTREAM):
            continue
        start = max(0, match.start() - 30)
        found.append(" ".join(text[start : match.end() + 30].split()))
    return found


def _files() -> list[Path]:
    paths: list[Path] = []
    for name in SCANNED:
        top = ROOT / name
        if top.is_file():
            paths.append(top)
            continue
        for path in top.rglob("*"):
            if path.is_file() and not SKIPPED_DIRS.intersection(path.relative_to(ROOT).parts):
                paths.append(path)
    return sorted(paths)


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_no_process_words_in_the_product() -> None:
    strays = []
    files = _files()
    assert any(path.suffix == ".json" for path in files) and any(path.suffix == ".ipynb" for path in files)
    for path in files:
        where = path.relative_to(ROOT)
        strays += [f"{where} (its name)" for _ in process_words(path.name)]
        text = _text(path)
        if text is None:
            continue
        for line_number, line in enumerate(text.splitlines(), start=1):
            strays += [f"{where}:{line_number}: {words}" for words in process_words(line)]
    assert not strays, (
        "the project's own tracker named (name the run by date, hardware and engine version):\n"
        + "\n".join(strays)
    )


def test_the_matcher_finds_planted_tracker_words() -> None:
    # Built from parts, so that this file holds none of them whole.
    issue, stop = "iss" + "ue", "st" + "op"
    planted = [
        f"# measured in {issue} 13's H200 run",
        f"Goals ({issue} #14): at most 1.2x",
        f"before {issue}s 22-24 merged",
        f"### {stop.title()} 33: what the outage test found",
        f"| {stop} 31's final run | this {stop}'s final run |",
        f"Earlier runs this {stop} took 667 s",
        f"repeats the {issue}'s first measurement",
        f"benchmarks/gpu/results/results-h200-{stop}30.json",
    ]
    for text in planted:
        assert process_words(text), text
    fine = [
        f"characters before calling tiktoken (tiktoken {issue} 195)",
        f"vLLM {issue} #31210, LMCache #4463, aider #1615, repomix #424",
        f"see https://github.com/vllm-project/vllm {issue} 48860",
        "groups[index] = (start, stop - 1)",
        "the server stops 2 replicas",
        "stop() ends the whole process group",
        "measured 2026-12-03 on one H200, vLLM 0.24.0",
    ]
    for text in fine:
        assert not process_words(text), text
