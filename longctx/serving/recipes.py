"""Launch recipes: the server command, environment and notes for one model on one engine.

A small built-in catalogue holds deployments that were validated by someone
(today ``nvidia/Kimi-K3-NVFP4``, from its model card); any other model gets a
generic recipe built from its ``config.json`` with the switches that
matter for long contexts:

1. an fp8 KV cache (half the memory of bf16, so twice the context x
   concurrency), only where the checkpoint carries calibrated KV scales
   (:mod:`longctx.serving.kv_scales`); without them the engines run fp8 at
   scale 1.0, which lost answers when measured (the engine registry's
   ``fp8_kv_unscaled``), so the recipe keeps the model's own KV type and says why;
2. prefix caching (vLLM ``--enable-prefix-caching``; SGLang's radix cache is
   on by default), plus cached-token reporting so longctx can show savings;
3. chunked prefill with a token budget of 8192 per step, so one long prompt
   does not stall every running decode.
"""

from __future__ import annotations

import dataclasses
import shlex
import types
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any

from longctx.backends.engines import find_profile, recipe_engines
from longctx.backends.profiles import HostTierRecipe, RecipeSwitches
from longctx.errors import ServingConfigError
from longctx.recordtypes import record_type
from longctx.serving.families import known_model, known_models
from longctx.serving.kv import LayerKind, kv_layout_from_config
from longctx.serving.kv_scales import KVScales, find_kv_scales

__all__ = [
    "ENGINES",
    "KIMI_K3_NVFP4",
    "RECIPE_KV_CACHE_DTYPES",
    "Mount",
    "Recipe",
    "catalogue_models",
    "recipe_for",
    "recipe_kv_cache_dtype",
]

ENGINES = recipe_engines()
"""The engines with a recipe at import (the CLI's choices); :func:`recipe_for` asks the registry."""

RECIPE_KV_CACHE_DTYPES = ("recipe", "auto", "fp8")
"""What :func:`recipe_for` takes as ``kv_cache_dtype``: the recipe's choice, the model's own type, or fp8."""

KIMI_K3_NVFP4 = "nvidia/Kimi-K3-NVFP4"
# From the nvidia/Kimi-K3-NVFP4 model card: validated on 8 x B300 at TP 8.
_K3_VALIDATED_GPUS = 8
_K3_VALIDATED_CONTEXT = 196_608
_K3_ARCHITECTURE_CONTEXT = 1_048_576
_K3_WEIGHT_BYTES = 1.6e12
_B300_BYTES = 288e9

_CHUNK_TOKENS = "8192"

_HF_CACHE = "$HOME/.cache/huggingface"


@record_type
class Mount:
    """A host path bind-mounted into the container (``source`` may use ``$HOME``/``$PWD``)."""

    source: str
    target: str
    read_only: bool = False

    def docker_volume(self) -> str:
        """The ``-v`` value, e.g. ``$HOME/x:/y:ro``."""
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")


