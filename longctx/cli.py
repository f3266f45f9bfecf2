"""The ``longctx`` command: a thin layer over the public API.

Answers (or JSON with ``--json``) go to stdout; progress, the one-line
savings summary and errors go to stderr. Only :class:`LongctxError` is
caught; anything else is a bug and shows its traceback.

Exit codes:

    0  success
    1  another longctx error (the store, a tokenizer...)
    2  usage: bad arguments or LONGCTX_* settings
    3  the server cannot be reached
    4  the prompt does not fit: context overflow or over budget
    5  bad input: a path or document that cannot be used
    6  the server answered with an error
    7  no such session
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from longctx.errors import (
    BackendError,
    BudgetError,
    ConfigError,
    ContextOverflow,
    InputError,
    LongctxError,
    ServerUnreachable,
    SessionNotFound,
)
from longctx.config import DEFAULT_MAX_STALE_SHARE

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_TOO_LONG = 4
EXIT_BAD_INPUT = 5
EXIT_SERVER = 6
EXIT_NO_SESSION = 7

T = TypeVar("T")


def exit_code(error: LongctxError) -> int:
    """The documented exit code for ``error``."""
    if isinstance(error, SessionNotFound):
        return EXIT_NO_SESSION
    if isinstance(error, ConfigError):
        return EXIT_USAGE
    if isinstance(error, ServerUnreachable):
        return EXIT_UNREACHABLE
    if isinstance(error, (ContextOverflow, BudgetError)):
        return EXIT_TOO_LONG
    if isinstance(error, InputError):
        return EXIT_BAD_INPUT
    if isinstance(error, BackendError):
        return EXIT_SERVER
    return EXIT_ERROR


def fail(error: LongctxError) -> NoReturn:
    """Print one line naming the problem (and its path, when it has one) and exit with its code."""
    message = str(error)
    path = getattr(error, "path", None)
    if path is not None and str(path) not in message:
        message = f"{path}: {message}"
    click.echo(f"longctx: error: {message}", err=True)
    sys.exit(exit_code(error))


def _console() -> Any:
    from rich.console import Console  # rich is only needed once there is something to show

    return Console(stderr=True, highlight=False)


@contextmanager
def progress(enabled: bool) -> Iterator[Callable[[str], None]]:
    """A status line on stderr while work runs (silent with ``--quiet`` or ``--json``)."""
    if not enabled:
        yield lambda message: None
        return
    with _console().status("starting") as status:
        yield status.update


def note(message: str, *, quiet: bool = False) -> None:
    if not quiet:
        click.echo(message, err=True)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


# -- shared options ---------------------------------------------------------------


def server_options(function: Callable[..., T]) -> Callable[..., T]:
    options = [
        click.option(
            "--base-url",
            envvar="LONGCTX_BASE_URL",
            help="Server URL (default http://127.0.0.1:8000/v1; env LONGCTX_BASE_URL; "
            "comma-separated replicas).",
        ),
        click.option(
            "--model",
            envvar="LONGCTX_MODEL",
            help="Served model name (env LONGCTX_MODEL; default: the server's model).",
        ),
        click.option(
            "--api-key", envvar="LONGCTX_API_KEY", help="Bearer token (env LONGCTX_API_KEY); never printed."
        ),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def corpus_options(function: Callable[..., T]) -> Callable[..., T]:
    options = [
        click.option(
            "--ordering",
            type=click.Choice(["stability", "path"]),
            help="Document order (default: stability in git repositories, else path).",
        ),
        click.option(
            "--include",
            multiple=True,
            metavar="GLOB",
            help="Only paths matching this gitignore-style pattern (repeatable).",
        ),
        click.option(
            "--exclude",
            multiple=True,
            metavar="GLOB",
            help="Leave out paths matching this pattern (repeatable).",
        ),
        click.option("--max-file-bytes", type=int, help="Skip files larger than this."),
        click.option("--max-total-bytes", type=int, help="Stop adding files past this total."),
        click.option("--max-files", type=int, help="Stop adding files past this count."),
        click.option("--allow-secrets", is_flag=True, help="Include files that look like credentials."),
        click.option(
            "--max-stale-share",
            type=click.FloatRange(0, 1, max_open=True),
            default=DEFAULT_MAX_STALE_SHARE,
            show_default=True,
            help="Largest share of a repository's tracked bytes kept as earlier copies of changed files,"
            " so that commits change only the pack's tail (0: no layering).",
        ),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def session_options(function: Callable[..., T]) -> Callable[..., T]:
    options = [
        click.option(
            "--max-tokens", type=int, default=512, show_default=True, help="Longest answer, in tokens."
        ),
        click.option("--cache-salt", help="Namespace for the server's prefix cache (keeps tenants apart)."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout."),
        click.option("--quiet", "-q", is_flag=True, help="No progress or summary on stderr."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def _limits(max_file_bytes: int | None, max_total_bytes: int | None, max_files: int | None) -> Any:
    from longctx.corpus import Limits

    defaults = Limits()
    try:
        return Limits(
            max_file_bytes=max_file_bytes if max_file_bytes is not None else defaults.max_file_bytes,
            max_total_bytes=max_total_bytes if max_total_bytes is not None else defaults.max_total_bytes,
            max_files=max_files if max_files is not None else defaults.max_files,
        )
    except ValueError as error:
        raise ConfigError(str(error)) from error


def _corpus_options(options: dict[str, Any]) -> Any:
    from longctx.config import CorpusOptions

    return CorpusOptions(
        ordering=options["ordering"],
        include=options["include"],
        exclude=options["exclude"],
        limits=_limits(options["max_file_bytes"], options["max_total_bytes"], options["max_files"]),
        allow_secrets=options["allow_secrets"],
        max_stale_share=options["max_stale_share"],
    )


def _open_session(paths: Sequence[str], options: dict[str, Any], say: Callable[[str], None]) -> Any:
    from longctx.session import RepoSession

    return RepoSession(
        list(paths),
        base_url=options["base_url"],
        model=options["model"],
        api_key=options["api_key"],
        corpus=_corpus_options(options),
        max_tokens=options["max_tokens"],
        cache_salt=options["cache_salt"],
        on_progress=say,
    )


def _answer_json(answer: Any) -> dict[str, Any]:
    usage = answer.usage
    return {
        "question": answer.question,
        "answer": answer.text,
        "reasoning": answer.reasoning,
        "session_id": answer.session_id,
        "turn": answer.turn,
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "cached_tokens": usage.cached_tokens,
            "created_cache_tokens": usage.created_cache_tokens,
            "completion_tokens": usage.completion_tokens,
            "ttft_seconds": usage.ttft_seconds,
            "total_seconds": usage.total_seconds,
            "cached_reason": usage.cached_reason,
        },
        "attempts": answer.attempts,
    }


# -- the command group ------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="longctx")
def main() -> None:
    """Cache-friendly questions over codebases and documents, on vLLM and SGLang."""


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
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the pack's summary and manifest as JSON instead of the pack.",
)
@click.option("--quiet", "-q", is_flag=True, help="No summary on stderr.")
def pack(
    paths: tuple[str, ...], tokenizer: str, output: str | None, as_json: bool, quiet: bool, **options: Any
) -> None:
    """Pack PATHS (repositories, folders, files) into one cache-friendly prompt prefix.

    The pack is the system message followed by the start of the first user
    message (documents, listing, boundary); a question goes right after it.
    An unchanged repository's pack is reused from the store. Counts go to
    stderr, flagged when estimated.
    """
    from longctx.pack import pack as pack_paths
    from longctx.store import Store

    try:
        result = pack_paths(
            list(paths),
            _corpus_options(options),
            tokenizer=_tokenizer(tokenizer, options),
            store=Store.open(),
        )
    except LongctxError as error:
        fail(error)
    built = result.pack
    saved = None
    if as_json:
        emit_json({"pack": built.summary(), "manifest": result.manifest.to_dict(), "reused": result.reused})
    elif output:
        try:
            saved = built.save(output)
        except LongctxError as error:
            fail(error)
    else:
        sys.stdout.flush()
        built.write_to(sys.stdout.buffer)
        sys.stdout.buffer.flush()
    skipped = result.manifest.skipped_by_reason()
    skipped_text = ", ".join(f"{count} {reason}" for reason, count in sorted(skipped.items())) or "none"
    tokens = built.prefix_tokens
    count_text = (
        "not counted" if tokens is None else f"{tokens:,} tokens{' (estimated)' if built.estimated else ''}"
    )
    earlier = built.earlier_copies
    earlier_text = ""
    if earlier:
        earlier_tokens = sum(section.tokens or 0 for section in earlier)
        copies = "copy" if len(earlier) == 1 else "copies"
        earlier_text = f" (and {len(earlier)} earlier {copies} of changed files" + (
            f", {earlier_tokens:,} tokens)" if tokens is not None else ")"
        )
    note(
        f"packed {len(built.documents)} documents{earlier_text}"
        f"{' (unchanged: reused)' if result.reused else ''}: "
        f"{count_text}; skipped: {skipped_text}; fingerprint {built.fingerprint[:16]}",
        quiet=quiet,
    )
    if saved is not None and saved.unchanged:
        note(f"{saved.path} already held this pack: left as it was", quiet=quiet)


def _tokenizer(choice: str, options: dict[str, Any]) -> Any:
    from longctx.tokens import EstimateTokenizer, TiktokenFileTokenizer, tokenizer_from_model_dir

    if choice == "estimate" or (choice == "auto" and not options.get("base_url")):
        return EstimateTokenizer()
    if choice in ("server", "auto"):
        from longctx.backends.base import connect

        return connect(
            options.get("base_url"), model=options.get("model"), api_key=options.get("api_key")
        ).tokenizer()
    if Path(choice).is_dir():
        return tokenizer_from_model_dir(Path(choice))
    return TiktokenFileTokenizer.named(choice)


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.argument("question")
@corpus_options
@server_options
@session_options
def ask(paths: tuple[str, ...], question: str, as_json: bool, quiet: bool, **options: Any) -> None:
    """Ask QUESTION about PATHS; the answer goes to stdout.

    The session is stored: continue it with `longctx chat --session ID`.
    """
    try:
        with progress(not (quiet or as_json)) as say:
            session = _open_session(paths, options, say)
            say("waiting for the answer")
            answer = session.ask(question)
        report = session.report()
    except LongctxError as error:
        fail(error)
    if as_json:
        emit_json({**_answer_json(answer), "report": report.to_dict()})
    else:
        click.echo(answer.text)
    note(f"session {session.id}: {report.summary_line()}", quiet=quiet)


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option(
    "--questions",
    "questions_file",
    required=True,
    type=click.File("r"),
    help="A file with one question per line ('-' for stdin).",
)
@click.option("--concurrency", type=int, default=4, show_default=True, help="Questions in flight at once.")
@corpus_options
@server_options
@session_options
def batch(
    paths: tuple[str, ...], questions_file: Any, concurrency: int, as_json: bool, quiet: bool, **options: Any
) -> None:
    """Ask every question of a file about PATHS, as siblings sharing one cached prefix.

    Answers go to stdout in question order, each under its question.
    """
    questions = [line.strip() for line in questions_file if line.strip()]
    if not questions:
        fail(ConfigError("the questions file holds no questions"))
    try:
        with progress(not (quiet or as_json)) as say:
            session = _open_session(paths, options, say)
            done = 0

            def answered(_: Any) -> None:
                nonlocal done
                done += 1
                say(f"answered {done} of {len(questions)} questions")

            say(f"asking {len(questions)} questions")
            result = session.ask_many(questions, concurrency=concurrency, on_answer=answered)
    except LongctxError as error:
        fail(error)
    if as_json:
        emit_json(
            {
                "session_id": session.id,
                "answers": [_answer_json(a) for a in result],
                "report": result.report.to_dict(),
            }
        )
    else:
        for answer in result:
            click.echo(f"## {answer.question}\n\n{answer.text}\n")
    note(f"session {session.id}: {result.report.summary_line()}", quiet=quiet)


@main.command()
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--session", "session_id", help="Resume this stored session instead of packing PATHS.")
@corpus_options
@server_options
@session_options
def chat(paths: tuple[str, ...], session_id: str | None, as_json: bool, quiet: bool, **options: Any) -> None:
    """Chat about PATHS: one question per line on stdin, answers on stdout.

    Every completed turn is stored at once; resume with --session ID after
    an interruption. End with an empty line or end of input.
    """
    from longctx.session import Session

    try:
        if session_id:
            from longctx.backends.base import connect

            backend = (
                connect(options["base_url"], model=options["model"], api_key=options["api_key"])
                if options["base_url"]
                else None
            )
            session = Session.resume(session_id, backend)
        elif paths:
            with progress(not (quiet or as_json)) as say:
                session = _open_session(paths, options, say)
        else:
            raise ConfigError("give PATHS to pack, or --session ID to resume")
    except LongctxError as error:
        fail(error)
    note(f"session {session.id} ({len(session.turns)} earlier turns); empty line to end", quiet=quiet)
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            click.echo("> ", err=True, nl=False)
        line = sys.stdin.readline()
        question = line.strip()
        if not question:
            break
        try:
            answer = session.ask(question)
        except LongctxError as error:
            fail(error)
        if as_json:
            click.echo(json.dumps(_answer_json(answer), sort_keys=True))
        else:
            click.echo(answer.text)
        if not quiet:
            cached = answer.usage.cached_tokens
            shown = "unknown" if cached is None else f"{cached:,}"
            note(f"[turn {answer.turn}: {shown} of {answer.usage.prompt_tokens or 0:,} prompt tokens cached]")
    try:
        note(f"session {session.id}: {session.report().summary_line()}", quiet=quiet)
    except LongctxError as error:
        fail(error)


@main.command()
@click.argument("session_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
@click.option("--markdown", is_flag=True, help="Markdown on stdout.")
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False, writable=True),
    help="Write a self-contained HTML page with the chart.",
)
def report(session_id: str | None, as_json: bool, markdown: bool, html_file: str | None) -> None:
    """The savings report of a session (default: the latest), its siblings included."""
    from longctx.session import Session
    from longctx.store import Store

    try:
        store = Store.open()
        if session_id is None:
            sessions = store.sessions()
            if not sessions:
                raise SessionNotFound("(latest)")
            session_id = sessions[0].id
        record = store.session(session_id)
        result = Session.resume(record.id, store=store).report()
    except LongctxError as error:
        fail(error)
    if html_file:
        Path(html_file).write_text(result.to_page(), encoding="utf-8")
        note(f"wrote {html_file}")
    if as_json:
        emit_json(result.to_dict())
    elif markdown:
        click.echo(result.to_markdown())
    elif not html_file:
        click.echo(result.to_text())


@main.command()
@server_options
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
@click.option("--no-probe", is_flag=True, help="Do not send the one-token probe request.")
def doctor(as_json: bool, no_probe: bool, **options: Any) -> None:
    """Check the server: engine, window, prefix caching, cached-token reporting; name the flags to add."""
    from longctx.backends.base import connect

    try:
        backend = connect(options["base_url"], model=options["model"], api_key=options["api_key"])
        diagnosis = backend.doctor(probe=not no_probe)
    except LongctxError as error:
        fail(error)
    if as_json:
        emit_json(diagnosis.to_dict())
    else:
        click.echo(diagnosis.to_text())


@main.group()
def sessions() -> None:
    """List, show and delete stored sessions."""


@sessions.command("list")
@click.option("--all", "show_all", is_flag=True, help="Include sibling branches.")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
def sessions_list(show_all: bool, as_json: bool) -> None:
    """Stored sessions, newest first."""
    from longctx.store import Store

    try:
        store = Store.open()
        records = store.sessions(include_branches=show_all)
        rows = [(r, len(store.turns(r.id))) for r in records]
    except LongctxError as error:
        fail(error)
    if as_json:
        emit_json(
            [
                {
                    "id": r.id,
                    "kind": r.kind,
                    "title": r.title,
                    "created_at": r.created_at,
                    "parent_id": r.parent_id,
                    "turns": turns,
                }
                for r, turns in rows
            ]
        )
        return
    for record, turns in rows:
        click.echo(f"{record.id}  {record.kind:<7}  {turns:>3} turns  {record.title}")


@sessions.command("show")
@click.argument("session_id")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
def sessions_show(session_id: str, as_json: bool) -> None:
    """A session's turns."""
    from longctx.session import Session
    from longctx.store import Store

    try:
        store = Store.open()
        session = Session.resume(session_id, store=store)
    except LongctxError as error:
        fail(error)
    if as_json:
        emit_json(
            {
                "id": session.id,
                "title": session.title,
                "turns": [{"question": t.question, "answer": t.answer} for t in session.turns],
            }
        )
        return
    click.echo(f"session {session.id}: {session.title}")
    for index, turn in enumerate(session.turns):
        click.echo(f"\n[{index}] > {turn.question}\n{turn.answer}")


