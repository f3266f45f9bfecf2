"""The KV-cache layout of a model, read from its Hugging Face ``config.json``.

A layout is a list of layer groups, each of one kind:

- ``ATTENTION``: full attention (multi-head, grouped-query or multi-query).
  Per token and layer it stores K and V for every KV head:
  ``2 x num_key_value_heads x head_dim x dtype_bytes``.
- ``SLIDING``: the same, but only the last ``sliding_window`` tokens are kept,
  so a sequence holds ``min(context, window)`` tokens.
- ``MLA``: multi-head latent attention (DeepSeek-V2/V3, Kimi K2, the full
  layers of Kimi Linear and Kimi K3). One latent vector per token and layer:
  ``(kv_lora_rank + qk_rope_head_dim) x dtype_bytes``. Every tensor-parallel
  rank holds the whole latent (it is not split by heads); decode context
  parallelism (``--dcp-size`` / ``--decode-context-parallel-size``) splits it
  along the sequence.
- ``LINEAR``: linear attention (Kimi Delta Attention, Gated DeltaNet). A fixed
  recurrent state per sequence, independent of the context length, plus the
  short-convolution state. Split across tensor-parallel ranks by heads.

The state shapes and dtypes follow vLLM 0.32 (``MambaStateShapeCalculator``
and ``MambaStateDtypeCalculator`` in ``model_executor/layers/mamba/mamba_utils.py``):
the KDA recurrent state is ``num_heads x head_dim x head_dim`` in float32 and
its convolution state ``3 x num_heads x head_dim`` channels by
``short_conv_kernel_size - 1`` steps in the model dtype; the Gated DeltaNet
recurrent state is ``linear_num_value_heads x linear_value_head_dim x
linear_key_head_dim`` (in ``mamba_ssm_dtype`` when the config pins it, as
Qwen3.5 does, else the model dtype) and its convolution state ``2 x
linear_num_key_heads x linear_key_head_dim + linear_num_value_heads x
linear_value_head_dim`` channels by ``linear_conv_kernel_dim - 1`` steps in
the model dtype.
``--kv-cache-dtype`` does not change either.

Simplifications, stated once: fp8 is one byte per element (per-tensor scales
are negligible; vLLM's sparse-MLA layout ``fp8_ds_mla`` stores 656 bytes per
token and layer instead of 576, not modelled); the indexer cache of sparse
attention (DeepSeek-V3.2) is not counted; vLLM pads linear-attention state
pages to the attention page size in hybrid models, not modelled.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from longctx.errors import InputError, ServingConfigError, UnsupportedArchitecture
from longctx.recordtypes import record_type

__all__ = [
    "KV_CACHE_DTYPES",
    "KVLayout",
    "LayerGroup",
    "LayerKind",
    "kv_layout_from_config",
    "load_model_config",
]

# Bytes per element of each name longctx accepts for --kv-cache-dtype, plus
# the dtype names configs use for the model weights ("torch_dtype"/"dtype").
KV_CACHE_DTYPES: Mapping[str, int] = {
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp32": 4,
    "float32": 4,
}

_CANONICAL_DTYPE = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "fp32": "fp32",
    "float32": "fp32",
}

# Keys that mark state-space or other hybrid layouts this module does not
# model. Naming the key in the error beats a silently wrong answer.
_UNSUPPORTED_KEYS = (
    "hybrid_override_pattern",
    "layers_block_type",
    "attn_type_list",
    "attn_layer_indices",
    "mamba_d_state",
    "ssm_state_size",
    "block_types",
)
_CONTEXT_KEYS = (
    "max_position_embeddings",
    "model_max_length",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
)
_UNSUPPORTED_MODEL_TYPES = frozenset({"mamba", "mamba2", "falcon_mamba", "rwkv", "recurrent_gemma", "xlstm"})


class LayerKind(enum.Enum):
    """How a layer keeps its past: per token (growing) or per sequence (fixed)."""

    ATTENTION = "attention"
    SLIDING = "sliding_attention"
    MLA = "mla"
    LINEAR = "linear"


@record_type
class LayerGroup:
    """Layers of one kind with the same shape.

    ``layers`` are 0-based indices. For ``ATTENTION``/``SLIDING``, ``heads``
    is the number of KV heads and ``head_dim`` the head size; for ``MLA``,
    ``heads`` is 1 and ``head_dim`` is ``kv_lora_rank + qk_rope_head_dim``;
    for ``LINEAR``, ``heads`` is the number of recurrent-state heads (value
    heads), ``key_heads`` the key heads, ``state_key_dim x state_value_dim``
    the state of one head and ``conv_channels x conv_steps`` the convolution
    state. ``heads_field`` is the config key the head count came from, used to
    name it when tensor parallelism cannot split it.
    """

    kind: LayerKind
    layers: tuple[int, ...]
    label: str
    heads: int
    head_dim: int = 0
    window: int | None = None
    key_heads: int = 0
    state_key_dim: int = 0
    state_value_dim: int = 0
    state_dtype_bytes: int = 0
    conv_channels: int = 0
    conv_steps: int = 0
    conv_dtype_bytes: int = 0
    heads_field: str = ""
    key_heads_field: str = ""

    @property
    def count(self) -> int:
        """Number of layers in the group."""
        return len(self.layers)

    def heads_per_gpu(self, tp: int) -> int:
        """KV (or state) heads one tensor-parallel rank holds.

        Attention heads are split when there are at least ``tp`` of them and
        replicated otherwise (each rank keeps at least one, as vLLM's
        ``get_num_kv_heads`` does); an MLA latent is never split; linear state
        heads must divide evenly. Raises :class:`ServingConfigError` naming the
        head count when ``tp`` cannot split it.
        """
        _check_positive(tp, "gpus")
        if self.kind is LayerKind.MLA:
            return 1
        if self.kind is LayerKind.LINEAR:
            checks = (
                (self.heads_field, self.heads),
                (self.key_heads_field or self.heads_field, self.key_heads),
            )
            for field, count in checks:
                if count % tp:
                    raise ServingConfigError(
                        f"tensor parallel size {tp} does not divide {field} = {count}: "
                        "linear-attention state is split by heads",
                        field=field,
                    )
            return self.heads // tp
        if self.heads >= tp:
            if self.heads % tp:
                raise ServingConfigError(
                    f"tensor parallel size {tp} does not divide {self.heads_field} = {self.heads}",
                    field=self.heads_field,
                )
            return self.heads // tp
        if tp % self.heads:
            raise ServingConfigError(
                f"tensor parallel size {tp} is not a multiple of {self.heads_field} = "
                f"{self.heads}, so the KV heads cannot be replicated evenly",
                field=self.heads_field,
            )
        return 1

    def token_bytes(self, dtype_bytes: int, tp: int = 1) -> int:
        """Bytes per token of context over the whole group, on one rank (0 for ``LINEAR``)."""
        if self.kind is LayerKind.LINEAR:
            return 0
        per_layer = self.heads_per_gpu(tp) * self.head_dim * dtype_bytes
        if self.kind is not LayerKind.MLA:
            per_layer *= 2  # K and V; MLA's latent serves as both
        return per_layer * self.count

    def state_bytes(self, tp: int = 1) -> int:
        """Fixed bytes per sequence over the whole group, on one rank (0 unless ``LINEAR``)."""
        if self.kind is not LayerKind.LINEAR:
            return 0
        heads = self.heads_per_gpu(tp)
        recurrent = heads * self.state_key_dim * self.state_value_dim * self.state_dtype_bytes
        conv = (self.conv_channels // tp) * self.conv_steps * self.conv_dtype_bytes
        return (recurrent + conv) * self.count


@record_type
class KVLayout:
    """The KV cache of one model at one KV-cache dtype.

    ``kv_cache_dtype`` is canonical (``bf16``, ``fp16``, ``fp8``, ``fp32``);
    ``max_context`` is the config's ``max_position_embeddings`` (or
    ``model_max_length`` and the like) when present;
    ``notes`` lists every assumption made while reading the config.
    """

    model_type: str | None
    architecture: str | None
    num_layers: int
    groups: tuple[LayerGroup, ...]
    kv_cache_dtype: str
    kv_dtype_bytes: int
    model_dtype: str
    max_context: int | None
    notes: tuple[str, ...] = ()

    def token_bytes(self, tp: int = 1) -> int:
        """Bytes per token of context in full-attention and MLA layers, on one rank.

        This is the part that grows without bound with the context.
        """
        return sum(
            g.token_bytes(self.kv_dtype_bytes, tp)
            for g in self.groups
            if g.kind in (LayerKind.ATTENTION, LayerKind.MLA)
        )

    def window_token_bytes(self, tp: int = 1) -> int:
        """Bytes per token in sliding-window layers, on one rank (they stop growing at the window)."""
        return sum(g.token_bytes(self.kv_dtype_bytes, tp) for g in self.groups if g.kind is LayerKind.SLIDING)

    def state_bytes(self, tp: int = 1) -> int:
        """Fixed bytes per sequence in linear-attention layers, on one rank."""
        return sum(g.state_bytes(tp) for g in self.groups)

    def sequence_bytes(self, context: int, *, tp: int = 1, dcp: int = 1, block_size: int = 1) -> int:
        """Bytes one sequence of ``context`` tokens holds on one GPU.

        Full-attention and MLA tokens are split over ``dcp`` decode-context-
        parallel ranks and rounded up to whole blocks of ``block_size`` tokens
        on each; sliding-window layers keep ``min(context, window)`` tokens
        (not split by DCP; engines may refuse DCP with sliding windows);
        linear layers add their fixed state. ``dcp`` must divide ``tp``.
        """
        _check_parallel(tp, dcp)
        _check_positive(block_size, "block_size")
        if context < 0:
            raise ServingConfigError(f"context must be >= 0, got {context}", field="context")
        if context == 0:
            return 0
        total = 0
        for group in self.groups:
            if group.kind is LayerKind.LINEAR:
                total += group.state_bytes(tp)
                continue
            if group.kind is LayerKind.SLIDING:
                assert group.window is not None
                tokens = min(context, group.window)
            else:
                tokens = -(-context // dcp)
            held = -(-tokens // block_size) * block_size
            total += held * group.token_bytes(self.kv_dtype_bytes, tp)
        return total

    def to_text(self) -> str:
        """One line per layer group, with its bytes per token or per sequence (TP 1)."""
        lines = []
        for g in self.groups:
            if g.kind is LayerKind.LINEAR:
                size = f"{g.state_bytes():,} bytes per sequence"
            else:
                size = f"{g.token_bytes(self.kv_dtype_bytes):,} bytes per token"
            lines.append(f"{g.count:>3} x {g.label}: {size}")
        return "\n".join(lines)


def load_model_config(path: str | Path) -> dict[str, Any]:
    """Read a ``config.json`` (or a model folder holding one) into a dict.

    Raises :class:`InputError` when the file is missing, unreadable or not a
    JSON object.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read model config {path}: {exc.strerror or exc}", path=path) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"model config {path} is not valid JSON: {exc}", path=path) from exc
    if not isinstance(data, dict):
        raise InputError(f"model config {path} is not a JSON object", path=path)
    return data