@record_type
class Recipe:
    """How to launch ``model`` on ``engine``.

    ``argv`` is the server command as run on a host with the engine installed
    (``vllm serve MODEL --flag value ...``); ``image_entrypoint`` is the
    leading part of ``argv`` the container image already runs, so inside
    ``image`` only the rest is passed. ``env`` holds fixed variables,
    ``required_env`` the names that must come from the caller's environment
    (secrets: never their values). ``setup`` lists shell commands to run once
    before the first launch. ``from_catalogue`` is false for a generic recipe
    built from a config. ``kv_cache_dtype`` is the KV cache it launches
    (``fp8``, or ``auto``: the model's own type), what ``longctx plan``
    sizes; ``warnings`` are notes that may cost answers.
    """

    model: str
    engine: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=lambda: types.MappingProxyType({}))
    required_env: tuple[str, ...] = ()
    image: str | None = None
    image_entrypoint: tuple[str, ...] = ()
    docker_options: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    setup: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    from_catalogue: bool = False
    kv_cache_dtype: str = "auto"
    warnings: tuple[str, ...] = ()

    def flags(self) -> tuple[str, ...]:
        """The ``--option`` names in ``argv``, in order (values left out)."""
        return tuple(arg for arg in self.argv if arg.startswith("--"))

    def to_text(self) -> str:
        """A copy-pasteable shell snippet: setup, then ``docker run`` (with an image) or the command."""
        lines: list[str] = []
        if self.setup:
            lines.append("# once, before the first launch:")
            lines += list(self.setup)
            lines.append("")
        if self.required_env:
            lines.append("# needs in your environment: " + " ".join(self.required_env))
        body: list[str] = []
        if self.image:
            body.append("docker run " + " ".join(self.docker_options))
            body += [f"  -e {name}" for name in self.required_env]
            body += [f"  -e {shlex.quote(f'{k}={v}')}" for k, v in self.env.items()]
            # Double quotes, not shlex: $HOME and $PWD must expand.
            body += [f'  -v "{mount.docker_volume()}"' for mount in self.mounts]
            body.append(f"  {self.image}")
            command = self.argv[len(self.image_entrypoint) :]
            indent = "  "
        else:
            body += [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
            command = self.argv
            indent = ""
        body += _command_lines(command, indent)
        lines.append(" \\\n".join(body))
        return "\n".join(lines)


def catalogue_models() -> tuple[str, ...]:
    """Models with a built-in, validated recipe."""
    return (KIMI_K3_NVFP4,)


def recipe_kv_cache_dtype(scales: KVScales) -> str:
    """What a generic recipe launches: ``fp8`` where the checkpoint carries KV scales, else ``auto``."""
    return "fp8" if scales.found else "auto"


def recipe_for(
    model: str,
    engine: str,
    *,
    gpus: int | None = None,
    max_model_len: int | None = None,
    config: Mapping[str, Any] | None = None,
    speculative: bool = True,
    host_tier: str | None = None,
    host_memory_gib: float | None = None,
    kv_cache_dtype: str = "recipe",
    kv_scales: KVScales | None = None,
) -> Recipe:
    """The launch recipe for ``model`` on ``engine`` (a registered engine with a recipe: ``"vllm"``...).

    Catalogue models (:func:`catalogue_models`, matched case-insensitively)
    get their validated recipe; ``gpus`` and ``max_model_len`` override the
    validated values and add a note saying so. Any other model needs its
    parsed ``config.json`` as ``config`` (or is one of the popular
    long-context models of :mod:`longctx.serving.families`, known by name)
    and gets a generic recipe for
    ``gpus`` GPUs (default 1) whose context defaults to the config's
    ``max_position_embeddings``. ``speculative`` keeps the catalogue's
    speculative decoding where it has one (SGLang DSPARK for Kimi K3).
    ``host_tier`` adds a KV tier in host memory of ``host_memory_gib`` GiB
    (the whole server's): vLLM ``native`` (its offloading connector) or
    ``lmcache`` (an ``lmcache server`` beside vLLM), SGLang ``hicache``
    (the profile's ``recipe.host_tiers``); ``longctx plan --host-memory`` says what it holds.

    ``kv_cache_dtype`` (:data:`RECIPE_KV_CACHE_DTYPES`): ``recipe`` launches
    an fp8 KV cache where ``kv_scales`` (the checkpoint's, from
    :func:`~longctx.serving.kv_scales.find_kv_scales`; None: judged from
    ``config`` alone) are found, else the model's own type, with a note
    saying why; ``fp8`` asks for it anyway (a warning where no scales are
    found); ``auto`` keeps the model's type. A catalogue recipe launches
    what was validated, and takes ``recipe`` only.

    Raises :class:`ServingConfigError` naming ``engine``, ``gpus``,
    ``max_model_len``, ``config`` or ``kv_cache_dtype`` when one is unusable.
    """
    profile = find_profile(engine)
    if profile is None or profile.recipe is None:
        choices = " or ".join(recipe_engines())
        raise ServingConfigError(f"unknown engine {engine!r}; use {choices}", field="engine")
    _check_sizes(gpus, max_model_len)
    if host_tier is not None and host_tier not in profile.recipe.host_tiers:
        known = " or ".join(profile.recipe.host_tiers) or "none"
        raise ServingConfigError(
            f"unknown host tier {host_tier!r} for {engine}; use {known}", field="host_tier"
        )
    if host_tier is not None and (
        host_memory_gib is None or isinstance(host_memory_gib, bool) or not host_memory_gib > 0
    ):
        raise ServingConfigError(
            f"a host tier needs its size: host_memory_gib > 0, got {host_memory_gib!r}",
            field="host_memory_gib",
        )
    if kv_cache_dtype not in RECIPE_KV_CACHE_DTYPES:
        raise ServingConfigError(
            f"unknown KV cache choice {kv_cache_dtype!r}; use {', '.join(RECIPE_KV_CACHE_DTYPES)}",
            field="kv_cache_dtype",
        )
    recipe = _base_recipe(
        model,
        engine,
        gpus=gpus,
        max_model_len=max_model_len,
        config=config,
        speculative=speculative,
        kv_cache=_KVCacheRequest(kv_cache_dtype, kv_scales),
    )
    if host_tier is None:
        return recipe
    assert host_memory_gib is not None
    return _with_host_tier(recipe, profile.recipe.host_tiers[host_tier], host_memory_gib)


def _check_sizes(gpus: int | None, max_model_len: int | None) -> None:
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise ServingConfigError(f"gpus must be a positive integer, got {gpus!r}", field="gpus")
    if max_model_len is not None and (
        isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1
    ):
        raise ServingConfigError(
            f"max_model_len must be a positive integer, got {max_model_len!r}", field="max_model_len"
        )


def _base_recipe(
    model: str,
    engine: str,
    *,
    gpus: int | None,
    max_model_len: int | None,
    config: Mapping[str, Any] | None,
    speculative: bool,
    kv_cache: _KVCacheRequest,
) -> Recipe:
    profile = find_profile(engine)
    assert profile is not None and profile.recipe is not None
    validated = _CATALOGUE.get((model.lower(), engine))
    if validated is not None:
        if kv_cache.dtype != "recipe":
            raise ServingConfigError(
                f"the built-in recipe for {KIMI_K3_NVFP4} launches the KV cache it was validated with; "
                "for another, pass the model's config.json for a generic recipe",
                field="kv_cache_dtype",
            )
        return validated(gpus, max_model_len, speculative)
    shape_note = None
    known = known_model(model) if config is None else None
    if known is not None:
        model, config = known.name, known.config
        shape_note = (
            "shape from longctx's table of popular long-context models; a fine-tune: pass its config.json"
        )
    if config is None:
        raise ServingConfigError(
            f"no built-in recipe for {model!r} (built in: {', '.join(catalogue_models())}; known by "
            f"shape: {', '.join(known_models())}); pass its config.json for a generic recipe",
            field="config",
        )
    scales = kv_cache.scales
    if scales is None:
        scales = find_kv_scales(config)
        if known is not None:
            scales = KVScales(None, "a model known by name only: no checkpoint to read its KV scales from")
    recipe = _generic(
        model,
        engine,
        profile.recipe,
        gpus=gpus or 1,
        max_model_len=max_model_len,
        config=config,
        kv_cache=_KVCacheRequest(kv_cache.dtype, scales),
    )
    if shape_note is not None:
        return dataclasses.replace(recipe, notes=(*recipe.notes, shape_note))
    return recipe


def _kimi_k3_common(gpus: int | None, max_model_len: int | None) -> tuple[int, list[str]]:
    """Kimi K3 on any engine: the tensor parallel size and the notes on the hardware."""
    if max_model_len is not None and max_model_len > _K3_ARCHITECTURE_CONTEXT:
        raise ServingConfigError(
            f"max_model_len {max_model_len:,} exceeds Kimi K3's architectural limit of "
            f"{_K3_ARCHITECTURE_CONTEXT:,} tokens",
            field="max_model_len",
        )
    tp = gpus or _K3_VALIDATED_GPUS
    notes = [
        "Blackwell only (B200/B300); validated on 8 x B300 at tensor parallel 8",
        "about 1.6 TB of weights, downloaded into the mounted Hugging Face cache on first launch",
    ]
    if tp != _K3_VALIDATED_GPUS:
        notes.append(f"{tp} GPUs is not the validated setup (8); expect to tune memory settings")
    if _K3_WEIGHT_BYTES / tp > _B300_BYTES:
        notes.append(
            f"1.6 TB of weights over {tp} GPUs is {_K3_WEIGHT_BYTES / tp / 1e9:,.0f} GB each, "
            "more than a B300's 288 GB: this will not load"
        )
    return tp, notes


def _kimi_k3_vllm(gpus: int | None, max_model_len: int | None, speculative: bool) -> Recipe:
    tp, notes = _kimi_k3_common(gpus, max_model_len)
    context = max_model_len or _K3_VALIDATED_CONTEXT
    notes += [
        "about 18 minutes to start on 8 GPUs with --load-format fastsafetensors; "
        "the default loader is substantially slower",
        f"--max-model-len {_K3_VALIDATED_CONTEXT:,} is the validated value on 8 GPUs, not the "
        f"architecture's limit ({_K3_ARCHITECTURE_CONTEXT:,}); KV memory grows with context x "
        "concurrency, so check a larger value with `longctx plan` before raising it",
        "the runtime patch (runtime_patches/sitecustomize.py, loaded through PYTHONPATH) is "
        "required until vLLM PRs #50617, #52406 and #52405 are in a release",
        "--enable-prompt-tokens-details is added by longctx (not in the model card) so "
        "responses report cached tokens",
    ]
    if context > _K3_VALIDATED_CONTEXT:
        notes.append(
            f"--max-model-len {context:,} is above the validated {_K3_VALIDATED_CONTEXT:,}: "
            "lower --max-num-seqs or confirm the KV cache fits with `longctx plan`"
        )
    argv = (
        "vllm", "serve", KIMI_K3_NVFP4,
        "--served-model-name", "kimi-k3-nvfp4",
        "--host", "0.0.0.0",
        "--port", "8000",
        "--trust-remote-code",
        "--quantization", "modelopt_mixed",
        "--load-format", "fastsafetensors",
        "--tensor-parallel-size", str(tp),
        "--moe-backend", "flashinfer_trtllm",
        "--gpu-memory-utilization", "0.90",
        "--max-model-len", str(context),
        "--max-num-batched-tokens", _CHUNK_TOKENS,
        "--max-num-seqs", "32",
        "--kv-cache-dtype", "fp8",
        "--attention-config",
        '{"mla_prefill_backend":"TRTLLM_RAGGED","use_prefill_query_quantization":true}',
        "--attention-backend", "FLASHINFER_MLA",
        "--enable-prefix-caching",
        "--enable-chunked-prefill",
        "--max-cudagraph-capture-size", "32",
        "--enable-auto-tool-choice",
        "--tool-call-parser", "kimi_k3",
        "--reasoning-parser", "kimi_k3",
        "--enable-prompt-tokens-details",
    )  # fmt: skip
    return Recipe(
        model=KIMI_K3_NVFP4,
        engine="vllm",
        argv=argv,
        env=types.MappingProxyType(
            {
                "PYTHONPATH": "/k3-runtime-patches",
                "KIMI_K3_FIX_MM_PROMPT_UPDATES": "1",
                "KIMI_K3_NVFP4_SITU_G1_SCALE": "1",
                "KIMI_K3_FP8_PB": "1",
                "VLLM_USE_DEEP_GEMM": "0",
                "VLLM_USE_V2_MODEL_RUNNER": "1",
                "VLLM_USE_RUST_FRONTEND": "0",
            }
        ),
        required_env=("HF_TOKEN",),
        image="vllm/vllm-openai:kimi-k3",
        image_entrypoint=("vllm", "serve"),
        docker_options=_DOCKER_OPTIONS,
        mounts=(
            Mount(_HF_CACHE, "/root/.cache/huggingface"),
            Mount("$PWD/kimi-k3-runtime/runtime_patches", "/k3-runtime-patches", read_only=True),
        ),
        setup=(f"hf download {KIMI_K3_NVFP4} runtime_patches/sitecustomize.py --local-dir kimi-k3-runtime",),
        notes=tuple(notes),
        from_catalogue=True,
        kv_cache_dtype="fp8",
    )


def _kimi_k3_sglang(gpus: int | None, max_model_len: int | None, speculative: bool) -> Recipe:
    tp, notes = _kimi_k3_common(gpus, max_model_len)
    notes += [
        "no runtime patch; a pip-installed SGLang cannot load this checkpoint until SGLang PR "
        "#35077 is released: use the image",
        "--moe-runner-backend flashinfer_trtllm is required: automatic selection never takes the "
        "TRT-LLM deferred-finalize path and flashinfer_cutlass has no SiTU kernel",
        "--dcp-size splits the KV cache across the GPUs along the sequence",
        "the context is the checkpoint's own unless --context-length narrows it; tune it "
        "together with concurrency (`longctx plan`)",
    ]
    argv_list = [
        "sglang", "serve",
        "--trust-remote-code",
        "--model-path", KIMI_K3_NVFP4,
        "--served-model-name", "kimi-k3-nvfp4",
        "--tp-size", str(tp),
        "--dcp-size", str(tp),
        "--mem-fraction-static", "0.85",
        "--reasoning-parser", "kimi_k3",
        "--tool-call-parser", "kimi_k3",
        "--host", "0.0.0.0",
        "--port", "30000",
        "--moe-runner-backend", "flashinfer_trtllm",
    ]  # fmt: skip
    if max_model_len is not None:
        argv_list += ["--context-length", str(max_model_len)]
    if speculative:
        argv_list += [
            "--speculative-algorithm", "DSPARK",
            "--speculative-draft-model-path", "RadixArk/Kimi-K3-DSpark",
            "--speculative-dspark-block-size", "7",
            "--enable-linear-replayssm-spec",
        ]  # fmt: skip
        notes.append(
            "DSPARK speculative decoding is on (the cookbook default);"
            " --no-speculative (speculative=False) drops it"
        )
    argv_list += ["--enable-cache-report", "--enable-metrics"]
    notes.append("--enable-cache-report and --enable-metrics are added by longctx so it can report savings")
    return Recipe(
        model=KIMI_K3_NVFP4,
        engine="sglang",
        argv=tuple(argv_list),
        required_env=("HF_TOKEN",),
        image="lmsysorg/sglang:dev-dev-kimi-k3-nvfp4",
        docker_options=_DOCKER_OPTIONS,
        mounts=(Mount(_HF_CACHE, "/root/.cache/huggingface"),),
        notes=tuple(notes),
        from_catalogue=True,
    )


# The validated deployments, by model (lower case) and engine.
_CATALOGUE: dict[tuple[str, str], Callable[[int | None, int | None, bool], Recipe]] = {
    (KIMI_K3_NVFP4.lower(), "vllm"): _kimi_k3_vllm,
    (KIMI_K3_NVFP4.lower(), "sglang"): _kimi_k3_sglang,
}


_DOCKER_OPTIONS = ("--rm", "--gpus all", "--ipc=host", "--network=host", "--shm-size=64g")


@record_type
class _KVCacheRequest:
    """The KV cache asked for (one of :data:`RECIPE_KV_CACHE_DTYPES`) and the checkpoint's scales."""

    dtype: str
    scales: KVScales | None


@record_type
class _KVCacheChoice:
    """The KV cache a generic recipe launches, its flags, and what is said of it."""

    dtype: str
    flags: tuple[str, ...]
    notes: tuple[str, ...]
    warnings: tuple[str, ...] = ()


def _kv_cache_choice(request: _KVCacheRequest, switches: RecipeSwitches) -> _KVCacheChoice:
    """fp8 where asked, or where the recipe decides and the checkpoint has scales; else the model's type."""
    scales = request.scales or KVScales(None, "KV scales not looked for")
    dtype = recipe_kv_cache_dtype(scales) if request.dtype == "recipe" else request.dtype
    if dtype == "auto":
        if request.dtype == "auto":
            return _KVCacheChoice("auto", (), ("KV cache in the model's own type, as asked",))
        return _KVCacheChoice(
            "auto",
            (),
            (
                f"KV cache in the model's own type, not fp8: {scales.source}; "
                f"{switches.fp8_kv_unscaled}; --kv-cache-dtype fp8 asks for it anyway",
            ),
        )
    if scales.found:
        return _KVCacheChoice(
            "fp8",
            switches.fp8_kv,
            (
                f"fp8 KV cache halves KV memory against bf16: {scales.source}; "
                "check answer quality on your task",
            ),
        )
    return _KVCacheChoice(
        "fp8",
        switches.fp8_kv,
        (),
        (
            f"fp8 KV cache as asked, with no calibrated KV scales ({scales.source}): "
            f"{switches.fp8_kv_unscaled}",
        ),
    )


def _generic(
    model: str,
    engine: str,
    switches: RecipeSwitches,
    *,
    gpus: int,
    max_model_len: int | None,
    config: Mapping[str, Any],
    kv_cache: _KVCacheRequest,
) -> Recipe:
    kv = _kv_cache_choice(kv_cache, switches)
    # Reading the layout validates the config (and that gpus can split its heads).
    layout = kv_layout_from_config(config, kv_cache_dtype=kv.dtype)
    layout.token_bytes(gpus)
    layout.state_bytes(gpus)
    context = max_model_len or layout.max_context
    trust_remote_code = "auto_map" in config
    notes = [
        "generic recipe from config.json: the long-context switches, not validated on hardware",
        *kv.notes,
    ]
    if max_model_len is None and context is not None:
        notes.append(
            f"context set to the config's max_position_embeddings ({context:,}); KV memory grows with "
            "context x concurrency, so check it with `longctx plan` before serving many users"
        )
    if max_model_len is not None and layout.max_context is not None and max_model_len > layout.max_context:
        notes.append(
            f"max_model_len {max_model_len:,} is above the config's max_position_embeddings "
            f"{layout.max_context:,}: only valid with rope scaling that extends it"
        )
    if trust_remote_code:
        notes.append("the config has auto_map: --trust-remote-code runs the model repository's code")
    is_mla = any(g.kind is LayerKind.MLA for g in layout.groups)

    argv = [model if part == "{model}" else part for part in switches.launch]
    argv += [switches.tensor_parallel, str(gpus)]
    if context is not None:
        argv += [switches.context, str(context)]
    argv += kv.flags
    argv += switches.switches
    if switches.followup_switches:
        argv += switches.followup_switches
        notes.append(f"{' '.join(switches.followup_switches)}: {switches.followup_source}")
    if trust_remote_code:
        argv.append("--trust-remote-code")
    notes += switches.notes
    if is_mla and gpus > 1 and switches.mla_note:
        notes.append(switches.mla_note.format(gpus=gpus))
    return Recipe(
        model=model,
        engine=engine,
        argv=tuple(argv),
        notes=tuple(notes),
        from_catalogue=False,
        kv_cache_dtype=kv.dtype,
        warnings=kv.warnings,
    )


def _with_host_tier(recipe: Recipe, tier: HostTierRecipe, gib: float) -> Recipe:
    """``recipe`` with a KV tier of ``gib`` GiB in host memory (see docs/serving.md, "Host tiers")."""
    size = f"{gib:g}"
    notes = (
        f"host tier: {size} GiB of host memory keep prefix blocks the GPU evicted; a revisit loads "
        "them back over PCIe/NVLink instead of prefilling (`longctx plan --host-memory` for its tokens)",
        *tier.notes,
        "known wrong-output reports on offloaded hits under load (vLLM #31210, #45704; LMCache #4463, "
        "#4247; SGLang #39830): check a cached answer against a cold one before relying on it",
    )
    return dataclasses.replace(
        recipe,
        argv=(*recipe.argv, *(flag.format(size=size) for flag in tier.flags)),
        setup=(*recipe.setup, *(step.format(size=size) for step in tier.setup)),
        notes=(*recipe.notes, *notes),
    )


def _command_lines(command: tuple[str, ...], indent: str) -> list[str]:
    """The command split one option (with its values) per line, shell-quoted."""
    lines: list[str] = []
    current: list[str] = []
    for arg in command:
        if arg.startswith("--") and current:
            lines.append(" ".join(current))
            current = []
        current.append(shlex.quote(arg))
    if current:
        lines.append(" ".join(current))
    return [indent + line if i == 0 else indent + "  " + line for i, line in enumerate(lines)]
