"""``longctx pack``: the pack of paths, on stdout or into a file."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import click

from longctx.cli.app import (
    corpus_options,
    emit_json,
    json_option,
    main,
    note,
    progress,
    runtime,
    server_options,
)
from longctx.errors import LongctxError
from longctx.options import CorpusOptions, ServerOptions
from longctx.outputs import save_text
from longctx.packing import pack as pack_paths
from longctx.recordtypes import record_type
from longctx.tokens import ImageTokenCounter, PatchImageCounter, Tokenizer, offline_tokenizer


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
    counting = _counting(tokenizer, server)
    corpus = _pdf_pages(corpus, counting)
    with runtime().open_store() as store, _counted_progress(quiet):
        result = pack_paths(
            list(paths), corpus, tokenizer=counting.tokenizer, store=store, image_counter=counting.images
        )
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
    from longctx.cli.pages import textless_pages_line

    if (pages := textless_pages_line(result.manifest, corpus.pdf_pages)) is not None:
        note(f"longctx: {pages}", quiet=quiet)
    if saved is not None and saved.unchanged:
        note(
            f"{saved.path} already held this {'summary' if as_json else 'pack'}: left as it was", quiet=quiet
        )


@contextmanager
def _counted_progress(quiet: bool) -> Iterator[None]:
    """A server's long count shown in the progress line (characters counted of the total)."""
    from longctx.backends import CountWatch, watched_counts

    with progress(not quiet) as say:

        def counted(done: int, total: int) -> None:
            say(f"counting tokens: {done / 1e6:.1f} of {total / 1e6:.1f} M characters")

        with watched_counts(CountWatch(on_progress=counted)):
            yield


@record_type
class _Counting:
    """What counts a pack: the text's tokenizer, and the images' counter (None: the estimate)."""

    tokenizer: Tokenizer
    images: ImageTokenCounter | None


def _pdf_pages(corpus: CorpusOptions, counting: _Counting) -> CorpusOptions:
    """``--pdf-pages server`` (the default) made auto where the counting server's model takes images."""
    takes_images = getattr(counting.images, "takes_images", None)
    if corpus.pdf_pages != "server" or takes_images is None:
        return corpus
    try:
        takes = takes_images() is True
    except LongctxError:
        takes = False
    return dataclasses.replace(corpus, pdf_pages="auto" if takes else "text")


def _counting(choice: str, server: ServerOptions) -> _Counting:
    """The counters ``--tokenizer`` names: the server counts text and images alike, offline a model
    folder's processor config counts images, else the documented estimate does."""
    if choice == "auto":
        choice = "server" if server.names_a_server() or runtime().backend is not None else "estimate"
    if choice != "server":
        processor = os.path.join(choice, "preprocessor_config.json")
        images = PatchImageCounter.from_processor_config(processor) if os.path.isfile(processor) else None
        return _Counting(offline_tokenizer(choice), images)
    # The counters ask through the connection's endpoint: it stays open until the command ends.
    backend = runtime().connect(server)
    return _Counting(backend.tokenizer(), backend.image_counter())
