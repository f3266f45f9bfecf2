"""``longctx mcp``: the MCP server over stdio (see :mod:`longctx.mcp`), for coding agents.

The mcp SDK is an optional extra: this module imports :mod:`longctx.mcp`
only when the command runs, so ``longctx --help`` works without it, and
without it the command fails with a :class:`~longctx.errors.ConfigError`
naming the extra to install.
"""

from __future__ import annotations

from pathlib import Path

import click

from longctx.cli.app import corpus_options, main, request_options, server_options
from longctx.errors import ConfigError
from longctx.options import CorpusOptions, RequestOptions, ServerOptions

EXTRA_HINT = "the MCP server needs the mcp extra: pip install 'longctx-sdk[mcp]'"


@main.command()
@corpus_options
@server_options
@request_options(concurrency=True)
@click.option(
    "--root",
    "roots",
    multiple=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A folder the tools may read (repeatable); the client's declared roots take precedence. "
    "Default: the folder the server is started in.",
)
def mcp(
    server: ServerOptions, corpus: CorpusOptions, request: RequestOptions, roots: tuple[Path, ...]
) -> None:
    """Serve longctx's tools to an agent over stdio (Model Context Protocol).

    Tools: ask (follow-ups are cached turns of one session per path), ask_many, show_pack, savings.
    They read only inside the client's roots, else the --root folders, else the folder the server
    is started in. The flags set every session's server, corpus and request options (see docs/agents.md).
    """
    try:
        from longctx.mcp import serve
    except ModuleNotFoundError as error:
        if error.name is not None and error.name.split(".")[0] == "mcp":
            raise ConfigError(EXTRA_HINT) from error
        raise
    serve(server=server, request=request, corpus=corpus, roots=roots)
