"""Serving knowledge for long-context deployments.

- :mod:`longctx.serving.kv`: the KV-cache layout of a model from its
  ``config.json`` (attention, MLA, sliding-window, linear-attention layers).
- :mod:`longctx.serving.kv_scales`: whether a checkpoint carries calibrated
  KV-cache scales (what makes an fp8 KV cache safe).
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

from typing import TYPE_CHECKING

from longctx.exports import lazy_exports

# The package's names (its ``__all__``), each with the module it comes from, imported on first use
# (PEP 562): `longctx recipe` and `plan` load the recipes and the planner, not doctor's backend.
_EXPORTS: dict[str, str] = {
    "CapacityPlan": "longctx.serving.plan",
    "ConcurrencyAnswer": "longctx.serving.plan",
    "ContextAnswer": "longctx.serving.plan",
    "DEFAULT_BLOCK_SIZE": "longctx.serving.plan",
    "DEFAULT_GPU_MEMORY_UTILIZATION": "longctx.serving.plan",
    "DEFAULT_RESERVE_GIB": "longctx.serving.plan",
    "Diagnosis": "longctx.serving.doctor",
    "ENGINES": "longctx.serving.recipes",
    "Finding": "longctx.serving.advice",
    "HostTierPlan": "longctx.serving.tiers",
    "KIMI_K3_NVFP4": "longctx.serving.recipes",
    "KVLayout": "longctx.serving.kv",
    "KV_CACHE_DTYPES": "longctx.serving.kv",
    "KVScales": "longctx.serving.kv_scales",
    "LayerGroup": "longctx.serving.kv",
    "LayerKind": "longctx.serving.kv",
    "Mount": "longctx.serving.recipes",
    "PlannedPack": "longctx.serving.planned_pack",
    "RetentionReport": "longctx.serving.retention",
    "measure_retention": "longctx.serving.retention",
    "RECIPE_KV_CACHE_DTYPES": "longctx.serving.recipes",
    "Recipe": "longctx.serving.recipes",
    "TierAnswer": "longctx.serving.tiers",
    "catalogue_models": "longctx.serving.recipes",
    "diagnose": "longctx.serving.doctor",
    "find_kv_scales": "longctx.serving.kv_scales",
    "known_model": "longctx.serving.families",
    "known_models": "longctx.serving.families",
    "kv_layout_from_config": "longctx.serving.kv",
    "load_model_config": "longctx.serving.kv",
    "plan_capacity": "longctx.serving.plan",
    "recipe_for": "longctx.serving.recipes",
    "recipe_kv_cache_dtype": "longctx.serving.recipes",
    "suggest_server_flags": "longctx.serving.advice",
}

if TYPE_CHECKING:
    from longctx.serving.advice import Finding as Finding
    from longctx.serving.advice import suggest_server_flags as suggest_server_flags
    from longctx.serving.doctor import Diagnosis as Diagnosis
    from longctx.serving.doctor import diagnose as diagnose
    from longctx.serving.families import known_model as known_model
    from longctx.serving.families import known_models as known_models
    from longctx.serving.kv import KV_CACHE_DTYPES as KV_CACHE_DTYPES
    from longctx.serving.kv import KVLayout as KVLayout
    from longctx.serving.kv import LayerGroup as LayerGroup
    from longctx.serving.kv import LayerKind as LayerKind
    from longctx.serving.kv import kv_layout_from_config as kv_layout_from_config
    from longctx.serving.kv import load_model_config as load_model_config
    from longctx.serving.kv_scales import KVScales as KVScales
    from longctx.serving.kv_scales import find_kv_scales as find_kv_scales
    from longctx.serving.plan import DEFAULT_BLOCK_SIZE as DEFAULT_BLOCK_SIZE
    from longctx.serving.plan import DEFAULT_GPU_MEMORY_UTILIZATION as DEFAULT_GPU_MEMORY_UTILIZATION
    from longctx.serving.plan import DEFAULT_RESERVE_GIB as DEFAULT_RESERVE_GIB
    from longctx.serving.plan import CapacityPlan as CapacityPlan
    from longctx.serving.plan import ConcurrencyAnswer as ConcurrencyAnswer
    from longctx.serving.plan import ContextAnswer as ContextAnswer
    from longctx.serving.plan import plan_capacity as plan_capacity
    from longctx.serving.planned_pack import PlannedPack as PlannedPack
    from longctx.serving.recipes import ENGINES as ENGINES
    from longctx.serving.recipes import KIMI_K3_NVFP4 as KIMI_K3_NVFP4
    from longctx.serving.recipes import RECIPE_KV_CACHE_DTYPES as RECIPE_KV_CACHE_DTYPES
    from longctx.serving.recipes import Mount as Mount
    from longctx.serving.recipes import Recipe as Recipe
    from longctx.serving.recipes import catalogue_models as catalogue_models
    from longctx.serving.recipes import recipe_for as recipe_for
    from longctx.serving.recipes import recipe_kv_cache_dtype as recipe_kv_cache_dtype
    from longctx.serving.retention import RetentionReport as RetentionReport
    from longctx.serving.retention import measure_retention as measure_retention
    from longctx.serving.tiers import HostTierPlan as HostTierPlan
    from longctx.serving.tiers import TierAnswer as TierAnswer


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = list(_EXPORTS)
