"""Packs: the cache-friendly prompt prefix of a corpus, its byte format, counts, budget and shards.

The modules, in the order they import each other (each imports only those
before it): :mod:`~longctx.packing.rendering` (the byte format, the contract
of ``docs/pack-format.md``), :mod:`~longctx.packing.counting` (counting beside
the reading), :mod:`~longctx.packing.model` (:class:`Section`, :class:`Pack`,
:class:`Budget`, :class:`ShardedPack` and the other values),
:mod:`~longctx.packing.compare` (:func:`compare_packs`,
:func:`check_cache_boundary`), :mod:`~longctx.packing.snapshots` (a pack read
back from the store), :mod:`~longctx.packing.assembly` (sections to a pack),
:mod:`~longctx.packing.budget` (the budget check, :func:`build_shards`),
:mod:`~longctx.packing.build` (:func:`build_pack`, :func:`pack`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from longctx.exports import lazy_exports

# Imported on first use (PEP 562), like the names of longctx itself: the
# counting worker imports longctx.packing.counting, and a fresh interpreter
# should then load the tokenizer only, not the corpus, store and builder.
_EXPORTS: dict[str, str] = {
    "BOUNDARY": "longctx.packing.rendering",
    "CHANGES_MARKER": "longctx.packing.rendering",
    "DEFAULT_PROBE_QUESTION": "longctx.packing.compare",
    "DOCUMENTS_OPENING": "longctx.packing.rendering",
    "FORMAT_VERSION": "longctx.packing.rendering",
    "NO_FINAL_NEWLINE": "longctx.packing.rendering",
    "SYSTEM_HEADER": "longctx.packing.rendering",
    "BoundaryCheck": "longctx.packing.model",
    "Budget": "longctx.packing.model",
    "ListingEntry": "longctx.packing.rendering",
    "Pack": "longctx.packing.model",
    "PackComparison": "longctx.packing.model",
    "PackResult": "longctx.packing.model",
    "PromptCount": "longctx.packing.model",
    "Section": "longctx.packing.model",
    "ShardedPack": "longctx.packing.model",
    "build_pack": "longctx.packing.build",
    "build_shards": "longctx.packing.budget",
    "check_cache_boundary": "longctx.packing.compare",
    "compare_packs": "longctx.packing.compare",
    "fence_for": "longctx.packing.rendering",
    "pack": "longctx.packing.build",
    "render_document": "longctx.packing.rendering",
    "render_listing": "longctx.packing.rendering",
    "render_path": "longctx.packing.rendering",
}

if TYPE_CHECKING:
    from longctx.packing.budget import build_shards
    from longctx.packing.build import build_pack, pack
    from longctx.packing.compare import DEFAULT_PROBE_QUESTION, check_cache_boundary, compare_packs
    from longctx.packing.model import (
        BoundaryCheck,
        Budget,
        Pack,
        PackComparison,
        PackResult,
        PromptCount,
        Section,
        ShardedPack,
    )
    from longctx.packing.rendering import (
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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

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
