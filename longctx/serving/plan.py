"""Capacity planning: how much context, at how much concurrency, fits the KV cache.

Memory model, per GPU of one tensor-parallel replica::

    kv_memory = gpu_memory x utilization - weights / gpus - reserve

``utilization`` is vLLM's ``--gpu-memory-utilization`` (0.92 by default in
vLLM 0.32; older releases used 0.90): the share of the GPU the instance may
use for weights, activations and KV cache. ``reserve`` stands for what vLLM
measures at start-up besides the weights (peak activations of one
``--max-num-batched-tokens`` step, CUDA graphs, communication buffers); 4 GiB
is a rough allowance, not a measurement. The weights are assumed to split
evenly over the GPUs. For an exact plan, pass the "Available KV cache memory"
vLLM logs at start-up as ``kv_memory_gib``. For SGLang, pass
``--mem-fraction-static`` as ``utilization`` and a reserve of 0: that fraction
already covers only weights and KV pool.

One sequence of ``L`` tokens holds, per GPU, ``ceil(L / dcp)`` tokens of every
full-attention and MLA layer rounded up to whole blocks, ``min(L, window)``
tokens of every sliding-window layer, and the fixed state of every
linear-attention layer (see :mod:`longctx.serving.kv`). ``c`` sequences of
``L`` tokens fit when ``c x sequence_bytes(L) <= kv_memory``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

from longctx.errors import InsufficientMemory, ServingConfigError
from longctx.recordtypes import record_type
from longctx.serving.kv import KVLayout, LayerKind
from longctx.serving.tiers import HostTierPlan, plan_host_tier

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "DEFAULT_RESERVE_GIB",
    "CapacityPlan",
    "ConcurrencyAnswer",
    "ContextAnswer",
    "plan_capacity",
]

DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
DEFAULT_RESERVE_GIB = 4.0
DEFAULT_BLOCK_SIZE = 16

_GIB = 1 << 30
# Far beyond any model's window: the search ceiling for "memory never runs out".
_SEARCH_CEILING = 1 << 40
_DEFAULT_CONTEXTS = (8_192, 32_768, 131_072, 262_144, 524_288, 1_048_576)
_DEFAULT_CONCURRENCIES = (1, 8, 32, 128)
_HOST_TIER_NOTE = (
    "host tier: a revisit of a pack parked there costs a transfer over PCIe/NVLink, not a prefill; "
    "the GPU still bounds the packs in flight at once"
)


@record_type
class ContextAnswer:
    """How many sequences of ``context_tokens`` tokens fit at once.

    ``shortfall_bytes`` is how much KV memory per GPU one such sequence lacks
    (0 when at least one fits); ``beyond_model_limit`` is true when the context
    exceeds the config's ``max_position_embeddings``. ``max_concurrency`` is
    None for a plan made without any memory figure (bytes only).
    """

    context_tokens: int
    sequence_bytes_per_gpu: int
    max_concurrency: int | None
    shortfall_bytes: int
    beyond_model_limit: bool


@record_type
class ConcurrencyAnswer:
    """The longest context that ``concurrency`` sequences can each have at once.

    ``memory_max_context_tokens`` is what memory allows (``None`` when memory
    never runs out: only fixed-state and sliding-window layers grow, and they
    stop); ``max_context_tokens`` is that, capped at the model's limit when the
    config states one; ``limited_by`` says which bound applies (``"none"``
    when neither does).
    """

    concurrency: int
    max_context_tokens: int | None
    memory_max_context_tokens: int | None
    limited_by: Literal["memory", "model", "none"]


@record_type
class CapacityPlan:
    """The answer of :func:`plan_capacity`; every byte count is per GPU.

    ``token_bytes_per_gpu`` is what one token of context costs a GPU in
    full-attention and MLA layers when that GPU holds it (with DCP each GPU
    holds 1/``dcp`` of the tokens); ``window_token_bytes_per_gpu`` the same for
    sliding-window layers; ``state_bytes_per_gpu`` the fixed linear-attention
    state of one sequence. The memory inputs are ``None`` when the plan was
    made from a measured ``kv_memory_per_gpu_bytes``; that too is ``None``
    (and ``at_concurrency`` empty) for a plan made without any memory figure,
    which gives the bytes per token and per sequence only.
    """

    layout: KVLayout
    gpus: int
    dcp: int
    block_size: int
    gpu_memory_bytes: int | None
    utilization: float | None
    weights_per_gpu_bytes: int | None
    reserve_per_gpu_bytes: int | None
    kv_memory_per_gpu_bytes: int | None
    token_bytes_per_gpu: int
    window_token_bytes_per_gpu: int
    state_bytes_per_gpu: int
    at_context: tuple[ContextAnswer, ...]
    at_concurrency: tuple[ConcurrencyAnswer, ...]
    notes: tuple[str, ...]
    #: The host tier beside the GPUs (``host_memory_gib`` given): its tokens and the packs each tier holds.
    host_tier: HostTierPlan | None = None

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain JSON-ready data (enums as their values)."""

        def factory(items: list[tuple[str, Any]]) -> dict[str, Any]:
            return {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in items}

        return dataclasses.asdict(self, dict_factory=factory)

    def to_text(self) -> str:
        """A human-readable report: inputs, per-token costs, the two answer tables, notes."""
        lines = [*self._model_lines(), *self._per_gpu_lines(), *self._at_context_table()]
        if self.kv_memory_per_gpu_bytes is not None:
            lines += self._context_at_concurrency_table()
        if self.host_tier is not None:
            lines.append(self.host_tier.to_text())
        if self.notes:
            lines += ["Notes:", *[f"  - {note}" for note in self.notes]]
        return "\n".join(lines)

    def _model_lines(self) -> list[str]:
        """The report's head: the model, its KV cache type and limit, then its layers."""
        layout = self.layout
        name = layout.model_type or "model"
        if layout.architecture:
            name += f" ({layout.architecture})"
        lines = [
            f"Model: {name}, {layout.num_layers} layers, KV cache {layout.kv_cache_dtype}"
            + (f", model limit {layout.max_context:,} tokens" if layout.max_context else ""),
            "Layers (whole model, one copy):",
        ]
        lines += ["  " + line for line in layout.to_text().splitlines()]
        return lines

    def _per_gpu_lines(self) -> list[str]:
        """What one GPU has for the KV cache (and how that was reached) and what a token costs it."""
        lines = [
            f"Per GPU (tensor parallel {self.gpus}, decode context parallel {self.dcp}, "
            f"blocks of {self.block_size} tokens):"
        ]
        kv_memory = self.kv_memory_per_gpu_bytes
        kv_line = (
            f"  KV memory           : {_format_bytes(kv_memory) if kv_memory is not None else 'not given'}"
        )
        if kv_memory is None:
            kv_line += "  (--gpu-memory and --weights, or --kv-memory, say what fits)"
        elif self.gpu_memory_bytes is not None and self.utilization is not None:
            kv_line += (
                f"  (= {_format_bytes(self.gpu_memory_bytes)} x {self.utilization:g}"
                f" - {_format_bytes(self.weights_per_gpu_bytes or 0)} weights"
                f" - {_format_bytes(self.reserve_per_gpu_bytes or 0)} reserve)"
            )
        else:
            kv_line += "  (measured, as given)"
        lines.append(kv_line)
        lines.append(f"  per token held      : {self.token_bytes_per_gpu:,} bytes ({self._growing_layers()})")
        if self.window_token_bytes_per_gpu:
            lines.append(
                f"  per window token    : {self.window_token_bytes_per_gpu:,} bytes (sliding-window layers)"
            )
        if self.state_bytes_per_gpu:
            lines.append(
                f"  per sequence, fixed : {_format_bytes(self.state_bytes_per_gpu)} (linear-attention state)"
            )
        return lines

    def _growing_layers(self) -> str:
        """The kinds of layer whose KV grows with the context, among those this model has."""
        kinds = {group.kind for group in self.layout.groups}
        named = [
            name
            for kind, name in ((LayerKind.ATTENTION, "full attention"), (LayerKind.MLA, "MLA"))
            if kind in kinds
        ]
        return " and ".join(named) or "no layer grows with the context"

    def _at_context_table(self) -> list[str]:
        """The first answer: how many sequences fit at each context (without a memory figure, their bytes)."""
        fitted = self.kv_memory_per_gpu_bytes is not None
        if fitted:
            lines = ["Highest concurrency at a given context:"]
            lines.append(f"  {'context':>11}  {'per sequence':>12}  {'sequences':>9}")
        else:
            lines = ["Bytes per sequence at a given context:", f"  {'context':>11}  {'per sequence':>12}"]
        for row in self.at_context:
            line = f"  {row.context_tokens:>11,}  {_format_bytes(row.sequence_bytes_per_gpu):>12}"
            if fitted:
                line += f"  {row.max_concurrency or 0:>9,}"
                if row.max_concurrency == 0:
                    line += f"  (one sequence is {_format_bytes(row.shortfall_bytes)} short)"
            if row.beyond_model_limit:
                line += "  (beyond the model's limit)"
            lines.append(line)
        return lines

    def _context_at_concurrency_table(self) -> list[str]:
        """The second answer: the longest context each concurrency allows, and what bounds it."""
        lines = ["Longest context at a given concurrency:", f"  {'sequences':>9}  {'context':>11}"]
        for answer in self.at_concurrency:
            if answer.max_context_tokens is None:
                text = "unbounded by memory"
            else:
                text = f"{answer.max_context_tokens:>11,}"
            if answer.limited_by == "model" and answer.memory_max_context_tokens is not None:
                text += f"  (model limit; memory allows {answer.memory_max_context_tokens:,})"
            elif answer.limited_by == "model":
                text += "  (model limit; memory never runs out)"
            elif answer.max_context_tokens == 0:
                text += "  (does not fit)"
            lines.append(f"  {answer.concurrency:>9,}  {text}")
        return lines


