"""The ``longctx`` command: a thin layer over the public API (see :mod:`longctx.cli.app`).

Each command group is one module, imported when one of its commands is run:

- :mod:`~longctx.cli.app`: the group, the one error boundary, exit codes, shared options;
- :mod:`~longctx.cli.flags`: an option object's flags, made from its fields;
- :mod:`~longctx.cli.waiting`: what a command waits on while a server is silent;
- :mod:`~longctx.cli.streaming`: an answer shown as it arrives, a spinner until then;
- :mod:`~longctx.cli.terminal`: what a model wrote, made inert on a terminal;
- :mod:`~longctx.cli.pages`: the line naming PDF pages without text, and the flag that sends them;
- :mod:`~longctx.cli.packing`: ``pack``;
- :mod:`~longctx.cli.questions`: ``ask``, ``batch``, ``chat``;
- :mod:`~longctx.cli.chat`: the chat loop and its slash commands;
- :mod:`~longctx.cli.jobs`: ``job``;
- :mod:`~longctx.cli.sessions`: ``sessions``, ``report``;
- :mod:`~longctx.cli.serving`: ``doctor``, ``plan``, ``recipe``, ``canary``;
- :mod:`~longctx.cli.serve`: ``serve --cpu-demo``;
- :mod:`~longctx.cli.mcp`: ``mcp``, the MCP server;
- :mod:`~longctx.cli.traffic`: ``lint``, ``proxy``, ``retention``: other applications' traffic.
"""

from __future__ import annotations

from longctx.cli.app import (
    EXIT_BAD_INPUT,
    EXIT_CODES,
    EXIT_EMPTY_CORPUS,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_ITEMS_FAILED,
    EXIT_NO_SESSION,
    EXIT_OK,
    EXIT_SERVER,
    EXIT_TOO_LONG,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Runtime,
    exit_code,
    main,
)

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_CODES",
    "EXIT_EMPTY_CORPUS",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_ITEMS_FAILED",
    "EXIT_NO_SESSION",
    "EXIT_OK",
    "EXIT_SERVER",
    "EXIT_TOO_LONG",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "Runtime",
    "exit_code",
    "main",
]
