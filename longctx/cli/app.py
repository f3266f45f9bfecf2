"""The ``longctx`` command group: its one error boundary, its exit codes, and what commands share.

Answers (or JSON with ``--json``) go to stdout; progress, the one-line
savings summary and errors go to stderr. Only :class:`LongctxError` is
caught, once, here (:class:`App`); anything else is a bug and shows its
traceback.

Exit codes: :data:`EXIT_CODES`, one distinct code per outcome, each with the
meaning ``docs/cli.md`` lists (written from this table).

Commands reach servers and the store through :class:`Runtime`, the object
click passes down (``obj``): tests give it a connection of their own to
run the commands in process against a fake server.
"""

from __future__ import annotations

import functools
import gc
import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, NoReturn

import click

from longctx.errors import (
    BackendError,
    BudgetError,
    CanaryDiverged,
    ConfigError,
    ContextOverflow,
    EmptyCorpus,
    InputError,
    InvalidAnswer,
    LongctxError,
    ServerUnreachable,
    SessionNotFound,
)

if TYPE_CHECKING:
    from longctx.backends import Backend
    from longctx.options import ServerOptions
    from longctx.schemas import AnswerSchema
    from longctx.store import Store

# Only what `longctx --help` needs is imported at the top: the option objects,
# their flags and the store are imported by the commands' modules, when one of
# them is looked up (see docs/benchmarks.md, "CLI start-up").

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_CANARY",
    "EXIT_CODES",
    "EXIT_EMPTY_CORPUS",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_INVALID_ANSWER",
    "EXIT_ITEMS_FAILED",
    "EXIT_LINT_FINDINGS",
    "EXIT_NO_PREFIX_CACHE",
    "EXIT_NO_SESSION",
    "EXIT_OK",
    "EXIT_REPLAY_MISMATCH",
    "EXIT_SERVER",
    "EXIT_TOO_LONG",
    "EXIT_UNREACHABLE",
    "EXIT_UNVERIFIED_CITATIONS",
    "EXIT_USAGE",
    "App",
    "Runtime",
    "corpus_options",
    "emit_json",
    "exit_code",
    "given_schema",
    "json_option",
    "main",
    "note",
    "output_options",
    "progress",
    "progress_bar",
    "request_options",
    "runtime",
    "schema_options",
    "server_options",
]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_TOO_LONG = 4
EXIT_BAD_INPUT = 5
EXIT_SERVER = 6
EXIT_NO_SESSION = 7
EXIT_EMPTY_CORPUS = 8
EXIT_ITEMS_FAILED = 9
EXIT_CANARY = 10
EXIT_NO_PREFIX_CACHE = 11
EXIT_INVALID_ANSWER = 12
EXIT_UNVERIFIED_CITATIONS = 13
EXIT_LINT_FINDINGS = 14
EXIT_REPLAY_MISMATCH = 15
EXIT_INTERRUPTED = 130

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success",
    EXIT_ERROR: "another longctx error (the store, a tokenizer...)",
    EXIT_USAGE: "usage: bad arguments or `LONGCTX_*` settings",
    EXIT_UNREACHABLE: "the server cannot be reached",
    EXIT_TOO_LONG: "the prompt does not fit: context overflow, or the pack is over budget",
    EXIT_BAD_INPUT: "bad input: a path or document that cannot be used",
    EXIT_SERVER: "the server answered with an error: a fault, or a rate limit (HTTP 429) still there"
    " after the retries; the message names the request id to find in the server's log",
    EXIT_NO_SESSION: "no such session",
    EXIT_EMPTY_CORPUS: "nothing to pack: the paths hold no document"
    " (the message names what was skipped and why)",
    EXIT_ITEMS_FAILED: "`longctx job` ran, but some items have no answer (their result lines carry `error`)",
    EXIT_CANARY: "the cache canary found a cached answer that differs from a cold one"
    " (`doctor --canary`; the evidence is printed)",
    EXIT_NO_PREFIX_CACHE: "`longctx doctor`: a server reports prefix caching off, so no request reuses"
    " a prefix (the flag to add is printed)",
    EXIT_INVALID_ANSWER: "an answer asked with `--schema` is cut, not JSON or refused by the schema"
    " (the raw answer is printed on stderr)",
    EXIT_UNVERIFIED_CITATIONS: "`--require-citations`: an answer gave no sources, or a source it cites is not"
    " verified against the pack (the answers and citations are printed first)",
    EXIT_LINT_FINDINGS: "`longctx lint`: a finding of a `--fail-on` cause,"
    " or a hit rate under `--min-hit-rate`",
    EXIT_REPLAY_MISMATCH: "`longctx lint --replay`: the server's cached tokens or counters differ"
    " from the simulation, or a replayed request failed",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C); a batch first prints the answers already stored"
    " and the session id",
}
"""Every exit code of the CLI and what it means: ``docs/cli.md``'s table is written from it."""


