"""The longctx demo: ask, batch and chat over a repository on a local vLLM.

Runs the real command line against vLLM's CPU build serving the tiny
locally-made model (started here unless ``LONGCTX_BASE_URL`` names a
running server):

1. ``longctx ask . "..."``: one question; the repository is packed and prefilled;
2. ``longctx batch . --questions questions.txt``: four sibling questions
   that share the pack's prefix, read from the server's cache;
3. ``longctx chat .`` fed three questions by a script: each turn reuses the
   previous turn's whole prompt;
4. ``longctx report``: the savings, checked against vLLM's own counters.

Run it with ``scripts/demo`` from a fresh clone. It exits non-zero if the
batch or the follow-up turns were not served from the cache. The server is
built under ``LONGCTX_HARNESS_DIR`` when set (as the test suite's is), else
``.cache/harness``: the first build is about 3.5 GB. Ctrl-C stops it with one
line and exit code 130.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from longctx.testing import EngineHarness, harness_dir

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".cache" / "demo"
FILES = ("textwrap.py", "heapq.py", "shlex.py", "fnmatch.py")
QUESTIONS = (
    "What does heapq provide, and how is it implemented?",
    "Which functions in textwrap would you use to wrap a paragraph?",
    "How does shlex split a command line?",
    "Which of these modules would be easiest to test, and why?",
)
CHAT = (
    "Summarise what this repository contains.",
    "Which module is the largest?",
    "What would you refactor first?",
)


def say(message: str) -> None:
    print(message, flush=True)


def make_repository() -> Path:
    """A small git repository of standard-library modules to ask about."""
    repository = WORK / "repo"
    if repository.exists():
        shutil.rmtree(repository)
    repository.mkdir(parents=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in FILES:
        shutil.copy(stdlib / name, repository / name)
    (repository / "README.md").write_text("# demo\n\nA few modules of the Python standard library.\n")
    git = ["git", "-c", "user.name=demo", "-c", "user.email=demo@example.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=repository, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repository, check=True)
    subprocess.run([*git, "commit", "-qm", "demo repository"], cwd=repository, check=True)
    return repository


def longctx(
    *args: str, cwd: Path, env: dict[str, str], stdin: str | None = None, show_output: bool = True
) -> str:
    """Run the installed ``longctx`` command, showing it and its output like a terminal would."""
    shown = " ".join(arg if " " not in arg else f'"{arg}"' for arg in args)
    say(f"\n$ longctx {shown}" + (" <<< (3 questions)" if stdin else ""))
    command = [str(Path(sys.executable).parent / "longctx"), *args]
    result = subprocess.run(
        command, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, check=False
    )
    if result.stdout and show_output:
        say(result.stdout.rstrip())
    elif result.stdout:
        say("(JSON on stdout, read by this script)")
    if result.stderr:
        say(result.stderr.rstrip())
    if result.returncode != 0:
        raise SystemExit(f"longctx {args[0]} failed with exit code {result.returncode}")
    return result.stdout


def main() -> int:
    harness = None
    base_url = os.environ.get("LONGCTX_BASE_URL")
    if not base_url:
        where = harness_dir(ROOT)
        say(
            f"Starting vLLM (CPU build) with the tiny model from {where}; a first run builds both there"
            " (about 3.5 GB, a few minutes; set LONGCTX_HARNESS_DIR to share a build)..."
        )
        harness = EngineHarness(where, on_progress=lambda m: say(f"  {m}"))
        base_url = harness.server("vllm").api_base
    home = WORK / "home"
    shutil.rmtree(home, ignore_errors=True)
    env = {**os.environ, "LONGCTX_BASE_URL": base_url, "LONGCTX_HOME": str(home)}
    try:
        repository = make_repository()
        (WORK / "questions.txt").write_text("\n".join(QUESTIONS) + "\n")
        say(f"Server: {base_url}; repository: {repository}")

        longctx("ask", ".", "What is in this repository?", "--max-tokens", "32", cwd=repository, env=env)
        longctx(
            "batch",
            ".",
            "--questions",
            str(WORK / "questions.txt"),
            "--max-tokens",
            "32",
            cwd=repository,
            env=env,
        )
        batch_report = json.loads(longctx("report", "--json", cwd=repository, env=env, show_output=False))
        longctx("chat", ".", "--max-tokens", "32", cwd=repository, env=env, stdin="\n".join(CHAT) + "\n")
        chat_report = json.loads(longctx("report", "--json", cwd=repository, env=env, show_output=False))
        longctx("report", cwd=repository, env=env)
    finally:
        if harness is not None:
            harness.close()

    batch_cached = sum(r["cached_tokens"] or 0 for r in batch_report["requests"])
    follow_ups = chat_report["requests"][1:]
    follow_up_cached = sum(r["cached_tokens"] or 0 for r in follow_ups)
    say(
        f"\nbatch: {batch_cached:,} cached tokens over {len(batch_report['requests'])} sibling requests; "
        f"chat follow-ups: {follow_up_cached:,} cached tokens over {len(follow_ups)} turns."
    )
    if batch_cached <= 0 or follow_up_cached <= 0 or any((r["cached_tokens"] or 0) <= 0 for r in follow_ups):
        say("FAILED: the server did not report cached tokens for the batch and every follow-up turn")
        return 1
    say("The server served the shared prefix from its cache.")
    return 0


EXIT_INTERRUPTED = 130


if __name__ == "__main__":
    try:
        code = main()
    except KeyboardInterrupt:
        # One line, no traceback. The servers started are stopped by main's
        # finally; os._exit, not sys.exit: a build still running on the
        # harness's worker thread would otherwise hold the exit until it ends.
        print("demo: interrupted", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_INTERRUPTED)
    sys.exit(code)
