"""The ``longctx`` command group: its one error boundary, its exit codes, and what commands share.

Answers (or JSON with ``--json``) go to stdout; progress, the one-line
savings summary and errors go to stderr. Only :class:`LongctxError` is
caught, once, here (:class:`App`); anything else is a bug and shows its
traceback.

Exit codes:

    0  success
    1  another longctx error (the store, a tokenizer...)
    2  usage: bad arguments or LONGCTX_* settings
    3  the server cannot be reached
    4  the prompt does not fit: context overflow or over budget
    5  bad input: a path or document that cannot be used
    6  the server answered with an error
    7  no such session
    8  nothing to pack: the paths hold no document (the message says what was skipped and why)
    9  the cache canary found a cached answer that differs from a cold one (doctor --canary)

Commands reach servers and the store through :class:`Runtime`, the object
click passes down (``obj``): tests give it a connection of their own to
run the commands in process against a fake server.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import click

from longctx.config import (
    DEFAULT_CONCURRENCY,
    DEFAULT_MAX_STALE_SHARE,
    DEFAULT_MAX_TOKENS,
    DISPATCHES,
    ORDERINGS,
    CorpusOptions,
    Limits,
    RequestOptions,
    ServerOptions,
)
from longctx.errors import (
    BackendError,
    BudgetError,
    CanaryDiverged,
    ConfigError,
    ContextOverflow,
    EmptyCorpus,
    InputError,
    LongctxError,
    ServerUnreachable,
    SessionNotFound,
)
from longctx.store import Store

if TYPE_CHECKING:
    from longctx.backends.base import Backend

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_CANARY",
    "EXIT_EMPTY_CORPUS",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_NO_SESSION",
    "EXIT_OK",
    "EXIT_SERVER",
    "EXIT_TOO_LONG",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "App",
    "Runtime",
    "corpus_options",
    "emit_json",
    "exit_code",
    "main",
    "note",
    "progress",
    "request_options",
    "server_options",
]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_TOO_LONG = 4
EXIT_BAD_INPUT = 5
EXIT_SERVER = 6
EXIT_NO_SESSION = 7
EXIT_EMPTY_CORPUS = 8
EXIT_CANARY = 9


def exit_code(error: LongctxError) -> int:
    """The documented exit code for ``error``."""
    if isinstance(error, SessionNotFound):
        return EXIT_NO_SESSION
    if isinstance(error, CanaryDiverged):
        return EXIT_CANARY
    if isinstance(error, ConfigError):
        return EXIT_USAGE
    if isinstance(error, ServerUnreachable):
        return EXIT_UNREACHABLE
    if isinstance(error, (ContextOverflow, BudgetError)):
        return EXIT_TOO_LONG
    if isinstance(error, EmptyCorpus):
        return EXIT_EMPTY_CORPUS
    if isinstance(error, InputError):
        return EXIT_BAD_INPUT
    if isinstance(error, BackendError):
        return EXIT_SERVER
    return EXIT_ERROR


def _fail(error: LongctxError) -> NoReturn:
    """Print one line naming the problem (and its path, when it has one) and exit with its code."""
    click.echo(f"longctx: error: {error.describe()}", err=True)
    sys.exit(exit_code(error))


# Each command's module, imported when the command is looked up: `longctx pack`
# then never imports the sessions and the openai client it does not use.
COMMAND_MODULES: dict[str, str] = {
    "pack": "longctx.cli.packing",
    "ask": "longctx.cli.questions",
    "batch": "longctx.cli.questions",
    "chat": "longctx.cli.questions",
    "report": "longctx.cli.sessions",
    "sessions": "longctx.cli.sessions",
    "doctor": "longctx.cli.serving",
    "recipe": "longctx.cli.serving",
    "plan": "longctx.cli.serving",
    "mcp": "longctx.cli.mcp",
    "job": "longctx.cli.jobs",
}


# What `longctx --help` lists for each command (its docstring's first line).
COMMAND_SUMMARIES: dict[str, str] = {
    "pack": "Pack PATHS (repositories, folders, files) into one cache-friendly prompt prefix.",
    "ask": "Ask QUESTION about PATHS; the answer goes to stdout.",
    "batch": "Ask every question of a file about PATHS, as siblings sharing one cached prefix.",
    "chat": "Chat about PATHS: one question per line on stdin, answers on stdout.",
    "report": "The savings report of a session (default: the latest), its siblings included.",
    "sessions": "List, show and delete stored sessions.",
    "doctor": "Check each server: engine, window, prefix caching, cached-token reporting;"
    " name the flags to add.",
    "recipe": "The launch command and environment for MODEL on ENGINE.",
    "plan": "KV-cache memory per token and sequence, and what fits: longest context, highest concurrency.",
    "mcp": "Serve longctx's tools to an agent over stdio (Model Context Protocol).",
    "job": "Answer a JSONL file of {paths, question} items, pack by pack, resumably.",
}


def _shortened(summary: str, limit: int) -> str:
    """``summary`` cut to ``limit`` characters at a word, as click shortens a command's help."""
    if len(summary) <= limit:
        return summary
    return summary[: limit - 3].rsplit(" ", 1)[0] + "..."