def exit_code(error: LongctxError) -> int:
    """The documented exit code for ``error``."""
    if isinstance(error, SessionNotFound):
        return EXIT_NO_SESSION
    if isinstance(error, CanaryDiverged):
        return EXIT_CANARY
    if isinstance(error, InvalidAnswer):
        return EXIT_INVALID_ANSWER
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
        # A 429 (RateLimited) as a fault: both are the server's no, said after the retries.
        return EXIT_SERVER
    return EXIT_ERROR


_JSON_ASKED: Final = "longctx.json"  # the context's meta key: the command was given --json


def _fail(error: LongctxError, *, as_json: bool = False) -> NoReturn:
    """Print one line naming the problem (and its path, when it has one) and exit with its code.

    With ``--json`` the error is also JSON on stdout (``{"error": {"type",
    "message", "exit_code"}}``), so a script reading stdout always gets JSON.
    """
    code = exit_code(error)
    raw = {"text": error.text} if isinstance(error, InvalidAnswer) else {}  # the answer it refused
    if as_json:
        failure = {"type": type(error).__name__, "message": error.describe(), "exit_code": code, **raw}
        emit_json({"error": failure})
    click.echo(f"longctx: error: {error.describe()}", err=True)
    if raw and not as_json:
        from longctx.cli.terminal import shown  # the model's text: inert on a terminal

        click.echo(f"longctx: the answer as it came:\n{shown(raw['text'], sys.stderr)}", err=True, color=True)
    sys.exit(code)


