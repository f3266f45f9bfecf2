"""The ``longctx`` command: a thin layer over the public API (see :mod:`longctx.cli.app`).

Each command group is one module, imported when one of its commands is run.
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
