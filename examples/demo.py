"""The longctx demo: ask, batch and chat over a repository on a local vLLM, with real answers.

Runs the real command line against vLLM's CPU build serving a trained
instruct model, Qwen2.5-Coder-0.5B-Instruct (:mod:`longctx.testing.real_model`:
converted once from the package registry's GGUF parts; no model hub, no GPU),
started here unless ``LONGCTX_BASE_URL`` names a running server, over a small
repository with known answers (:mod:`longctx.testing.answer_set`):

1. ``longctx ask . "..."``: one question; the repository is packed and
   prefilled, and the answer is checked against the file that holds it;
2. ``longctx batch . --questions questions.txt``: four sibling questions
   that share the pack's prefix, read from the server's cache;
3. ``longctx chat .`` fed three questions by a script: each turn reuses the
   previous turn's whole prompt, and the last one needs the answer before it;
4. ``longctx report``: the savings, checked against vLLM's own counters.

``--tiny`` serves the random-weight tiny model instead (seconds to build, no
download; its answers are noise, and every line that shows one says so).

Run it with ``scripts/demo`` from a fresh clone. It exits non-zero if the
batch or the follow-up turns were not served from the cache. The server is
built under ``LONGCTX_HARNESS_DIR`` when set (as the test suite's is), else
``.cache/harness``: the first build is about 3.5 GB of environment and 0.5 GB
of model wheels. Ctrl-C stops it with one line and exit code 130.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

from longctx.testing import EngineHarness, harness_dir
from longctx.testing.answer_set import write_fact_repository
from longctx.testing.model import SERVED_MODEL_NAME
from longctx.testing.real_model import REAL_SERVERS, real_model_spec, start_real_server

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".cache" / "demo"
FIRST = "Who is the maintainer of skyline-tools?"
FIRST_RIGHT = "Ingrid Halvorsen"  # README.md: "The maintainer is Ingrid Halvorsen."
QUESTIONS = (
    "How many times is a failed upload retried? Answer with the number.",
    "Under which licence is skyline-tools released?",
    "To which host are finished exposures uploaded?",
    "In what unit are exposure times given?",
)
CHAT = (
    "Summarise in one sentence what this repository contains.",
    "Which function of colorsys.py converts RGB to HLS? Give its name only.",
    "Which function in the same file does the reverse of the function you just named? Give its name only.",
)
NOISE = "(random weights: this answer is noise, not a fault of longctx; run without --tiny for real answers)"


def say(message: str) -> None:
    print(message, flush=True)


def make_repository() -> Path:
    """The test suite's repository with known answers (stdlib modules, a project, three notes)."""
    repository = WORK / "skyline-tools"
    if repository.exists():
        shutil.rmtree(repository)
    return write_fact_repository(repository, planted=True)


def served_model(base_url: str) -> str:
    """The name the server serves its model under (its ``/v1/models``); "unknown" if it does not say.

    A server that does not answer is the first question's to report, with longctx's own message.
    """
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=30) as response:
            return str(json.load(response)["data"][0]["id"])
    except (OSError, ValueError, KeyError, IndexError):
        return "unknown"


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
    tiny = "--tiny" in sys.argv[1:]
    harness = None
    base_url = os.environ.get("LONGCTX_BASE_URL")
    if not base_url:
        where = harness_dir(ROOT)
        harness = EngineHarness(where, on_progress=lambda m: say(f"  {m}"))
        if tiny:
            say(
                f"Starting vLLM (CPU build) with the random-weight tiny model from {where} (--tiny: its"
                " answers are noise); a first run builds both there (about 3.5 GB, a few minutes)..."
            )
            base_url = harness.server("vllm").api_base
        else:
            spec = real_model_spec()
            name = getattr(spec, "upstream", str(spec))
            say(
                f"Starting vLLM (CPU build) with {name} from {where}; a first run builds the environment"
                " and converts the model there (about 3.5 GB and 0.5 GB, about 2 minutes; set"
                " LONGCTX_HARNESS_DIR to share a build)..."
            )
            base_url = harness.extra_server(
                REAL_SERVERS["vllm"], lambda h: start_real_server(h, "vllm")
            ).api_base
    model = served_model(base_url)
    noise = model == SERVED_MODEL_NAME
    home = WORK / "home"
    shutil.rmtree(home, ignore_errors=True)
    # Greedy answers (temperature 0), as the tests ask: with the server's default sampling the 0.5B
    # model wrote "slkyline-tools" and "ARCHIVE_HOST" where greedy decoding answers right.
    env = {**os.environ, "LONGCTX_BASE_URL": base_url, "LONGCTX_HOME": str(home), "LONGCTX_TEMPERATURE": "0"}
    try:
        repository = make_repository()
        (WORK / "questions.txt").write_text("\n".join(QUESTIONS) + "\n")
        say(f"Server: {base_url} ({model}); repository: {repository}")
        if noise:
            say(
                f"This server serves the tiny model with random weights: every answer below is noise. {NOISE}"
            )

        answer = longctx("ask", ".", FIRST, "--max-tokens", "32", cwd=repository, env=env)
        if noise:
            say(NOISE)
        elif FIRST_RIGHT in answer:
            say(f"(right: README.md says the maintainer is {FIRST_RIGHT})")
        else:
            say(f"(not right: README.md says the maintainer is {FIRST_RIGHT})")
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
        if noise:
            say(NOISE)
        batch_report = json.loads(longctx("report", "--json", cwd=repository, env=env, show_output=False))
        longctx("chat", ".", "--max-tokens", "32", cwd=repository, env=env, stdin="\n".join(CHAT) + "\n")
        if noise:
            say(NOISE)
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
    say(
        "\nNext: ask about your own repository. Keep a server running with `longctx serve --cpu-demo`"
        " (this model, on the CPU), or start vLLM or SGLang on a GPU with the model you use; then\n"
        "  export LONGCTX_BASE_URL=http://127.0.0.1:PORT/v1\n"
        '  longctx ask path/to/your/repo "Where is the retry policy defined?"\n'
        "docs/quickstart.md goes on from here."
    )
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