# Each command's module, imported when the command is looked up: `longctx pack`
# then never imports the sessions and the HTTP client it does not use.
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
    "serve": "longctx.cli.serve",
    "lint": "longctx.cli.traffic",
    "proxy": "longctx.cli.traffic",
    "retention": "longctx.cli.traffic",
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
    "serve": "Start a local server to try longctx on; Ctrl-C stops it.",
    "lint": "Lint a request log for prefix-cache reuse: cached tokens per request on vLLM and SGLang,"
    " every break.",
    "proxy": "Record an application's requests on their way to a server: point its base URL here.",
    "retention": "Measure how many packs of --pack-tokens the server really keeps,"
    " beside the estimate from its KV size.",
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
        second (the sessions and the HTTP client) before the list shows.
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
            with _collector_paused():
                importlib.import_module(COMMAND_MODULES[cmd_name])
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LongctxError as error:
            _fail(error, as_json=bool(ctx.meta.get(_JSON_ASKED)))
        except KeyboardInterrupt:
            # 130, the shell's code for SIGINT; 1 is reserved for other errors.
            click.echo("longctx: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """While a command's modules are imported, no garbage collection; after, their objects are frozen.

    An import makes thousands of objects that live as long as the process (functions, classes,
    constants), and each collection of the cyclic garbage collector walks them again: 105 collections
    and 4% of a new `longctx batch` process's instructions (callgrind, Python 3.11.7). Frozen
    (``gc.freeze``), they are never walked again; what the command makes later is collected as usual.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


class Runtime:
    """How commands reach the world: the server connection and the store.

    By default a command connects to the server its options name and opens
    the default store, and closes both. A caller that passes a ``backend``
    (a test, through ``CliRunner().invoke(main, args,
    obj=Runtime(backend=...))``) keeps it: commands use it and leave it open.
    ``open_store`` opens the store (default :meth:`Store.open <longctx.store.Store.open>`).
    """

    def __init__(self, backend: Backend | None = None, open_store: Callable[[], Store] | None = None) -> None:
        self.backend = backend
        self._open_store = open_store
        # The command's --store (a server's URL), where it was given: it wins over LONGCTX_STORE.
        self.store_url: str | None = None

    def open_store(self) -> Store:
        """The store commands use (the caller closes it)."""
        if self._open_store is not None:
            return self._open_store()
        from longctx.store import Store  # imported here: `longctx --help` opens no store

        return Store.open(database_url=self.store_url)

    def connect(self, server: ServerOptions) -> Backend:
        """The given backend, else a new connection (the caller closes it)."""
        if self.backend is not None:
            return self.backend
        # Imported here, not above: the backends and the HTTP client they load are
        # import time that `longctx pack` with an offline tokenizer never needs.
        from longctx.backends import connect

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
    """A status line on stderr while work runs (silent with ``--quiet`` or ``--json``).

    A request to a server that stays silent is shown within a second (what
    it waits on, for how long, when it gives up: :mod:`longctx.cli.waiting`):
    in the live line on a terminal, as plain lines otherwise.
    """
    if not enabled:
        yield lambda message: None
        return
    from longctx.cli.waiting import StatusLine, watching_waits

    if not sys.stderr.isatty():
        # Plain lines: rich (about 40 modules) is not imported for a file or a pipe.
        with watching_waits(plain=lambda line: click.echo(f"longctx: {line}", err=True)):
            yield lambda message: None
        return
    console = _console()
    if not console.is_terminal:  # a terminal rich does not take for one (TERM=dumb...)
        with watching_waits(plain=lambda line: click.echo(f"longctx: {line}", err=True)):
            yield lambda message: None
        return
    with console.status("starting") as status:
        line = StatusLine(status.update)
        with watching_waits(live=line.wait):
            yield line.say


@contextmanager
def progress_bar(enabled: bool, total: int) -> Iterator[Callable[[int, str], None]]:
    """A bar of ``total`` steps on stderr; the caller updates it with (steps done, what is happening)."""
    if not enabled:
        yield lambda done, message: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from longctx.cli.waiting import watching_waits

    columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"))
    console = _console()
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("starting", total=total)

        def update(done: int, message: str) -> None:
            bar.update(task, completed=done, description=message)

        # A silent server is said above the bar (or as plain lines off a terminal), never wrapped:
        # a file or a pipe gets whole lines, however wide.
        with watching_waits(
            plain=lambda line: console.print(f"longctx: {line}", markup=False, soft_wrap=True)
        ):
            yield update


def note(message: str, *, quiet: bool = False) -> None:
    """A line on stderr, unless ``quiet``."""
    if not quiet:
        click.echo(message, err=True)


def emit_json(data: Any) -> None:
    """``data`` as indented JSON on stdout, keys sorted."""
    import json  # imported here: `longctx --help` prints no JSON

    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


# -- shared options: each group of flags becomes one option object ---------------------


def _apply(function: Callable[..., Any], options: list[Any]) -> Callable[..., Any]:
    for option in reversed(options):
        function = option(function)
    return function


def server_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """The flags of :class:`~longctx.options.ServerOptions` (``--base-url``, ...), passed on as ``server``."""
    from longctx.cli.flags import options_from_flags
    from longctx.options import ServerOptions

    @functools.wraps(function)
    def with_store(*args: Any, server: ServerOptions, **kwargs: Any) -> Any:
        if server.store is not None:  # --store: the store the command opens
            runtime().store_url = server.store
        return function(*args, server=server, **kwargs)

    return options_from_flags(ServerOptions, "server")(with_store)


def corpus_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """The flags of :class:`~longctx.options.CorpusOptions` (its limits' too), passed on as ``corpus``."""
    from longctx.cli.flags import options_from_flags
    from longctx.options import CorpusOptions

    return options_from_flags(CorpusOptions, "corpus")(function)


def request_options(**groups: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The flags of :class:`~longctx.options.groups.RequestOptions`, passed on as ``request``.

    Every command gets those of no group (``--max-tokens``, ``--cache-salt``);
    ``concurrency=True`` adds ``--concurrency`` and ``--dispatch``, and
    ``follow_changes``, ``warm_start``, ``token_history`` their own switches
    (each flag's ``group`` in :mod:`longctx.options.groups`).
    """
    from longctx.cli.flags import options_from_flags
    from longctx.options import RequestOptions

    return options_from_flags(RequestOptions, "request", [name for name, wanted in groups.items() if wanted])


def _remember_json(context: click.Context, parameter: click.Parameter, value: bool) -> bool:
    # The meta is shared by every context of the run: the group's error boundary reads it.
    context.meta[_JSON_ASKED] = value
    return value


def json_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--json`` (as ``as_json``): with it, an error is JSON on stdout too (see :func:`_fail`)."""
    return click.option("--json", "as_json", is_flag=True, help=help_text, callback=_remember_json)


def output_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """``--json`` and ``--quiet``."""
    return _apply(
        function,
        [
            click.option(
                "--json",
                "as_json",
                is_flag=True,
                help="Print JSON on stdout (an error too).",
                callback=_remember_json,
            ),
            click.option("--quiet", "-q", is_flag=True, help="No progress or summary on stderr."),
        ],
    )


@click.group(cls=App, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
# By the distribution's name (the import name longctx can map to two: an editable build's
# egg-info beside its dist-info), and one program name however the CLI was started.
@click.version_option(package_name="longctx-sdk", prog_name="longctx")
def main() -> None:
    """Cache-friendly questions over codebases and documents, on vLLM and SGLang."""


def schema_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """``--schema FILE|SPEC`` and ``--schema-multi``: the command gets ``schema``, an AnswerSchema or None.

    Read as the command line is parsed: a spec or file it refuses is a usage
    error (exit 2) before any path is read.
    """

    def multi(context: click.Context, _: click.Parameter, value: bool) -> bool:
        context.meta[_SCHEMA_MULTI] = value
        return value

    def schema(context: click.Context, _: click.Parameter, value: str | None) -> AnswerSchema | None:
        try:
            return given_schema(value, bool(context.meta.get(_SCHEMA_MULTI)))
        except ConfigError as error:
            raise click.BadParameter(error.message) from None

    function = click.option(
        "--schema-multi",
        is_flag=True,
        is_eager=True,  # read before --schema, which it shapes
        expose_value=False,
        callback=multi,
        help='With --schema: the answer is a list of such objects ({"items": [...]}).',
    )(function)
    return click.option(
        "--schema",
        metavar="FILE|SPEC",
        callback=schema,
        help="Answer in JSON that satisfies a schema: a JSON Schema file, or a concise spec such as "
        "'name, age int, bio: their biography' (types str, int, float, bool; newlines may separate "
        "fields). The server constrains decoding to it; an answer that is cut or invalid fails (exit 12).",
    )(function)


_SCHEMA_MULTI: Final = "longctx.schema_multi"  # the context's meta key: --schema-multi was given


def given_schema(text: str | None, multi: bool) -> AnswerSchema | None:
    """The schema ``--schema`` gave (None without); ``--schema-multi`` alone is refused."""
    if text is None:
        if multi:
            raise ConfigError("--schema-multi needs --schema FILE|SPEC")
        return None
    from longctx.schemas import schema_argument  # here: only a command given --schema loads it

    return schema_argument(text, multi=multi)
