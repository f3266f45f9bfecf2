"""Write docs/cli.md from the command's own --help texts (a test checks it is current).

python scripts/cli_reference.py          # print
python scripts/cli_reference.py --write  # rewrite docs/cli.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from longctx.cli import EXIT_CODES, main
from longctx.options.groups import DEFAULT_BASE_URL

TARGET = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
INTRO = f"""# Command-line reference

Generated from `longctx --help` by `scripts/cli_reference.py --write`; a
test fails when it is out of date. Answers go to stdout, progress and the
savings summary to stderr; `--json` prints JSON on stdout.

## Settings: flags, the environment, config files

A flag left out takes its value from, in this order (the first that sets
it wins): the environment, `LONGCTX_<NAME>` (`LONGCTX_MAX_TOKENS=256`,
`LONGCTX_BASE_URL`, `LONGCTX_MODEL`, `LONGCTX_API_KEY`: the flag's name
in capitals, dashes as underscores); the project file, `.longctx.toml` in
the current folder or the nearest parent (the search stops at the
repository's root, the folder holding `.git`, or at the home folder); the
user file, `config.toml` in the platform's user config folder
(`~/.config/longctx/config.toml` on Linux; `LONGCTX_CONFIG` names another
file). The default comes last. So: flag > environment > project file >
user file > default. A file's keys are the flags' names with underscores,
in TOML:

```toml
base_url = "http://gpu-box:8000/v1"   # or a list of replicas
model = "Qwen/Qwen3-8B"
api_key = "..."                       # never printed
max_tokens = 1024
exclude = ["tests/", "*.lock"]
```

Every value goes through its option's own check, the one the Python API
applies: a bad one is an error naming where it was found
(`LONGCTX_MAX_TOKENS: max_tokens must be at least 1, not 0`,
`/repo/.longctx.toml: max_tokenz: unknown key`, exit code 2). In Python,
the server settings (`base_url`, `model`, `api_key`) are read the same
way when a connection is made; the other options are the objects you pass.
`LONGCTX_HOME` is where the session store lives. With nothing set, the
server is `{DEFAULT_BASE_URL}`.

Shell completion is click's: add
`eval "$(_LONGCTX_COMPLETE=bash_source longctx)"` to `~/.bashrc`
(`zsh_source` in `~/.zshrc`; for fish,
`_LONGCTX_COMPLETE=fish_source longctx | source` in
`~/.config/fish/completions/longctx.fish`).

## Cited answers: --cite

`longctx ask ... --cite` and `longctx batch ... --cite` ask the model for
each answer's sources, a path and a line quoted from it (in JSON held by the
server's grammar to the pack's paths and lines, so a small model's quotes
are real lines: see [api.md](api.md#grounded-answers-citetrue)), print each
answer followed by its sources (`PATH:START-END "QUOTE"`), and check each
against the pack: the path is a packed document, the lines exist in it, the
quote is in those lines. A cited answer is printed whole, not streamed. After the answer come the
citations, each marked `[ok]` or `[UNVERIFIED: reason]`; on a terminal
(stdout a tty, `TERM` not `dumb`) each location is an OSC 8 hyperlink to
the file (`file://`), plain text otherwise. `--json` holds them under
`citations`; `longctx report ID` (and `--html`, linked) lists them.
`examples/cited_answer.sh` shows one; why a line range and a quote:
[api.md](api.md#grounded-answers-citetrue).

## Typed answers: --schema

`longctx ask ... --schema SPEC`, `longctx batch ... --schema SPEC` and
`longctx job FILE --schema SPEC` make each answer JSON that satisfies a
schema. SPEC is a JSON Schema file (`person.json`) or the concise spec of
simonw/llm: `'name, age int, bio: their biography'` (fields separated by
commas, or by newlines when there are any; types `str` (the default), `int`,
`float`, `bool`; a description after a colon). `--schema-multi` asks for a
list of such objects (`{{"items": [...]}}`). The server constrains decoding to
the schema (a request field, never the prompt: the cached prefix is the
plain question's); longctx validates the answer again. The answer is printed
as it came (JSON); `--json` adds `data` (the validated value) and `schema`.
An answer cut at `--max-tokens`, not JSON, or refused by the schema exits
12 with the reason and the raw answer on stderr, and is not stored. A job
item may carry its own `"schema"` (a JSON Schema object or a concise spec;
`--schema` types the items without one); its result line carries `data`,
and a changed schema asks the item again. See
[api.md](api.md#typed-answers-schema).

## A server that does not answer: --timeout, --stall-timeout

Every command that talks to a server says, within a second, what it waits
on while the server is silent: `waiting for http://gpu-box:8000/v1/models
(3 s, gives up after 60 s)`, in the live status line on a terminal, as a
plain line on stderr otherwise (every 10 s while the same request waits;
nothing with `--quiet` or `--json`). `--stall-timeout` (`LONGCTX_STALL_TIMEOUT`)
bounds the silence of one request, `--timeout` (`LONGCTX_TIMEOUT`) a
request with its retries, and the first contact with the server; past
either the command gives up with exit code 3. A URL where nothing listens
(connection refused) is said at once, without retries. A cold prefill is not
a stall: a request whose prompt the server does not hold yet may wait for its
first token as long as its uncached tokens take at the prefill rate measured
on that server (by this process, or earlier, as the store recorded it), three
times over, plus the stall timeout; the line then says what it waits for
(`... gives up after 1,518 s): a prefill of ~30,600 uncached tokens of
~30,700, expected about 306 s at 100 tokens/s (measured on this server)`).
Without a measured rate the stall timeout bounds it, as before.

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
