"""Serving knowledge for long-context deployments.

- :mod:`longctx.serving.kv`: the KV-cache layout of a model from its
  ``config.json`` (attention, MLA, sliding-window, linear-attention layers).
- :mod:`longctx.serving.plan`: how much context at how much concurrency fits.
- :mod:`longctx.serving.planned_pack`: the context a pack needs (``plan --pack``), images included.
- :mod:`longctx.serving.recipes`: launch commands for vLLM and SGLang.
- :mod:`longctx.serving.advice`: flags to add to a running server.
- :mod:`longctx.serving.tiers`: the planner's host tier.
- :mod:`longctx.serving.doctor`: a backend's servers checked.
- :mod:`longctx.serving.families`: popular long-context models by name.
- :mod:`longctx.serving.retention`: how many packs a server really keeps, measured.

The CLI (``longctx recipe``, ``longctx plan``, ``longctx doctor``) is a thin
layer over the names exported here.
"""

from __future__ import annotations

from longctx.serving.advice import Finding, suggest_server_flags
from longctx.serving.kv import (
    KV_CACHE_DTYPES,
    KVLayout,
    LayerGroup,
    LayerKind,
    kv_layout_from_config,
    load_model_config,
)
from longctx.serving.plan import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_RESERVE_GIB,
    CapacityPlan,
    ConcurrencyAnswer,
    ContextAnswer,
    plan_capacity,
)
from longctx.serving.recipes import (
    ENGINES,
    KIMI_K3_NVFP4,
    Mount,
    Recipe,
    catalogue_models,
    recipe_for,
)
from longctx.serving.tiers import HostTierPlan, TierAnswer

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "DEFAULT_RESERVE_GIB",
    "ENGINES",
    "KIMI_K3_NVFP4",
    "KV_CACHE_DTYPES",
    "CapacityPlan",
    "ConcurrencyAnswer",
    "ContextAnswer",
    "Finding",
    "HostTierPlan",
    "KVLayout",
    "LayerGroup",
    "LayerKind",
    "Mount",
    "Recipe",
    "TierAnswer",
    "catalogue_models",
    "kv_layout_from_config",
    "load_model_config",
    "plan_capacity",
    "recipe_for",
    "suggest_server_flags",
]