def plan_capacity(
    layout: KVLayout,
    *,
    gpus: int = 1,
    gpu_memory_gib: float | None = None,
    weights_gib: float | None = None,
    utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    reserve_gib: float = DEFAULT_RESERVE_GIB,
    kv_memory_gib: float | None = None,
    dcp: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
    contexts: Sequence[int] | None = None,
    concurrencies: Sequence[int] | None = None,
    host_memory_gib: float | None = None,
) -> CapacityPlan:
    """Answer both capacity questions for one replica over ``gpus`` GPUs.

    ``gpus`` is the tensor-parallel size, ``dcp`` the decode-context-parallel
    size (it must divide ``gpus``). Give either ``gpu_memory_gib`` (per GPU)
    and ``weights_gib`` (the whole model), or a measured ``kv_memory_gib``
    (per GPU), which then wins; given none of them, the plan holds the bytes
    per token and per sequence only. ``utilization`` is vLLM's
    ``--gpu-memory-utilization`` (SGLang's ``--mem-fraction-static``) the
    server runs with. ``contexts`` defaults to powers of two up to
    the model's limit, ``concurrencies`` to 1, 8, 32 and 128.
    ``host_memory_gib`` is a host tier's size for the whole replica (vLLM's
    ``--kv-offloading-size``): the plan then says how many tokens it holds and
    how many packs of each context each tier keeps (:mod:`longctx.serving.tiers`).

    Raises :class:`InsufficientMemory` when no memory is left for the KV cache
    (naming the shortfall) and :class:`ServingConfigError` for invalid inputs,
    including a ``gpus`` that cannot split the model's heads.
    """
    _require_int(gpus, "gpus")
    _require_int(dcp, "dcp")
    _require_int(block_size, "block_size")
    # Validates tp/dcp and head splitting once, with clear errors.
    token_bytes = layout.token_bytes(gpus)
    window_bytes = layout.window_token_bytes(gpus)
    state_bytes = layout.state_bytes(gpus)
    layout.sequence_bytes(1, tp=gpus, dcp=dcp, block_size=block_size)

    memory = _kv_memory(gpus, gpu_memory_gib, weights_gib, utilization, reserve_gib, kv_memory_gib)
    context_list = _contexts(contexts, layout.max_context)
    concurrency_list = _positive_ints(concurrencies or _DEFAULT_CONCURRENCIES, "concurrency")

    sequence_bytes = functools.partial(layout.sequence_bytes, tp=gpus, dcp=dcp, block_size=block_size)
    kv_memory = memory.kv_memory_per_gpu_bytes
    notes = [*layout.notes, *memory.notes, *_layout_notes(layout, gpus=gpus, dcp=dcp, block_size=block_size)]
    host_tier = _host_tier(
        layout, host_memory_gib, gpus=gpus, block_size=block_size, contexts=context_list, kv_memory=kv_memory
    )
    notes += [_HOST_TIER_NOTE] if host_tier is not None else []

    return CapacityPlan(
        layout=layout,
        gpus=gpus,
        dcp=dcp,
        block_size=block_size,
        gpu_memory_bytes=memory.gpu_memory_bytes,
        utilization=memory.utilization,
        weights_per_gpu_bytes=memory.weights_per_gpu_bytes,
        reserve_per_gpu_bytes=memory.reserve_per_gpu_bytes,
        kv_memory_per_gpu_bytes=kv_memory,
        token_bytes_per_gpu=token_bytes,
        window_token_bytes_per_gpu=window_bytes,
        state_bytes_per_gpu=state_bytes,
        at_context=_answers_at_context(layout, context_list, sequence_bytes, kv_memory),
        at_concurrency=_answers_at_concurrency(layout, concurrency_list, sequence_bytes, kv_memory),
        notes=tuple(notes),
        host_tier=host_tier,
    )


