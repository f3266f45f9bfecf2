"""Names a package exports but imports only when first used (PEP 562).

``import longctx`` stays cheap for the command line, and a counting worker
that imports :mod:`longctx.packing.counting` loads the tokenizer alone, not
the corpus, store and builder that the package's other names need.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, table: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: a name of ``table`` loads from its module once.

    ``dir()`` lists the package's ``__all__`` (its public names).
    """

    def getattr_(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        vars(sys.modules[package])[name] = value  # later lookups find it without this function
        return value

    def dir_() -> list[str]:
        return sorted(getattr(sys.modules[package], "__all__", table))

    return getattr_, dir_