def kv_layout_from_config(config: Mapping[str, Any], *, kv_cache_dtype: str = "auto") -> KVLayout:
    """Work out the KV-cache layout of the model ``config`` describes.

    ``config`` is a parsed Hugging Face ``config.json``; a multimodal config's
    ``text_config`` is used when present. ``kv_cache_dtype`` is a name from
    :data:`KV_CACHE_DTYPES` or ``"auto"`` (the model dtype). Raises
    :class:`ServingConfigError` naming the missing or invalid field, and
    :class:`UnsupportedArchitecture` for layouts it does not model.
    """
    return _ConfigReader(config).layout(kv_cache_dtype)


class _ConfigReader:
    """Reads one config; ``prefix`` makes field names in errors point at the right place."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        if not isinstance(config, Mapping):
            raise ServingConfigError("model config must be a JSON object", field="config")
        self.outer = config
        text = config.get("text_config")
        if isinstance(text, Mapping):
            self.cfg: Mapping[str, Any] = text
            self.prefix = "text_config."
        else:
            self.cfg = config
            self.prefix = ""
        self.notes: list[str] = []
        model_type = self.cfg.get("model_type") or config.get("model_type")
        self.model_type = model_type if isinstance(model_type, str) else None
        archs = self.cfg.get("architectures") or config.get("architectures")
        self.architecture = (
            archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
        )

    # -- field access -------------------------------------------------------

    def name(self, key: str) -> str:
        return self.prefix + key

    def int_field(self, key: str, *, within: Mapping[str, Any] | None = None, where: str = "") -> int:
        source = self.cfg if within is None else within
        full = (where or self.prefix) + key
        if key not in source or source[key] is None:
            raise ServingConfigError(f"model config has no {full}", field=full)
        value = source[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ServingConfigError(f"{full} must be a non-negative integer, got {value!r}", field=full)
        return value

    def optional_int(self, key: str) -> int | None:
        if self.cfg.get(key) is None:
            return None
        return self.int_field(key)

    # -- the layout ---------------------------------------------------------

    def layout(self, kv_cache_dtype: str) -> KVLayout:
        self.reject_unsupported()
        num_layers = self.int_field("num_hidden_layers")
        if num_layers == 0:
            raise ServingConfigError(
                f"{self.name('num_hidden_layers')} is 0", field=self.name("num_hidden_layers")
            )
        model_dtype = self.model_dtype()
        kv_dtype = self.kv_dtype(kv_cache_dtype, model_dtype)
        kinds, linear_variant = self.layer_kinds(num_layers)

        groups: list[LayerGroup] = []
        full = tuple(i for i, k in enumerate(kinds) if k is LayerKind.ATTENTION)
        sliding = tuple(i for i, k in enumerate(kinds) if k is LayerKind.SLIDING)
        linear = tuple(i for i, k in enumerate(kinds) if k is LayerKind.LINEAR)
        if full:
            groups.append(self.full_attention_group(full))
        if sliding:
            groups.append(self.sliding_group(sliding))
        if linear:
            groups.append(self.linear_group(linear, linear_variant, model_dtype))

        max_context = self.max_context()
        return KVLayout(
            model_type=self.model_type,
            architecture=self.architecture,
            num_layers=num_layers,
            groups=tuple(groups),
            kv_cache_dtype=kv_dtype,
            kv_dtype_bytes=KV_CACHE_DTYPES[kv_dtype],
            model_dtype=model_dtype,
            max_context=max_context,
            notes=tuple(self.notes),
        )

    def max_context(self) -> int | None:
        # The keys vLLM derives a default max_model_len from, most common first.
        for key in _CONTEXT_KEYS:
            value = self.optional_int(key)
            if value:
                return value
        return None

    def reject_unsupported(self) -> None:
        if self.model_type in _UNSUPPORTED_MODEL_TYPES:
            raise UnsupportedArchitecture(
                f"model_type {self.model_type!r} (state-space model) is not supported: "
                "longctx plans attention, MLA, sliding-window, KDA and Gated DeltaNet layers",
                architecture=self.model_type,
                field=self.name("model_type"),
            )
        for key in _UNSUPPORTED_KEYS:
            if key in self.cfg:
                raise UnsupportedArchitecture(
                    f"config key {self.name(key)!r} marks a hybrid layout longctx does not model "
                    f"(model_type {self.model_type!r}); supported: attention, MLA, sliding-window, "
                    "KDA (linear_attn_config) and Gated DeltaNet (layer_types) layers",
                    architecture=self.model_type,
                    field=self.name(key),
                )

    def model_dtype(self) -> str:
        for source in (self.cfg, self.outer):
            for key in ("torch_dtype", "dtype"):
                value = source.get(key)
                if isinstance(value, str):
                    canonical = _CANONICAL_DTYPE.get(value.lower())
                    if canonical is None or canonical == "fp8":
                        # Engines keep activations (and "auto" KV) in 16 bits for these.
                        self.notes.append(
                            f"{key} {value!r} is not a 16/32-bit dtype: model dtype assumed bf16"
                        )
                        return "bf16"
                    return canonical
        self.notes.append("config states no torch_dtype/dtype: model dtype assumed bf16")
        return "bf16"

    def kv_dtype(self, requested: str, model_dtype: str) -> str:
        if requested == "auto":
            return model_dtype
        canonical = _CANONICAL_DTYPE.get(requested.lower())
        if canonical is None:
            raise ServingConfigError(
                f"unknown KV-cache dtype {requested!r}; use auto, bf16, fp16, fp8 or fp32",
                field="kv_cache_dtype",
            )
        return canonical

    def layer_kinds(self, num_layers: int) -> tuple[list[LayerKind], str]:
        """The kind of every layer, and the linear-attention variant if any."""
        linear_config = self.cfg.get("linear_attn_config")
        if isinstance(linear_config, Mapping):
            return self.kimi_linear_kinds(linear_config, num_layers), "kda"

        layer_types = self.cfg.get("layer_types")
        if layer_types is not None:
            return self.kinds_from_layer_types(layer_types, num_layers), "gated_deltanet"

        interval = self.cfg.get("full_attention_interval")
        if interval is not None and "linear_num_value_heads" in self.cfg:
            # Qwen3-Next without an explicit layer_types: every interval-th layer is full.
            return self.every_nth_full(
                "full_attention_interval", num_layers, LayerKind.LINEAR
            ), "gated_deltanet"

        window = self.cfg.get("sliding_window")
        if window is None:
            return [LayerKind.ATTENTION] * num_layers, ""

        pattern = self.cfg.get("sliding_window_pattern")
        if pattern is not None:
            # Gemma 3 before layer_types: every pattern-th layer is global.
            return self.every_nth_full("sliding_window_pattern", num_layers, LayerKind.SLIDING), ""
        if self.model_type in ("gemma2", "gpt_oss"):
            # Their transformers configs alternate sliding and full, sliding first.
            return _every_nth_full(2, num_layers, LayerKind.SLIDING), ""
        if "use_sliding_window" in self.cfg:
            # Qwen2/Qwen3 ship a sliding_window value that is off unless use_sliding_window.
            if not self.cfg.get("use_sliding_window"):
                return [LayerKind.ATTENTION] * num_layers, ""
            first_sliding = self.optional_int("max_window_layers") or 0
            return [
                LayerKind.SLIDING if i >= first_sliding else LayerKind.ATTENTION for i in range(num_layers)
            ], ""
        # Mistral-style: one window for every layer.
        return [LayerKind.SLIDING] * num_layers, ""

    def every_nth_full(self, key: str, num_layers: int, between: LayerKind) -> list[LayerKind]:
        """Every ``cfg[key]``-th layer full attention, the layers between of kind ``between``."""
        step = self.int_field(key)
        if step == 0:
            raise ServingConfigError(f"{key} is 0", field=self.name(key))
        return _every_nth_full(step, num_layers, between)

    def kimi_linear_kinds(self, linear_config: Mapping[str, Any], num_layers: int) -> list[LayerKind]:
        where = self.prefix + "linear_attn_config."
        lists: dict[str, list[int]] = {}
        for key in ("kda_layers", "full_attn_layers"):
            value = linear_config.get(key)
            if not isinstance(value, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in value
            ):
                raise ServingConfigError(
                    f"model config has no {where}{key} (a list of 1-based layer numbers)",
                    field=where + key,
                )
            lists[key] = value
        kda, full = set(lists["kda_layers"]), set(lists["full_attn_layers"])
        expected = set(range(1, num_layers + 1))
        duplicated = len(kda) != len(lists["kda_layers"]) or len(full) != len(lists["full_attn_layers"])
        # Kimi numbers layers from 1 (vLLM's is_kda_layer tests layer_idx + 1).
        if duplicated or kda & full or kda | full != expected:
            missing = sorted(expected - kda - full)
            extra = sorted((kda | full) - expected)
            both = sorted(kda & full)
            raise ServingConfigError(
                f"{where}kda_layers and full_attn_layers must split layers 1..{num_layers} "
                f"exactly once (missing {missing}, out of range {extra}, in both {both})",
                field=where + "kda_layers",
            )
        return [LayerKind.LINEAR if i + 1 in kda else LayerKind.ATTENTION for i in range(num_layers)]

    def kinds_from_layer_types(self, layer_types: Any, num_layers: int) -> list[LayerKind]:
        field = self.name("layer_types")
        if not isinstance(layer_types, Sequence) or isinstance(layer_types, str):
            raise ServingConfigError(f"{field} must be a list of strings", field=field)
        if len(layer_types) != num_layers:
            raise ServingConfigError(
                f"{field} has {len(layer_types)} entries but num_hidden_layers is {num_layers}",
                field=field,
            )
        known = {
            "full_attention": LayerKind.ATTENTION,
            "attention": LayerKind.ATTENTION,
            "sliding_attention": LayerKind.SLIDING,
            "linear_attention": LayerKind.LINEAR,
        }
        kinds = []
        for i, value in enumerate(layer_types):
            kind = known.get(value) if isinstance(value, str) else None
            if kind is None:
                raise UnsupportedArchitecture(
                    f"{field}[{i}] is {value!r}; longctx knows {', '.join(sorted(known))}",
                    architecture=self.model_type,
                    field=f"{field}[{i}]",
                )
            kinds.append(kind)
        return kinds

    # -- groups ---------------------------------------------------------------

    def full_attention_group(self, layers: tuple[int, ...]) -> LayerGroup:
        if self.cfg.get("kv_lora_rank") is not None:
            rank = self.int_field("kv_lora_rank")
            rope = self.int_field("qk_rope_head_dim")
            return LayerGroup(
                kind=LayerKind.MLA,
                layers=layers,
                label=f"MLA (latent {rank} + rope {rope})",
                heads=1,
                head_dim=rank + rope,
                heads_field=self.name("kv_lora_rank"),
            )
        heads, head_dim = self.attention_heads()
        return LayerGroup(
            kind=LayerKind.ATTENTION,
            layers=layers,
            label=f"attention ({heads} KV heads x {head_dim})",
            heads=heads,
            head_dim=head_dim,
            heads_field=self.name("num_key_value_heads"),
        )

    def sliding_group(self, layers: tuple[int, ...]) -> LayerGroup:
        window = self.int_field("sliding_window")
        if window == 0:
            raise ServingConfigError("sliding_window is 0", field=self.name("sliding_window"))
        heads, head_dim = self.attention_heads()
        return LayerGroup(
            kind=LayerKind.SLIDING,
            layers=layers,
            label=f"sliding window {window} ({heads} KV heads x {head_dim})",
            heads=heads,
            head_dim=head_dim,
            window=window,
            heads_field=self.name("num_key_value_heads"),
        )

    def attention_heads(self) -> tuple[int, int]:
        query_heads = self.int_field("num_attention_heads")
        if query_heads == 0:
            raise ServingConfigError("num_attention_heads is 0", field=self.name("num_attention_heads"))
        kv_heads = self.optional_int("num_key_value_heads")
        if kv_heads is None:
            kv_heads = query_heads
            self.notes.append(
                "num_key_value_heads absent: multi-head attention assumed (one KV head per query head)"
            )
        if kv_heads == 0:
            raise ServingConfigError("num_key_value_heads is 0", field=self.name("num_key_value_heads"))
        head_dim = self.optional_int("head_dim")
        if head_dim is None:
            hidden = self.int_field("hidden_size")
            if hidden % query_heads:
                raise ServingConfigError(
                    f"no head_dim, and hidden_size {hidden} is not a multiple of "
                    f"num_attention_heads {query_heads}",
                    field=self.name("head_dim"),
                )
            head_dim = hidden // query_heads
        return kv_heads, head_dim

    def linear_group(self, layers: tuple[int, ...], variant: str, model_dtype: str) -> LayerGroup:
        model_bytes = KV_CACHE_DTYPES[model_dtype]
        if variant == "kda":
            linear_config = self.cfg["linear_attn_config"]
            where = self.prefix + "linear_attn_config."
            heads = self.int_field("num_heads", within=linear_config, where=where)
            head_dim = self.int_field("head_dim", within=linear_config, where=where)
            kernel = self.int_field("short_conv_kernel_size", within=linear_config, where=where)
            self.notes.append(
                "KDA state as vLLM keeps it: recurrent state in fp32, convolution state in the "
                "model dtype; --kv-cache-dtype does not shrink it"
            )
            return LayerGroup(
                kind=LayerKind.LINEAR,
                layers=layers,
                label=f"KDA ({heads} heads x {head_dim} x {head_dim} state)",
                heads=heads,
                key_heads=heads,
                state_key_dim=head_dim,
                state_value_dim=head_dim,
                state_dtype_bytes=4,
                # q, k and v each pass through the short convolution.
                conv_channels=3 * heads * head_dim,
                conv_steps=max(kernel - 1, 0),
                conv_dtype_bytes=model_bytes,
                heads_field=where + "num_heads",
            )
        key_heads = self.int_field("linear_num_key_heads")
        value_heads = self.int_field("linear_num_value_heads")
        key_dim = self.int_field("linear_key_head_dim")
        value_dim = self.int_field("linear_value_head_dim")
        kernel = self.int_field("linear_conv_kernel_dim")
        state_bytes = model_bytes
        ssm_dtype = self.cfg.get("mamba_ssm_dtype")
        if isinstance(ssm_dtype, str):
            # Qwen3.5 configs pin the recurrent state dtype; vLLM adopts it for "auto".
            if ssm_dtype.lower() not in _CANONICAL_DTYPE:
                raise ServingConfigError(
                    f"{self.name('mamba_ssm_dtype')} {ssm_dtype!r} is not a dtype longctx knows",
                    field=self.name("mamba_ssm_dtype"),
                )
            state_bytes = KV_CACHE_DTYPES[ssm_dtype.lower()]
            state_source = f"mamba_ssm_dtype {ssm_dtype}"
        else:
            state_source = "the model dtype"
        self.notes.append(
            f"Gated DeltaNet state as vLLM keeps it: recurrent state in {state_source}, convolution "
            "state in the model dtype; --kv-cache-dtype does not shrink it"
        )
        return LayerGroup(
            kind=LayerKind.LINEAR,
            layers=layers,
            label=f"Gated DeltaNet ({value_heads} heads x {value_dim} x {key_dim} state)",
            heads=value_heads,
            key_heads=key_heads,
            state_key_dim=key_dim,
            state_value_dim=value_dim,
            state_dtype_bytes=state_bytes,
            conv_channels=2 * key_heads * key_dim + value_heads * value_dim,
            conv_steps=max(kernel - 1, 0),
            conv_dtype_bytes=model_bytes,
            heads_field=self.name("linear_num_value_heads"),
            key_heads_field=self.name("linear_num_key_heads"),
        )


def _check_positive(value: int, field: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ServingConfigError(f"{field} must be a positive integer, got {value!r}", field=field)


def _check_parallel(tp: int, dcp: int) -> None:
    _check_positive(tp, "gpus")
    _check_positive(dcp, "dcp")
    if tp % dcp:
        raise ServingConfigError(
            f"decode context parallel size {dcp} must divide the tensor parallel size {tp} "
            "(DCP ranks are the tensor-parallel GPUs)",
            field="dcp",
        )


def _every_nth_full(step: int, num_layers: int, between: LayerKind) -> list[LayerKind]:
    """Layers ``step``, ``2 x step``... (1-based) full attention; the others of kind ``between``."""
    return [LayerKind.ATTENTION if (i + 1) % step == 0 else between for i in range(num_layers)]
