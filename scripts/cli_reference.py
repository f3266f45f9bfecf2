"""Write docs/cli.md from the command's own --help texts (a test checks it is current).

python scripts/cli_reference.py          # print
python scripts/cli_reference.py --write  # rewrite docs/cli.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from longctx.cli import main

TARGET = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
INTRO = """# Command-line reference

Generated from `longctx --help` by `scripts/cli_reference.py --write`; a
test fails when it is out of date. Answers go to stdout, progress and the
savings summary to stderr; `--json` prints JSON on stdout.

Settings also come from the environment: `LONGCTX_BASE_URL` (default
`http://127.0.0.1:8000/v1`), `LONGCTX_MODEL`, `LONGCTX_API_KEY` (never
printed), `LONGCTX_HOME` (where the session store lives).

## Exit codes

| code | meaning |
|---:|---|
| 0 | success |
| 1 | another longctx error (the store, a tokenizer...) |
| 2 | usage: bad arguments or `LONGCTX_*` settings |
| 3 | the server cannot be reached |
| 4 | the prompt does not fit: context overflow, or the pack is over budget |
| 5 | bad input: a path or document that cannot be used |
| 6 | the server answered with an error |
| 7 | no such session |
| 8 | nothing to pack: the paths hold no document (the message names what was skipped and why) |
"""


def _help(command: click.Command, name: str, parent: click.Context | None) -> str:
    context = click.Context(command, info_name=name, parent=parent, terminal_width=100, max_content_width=100)
    return command.get_help(context)


def reference() -> str:
    sections = [INTRO]
    root = click.Context(main, info_name="longctx", terminal_width=100, max_content_width=100)
    sections.append(f"## longctx\n\n```text\n{main.get_help(root)}\n```\n")

    def walk(group: click.Group, context: click.Context, prefix: str) -> None:
        for name in sorted(group.commands):
            command = group.commands[name]
            full = f"{prefix} {name}"
            sections.append(f"## {full}\n\n```text\n{_help(command, name, context)}\n```\n")
            if isinstance(command, click.Group):
                walk(command, click.Context(command, info_name=name, parent=context), full)

    walk(main, root, "longctx")
    return "\n".join(sections)


if __name__ == "__main__":
    text = reference()
    if "--write" in sys.argv:
        TARGET.write_text(text)
        print(f"wrote {TARGET}", file=sys.stderr)
    else:
        print(text, end="")
