"""The ``llm`` plugin: ``llm -f longctx:PATH "question"`` sends the pack of PATH as one fragment.

This is the one module importing ``llm`` (simonw/llm), registered through
the ``llm`` entry point in pyproject.toml. The fragment is the pack's
system header, a line break, then the pack's prefix without its final line
break: ``llm`` joins a prompt's fragments and its text with one line break,
so the user message it sends is the header, then exactly what longctx itself
sends (the documents, the listing, ``Question:`` and the question). The
fragment is the same bytes for the same repository state, so its tokens
are a prefix the server's cache keeps from one question to the next (the
measurement is in docs/agents.md and tests/test_llm_plugin.py).

Options come from ``LONGCTX_*`` variables (``LONGCTX_HOME`` for the store,
where an unchanged repository's pack is read back instead of re-read); the
corpus options are the defaults. An error is a
:class:`~longctx.errors.LongctxError`, which ``llm`` reports as "Could not
load fragment ...: MESSAGE".
"""

from __future__ import annotations

from collections.abc import Callable

import llm

from longctx.errors import InputError, LongctxError
from longctx.packing import pack
from longctx.store import Store

__all__ = ["PREFIX", "fragment_text", "load_fragment", "register_fragment_loaders"]

PREFIX = "longctx"
"""The fragment prefix: ``-f longctx:path/to/repo``."""


def fragment_text(system: str, prefix: str) -> str:
    """The fragment for a pack: ``system``, a line break, ``prefix`` less its final line break."""
    return system + "\n" + prefix.removesuffix("\n")


def load_fragment(argument: str) -> llm.Fragment:
    """The pack of the path ``argument`` (one repository, folder or document) as an ``llm`` fragment."""
    try:
        with Store.open() as store:
            result = pack(argument, store=store)
    except LongctxError as error:
        # llm prints "Could not load fragment longctx:ARGUMENT: " before the error: an error about
        # ARGUMENT itself follows with its message alone, or the path would be named twice.
        if str(getattr(error, "path", None)) == argument:
            raise InputError(error.message) from error
        raise
    packed = result.pack
    source = f"longctx:{packed.fingerprint[:16]}:{argument}"
    return llm.Fragment(fragment_text(packed.system, packed.prefix), source)  # type: ignore[no-untyped-call]


@llm.hookimpl
def register_fragment_loaders(register: Callable[[str, Callable[[str], llm.Fragment]], None]) -> None:
    """Register the ``longctx:`` fragment prefix."""
    register(PREFIX, load_fragment)
