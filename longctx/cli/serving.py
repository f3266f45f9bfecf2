"""``longctx doctor``, ``recipe`` and ``plan``: the server, how to launch one, what fits."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import click

from longctx.backends import recipe_engines, recipe_host_tiers
from longctx.cli.app import (
    EXIT_NO_PREFIX_CACHE,
    emit_json,
    exit_code,
    main,
    note,
    progress,
    runtime,
    server_options,
)
from longctx.errors import BackendError, CanaryDiverged, ConfigError, LongctxError, ServingConfigError
from longctx.options import RequestOptions, ServerOptions
from longctx.serving import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    RECIPE_KV_CACHE_DTYPES,
    KVScales,
    PlannedPack,
    diagnose,
    find_kv_scales,
    known_model,
    known_models,
    kv_layout_from_config,
    load_model_config,
    plan_capacity,
    recipe_for,
    recipe_kv_cache_dtype,
)

# The planner's argument names, as `plan`'s flags: its errors name what the user typed.
_PLAN_FLAGS = {
    "gpu_memory_gib": "--gpu-memory",
    "weights_gib": "--weights",
    "kv_memory_gib": "--kv-memory",
    "gpu_memory": "--gpu-memory",
    "kv_memory": "--kv-memory",
    "host_memory": "--host-memory",
    "weights": "--weights",
    "utilization": "--gpu-memory-utilization",
    "gpus": "--gpus",
    "dcp": "--dcp",
    "concurrency": "--concurrency",
    "context": "--context",
}


@main.command()
@server_options
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout (also when a server fails).")
@click.option("--no-probe", is_flag=True, help="Do not send the one-token probe request.")
@click.option(
    "--canary",
    "with_canary",
    is_flag=True,
    help="Also check that a cached answer equals a cold one (greedy, with logprobs); exit 10 if not.",
)
@click.option(
    "--canary-host-tier",
    is_flag=True,
    help="With --canary: fill the device cache first, so the probe is read back from the host tier.",
)
@click.option(
    "--cache-salt",
    help="The cache_salt your sessions use: a router policy that ignores salted requests is flagged.",
)
@click.option(
    "--canary-fill-tokens",
    type=click.IntRange(min=1),
    help="Tokens to fill the device cache with (default: 1.25 x the KV cache the server reports).",
)
def doctor(
    as_json: bool,
    no_probe: bool,
    with_canary: bool,
    canary_host_tier: bool,
    canary_fill_tokens: int | None,
    cache_salt: str | None,
    server: ServerOptions,
) -> None:
    """Check each server: engine, window, prefix caching, cached-token reporting; name the flags to add.

    Several replica URLs are checked one by one; a replica that fails is
    reported in one line and the others are still checked. With
    --canary each is also asked a probe cold and from its cache; a
    cached answer that diverges prints both outputs and exits with 10. A
    server that reports prefix caching off exits with 11: nothing longctx
    sends can be reused there.
    """
    # Imported here: recipe and plan never connect to a server.
    from longctx.verification import CanaryOptions, canary

    canary_options = (
        CanaryOptions(host_tier=canary_host_tier, fill_tokens=canary_fill_tokens) if with_canary else None
    )
    given = runtime().backend
    targets = [server] if given is not None else [replace(server, base_url=url) for url in server.base_urls()]
    reports: list[dict[str, Any]] = []
    texts: list[str] = []
    failure: LongctxError | None = None
    caching_off: list[str] = []
    for target in targets:
        url = ", ".join(target.base_urls()) if given is None else "the given server"
        try:
            with progress(not as_json) as say:
                say(f"checking {url}")
                backend = runtime().connect(target)
                try:
                    diagnosis = diagnose(
                        backend, probe=not no_probe, request=RequestOptions(cache_salt=cache_salt)
                    )
                    result = canary(backend, options=canary_options) if canary_options else None
                finally:
                    runtime().release(backend)
        except LongctxError as error:
            failure = failure or error
            line = _one_line(error)
            reports.append({"url": url, "ok": False, "error": line, "exit_code": exit_code(error)})
            texts.append(f"{url}: {line}")
            continue
        reports.append({"url": url, **diagnosis.to_dict()})
        texts.append(diagnosis.to_text())
        caching_off.extend(diagnosis.caching_off)
        if result is not None:
            reports[-1]["canary"] = result.to_dict()
            reports[-1]["ok"] = reports[-1]["ok"] and not result.diverged
            texts.append(result.to_text())
            if result.diverged:
                failure = failure or CanaryDiverged(f"{url}: the cache canary diverged", result=result)
    if as_json:
        emit_json({"ok": failure is None and all(r["ok"] for r in reports), "replicas": reports})
    else:
        click.echo("\n".join(texts))
    if failure is not None:
        sys.exit(exit_code(failure))
    if caching_off:
        # The one fact that decides every saving: said last, on stderr, and in the exit code.
        note(f"longctx: error: prefix caching is OFF on {', '.join(caching_off)}: no request reuses a prefix")
        sys.exit(EXIT_NO_PREFIX_CACHE)


def _one_line(error: LongctxError) -> str:
    """What went wrong, in one line: a server that is not an LLM server is named as such, not dumped."""
    body = getattr(error, "body", None)
    status = getattr(error, "status", None)
    if isinstance(error, BackendError) and body and not body.lstrip().startswith(("{", "[")):
        kind = "an HTML page" if "<html" in body[:500].lower() else "text that is not JSON"
        return (
            f"this is not an OpenAI-compatible LLM server: it answered HTTP {status} with {kind}; "
            "check the URL (host, port, and the /v1 path)"
        )
    return str(error).splitlines()[0] if str(error) else type(error).__name__


@main.command()
@click.argument("model")
@click.option("--engine", type=click.Choice(recipe_engines()), required=True)
@click.option("--gpus", type=int, help="GPUs for tensor parallelism.")
@click.option("--max-model-len", type=int, help="Context length to serve.")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True),
    help="The model's config.json (or folder), for a model outside the catalogue.",
)
@click.option(
    "--speculative/--no-speculative",
    default=True,
    show_default=True,
    help="Keep the catalogue's speculative decoding where it has one (SGLang DSPARK for Kimi K3).",
)
@click.option(
    "--host-tier",
    type=click.Choice(recipe_host_tiers()),
    help="A KV tier in host memory: vLLM native or lmcache, SGLang hicache.",
)
@click.option("--host-memory", type=float, help="GiB of host memory for --host-tier (the whole server's).")
@click.option(
    "--kv-cache-dtype",
    type=click.Choice(RECIPE_KV_CACHE_DTYPES),
    default="recipe",
    show_default=True,
    help="recipe: fp8 where the checkpoint next to --config carries calibrated KV scales, else the"
    " model's own type; fp8: fp8 anyway (warns without scales); auto: the model's own type.",
)
def recipe(
    model: str,
    engine: str,
    gpus: int | None,
    max_model_len: int | None,
    config_path: str | None,
    speculative: bool,
    host_tier: str | None,
    host_memory: float | None,
    kv_cache_dtype: str,
) -> None:
    """The launch command and environment for MODEL on ENGINE.

    The KV cache is fp8 only where the checkpoint carries calibrated KV
    scales (config.json's quantization_config, or k_scale/v_scale tensors
    in the safetensors beside it); otherwise the model's own type, and a
    note says why.
    """
    config = load_model_config(config_path) if config_path else None
    scales = find_kv_scales(config, config_path) if config is not None else None
    result = recipe_for(
        model,
        engine,
        gpus=gpus,
        max_model_len=max_model_len,
        config=config,
        speculative=speculative,
        host_tier=host_tier,
        host_memory_gib=host_memory,
        kv_cache_dtype=kv_cache_dtype,
        kv_scales=scales,
    )
    click.echo(result.to_text())
    for line in result.warnings:
        note(f"warning: {line}")
    for line in result.notes:
        note(f"note: {line}")


@main.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True),
    help="The model's config.json (or its folder).",
)
@click.option("--model", help="A popular long-context model by name, instead of --config (see `recipe`).")
@click.option(
    "--kv-cache-dtype",
    type=click.Choice(["recipe", "auto", "bf16", "fp16", "fp8"]),
    default="recipe",
    show_default=True,
    help="recipe: the KV cache `longctx recipe` launches (fp8 where the checkpoint beside --config"
    " carries calibrated KV scales, else the model's own type); auto: the model's own type"
    " (the engines' default when the server is started without --kv-cache-dtype).",
)
@click.option("--gpus", type=int, default=1, show_default=True)
@click.option("--gpu-memory", type=float, help="GiB per GPU.")
@click.option("--weights", type=float, help="GiB of weights in all (split over the GPUs).")
@click.option(
    "--gpu-memory-utilization",
    "utilization",
    type=float,
    default=DEFAULT_GPU_MEMORY_UTILIZATION,
    show_default=True,
    help="The share of each GPU the server may use: vLLM's --gpu-memory-utilization "
    "(SGLang: --mem-fraction-static).",
)
@click.option(
    "--kv-memory", type=float, help="GiB of KV cache per GPU, as the server logs it (overrides the estimate)."
)
@click.option("--dcp", type=int, default=1, show_default=True, help="SGLang decode context parallelism.")
@click.option(
    "--context", "contexts", type=int, multiple=True, help="Context lengths to answer for (repeatable)."
)
@click.option(
    "--concurrency",
    "concurrencies",
    type=int,
    multiple=True,
    help="Concurrencies to answer for (repeatable).",
)
@click.option(
    "--host-memory",
    type=float,
    help="GiB of host memory for KV offloading, the whole replica's (vLLM --kv-offloading-size).",
)
@click.option(
    "--pack",
    "pack_json",
    type=click.Path(exists=True, dir_okay=False),
    help="A pack's summary (`longctx pack --json`): plan for its context, image tokens included.",
)
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
def plan(
    config_path: str | None,
    model: str | None,
    kv_cache_dtype: str,
    gpus: int,
    gpu_memory: float | None,
    weights: float | None,
    utilization: float,
    kv_memory: float | None,
    dcp: int,
    contexts: tuple[int, ...],
    concurrencies: tuple[int, ...],
    host_memory: float | None,
    pack_json: str | None,
    as_json: bool,
) -> None:
    """KV-cache memory per token and sequence, and what fits: longest context, highest concurrency.

    Without --gpu-memory and --weights (or a measured --kv-memory) it gives
    the bytes per token and per sequence only. With --pack, the pack's whole
    context (text, template and image tokens, as the pack counted them) is
    one of the contexts answered for.
    """
    planned = PlannedPack.read(pack_json) if pack_json is not None else None
    if planned is not None:
        contexts = (planned.total_tokens, *contexts)
        note(planned.line())
    config = _plan_config(config_path, model)
    if kv_cache_dtype == "recipe":
        if config_path is not None:
            scales = find_kv_scales(config, config_path)
        else:
            scales = KVScales(None, "a model known by name only: no checkpoint to read its KV scales from")
        kv_cache_dtype = recipe_kv_cache_dtype(scales)
        found = "calibrated KV scales" if scales.found else "no calibrated KV scales"
        shown = "fp8" if kv_cache_dtype == "fp8" else "auto (the model's own type)"
        note(f"KV cache {shown}, as `longctx recipe` launches it: {found} ({scales.source})")
    layout = kv_layout_from_config(config, kv_cache_dtype=kv_cache_dtype)
    try:
        result = plan_capacity(
            layout,
            gpus=gpus,
            gpu_memory_gib=gpu_memory,
            weights_gib=weights,
            utilization=utilization,
            kv_memory_gib=kv_memory,
            dcp=dcp,
            contexts=list(contexts) or None,
            concurrencies=list(concurrencies) or None,
            host_memory_gib=host_memory,
        )
    except ServingConfigError as error:
        raise _naming_flags(error) from None
    if as_json:
        emit_json({**result.to_dict(), **({"pack": planned.to_dict()} if planned else {})})
    else:
        click.echo(result.to_text())


def _plan_config(config_path: str | None, model: str | None) -> Mapping[str, Any]:
    if (config_path is None) == (model is None):
        raise ConfigError("give the model's --config FILE or a known --model NAME (one of them)")
    if config_path is not None:
        return load_model_config(config_path)
    assert model is not None
    known = known_model(model)
    if known is None:
        raise ConfigError(
            f"--model {model!r} is not in the table ({', '.join(known_models())}); give its --config FILE"
        )
    return known.config


def _naming_flags(error: ServingConfigError) -> ServingConfigError:
    """``error`` with the planner's argument names replaced by the flags of ``plan``."""
    message = str(error)
    for name in ("gpu_memory_gib", "weights_gib", "kv_memory_gib"):
        message = re.sub(rf"\b{name}\b", _PLAN_FLAGS[name], message)
    field = error.field or ""
    if field in _PLAN_FLAGS and message.startswith(f"{field} "):
        message = _PLAN_FLAGS[field] + message[len(field) :]
    error.args = (message,)
    return error