@record_type
class _KVMemory:
    """The KV memory of one GPU and what it came from; the inputs are ``None`` where not used."""

    kv_memory_per_gpu_bytes: int | None
    notes: tuple[str, ...]
    gpu_memory_bytes: int | None = None
    utilization: float | None = None
    weights_per_gpu_bytes: int | None = None
    reserve_per_gpu_bytes: int | None = None


def _kv_memory(  # noqa: PLR0917 - one call, its arguments plan_capacity's own, in their order
    gpus: int,
    gpu_memory_gib: float | None,
    weights_gib: float | None,
    utilization: float,
    reserve_gib: float,
    kv_memory_gib: float | None,
) -> _KVMemory:
    """The KV memory per GPU: none given, a measured figure, or GPU memory less weights and reserve."""
    if kv_memory_gib is None and gpu_memory_gib is None and weights_gib is None:
        return _KVMemory(None, ("no memory figure given: bytes per token and per sequence only",))
    if kv_memory_gib is not None:
        kv_memory = _gib_to_bytes(kv_memory_gib, "kv_memory")
        if kv_memory == 0:
            raise InsufficientMemory("the KV memory given is 0", shortfall_bytes=0, field="kv_memory")
        if gpu_memory_gib is not None or weights_gib is not None:
            return _KVMemory(kv_memory, ("measured KV memory given: GPU memory and weights were not used",))
        return _KVMemory(kv_memory, ())
    if gpu_memory_gib is None:
        raise ServingConfigError(
            "give the memory of one GPU (gpu_memory_gib) as well as the weights (weights_gib), "
            "or a measured KV memory (kv_memory_gib)",
            field="gpu_memory",
        )
    if weights_gib is None:
        raise ServingConfigError(
            "give the size of the model weights (weights_gib) as well as the memory of one GPU "
            "(gpu_memory_gib), or a measured KV memory (kv_memory_gib)",
            field="weights",
        )
    if not 0 < utilization <= 1:
        raise ServingConfigError(f"utilization must be in (0, 1], got {utilization}", field="utilization")
    gpu_memory_bytes = _gib_to_bytes(gpu_memory_gib, "gpu_memory")
    weights_per_gpu = _gib_to_bytes(weights_gib, "weights") // gpus
    reserve_bytes = _gib_to_bytes(reserve_gib, "reserve")
    budget = int(gpu_memory_bytes * utilization)
    kv_memory = budget - weights_per_gpu - reserve_bytes
    if kv_memory <= 0:
        shortfall = -kv_memory
        raise InsufficientMemory(
            f"no memory left for the KV cache: weights {_format_bytes(weights_per_gpu)} per GPU "
            f"({weights_gib:g} GiB over {gpus} GPUs) + reserve {_format_bytes(reserve_bytes)} "
            f"exceed the {_format_bytes(budget)} usable per GPU ({utilization:g} x "
            f"{gpu_memory_gib:g} GiB) by {_format_bytes(shortfall)}; use more or larger GPUs",
            shortfall_bytes=shortfall,
            field="gpu_memory",
        )
    note = (
        f"KV memory = GPU memory x {utilization:g} - weights / {gpus} - "
        f"{reserve_gib:g} GiB reserve (an allowance for activations and CUDA graphs; "
        "vLLM logs the measured 'Available KV cache memory' at start-up)"
    )
    return _KVMemory(kv_memory, (note,), gpu_memory_bytes, utilization, weights_per_gpu, reserve_bytes)