@sessions.command("delete")
@click.argument("session_id")
def sessions_delete(session_id: str) -> None:
    """Delete a session, its turns and its requests."""
    from longctx.store import Store

    try:
        Store.open().delete_session(session_id)
    except LongctxError as error:
        fail(error)
    note(f"deleted session {session_id}")


@main.command()
@click.argument("model")
@click.option("--engine", type=click.Choice(["vllm", "sglang"]), required=True)
@click.option("--gpus", type=int, help="GPUs for tensor parallelism.")
@click.option("--max-model-len", type=int, help="Context length to serve.")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True),
    help="The model's config.json (or folder), for a model outside the catalogue.",
)
def recipe(
    model: str, engine: str, gpus: int | None, max_model_len: int | None, config_path: str | None
) -> None:
    """The launch command and environment for MODEL on ENGINE."""
    from longctx.serving import load_model_config, recipe_for

    try:
        config = load_model_config(config_path) if config_path else None
        result = recipe_for(model, engine, gpus=gpus, max_model_len=max_model_len, config=config)
    except LongctxError as error:
        fail(error)
    click.echo(result.render_shell())
    for line in result.notes:
        note(f"note: {line}")


@main.command()
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(exists=True),
    help="The model's config.json (or its folder).",
)
@click.option(
    "--kv-cache-dtype", type=click.Choice(["auto", "bf16", "fp16", "fp8"]), default="auto", show_default=True
)
@click.option("--gpus", type=int, default=1, show_default=True)
@click.option("--gpu-memory", type=float, help="GiB per GPU.")
@click.option("--weights", type=float, help="GiB of weights in all (split over the GPUs).")
@click.option(
    "--kv-memory", type=float, help="GiB of KV cache per GPU, as the server logs it (overrides the estimate)."
)
@click.option("--dcp", type=int, default=1, show_default=True, help="SGLang decode context parallelism.")
@click.option(
    "--context", "contexts", type=int, multiple=True, help="Context lengths to answer for (repeatable)."
)
@click.option(
    "--concurrency",
    "concurrencies",
    type=int,
    multiple=True,
    help="Concurrencies to answer for (repeatable).",
)
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
def plan(
    config_path: str,
    kv_cache_dtype: str,
    gpus: int,
    gpu_memory: float | None,
    weights: float | None,
    kv_memory: float | None,
    dcp: int,
    contexts: tuple[int, ...],
    concurrencies: tuple[int, ...],
    as_json: bool,
) -> None:
    """KV-cache memory per token and sequence, and what fits: longest context, highest concurrency."""
    from longctx.serving import kv_layout_from_config, load_model_config, plan_capacity

    try:
        layout = kv_layout_from_config(load_model_config(config_path), kv_cache_dtype=kv_cache_dtype)
        result = plan_capacity(
            layout,
            gpus=gpus,
            gpu_memory_gib=gpu_memory,
            weights_gib=weights,
            kv_memory_gib=kv_memory,
            dcp=dcp,
            contexts=list(contexts) or None,
            concurrencies=list(concurrencies) or None,
        )
    except LongctxError as error:
        fail(error)
    if as_json:
        emit_json(result.as_dict())
    else:
        click.echo(result.render_text())


if __name__ == "__main__":  # pragma: no cover
    main()
