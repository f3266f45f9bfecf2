"""``longctx doctor``, ``recipe`` and ``plan``: the server, how to launch one, what fits."""

from __future__ import annotations

import click

from longctx.cli.app import emit_json, main, note, runtime, server_options
from longctx.config import ServerOptions
from longctx.serving import kv_layout_from_config, load_model_config, plan_capacity, recipe_for


@main.command()
@server_options
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
@click.option("--no-probe", is_flag=True, help="Do not send the one-token probe request.")
def doctor(as_json: bool, no_probe: bool, server: ServerOptions) -> None:
    """Check the server: engine, window, prefix caching, cached-token reporting; name the flags to add."""
    backend = runtime().connect(server)
    try:
        diagnosis = backend.doctor(probe=not no_probe)
    finally:
        runtime().release(backend)
    if as_json:
        emit_json(diagnosis.to_dict())
    else:
        click.echo(diagnosis.to_text())


@main.command()
@click.argument("model")
@click.option("--engine", type=click.Choice(["vllm", "sglang"]), required=True)
@click.option("--gpus", type=int, help="GPUs for tensor parallelism.")
@click.option("--max-model-len", type=int, help="Context length to serve.")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True),
    help="The model's config.json (or folder), for a model outside the catalogue.",
)
def recipe(
    model: str, engine: str, gpus: int | None, max_model_len: int | None, config_path: str | None
) -> None:
    """The launch command and environment for MODEL on ENGINE."""
    config = load_model_config(config_path) if config_path else None
    result = recipe_for(model, engine, gpus=gpus, max_model_len=max_model_len, config=config)
    click.echo(result.to_text())
    for line in result.notes:
        note(f"note: {line}")


@main.command()
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(exists=True),
    help="The model's config.json (or its folder).",
)
@click.option(
    "--kv-cache-dtype", type=click.Choice(["auto", "bf16", "fp16", "fp8"]), default="auto", show_default=True
)
@click.option("--gpus", type=int, default=1, show_default=True)
@click.option("--gpu-memory", type=float, help="GiB per GPU.")
@click.option("--weights", type=float, help="GiB of weights in all (split over the GPUs).")
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
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout.")
def plan(
    config_path: str,
    kv_cache_dtype: str,
    gpus: int,
    gpu_memory: float | None,
    weights: float | None,
    kv_memory: float | None,
    dcp: int,
    contexts: tuple[int, ...],
    concurrencies: tuple[int, ...],
    as_json: bool,
) -> None:
    """KV-cache memory per token and sequence, and what fits: longest context, highest concurrency."""
    layout = kv_layout_from_config(load_model_config(config_path), kv_cache_dtype=kv_cache_dtype)
    result = plan_capacity(
        layout,
        gpus=gpus,
        gpu_memory_gib=gpu_memory,
        weights_gib=weights,
        kv_memory_gib=kv_memory,
        dcp=dcp,
        contexts=list(contexts) or None,
        concurrencies=list(concurrencies) or None,
    )
    if as_json:
        emit_json(result.to_dict())
    else:
        click.echo(result.to_text())
