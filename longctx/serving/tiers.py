"""The host tier in a capacity plan: how many tokens and packs host memory holds beside the GPU.

An engine with KV offloading (vLLM ``--kv-offloading-backend native
--kv-offloading-size GiB``, LMCache's L1, SGLang ``--hicache-size``) keeps
evicted prefix blocks in host memory. One token there costs what it costs
on the GPUs of the replica together:

- full-attention and sliding-window layers are split over tensor-parallel
  ranks by heads, and every rank offloads its own share: the replica's
  bytes are the per-GPU bytes times the GPUs;
- MLA layers hold the whole latent on every rank; vLLM offloads one copy
  (its "replicated layout"), so they count once;
- linear-attention (KDA, Gated DeltaNet) state is split by heads, a fixed
  amount per sequence, counted once per pack.

vLLM sizes its host tier in chunks of whole GPU blocks, each padded to the
page size (4 KiB): ``tokens = floor(bytes / round_up(block_bytes, 4096)) x
block`` (``CPUOffloadingSpec`` in vLLM 0.32). Hybrid models are approximate:
vLLM pads linear-state pages to the attention page size, not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence

from longctx.recordtypes import record_type
from longctx.serving.kv import KVLayout, LayerKind

__all__ = ["HostTierPlan", "TierAnswer", "host_token_bytes", "plan_host_tier"]

_PAGE = 4096
_GIB = 1 << 30


@record_type
class TierAnswer:
    """How many packs of ``context_tokens`` each tier of one replica holds.

    ``gpu_packs`` fit in the GPUs' KV memory (None without a memory figure),
    ``host_packs`` in host memory; ``together`` is what the replica keeps
    between visits: with an inclusive tier (every block written to the host
    as it is computed, vLLM native and LMCache) the host holds copies of the
    GPU's packs, so the larger of the two; else their sum.
    """

    context_tokens: int
    gpu_packs: int | None
    host_packs: int
    together: int | None


@record_type
class HostTierPlan:
    """The host tier of one replica: its size, its cost per token, and what it holds."""

    host_memory_bytes: int
    token_bytes: int
    state_bytes: int
    block_size: int
    tokens: int
    gpu_tokens: int | None
    inclusive: bool
    at_context: tuple[TierAnswer, ...]

    def to_text(self) -> str:
        lines = [
            f"Host tier (the whole replica): {self.host_memory_bytes / _GIB:,.2f} GiB at "
            f"{self.token_bytes:,} bytes per token"
            + (
                f" + {self.state_bytes / (1 << 20):,.2f} MiB per pack (linear state)"
                if self.state_bytes
                else ""
            ),
            f"  host tokens         : {self.tokens:,} (blocks of {self.block_size}, padded to {_PAGE} bytes)",
        ]
        if self.gpu_tokens is not None:
            lines.append(f"  GPU tokens          : {self.gpu_tokens:,}")
        kind = "inclusive: the host holds copies of the GPU's blocks" if self.inclusive else "exclusive"
        lines.append(f"  tiers               : {kind}")
        lines.append(f"  {'pack':>11}  {'on GPU':>7}  {'on host':>7}  {'kept':>5}")
        for row in self.at_context:
            gpu = "-" if row.gpu_packs is None else f"{row.gpu_packs:,}"
            kept = "-" if row.together is None else f"{row.together:,}"
            lines.append(f"  {row.context_tokens:>11,}  {gpu:>7}  {row.host_packs:>7,}  {kept:>5}")
        return "\n".join(lines)


def host_token_bytes(layout: KVLayout, gpus: int) -> int:
    """Bytes one token takes in the host tier of a replica over ``gpus`` tensor-parallel GPUs."""
    total = 0
    for group in layout.groups:
        if group.kind is LayerKind.LINEAR:
            continue
        per_gpu = group.token_bytes(layout.kv_dtype_bytes, gpus)
        total += per_gpu if group.kind is LayerKind.MLA else per_gpu * gpus
    return total


def plan_host_tier(
    layout: KVLayout,
    *,
    gpus: int,
    host_memory_gib: float,
    block_size: int,
    contexts: Sequence[int],
    gpu_kv_bytes_per_gpu: int | None = None,
    inclusive: bool = True,
) -> HostTierPlan:
    """The host tier of ``host_memory_gib`` (the replica's total, as ``--kv-offloading-size``)."""
    host_bytes = round(host_memory_gib * _GIB)
    per_token = host_token_bytes(layout, gpus)
    state = layout.state_bytes(gpus) * gpus
    block_bytes = per_token * block_size
    padded = -(-block_bytes // _PAGE) * _PAGE if block_bytes else 0
    tokens = (host_bytes // padded) * block_size if padded else 0
    gpu_token_bytes = layout.token_bytes(gpus)
    gpu_tokens = None
    if gpu_kv_bytes_per_gpu is not None and gpu_token_bytes:
        gpu_tokens = (gpu_kv_bytes_per_gpu // (gpu_token_bytes * block_size)) * block_size
    answers = []
    for context in contexts:
        blocks = -(-context // block_size)
        pack_bytes = blocks * padded + state
        host_packs = host_bytes // pack_bytes if pack_bytes else 0
        gpu_packs = None
        if gpu_kv_bytes_per_gpu is not None:
            sequence = layout.sequence_bytes(context, tp=gpus, block_size=block_size)
            gpu_packs = gpu_kv_bytes_per_gpu // sequence if sequence else 0
        together = None
        if gpu_packs is not None:
            together = max(gpu_packs, host_packs) if inclusive else gpu_packs + host_packs
        answers.append(TierAnswer(context, gpu_packs, host_packs, together))
    return HostTierPlan(
        host_memory_bytes=host_bytes,
        token_bytes=per_token,
        state_bytes=state,
        block_size=block_size,
        tokens=tokens,
        gpu_tokens=gpu_tokens,
        inclusive=inclusive,
        at_context=tuple(answers),
    )
