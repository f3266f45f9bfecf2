"""Packs: the cache-friendly prompt prefix of a corpus, its byte format, counts, budget and shards.

The modules, in the order they import each other (each imports only those
before it): :mod:`~longctx.packing.rendering` (the byte format, the contract
of ``docs/pack-format.md``), :mod:`~longctx.packing.image_parts` (an image
placed in a pack's prefix, the first message as content parts),
:mod:`~longctx.packing.counting` (counting beside
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

# The package's names (its ``__all__``), each with the module it comes from.
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
    # The names again, for type checkers only (`X as X`: a re-export); a layout test holds them to _EXPORTS.
    from longctx.packing.budget import build_shards as build_shards
    from longctx.packing.build import build_pack as build_pack
    from longctx.packing.build import pack as pack
    from longctx.packing.compare import DEFAULT_PROBE_QUESTION as DEFAULT_PROBE_QUESTION
    from longctx.packing.compare import check_cache_boundary as check_cache_boundary
    from longctx.packing.compare import compare_packs as compare_packs
    from longctx.packing.model import BoundaryCheck as BoundaryCheck
    from longctx.packing.model import Budget as Budget
    from longctx.packing.model import Pack as Pack
    from longctx.packing.model import PackComparison as PackComparison
    from longctx.packing.model import PackResult as PackResult
    from longctx.packing.model import PromptCount as PromptCount
    from longctx.packing.model import Section as Section
    from longctx.packing.model import ShardedPack as ShardedPack
    from longctx.packing.rendering import BOUNDARY as BOUNDARY
    from longctx.packing.rendering import CHANGES_MARKER as CHANGES_MARKER
    from longctx.packing.rendering import DOCUMENTS_OPENING as DOCUMENTS_OPENING
    from longctx.packing.rendering import FORMAT_VERSION as FORMAT_VERSION
    from longctx.packing.rendering import NO_FINAL_NEWLINE as NO_FINAL_NEWLINE
    from longctx.packing.rendering import SYSTEM_HEADER as SYSTEM_HEADER
    from longctx.packing.rendering import ListingEntry as ListingEntry
    from longctx.packing.rendering import fence_for as fence_for
    from longctx.packing.rendering import render_document as render_document
    from longctx.packing.rendering import render_listing as render_listing
    from longctx.packing.rendering import render_path as render_path


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = list(_EXPORTS)
