"""``longctx lint``, ``proxy`` and ``retention``: other applications' traffic, and what a server keeps."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from longctx.cli.app import (
    EXIT_LINT_FINDINGS,
    EXIT_REPLAY_MISMATCH,
    emit_json,
    main,
    note,
    progress,
    runtime,
    server_options,
)
from longctx.errors import ConfigError, InputError
from longctx.options import ServerOptions

if TYPE_CHECKING:
    from longctx.lint import LintReport, ReplayReport


@main.command()
@click.argument("log", type=click.Path(path_type=Path))
@server_options
@click.option(
    "--model-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Tokenize offline with this model folder's tokenizer and chat template (no server).",
)
@click.option(
    "--block-tokens", type=click.IntRange(min=1), help="vLLM's block size (default: the server's, else 16)."
)
@click.option(
    "--page-tokens", type=click.IntRange(min=1), help="SGLang's page size (default: the server's, else 1)."
)
@click.option(
    "--kv-tokens",
    type=click.IntRange(min=1),
    help="The KV cache both simulations hold, in tokens (default: unbounded).",
)
@click.option(
    "--plan-json",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Take the KV budget from `longctx plan --json` output.",
)
@click.option(
    "--format", "output", type=click.Choice(["table", "json", "html"]), default="table", show_default=True
)
@click.option(
    "--output",
    "-o",
    "output_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the report here instead of stdout.",
)
@click.option(
    "--fail-on", help="Exit 14 when a finding has one of these causes (comma-separated; any, break, loss)."
)
@click.option(
    "--min-hit-rate",
    type=click.FloatRange(0, 1),
    help="Exit 14 when the vLLM simulation's hit rate is below this (0 to 1).",
)
@click.option(
    "--replay",
    is_flag=True,
    help="Also send the requests to the server and compare its cached tokens and counters;"
    " exit 15 if they differ.",
)
def lint(
    log: Path,
    server: ServerOptions,
    model_dir: Path | None,
    block_tokens: int | None,
    page_tokens: int | None,
    kv_tokens: int | None,
    plan_json: Path | None,
    output: str,
    output_path: Path | None,
    fail_on: str | None,
    min_hit_rate: float | None,
    replay: bool,
) -> None:
    """Lint a request log for prefix-cache reuse: cached tokens per request on vLLM and SGLang, every break.

    LOG is JSONL: OpenAI chat or completions bodies, batch-file lines, or
    what `longctx proxy` records. The requests are tokenized exactly (the
    server's tokenize route, or --model-dir offline) and run through
    simulated vLLM and SGLang caches in the log's order.
    """
    from longctx.lint import (
        ModelFolderRenderer,
        Renderer,
        ServerRenderer,
        fail_selection,
        lint_requests,
        read_log,
    )

    causes = fail_selection(fail_on) if fail_on else frozenset()
    if plan_json is not None:
        kv_tokens = kv_tokens or _planned_kv_tokens(plan_json)
    if replay and model_dir is not None:
        raise ConfigError("--replay sends the requests to a server: leave out --model-dir")
    requests = read_log(log)
    backend = None if model_dir is not None else runtime().connect(server)
    try:
        renderer: Renderer
        if backend is None:
            assert model_dir is not None
            renderer = ModelFolderRenderer(model_dir)
            block, page = block_tokens or 16, page_tokens or 1
        else:
            renderer = ServerRenderer(backend.tokenizer())
            # The server's own unit for its engine's simulation; the default for the other.
            served = backend.server_for(None)
            radix = served.profile.prefix_cache == "radix"
            block = block_tokens or (None if radix else served.cache_block_tokens) or 16
            page = page_tokens or (served.cache_block_tokens if radix else None) or 1
        with progress(output_path is not None or output == "table") as say:
            report = lint_requests(
                requests,
                renderer,
                block_tokens=block,
                page_tokens=page,
                kv_tokens=kv_tokens,
                on_progress=lambda done, total: say(f"tokenized and simulated {done} of {total} requests"),
            )
        replayed = None
        if replay:
            assert backend is not None
            from longctx.lint import replay as replay_log

            with progress(True) as say:
                say(f"replaying {len(requests)} requests")
                replayed = replay_log(requests, renderer, backend, kv_tokens=kv_tokens)
    finally:
        if backend is not None:
            runtime().release(backend)
    _emit(report, replayed, output, output_path)
    _exit_for(report, replayed, causes, min_hit_rate)


def _exit_for(
    report: LintReport, replayed: ReplayReport | None, causes: frozenset[str], min_hit_rate: float | None
) -> None:
    """Exit 14 on a finding of ``causes`` or a hit rate under ``min_hit_rate``, 15 on a differing replay."""
    failing = report.failing(causes)
    if failing:
        note(
            f"longctx: {len(failing)} finding(s) of --fail-on causes: "
            f"{', '.join(sorted({f.cause for f in failing}))}"
        )
        sys.exit(EXIT_LINT_FINDINGS)
    rate = report.hit_rate(report.engines[0])
    if min_hit_rate is not None and rate < min_hit_rate:
        note(f"longctx: hit rate {rate:.1%} is below --min-hit-rate {min_hit_rate:.1%}")
        sys.exit(EXIT_LINT_FINDINGS)
    if replayed is not None and not replayed.matches:
        note("longctx: the replay does not match the simulation (see above)")
        sys.exit(EXIT_REPLAY_MISMATCH)


def _planned_kv_tokens(plan_json: Path) -> int:
    """The KV tokens of a ``longctx plan --json`` output."""
    from longctx.lint import kv_tokens_of_plan

    try:
        planned = kv_tokens_of_plan(json.loads(plan_json.read_text(encoding="utf-8")))
    except (OSError, ValueError) as error:
        raise InputError(f"--plan-json: cannot read {plan_json}: {error}") from error
    if planned is None:
        raise ConfigError(
            "--plan-json: the plan has no KV memory (give --gpu-memory and --weights, or --kv-memory)"
        )
    return planned


def _emit(report: LintReport, replayed: ReplayReport | None, output: str, output_path: Path | None) -> None:
    """The report in its format, on stdout or in ``output_path`` (the replay beside it)."""
    if output == "json":
        data = report.to_dict()
        if replayed is not None:
            data["replay"] = replayed.to_dict()
        text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    elif output == "html":
        text = report.to_html()
    else:
        text = report.to_text() + ("" if replayed is None else "\n" + replayed.to_text())
    if output_path is not None:
        output_path.write_text(text, encoding="utf-8")
        note(f"longctx: wrote {output_path}")
        if replayed is not None and output == "html":
            note(replayed.to_text().rstrip())
    else:
        click.echo(text, nl=False)


@main.command()
@click.option(
    "--upstream", required=True, help="The server to forward to (http://host:port, with or without /v1)."
)
@click.option(
    "--log",
    "log_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=Path("longctx-requests.jsonl"),
    show_default=True,
    help="The JSONL file the requests are appended to (`longctx lint` reads it).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=8001,
    show_default=True,
    help="The port to listen on (0: any free port).",
)
@click.option(
    "--no-usage-injection",
    is_flag=True,
    help="Forward streamed bodies untouched (no stream_options.include_usage added).",
)
@click.option(
    "--no-counter-check", is_flag=True, help="Do not read the upstream's counters at start and stop."
)
def proxy(
    upstream: str, log_path: Path, host: str, port: int, no_usage_injection: bool, no_counter_check: bool
) -> None:
    """Record an application's requests on their way to a server: point its base URL here.

    Every request is forwarded as it came (streamed answers as they arrive);
    chat and completions requests are appended to --log without any header,
    so API keys are never stored. Ctrl-C stops it and prints the recorded
    cached tokens against the server's own counter.
    """
    from longctx.lint import RecordingProxy

    recording = RecordingProxy(upstream, log_path, host=host, port=port, inject_usage=not no_usage_injection)
    backend = None
    if not no_counter_check:
        backend = runtime().connect(ServerOptions(base_url=recording.upstream + "/v1"))
    try:
        recording.start(backend=backend)
        note(f"longctx: recording to {log_path}; point the application at {recording.url}/v1 (Ctrl-C stops)")
        with contextlib.suppress(KeyboardInterrupt):
            recording.serve_forever()
        check = recording.counter_check()
    finally:
        recording.close()
        if backend is not None:
            runtime().release(backend)
    note(f"longctx: recorded {recording.recorder.count} request(s) in {log_path}")
    if check is not None:
        verdict = "unchecked" if check.matches is None else ("matches" if check.matches else "DIFFERS")
        note(
            f"longctx: counter check: {check.counter} grew {check.server_delta}, "
            f"recorded {check.reported}: {verdict}" + (f" ({check.note})" if check.note else "")
        )


@main.command()
@server_options
@click.option(
    "--pack-tokens",
    type=click.IntRange(min=16),
    required=True,
    help="The size of each probe pack, in tokens.",
)
@click.option(
    "--packs", type=click.IntRange(min=2), help="How many packs to send (default: 1.5 x the estimate + 2)."
)
@click.option(
    "--kv-tokens",
    type=click.IntRange(min=1),
    help="The KV size to estimate from, where the server does not say.",
)
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
def retention(
    server: ServerOptions, pack_tokens: int, packs: int | None, kv_tokens: int | None, as_json: bool
) -> None:
    """Measure how many packs of --pack-tokens the server really keeps, beside the estimate from its KV size.

    Fills the cache with distinct packs, re-sends them newest first; the first
    that is not served from the cache marks the oldest kept. The figure in KV
    tokens is what `longctx job --kv-tokens` takes. The probe evicts other
    clients' prefixes: run it on a server that is not serving users.
    """
    from longctx.serving import measure_retention

    backend = runtime().connect(server)
    try:
        with progress(not as_json) as say:
            report = measure_retention(
                backend, pack_tokens, packs=packs, kv_tokens=kv_tokens, on_progress=say
            )
    finally:
        runtime().release(backend)
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(report.to_text(), nl=False)