def _answers_at_context(
    layout: KVLayout, contexts: Sequence[int], sequence_bytes: Callable[[int], int], kv_memory: int | None
) -> tuple[ContextAnswer, ...]:
    """The first question's answers: how many sequences of each context fit (None without a memory figure)."""
    answers = []
    for context in contexts:
        per_sequence = sequence_bytes(context)
        answers.append(
            ContextAnswer(
                context_tokens=context,
                sequence_bytes_per_gpu=per_sequence,
                max_concurrency=kv_memory // per_sequence if kv_memory is not None else None,
                shortfall_bytes=max(per_sequence - kv_memory, 0) if kv_memory is not None else 0,
                beyond_model_limit=layout.max_context is not None and context > layout.max_context,
            )
        )
    return tuple(answers)


def _answers_at_concurrency(
    layout: KVLayout,
    concurrencies: Sequence[int],
    sequence_bytes: Callable[[int], int],
    kv_memory: int | None,
) -> tuple[ConcurrencyAnswer, ...]:
    """The longest context at each concurrency and what bounds it; none without a memory figure."""
    if kv_memory is None:
        return ()
    answers = []
    for concurrency in concurrencies:
        memory_max = _longest_context(sequence_bytes, concurrency, kv_memory)
        model_max = layout.max_context
        limited_by: Literal["memory", "model", "none"]
        if model_max is not None and (memory_max is None or memory_max > model_max):
            best: int | None = model_max
            limited_by = "model"
        elif memory_max is None:
            best, limited_by = None, "none"
        else:
            best, limited_by = memory_max, "memory"
        answers.append(
            ConcurrencyAnswer(
                concurrency=concurrency,
                max_context_tokens=best,
                memory_max_context_tokens=memory_max,
                limited_by=limited_by,
            )
        )
    return tuple(answers)


