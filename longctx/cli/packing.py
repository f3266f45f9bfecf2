"""``longctx pack``: the pack of paths, on stdout or into a file."""

from __future__ import annotations

import json
import sys

import click

from longctx.cli.app import corpus_options, emit_json, json_option, main, note, runtime, server_options
from longctx.config import CorpusOptions, ServerOptions
from longctx.outputs import save_text
from longctx.packing import pack as pack_paths
from longctx.tokens import Tokenizer, offline_tokenizer


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@corpus_options
@server_options
@click.option(
    "--tokenizer",
    default="auto",
    show_default=True,
    help="auto (the server's when a server URL is set, else the estimate), server, estimate, "
    "a tiktoken name such as cl100k_base, or a model folder.",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the pack here instead of stdout: whole or not at all, and a file that already holds "
    "exactly this pack is left as it is.",
)
@json_option("Print the pack's summary and manifest as JSON instead of the pack (to --output); errors too.")
@click.option("--quiet", "-q", is_flag=True, help="No summary on stderr.")
def pack(
    paths: tuple[str, ...],
    tokenizer: str,
    output: str | None,
    as_json: bool,
    quiet: bool,
    server: ServerOptions,
    corpus: CorpusOptions,
) -> None:
    """Pack PATHS (repositories, folders, files) into one cache-friendly prompt prefix.

    The pack is the system message followed by the start of the first user
    message (documents, listing, boundary); a question goes right after it.
    An unchanged repository's pack is reused from the store. Counts go to
    stderr, flagged when estimated.
    """
    with runtime().open_store() as store:
        result = pack_paths(list(paths), corpus, tokenizer=_tokenizer(tokenizer, server), store=store)
    saved = None
    if as_json and output:
        # Through the one saving path, like the pack itself.
        saved = save_text(output, json.dumps(result.to_dict(), indent=2, sort_keys=True, default=str) + "\n")
    elif as_json:
        emit_json(result.to_dict())
    elif output:
        saved = result.pack.save(output)
    else:
        sys.stdout.flush()
        result.pack.write_to(sys.stdout.buffer)
        sys.stdout.buffer.flush()
    note(result.summary_line(), quiet=quiet)
    if saved is not None and saved.unchanged:
        note(
            f"{saved.path} already held this {'summary' if as_json else 'pack'}: left as it was", quiet=quiet
        )


def _tokenizer(choice: str, server: ServerOptions) -> Tokenizer:
    if choice == "auto":
        choice = "server" if server.names_a_server() or runtime().backend is not None else "estimate"
    if choice != "server":
        return offline_tokenizer(choice)
    # The tokenizer counts through the connection's endpoint: it stays open until the command ends.
    return runtime().connect(server).tokenizer()
