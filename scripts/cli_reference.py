"""Write docs/cli.md from the command's own --help texts (a test checks it is current).

python scripts/cli_reference.py          # print
python scripts/cli_reference.py --write  # rewrite docs/cli.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from longctx.cli import EXIT_CODES, main
from longctx.config import DEFAULT_BASE_URL

TARGET = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
INTRO = f"""# Command-line reference

Generated from `longctx --help` by `scripts/cli_reference.py --write`; a
test fails when it is out of date. Answers go to stdout, progress and the
savings summary to stderr; `--json` prints JSON on stdout.

Settings also come from the environment: `LONGCTX_BASE_URL` (default
`{DEFAULT_BASE_URL}`), `LONGCTX_MODEL`, `LONGCTX_API_KEY` (never
printed), `LONGCTX_HOME` (where the session store lives).

## Exit codes

| code | meaning |
|---:|---|
"""


def exit_code_table() -> str:
    """The exit codes' rows, from the CLI's own table (:data:`longctx.cli.app.EXIT_CODES`)."""
    return "".join(f"| {code} | {meaning} |\n" for code, meaning in sorted(EXIT_CODES.items()))


def _context(command: click.Command, name: str, parent: click.Context | None) -> click.Context:
    # make_context applies the command's context settings (-h, the width), as a real run does;
    # resilient parsing: no argument is given, and none is needed for the help text.
    return command.make_context(name, [], parent=parent, resilient_parsing=True, terminal_width=100)


def _help(command: click.Command, name: str, parent: click.Context | None) -> str:
    return command.get_help(_context(command, name, parent))


def reference() -> str:
    sections = [INTRO + exit_code_table()]
    root = _context(main, "longctx", None)
    sections.append(f"## longctx\n\n```text\n{main.get_help(root)}\n```\n")

    def walk(group: click.Group, context: click.Context, prefix: str) -> None:
        # Looked up, not read from group.commands: longctx imports a command's module on lookup.
        for name in sorted(group.list_commands(context)):
            command = group.get_command(context, name)
            assert command is not None, name
            full = f"{prefix} {name}"
            sections.append(f"## {full}\n\n```text\n{_help(command, name, context)}\n```\n")
            if isinstance(command, click.Group):
                walk(command, _context(command, name, context), full)

    walk(main, root, "longctx")
    return "\n".join(sections)


if __name__ == "__main__":
    text = reference()
    if "--write" in sys.argv:
        TARGET.write_text(text)
        print(f"wrote {TARGET}", file=sys.stderr)
    else:
        print(text, end="")
