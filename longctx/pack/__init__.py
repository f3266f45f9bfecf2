"""Packs: the cache-friendly prompt prefix of a corpus, its byte format, counts, budget and shards.

The modules, in the order they import each other (each imports only those
before it): :mod:`~longctx.pack.rendering` (the byte format, the contract
of ``docs/pack-format.md``), :mod:`~longctx.pack.counting` (counting beside
the reading), :mod:`~longctx.pack.model` (:class:`Section`, :class:`Pack`,
:class:`Budget`, :class:`ShardedPack` and the other values),
:mod:`~longctx.pack.compare` (:func:`compare_packs`,
:func:`check_cache_boundary`), :mod:`~longctx.pack.snapshots` (a pack read
back from the store), :mod:`~longctx.pack.assembly` (sections to a pack),
:mod:`~longctx.pack.budget` (the budget check, :func:`build_shards`),
:mod:`~longctx.pack.build` (:func:`build_pack`, :func:`pack`).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Imported on first use (PEP 562), like the names of longctx itself: the
# counting worker imports longctx.pack.counting, and a fresh interpreter
# should then load the tokenizer only, not the corpus, store and builder.
_EXPORTS: dict[str, str] = {
    "BOUNDARY": "longctx.pack.rendering",
    "CHANGES_MARKER": "longctx.pack.rendering",
    "DEFAULT_PROBE_QUESTION": "longctx.pack.compare",
    "DOCUMENTS_OPENING": "longctx.pack.rendering",
    "FORMAT_VERSION": "longctx.pack.rendering",
    "NO_FINAL_NEWLINE": "longctx.pack.rendering",
    "SYSTEM_HEADER": "longctx.pack.rendering",
    "BoundaryCheck": "longctx.pack.model",
    "Budget": "longctx.pack.model",
    "ListingEntry": "longctx.pack.rendering",
    "Pack": "longctx.pack.model",
    "PackComparison": "longctx.pack.model",
    "PackResult": "longctx.pack.model",
    "PromptCount": "longctx.pack.model",
    "Section": "longctx.pack.model",
    "ShardedPack": "longctx.pack.model",
    "build_pack": "longctx.pack.build",
    "build_shards": "longctx.pack.budget",
    "check_cache_boundary": "longctx.pack.compare",
    "compare_packs": "longctx.pack.compare",
    "fence_for": "longctx.pack.rendering",
    "pack": "longctx.pack.build",
    "render_document": "longctx.pack.rendering",
    "render_listing": "longctx.pack.rendering",
    "render_path": "longctx.pack.rendering",
}

if TYPE_CHECKING:
    from longctx.pack.budget import build_shards
    from longctx.pack.build import build_pack, pack
    from longctx.pack.compare import DEFAULT_PROBE_QUESTION, check_cache_boundary, compare_packs
    from longctx.pack.model import (
        BoundaryCheck,
        Budget,
        Pack,
        PackComparison,
        PackResult,
        PromptCount,
        Section,
        ShardedPack,
    )
    from longctx.pack.rendering import (
        BOUNDARY,
        CHANGES_MARKER,
        DOCUMENTS_OPENING,
        FORMAT_VERSION,
        NO_FINAL_NEWLINE,
        SYSTEM_HEADER,
        ListingEntry,
        fence_for,
        render_document,
        render_listing,
        render_path,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'longctx.pack' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "BOUNDARY",
    "CHANGES_MARKER",
    "DEFAULT_PROBE_QUESTION",
    "DOCUMENTS_OPENING",
    "FORMAT_VERSION",
    "NO_FINAL_NEWLINE",
    "SYSTEM_HEADER",
    "BoundaryCheck",
    "Budget",
    "ListingEntry",
    "Pack",
    "PackComparison",
    "PackResult",
    "PromptCount",
    "Section",
    "ShardedPack",
    "build_pack",
    "build_shards",
    "check_cache_boundary",
    "compare_packs",
    "fence_for",
    "pack",
    "render_document",
    "render_listing",
    "render_path",
]
