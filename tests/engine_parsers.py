"""Parse launch arguments with the real vLLM / SGLang argument parsers, in their own interpreters.

Nothing is started: each engine's parser is built and asked to parse the
recipe's flags. The longctx process never imports vllm or sglang.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_RESULT_MARK = "LONGCTX-PARSE-RESULT "

# Runs inside the engine's interpreter. Reads a JSON list of argument lists on
# stdin; for each, drops the options the parser does not know (reporting them),
# parses the rest, and prints one JSON line.
_COMMON = (
    f"RESULT_MARK = {_RESULT_MARK!r}\n"
    + r"""
import contextlib, io, json, sys

def split_known(parser, argv):
    known = {o for action in parser._actions for o in action.option_strings}
    kept, unknown, i = [], [], 0
    while i < len(argv):
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        name = argv[i].split("=", 1)[0]
        if name.startswith("--") and name not in known:
            unknown.append(name)
        else:
            kept += argv[i:j]
        i = j
    return kept, unknown

def plain(value):
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)

results = []
parser = build_parser()
for argv in json.load(sys.stdin):
    kept, unknown = split_known(parser, argv)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            namespace = parser.parse_args(kept)
        parsed, error = {k: plain(v) for k, v in vars(namespace).items()}, None
    except SystemExit:
        parsed, error = None, err.getvalue()[-3000:]
    results.append({"unknown": unknown, "parsed": parsed, "error": error})
print(RESULT_MARK + json.dumps(results))
"""
)

VLLM_SCRIPT = (
    r"""
def build_parser():
    try:  # vLLM 0.32
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # earlier releases
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    return make_arg_parser(FlexibleArgumentParser())
"""
    + _COMMON
)

SGLANG_SCRIPT = (
    r"""
def build_parser():
    import argparse
    from sglang.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser
"""
    + _COMMON
)


@dataclass(frozen=True)
class ParseResult:
    """What the engine's parser made of one argument list.

    ``unknown`` lists the options the parser does not have (left out of the
    parse); ``parsed`` maps destinations to values, or is ``None`` when the
    parse failed with ``error`` (argparse's message).
    """

    unknown: tuple[str, ...]
    parsed: dict[str, Any] | None
    error: str | None


def parse_with(python: Path, script: str, argvs: Sequence[Sequence[str]]) -> list[ParseResult]:
    """Run ``script`` under ``python`` on every argument list; raise with its output on failure."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    completed = subprocess.run(
        [str(python), "-c", script],
        input=json.dumps([list(a) for a in argvs]),
        capture_output=True,
        check=False,
        text=True,
        timeout=600,
        env=env,
        cwd=str(Path(python).parent),
    )
    for line in completed.stdout.splitlines():
        if line.startswith(_RESULT_MARK):
            return [
                ParseResult(tuple(r["unknown"]), r["parsed"], r["error"])
                for r in json.loads(line[len(_RESULT_MARK) :])
            ]
    raise AssertionError(
        f"parser script failed (exit {completed.returncode}):\n"
        f"{completed.stdout[-3000:]}\n{completed.stderr[-5000:]}"
    )
