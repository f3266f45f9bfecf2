"""``longctx job``: a JSONL file of (paths, question) items answered pack by pack."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import replace
from typing import IO, TYPE_CHECKING

import click

from longctx.cli.app import (
    EXIT_ITEMS_FAILED,
    corpus_options,
    main,
    note,
    progress_bar,
    request_options,
    runtime,
    schema_options,
    server_options,
)
from longctx.errors import OutputError
from longctx.jobs import Job, JobItem, JobOptions, JobProgress, JobReport, JobResult, read_job
from longctx.options import CorpusOptions, RequestOptions, ServerOptions
from longctx.outputs import save_text

if TYPE_CHECKING:
    from longctx.schemas import AnswerSchema


@main.command()
@click.argument("job_file", metavar="FILE", type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the results JSONL here instead of stdout: each line as its item is done (an interrupted "
    "job leaves the lines done so far), rewritten in item order once the job ends.",
)
@click.option(
    "--kv-tokens",
    type=click.IntRange(min=1),
    help="KV cache of each server URL in tokens, where the server does not report it.",
)
@click.option(
    "--host-kv-tokens",
    type=click.IntRange(min=0),
    help="Host tier (KV offloading) of each server URL in tokens, where the server does not say "
    "(`longctx plan --host-memory` gives it): orders revisits, adds no room in flight.",
)
@click.option(
    "--packs-in-flight",
    type=click.IntRange(min=1),
    help="Most packs asked at once in all (default: two per server URL).",
)
@click.option("--job-id", help="Name of the job in the store (default: a hash of its items).")
@click.option("--fresh", is_flag=True, help="Ask every item again, whatever answers are stored.")
@corpus_options
@server_options
@request_options(concurrency=True)
@schema_options
@click.option("--quiet", "-q", is_flag=True, help="No progress or summary on stderr.")
def job(
    job_file: str,
    output: str | None,
    kv_tokens: int | None,
    host_kv_tokens: int | None,
    packs_in_flight: int | None,
    job_id: str | None,
    fresh: bool,
    schema: AnswerSchema | None,
    quiet: bool,
    server: ServerOptions,
    corpus: CorpusOptions,
    request: RequestOptions,
) -> None:
    """Answer a JSONL file of {paths, question} items, pack by pack, resumably.

    Each line of FILE ('-' for stdin) is {"paths": PATH or [PATHS], "question":
    TEXT} with an optional "id"; paths are relative to the current folder.
    Every pack's questions go out together (one prefill per pack), packs are
    spread over the replicas, and no replica gets more packs at once than its
    KV cache holds. Run the same file again after a crash or Ctrl-C: answers
    already stored are not asked again, unless what shapes them changed (the
    pack's files, the model, the server, --max-tokens, --extra-body): those
    items are asked again and the summary says why; --fresh
    asks everything again. Results are JSONL in item order, one line per item
    with its answer (its "data" when typed) or its error; exit 9 when some item failed.
    """
    if output and not os.path.isdir(os.path.dirname(os.path.abspath(output))):
        # Refused before the job runs, not after an hour of answers.
        raise OutputError("its folder does not exist", path=output)
    items = _read_items(job_file, schema)
    options = JobOptions(
        kv_tokens=kv_tokens,
        host_kv_tokens=host_kv_tokens,
        packs_in_flight=packs_in_flight,
        job_id=job_id,
        fresh=fresh,
    )
    app = runtime()
    partial = _PartialResults(output) if output else None
    with app.open_store() as store, progress_bar(not quiet, len(items)) as update:

        def progressed(state: JobProgress) -> None:
            update(
                state.answered,
                f"packs {state.packs_done}/{state.packs}, {state.in_flight} in flight: {state.message}",
            )

        # The given backend (a test's), else the job connects and closes its own.
        work = Job(
            items,
            backend=app.backend,
            server=server,
            store=store,
            corpus=corpus,
            request=request,
            options=options,
            on_progress=progressed,
            on_result=partial.write if partial else None,
        )
        try:
            report = work.run()
        except KeyboardInterrupt:
            _say_interrupted(work, len(items), partial, output)
            raise
        finally:
            if partial is not None:
                partial.close()
    _print_results(report, output, quiet=quiet)


def _print_results(report: JobReport, output: str | None, *, quiet: bool) -> None:
    """The results to ``output`` (else stdout), the summary and first failures to stderr; exit 9 if any."""
    results = report.to_jsonl()
    if output:
        save_text(output, results)
        note(f"wrote {len(report.results)} results to {output}", quiet=quiet)
    else:
        click.echo(results, nl=False)
    note(report.summary_line(), quiet=quiet)
    for failed in report.failed[:5]:
        note(f"item {failed.index}: {failed.error}", quiet=quiet)
    if report.failed:
        raise SystemExit(EXIT_ITEMS_FAILED)


def _say_interrupted(work: Job, total: int, partial: _PartialResults | None, output: str | None) -> None:
    """Say on stderr, after Ctrl-C, what the job stored and where the lines done so far are."""
    written = ""
    if partial is not None:
        # Closed before it is counted: an answer arriving meanwhile would add a line the
        # message does not count (seen: "the 2 done so far" over a file of 3 lines).
        partial.close()
        # With nothing done the file was never made: it is not named.
        written = f"; the {partial.lines} done so far are in {output}" if partial.lines else ""
    click.echo(
        f"longctx: job {work.id}: {work.answered} of {total} items answered and stored"
        f"{written}; run the same command again to ask the rest",
        err=True,
    )


def _read_items(job_file: str, schema: AnswerSchema | None) -> tuple[JobItem, ...]:
    """The items of ``job_file`` ('-': stdin), each without a schema of its own typed by ``--schema``."""
    items = read_job(click.open_file(job_file, encoding="utf-8") if job_file == "-" else job_file)
    if schema is None:
        return items
    return tuple(item if item.schema is not None else replace(item, schema=schema) for item in items)


class _PartialResults:
    """The ``-o`` file while the job runs: one whole JSON line per item as it is done, flushed at once."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lines = 0
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self._closed = False

    def write(self, result: JobResult) -> None:
        line = json.dumps(result.to_dict(), sort_keys=True) + "\n"
        with self._lock:
            if self._closed:
                return  # an answer that arrived after Ctrl-C: stored, and written by the next run
            try:
                if self._file is None:
                    self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
                # One write per line, flushed: a job stopped at any point leaves whole lines only.
                self._file.write(line)
                self._file.flush()
            except OSError as error:
                raise OutputError(
                    f"cannot write the results: {error.strerror or error}", path=self.path
                ) from error
            self.lines += 1

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._file is not None:
                self._file.close()
                self._file = None