def _host_tier(
    layout: KVLayout,
    host_memory_gib: float | None,
    *,
    gpus: int,
    block_size: int,
    contexts: Sequence[int],
    kv_memory: int | None,
) -> HostTierPlan | None:
    """The host tier beside the GPUs, or None where no host memory was given."""
    if host_memory_gib is None:
        return None
    host_bytes = _gib_to_bytes(host_memory_gib, "host_memory")
    return plan_host_tier(
        layout,
        gpus=gpus,
        host_memory_gib=host_bytes / _GIB,
        block_size=block_size,
        contexts=contexts,
        gpu_kv_bytes_per_gpu=kv_memory,
    )


def _layout_notes(layout: KVLayout, *, gpus: int, dcp: int, block_size: int) -> list[str]:
    """What the reader of a plan should know about blocks, DCP, MLA and the engine's own cap."""
    notes = []
    if block_size > 1:
        notes.append(f"tokens are held in whole blocks of {block_size} (vLLM's default block size is 16)")
    if dcp > 1 and any(g.kind is LayerKind.SLIDING for g in layout.groups):
        notes.append("sliding-window layers are not split by DCP here; engines may refuse DCP with them")
    if any(g.kind is LayerKind.MLA for g in layout.groups) and gpus > 1 and dcp == 1:
        notes.append(
            f"every GPU holds the whole MLA latent cache; decode context parallelism "
            f"(SGLang --dcp-size, vLLM --decode-context-parallel-size) up to {gpus} divides it"
        )
    notes.append("the engine also caps running requests (vLLM --max-num-seqs, SGLang --max-running-requests)")
    return notes


def _longest_context(sequence_bytes: Callable[[int], int], concurrency: int, kv_memory: int) -> int | None:
    """Largest L with concurrency x sequence_bytes(L) <= kv_memory; None if no L is too large."""
    if concurrency * sequence_bytes(_SEARCH_CEILING) <= kv_memory:
        return None
    if concurrency * sequence_bytes(1) > kv_memory:
        return 0
    fits, too_big = 1, _SEARCH_CEILING
    while too_big - fits > 1:
        middle = (fits + too_big) // 2
        if concurrency * sequence_bytes(middle) <= kv_memory:
            fits = middle
        else:
            too_big = middle
    return fits


def _contexts(contexts: Sequence[int] | None, model_max: int | None) -> list[int]:
    if contexts is not None:
        return _positive_ints(contexts, "context")
    chosen = [c for c in _DEFAULT_CONTEXTS if model_max is None or c <= model_max]
    if model_max is not None and model_max not in chosen:
        chosen.append(model_max)
    return chosen


def _positive_ints(values: Sequence[int], field: str) -> list[int]:
    for value in values:
        _require_int(value, field)
    return list(values)


def _require_int(value: int, field: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ServingConfigError(f"{field} must be a positive integer, got {value!r}", field=field)


def _gib_to_bytes(gib: float, field: str) -> int:
    if isinstance(gib, bool) or not isinstance(gib, (int, float)) or gib < 0 or not math.isfinite(gib):
        raise ServingConfigError(f"{field} must be a non-negative number of GiB, got {gib!r}", field=field)
    return round(gib * _GIB)


def _format_bytes(count: int) -> str:
    for unit, size in (("GiB", _GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:,.2f} {unit}"
    return f"{count:,} B"
