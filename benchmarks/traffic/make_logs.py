"""Request logs for comparing ``longctx lint`` with kvlint: the same JSONL read by both.

Writes into the folder given (default ``benchmarks/traffic/logs``):

- ``longctx-siblings.jsonl``: six questions over one pack of ``longctx/lint``,
  the bodies exactly as longctx sends them (``Pack.messages``).
- ``plain-client.jsonl``: the same six questions as a plain client sends
  them: the question first, then the files in ``os.walk`` order.
- ``agent-loop.jsonl``: an agent's conversation, appended turn by turn, with
  tool results, and a ``Current time`` line in its system prompt.
- ``tool-order.jsonl``: four requests whose tool list is the same JSON with
  its keys in another order each time.

``kvlint demo --out kvlint-demo.jsonl`` writes kvlint's own synthetic log.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from longctx import CorpusOptions, pack

QUESTIONS = [
    "Where is the vLLM block hash chain simulated?",
    "How is a timestamp break recognised?",
    "What does the proxy never store?",
    "How does --fail-on choose the findings?",
    "How are requests replayed against a server?",
    "Which log formats are read?",
]


def write(path: Path, bodies: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(body, ensure_ascii=False) + "\n" for body in bodies), encoding="utf-8")


def main(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    source = Path(__file__).resolve().parents[2] / "longctx" / "lint"
    built = pack([source], CorpusOptions()).pack
    write(
        folder / "longctx-siblings.jsonl", [{"model": "m", "messages": built.messages(q)} for q in QUESTIONS]
    )
    files = []
    for root, _, names in os.walk(source):
        for name in names:
            if name.endswith(".py"):
                files.append(f"--- {name}\n" + (Path(root) / name).read_text(encoding="utf-8"))
    plain = "\n".join(files)
    write(
        folder / "plain-client.jsonl",
        [{"model": "m", "messages": [{"role": "user", "content": f"{q}\n\n{plain}"}]} for q in QUESTIONS],
    )
    messages: list[dict[str, object]] = [{"role": "user", "content": "Find where retries are configured."}]
    agent: list[dict[str, Any]] = []
    for turn in range(6):
        system = {
            "role": "system",
            "content": f"You are a coding agent.\nCurrent time: 2026-12-06T08:{turn:02d}:00Z",
        }
        agent.append({"model": "m", "messages": [system, *messages]})
        messages = [
            *messages,
            {"role": "assistant", "content": f"Calling grep for step {turn}."},
            {"role": "user", "content": f"Tool result {turn}: " + "match found in retry.py line 12\n" * 20},
        ]
    write(folder / "agent-loop.jsonl", agent)
    parameters = {"type": "object", "properties": {"path": {"type": "string"}, "line": {"type": "integer"}}}
    tools: list[dict[str, Any]] = []
    for turn in range(4):
        function = {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": parameters,
        }
        ordered = dict(sorted(function.items(), reverse=bool(turn % 2)))
        tools.append(
            {
                "model": "m",
                "tools": [{"type": "function", "function": ordered}],
                "messages": [
                    {"role": "system", "content": "You read code. " * 40},
                    {"role": "user", "content": f"Q{turn}"},
                ],
            }
        )
    write(folder / "tool-order.jsonl", tools)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "logs")