class App(click.Group):
    """The command group, with the one place a :class:`LongctxError` becomes an exit code.

    Its commands live in the modules of :data:`COMMAND_MODULES`, which
    register themselves on :data:`main` when imported.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMAND_MODULES)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``longctx --help``, from :data:`COMMAND_SUMMARIES`.

        Click would import every command module to read its help: about half a
        second (the sessions and the openai client) before the list shows.
        A test holds each summary equal to its command's own short help.
        """
        names = self.list_commands(ctx)
        # The width click itself would give each summary, so the list reads as it always did.
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, _shortened(COMMAND_SUMMARIES[name], limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMAND_MODULES and cmd_name not in self.commands:
            importlib.import_module(COMMAND_MODULES[cmd_name])
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LongctxError as error:
            _fail(error)
        except KeyboardInterrupt:
            # 130, the shell's code for SIGINT; 1 is reserved for other errors.
            click.echo("longctx: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)


@dataclass
class Runtime:
    """How commands reach the world: the server connection and the store.

    By default a command connects to the server its options name and opens
    the default store, and closes both. A caller that passes a ``backend``
    (a test, through ``CliRunner().invoke(main, args,
    obj=Runtime(backend=...))``) keeps it: commands use it and leave it open.
    """

    backend: Backend | None = None
    open_store: Callable[[], Store] = Store.open

    def connect(self, server: ServerOptions) -> Backend:
        """The given backend, else a new connection (the caller closes it)."""
        if self.backend is not None:
            return self.backend
        # Imported here, not above: the openai client it loads costs a quarter
        # of a second, which `longctx pack` with an offline tokenizer never needs.
        from longctx.backends.base import connect

        return connect(server)

    def release(self, backend: Backend) -> None:
        """Close ``backend`` if :meth:`connect` made it."""
        if backend is not self.backend:
            backend.close()


def runtime() -> Runtime:
    """The runtime of the command being run (the default one unless the caller gave another)."""
    context = click.get_current_context()
    if not isinstance(context.obj, Runtime):
        context.obj = Runtime()
    return context.obj


# -- output -------------------------------------------------------------------------


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


@contextmanager
def progress_bar(enabled: bool, total: int) -> Iterator[Callable[[int, str], None]]:
    """A bar of ``total`` steps on stderr; the caller updates it with (steps done, what is happening)."""
    if not enabled:
        yield lambda done, message: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"))
    with Progress(*columns, console=_console(), transient=True) as bar:
        task = bar.add_task("starting", total=total)

        def update(done: int, message: str) -> None:
            bar.update(task, completed=done, description=message)

        yield update


def note(message: str, *, quiet: bool = False) -> None:
    """A line on stderr, unless ``quiet``."""
    if not quiet:
        click.echo(message, err=True)


def emit_json(data: Any) -> None:
    """``data`` as indented JSON on stdout, keys sorted."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


# -- shared options: each group of flags becomes one option object ---------------------


def _apply(function: Callable[..., Any], options: list[Any]) -> Callable[..., Any]:
    for option in reversed(options):
        function = option(function)
    return function


def server_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """``--base-url``, ``--model``, ``--api-key``, passed on as ``server: ServerOptions``."""

    @functools.wraps(function)
    def wrapper(
        *args: Any, base_url: str | None, model: str | None, api_key: str | None, **kwargs: Any
    ) -> Any:
        return function(
            *args, server=ServerOptions(base_url=base_url, model=model, api_key=api_key), **kwargs
        )

    return _apply(
        wrapper,
        [
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
                "--api-key",
                envvar="LONGCTX_API_KEY",
                help="Bearer token (env LONGCTX_API_KEY); never printed.",
            ),
        ],
    )


def corpus_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """The flags of :class:`~longctx.config.CorpusOptions`, passed on as ``corpus``."""

    @functools.wraps(function)
    def wrapper(
        *args: Any,
        ordering: str | None,
        include: tuple[str, ...],
        exclude: tuple[str, ...],
        max_file_bytes: int | None,
        max_total_bytes: int | None,
        max_files: int | None,
        allow_secrets: bool,
        max_stale_share: float,
        **kwargs: Any,
    ) -> Any:
        given = {"max_file_bytes": max_file_bytes, "max_total_bytes": max_total_bytes, "max_files": max_files}
        corpus = CorpusOptions(
            ordering=ordering,
            include=include,
            exclude=exclude,
            limits=Limits(**{name: value for name, value in given.items() if value is not None}),
            allow_secrets=allow_secrets,
            max_stale_share=max_stale_share,
        )
        return function(*args, corpus=corpus, **kwargs)

    defaults = Limits()
    return _apply(
        wrapper,
        [
            click.option(
                "--ordering",
                type=click.Choice(ORDERINGS),
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
            click.option(
                "--max-file-bytes",
                type=int,
                help=f"Skip files larger than this (default {defaults.max_file_bytes}).",
            ),
            click.option(
                "--max-total-bytes",
                type=int,
                help=f"Stop adding files past this total (default {defaults.max_total_bytes}).",
            ),
            click.option(
                "--max-files",
                type=int,
                help=f"Stop adding files past this count (default {defaults.max_files}).",
            ),
            click.option("--allow-secrets", is_flag=True, help="Include files that look like credentials."),
            click.option(
                "--max-stale-share",
                type=click.FloatRange(0, 1, max_open=True),
                default=DEFAULT_MAX_STALE_SHARE,
                show_default=True,
                help="Largest share of a repository's tracked bytes kept as earlier copies of changed files,"
                " so that commits change only the pack's tail (0: no layering).",
            ),
        ],
    )


def request_options(
    *,
    concurrency: bool = False,
    follow_changes: bool = False,
    warm_start: bool = False,
    token_history: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--max-tokens``, ``--cache-salt`` and the flags asked for, passed on as ``request``."""

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def wrapper(
            *args: Any, max_tokens: int, cache_salt: str | None, prompt_cache_key: str | None, **kwargs: Any
        ) -> Any:
            extra = (
                {"concurrency": kwargs.pop("concurrency"), "dispatch": kwargs.pop("dispatch")}
                if concurrency
                else {}
            )
            if follow_changes:
                extra["follow_changes"] = kwargs.pop("follow_changes")
            if warm_start:
                extra["warm_start"] = kwargs.pop("warm_start")
            if token_history:
                extra["token_history"] = kwargs.pop("token_history")
            request = RequestOptions(
                max_tokens=max_tokens, cache_salt=cache_salt, prompt_cache_key=prompt_cache_key, **extra
            )
            return function(*args, request=request, **kwargs)

        options = [
            click.option(
                "--max-tokens",
                type=int,
                default=DEFAULT_MAX_TOKENS,
                show_default=True,
                help="Longest answer, in tokens.",
            ),
            click.option(
                "--cache-salt", help="Namespace for the server's prefix cache (keeps tenants apart)."
            ),
            click.option(
                "--prompt-cache-key",
                help="The routing key to send instead of the pack's (OpenAI's name; routers keep one key"
                " on one replica).",
            ),
        ]
        if concurrency:
            options.append(
                click.option(
                    "--concurrency",
                    type=click.IntRange(min=1),
                    default=None,
                    help="Questions in flight at once (default: the engine's measured one, else"
                    f" {DEFAULT_CONCURRENCY}).",
                )
            )
            options.append(
                click.option(
                    "--dispatch",
                    type=click.Choice(DISPATCHES),
                    default="auto",
                    show_default=True,
                    help="How sibling questions go out: all together, the lead's first token first,"
                    " the lead's admission first, or what was measured fastest for the engine.",
                )
            )
        if follow_changes:
            options.append(
                click.option(
                    "--follow-changes/--no-follow-changes",
                    default=True,
                    show_default=True,
                    help="Append files changed since the pack to the next question.",
                )
            )
        if warm_start:
            options.append(
                click.option(
                    "--warm-start/--no-warm-start",
                    default=True,
                    show_default=True,
                    help="Prefill the pack in the background while the first question is typed.",
                )
            )
        if token_history:
            options.append(
                click.option(
                    "--token-history/--no-token-history",
                    default=False,
                    show_default=True,
                    help="Send earlier answers as the token ids the model generated (vLLM, SGLang),"
                    " so the next turn reads them from the cache.",
                )
            )
        return _apply(wrapper, options)

    return decorate


def output_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """``--json`` and ``--quiet``."""
    return _apply(
        function,
        [
            click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout."),
            click.option("--quiet", "-q", is_flag=True, help="No progress or summary on stderr."),
        ],
    )


@click.group(cls=App, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="longctx")
def main() -> None:
    """Cache-friendly questions over codebases and documents, on vLLM and SGLang."""
