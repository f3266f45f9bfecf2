"""The engine registry: one :class:`~longctx.backends.profiles.EngineProfile` per engine, and discovery.

The one module that names engines, their metrics and the routers in front of
them (one :class:`~longctx.backends.profiles.RouterProfile` per router). What
it reads from each engine (also in docs/serving.md, with the flags each
needs), checked against vLLM 0.32 (CPU) and SGLang 0.5.23 in the test suite:

- both serve ``GET /v1/models`` with ``owned_by`` naming the engine and
  ``max_model_len`` the effective context length;
- vLLM: ``GET /version``; its ``/metrics`` always carries
  ``vllm:cache_config_info`` (labels ``enable_prefix_caching``,
  ``block_size``, ``cache_dtype``, ``num_gpu_blocks``; from 0.32 also
  ``kv_cache_size_tokens``) and the counters
  ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``;
  cached tokens appear in responses only with ``--enable-prompt-tokens-details``;
- images: SGLang's ``GET /model_info`` says ``has_image_understanding``; vLLM's
  ``/tokenize`` with chat messages expands an image part to its tokens (a
  text-only model answers 400), SGLang's leaves one placeholder
  (:mod:`longctx.backends.images` counts with what each offers);
- SGLang: ``GET /server_info`` (older name ``/get_server_info``) has the flat
  server arguments and ``max_total_num_tokens`` (the KV pool); counters need ``--enable-metrics``
  (``sglang:cached_tokens_total``); cached tokens in OpenAI responses need
  ``--enable-cache-report``; its tokenize answer's ``max_model_len`` is the
  tokenizer's, so the context length comes from ``/v1/models``, else its
  ``context_length`` setting.

Any other OpenAI-compatible server is ``generic``. A new engine is one
:func:`register` call (:func:`registered` for a test).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any

from longctx.backends.http import HttpEndpoint
from longctx.backends.metrics import Sample, parse_metrics, total
from longctx.backends.profiles import (
    CHECKPOINT_KV_SCALES,
    CacheTiers,
    Check,
    EngineFacts,
    EngineProfile,
    Finding,
    HostTierRecipe,
    Measured,
    RecipeSwitches,
    RouterProfile,
    SchemaForm,
    truth,
)
from longctx.backends.tiers import HostTier
from longctx.errors import BackendError
from longctx.options.groups import DEFAULT_CONCURRENCY

__all__ = [
    "DYNAMO",
    "GENERIC",
    "SGLANG",
    "SMG",
    "SPREADING_POLICIES",
    "VLLM",
    "VLLM_ROUTER",
    "find_profile",
    "find_router",
    "identify",
    "measured_dispatch",
    "profiles",
    "recipe_engines",
    "recipe_host_tiers",
    "register",
    "registered",
    "routers",
]

CHUNK_TOKENS = 8192
# vLLM's offloading connector's bytes moved, by direction: the flat counter first, then the
# labelled one (0.24 exports both; the labelled one alone on some builds). Same in 0.24 and 0.32.
_VLLM_LOAD_BYTES: tuple[tuple[str, Mapping[str, str]], ...] = (
    ("vllm:kv_offload_load_bytes_total", {}),
    ("vllm:kv_offload_total_bytes_total", {"transfer_type": "CPU_to_GPU"}),
)
_VLLM_STORE_BYTES: tuple[tuple[str, Mapping[str, str]], ...] = (
    ("vllm:kv_offload_store_bytes_total", {}),
    ("vllm:kv_offload_total_bytes_total", {"transfer_type": "GPU_to_CPU"}),
)
#: The LMCache release the vLLM recipe names (PyPI; wheels for CPython 3.10-3.13, CUDA 13). Its
#: compiled ops link against the torch they were built with: 0.5.3 is the newest whose ops resolve
#: every symbol against vLLM 0.24.0's torch 2.11.0 (0.5.4-0.5.6 call a c10::NotImplementedError
#: constructor that 2.11 does not export, so their import fails).
LMCACHE_VERSION = "0.5.3"
_SIXTEEN_BIT = frozenset({"auto", "bf16", "bfloat16", "fp16", "float16", "half"})
# vLLM's and SGLang's one-byte KV cache types (vLLM fp8 = fp8_e4m3; fp8_ds_mla and fp8_inc are vLLM's).
_EIGHT_BIT = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"})
# What doctor's flags buy (Finding.reason), and the flags that name the chunk budget.
_AGAIN = "without it every request prefills the whole document again"
_RADIX_OFF = "without the radix cache every request prefills the whole document again"
_REPORTS = "responses then report cached tokens, so longctx can show what the cache saved"
_STALLS = "a long prompt otherwise takes whole steps and stalls every running decode"
_SMALL_CHUNKS = (
    f"prefill of long prompts runs in chunks of {{value}} tokens; "
    f"{CHUNK_TOKENS} prefills faster at a small cost in decode latency"
)
_NOT_CHUNKED = "chunked prefill is off: a long prompt stalls every running decode"
_COUNTERS = "exposes server-wide cached-token counters to cross-check longctx's figures"
_HALVES = (
    "halves KV memory: twice the context x concurrency; the checkpoint carries calibrated k/v scales"
    " (check answer quality)"
)
# fp8 KV at scale 1.0 (the checkpoint carries no scales), measured by benchmarks/gpu/quality.sh on
# Qwen2.5-Coder-1.5B-Instruct in bf16 (a GGUF conversion: no scales), its answer-quality-gpu section
# of docs/benchmarks.md: 10 facts over longctx's layout of a pack, bf16 KV beside fp8 KV.
_VLLM_UNSCALED = (
    "an fp8 KV cache without k/v scales in the checkpoint runs at scale 1.0 and loses answers: "
    "2026-12-06, H100, vLLM 0.24.0, Qwen2.5-Coder-1.5B-Instruct: longctx's layout at 17k tokens, "
    "9/10 facts with bf16 KV, 1/10 with fp8 KV without scales"
)
_SGLANG_UNSCALED = (
    "an fp8 KV cache without k/v scales in the checkpoint runs at scale 1.0 and loses answers: "
    "2026-12-06, H100, SGLang 0.5.17, Qwen2.5-Coder-1.5B-Instruct: longctx's layout at 17k tokens, "
    "9/10 facts with bf16 KV, 5/10 with fp8_e4m3 KV without scales"
)
_CHUNKED = f"--enable-chunked-prefill --max-num-batched-tokens {CHUNK_TOKENS}"
_BUDGET = f"--max-num-batched-tokens {CHUNK_TOKENS}"
_CHUNK_SIZE = f"--chunked-prefill-size {CHUNK_TOKENS}"


def _integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _false(value: Any) -> bool:
    return truth(value) is False


def _true(value: Any) -> bool:
    return truth(value) is True


def _sixteen_bit(value: Any) -> bool:
    return isinstance(value, str) and value.lower() in _SIXTEEN_BIT


def _eight_bit(value: Any) -> bool:
    return isinstance(value, str) and value.lower() in _EIGHT_BIT


def _scaled(observed: Mapping[str, Any]) -> bool:
    """Whether doctor found calibrated KV scales in the served checkpoint (unknown is not found)."""
    return observed.get(CHECKPOINT_KV_SCALES) is True


def _unscaled(observed: Mapping[str, Any]) -> bool:
    """Whether doctor read the served checkpoint and found no KV scales in it."""
    return observed.get(CHECKPOINT_KV_SCALES) is False


def _scaled_gpu(labels: Mapping[str, Any]) -> bool:
    return _scaled(labels) and _not_vllm_cpu(labels)


def _not_vllm_cpu(labels: Mapping[str, Any]) -> bool:
    """Whether a vLLM's ``cache_config_info`` labels are not its CPU build's, which takes no fp8 KV cache.

    The CPU build sizes its cache from ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB, in
    ``kv_cache_memory_bytes``, which a GPU build leaves None) and pages it in
    blocks of 128 tokens (vLLM 0.32.0's CPU platform; a GPU's are 16).
    """
    memory = _whole(labels.get("kv_cache_memory_bytes"))
    whole_gib = memory is not None and memory > 0 and memory % 2**30 == 0
    return not (whole_gib and _whole(labels.get("block_size")) == 128)


def _whole(value: Any) -> int | None:
    """An int, or a string of one (as labels are); a float or a bool is no token count."""
    return _integer(value) if isinstance(value, (int, str)) else None


def _below_chunk(value: Any) -> bool:
    return (size := _whole(value)) is not None and size < CHUNK_TOKENS


def _chunking_off(value: Any) -> bool:
    # -1 (or 0) turns chunking off; None means SGLang has not resolved its default, so say nothing.
    return (size := _whole(value)) is not None and size <= 0


def _discover_vllm(endpoint: HttpEndpoint, model: str) -> EngineFacts:
    version = None
    with suppress(BackendError):
        version = str(endpoint.get_json("/version").get("version"))
    samples: list[Sample] | None = None
    with suppress(BackendError):
        samples = parse_metrics(endpoint.get_text("/metrics"))
    config = (s.labels for s in samples or () if s.name == "vllm:cache_config_info" and s.serves(model))
    settings: dict[str, Any] = dict(next(config, {}))
    return EngineFacts(
        version=version,
        prefix_caching=truth(settings.get("enable_prefix_caching")),
        # vLLM says nothing of --enable-prompt-tokens-details until a response shows it.
        cache_reporting=None,
        metrics=samples is not None,
        cache_block_tokens=_integer(settings.get("block_size")),
        kv_cache_tokens=_vllm_kv_tokens(settings),
        settings=settings,
        host_tier=_vllm_host_tier(settings, samples or []),
    )


def _vllm_kv_tokens(labels: Mapping[str, Any]) -> int | None:
    """The KV cache's size in tokens: vLLM 0.32's own label, else blocks times block size."""
    tokens = _integer(labels.get("kv_cache_size_tokens"))
    if tokens:
        return tokens
    blocks, block = _integer(labels.get("num_gpu_blocks")), _integer(labels.get("block_size"))
    return blocks * block if blocks and block else None


def _vllm_host_tier(labels: Mapping[str, Any], samples: list[Sample]) -> HostTier | None:
    """vLLM's host tier from its ``vllm:cache_config_info`` labels (``CacheConfig``'s fields as text).

    ``kv_offloading_size`` (GiB, the whole server's) and ``kv_offloading_backend``
    come from ``--kv-offloading-size`` / ``--kv-offloading-backend``. A server
    started with ``--kv-transfer-config`` alone shows no size there; its
    offloading counters still say a tier exists.
    """
    try:
        size = float(labels.get("kv_offloading_size") or 0)
    except ValueError:
        size = 0.0
    if size > 0:
        backend = str(labels.get("kv_offloading_backend") or "native")
        return HostTier(backend=backend, size_bytes=int(size * (1 << 30)))
    if any(sample.name.startswith("vllm:kv_offload_") for sample in samples):
        return HostTier(backend="kv connector (size not in the server's settings)")
    return None


def _sglang_host_tier(info: Mapping[str, Any], endpoint: HttpEndpoint) -> HostTier | None:
    """SGLang's HiCache from ``/server_info``, with its host capacity gauge when metrics are on."""
    if not truth(info.get("enable_hierarchical_cache")):
        return None
    tokens = None
    if truth(info.get("enable_metrics")):
        with suppress(BackendError):
            found = total(parse_metrics(endpoint.get_text("/metrics")), "sglang:hicache_host_total_tokens")
            tokens = None if found is None else int(found)
    size_gb = _whole(info.get("hicache_size"))
    ranks = (_whole(info.get("tp_size")) or 1) * (_whole(info.get("pp_size")) or 1)
    storage = info.get("hicache_storage_backend")
    return HostTier(
        backend="hicache",
        # --hicache-size is GB per rank (tensor x pipeline parallel), 0: --hicache-ratio decides.
        size_bytes=size_gb * 10**9 * ranks if size_gb else None,
        size_tokens=tokens or None,
        storage=str(storage) if storage else None,
        inclusive=str(info.get("hicache_write_policy") or "write_through").startswith("write_through"),
    )


def _discover_sglang(endpoint: HttpEndpoint, model: str) -> EngineFacts:
    info: dict[str, Any] = {}
    for path in ("/server_info", "/get_server_info"):
        with suppress(BackendError):
            if isinstance(loaded := endpoint.get_json(path), dict):
                info = loaded
                break
    radix_off = truth(info.get("disable_radix_cache"))
    return EngineFacts(
        version=str(info["version"]) if "version" in info else None,
        prefix_caching=None if radix_off is None else not radix_off,
        cache_reporting=truth(info.get("enable_cache_report")),
        metrics=truth(info.get("enable_metrics")),
        cache_block_tokens=_integer(info.get("page_size")),
        schedule_policy=info.get("schedule_policy"),
        kv_cache_tokens=_integer(info.get("max_total_num_tokens")),
        settings=info,
        host_tier=_sglang_host_tier(info, endpoint),
    )


# The generic recipes' long-context switches: prefix caching, chunked prefill, cache reports; fp8 KV
# apart (RecipeSwitches.fp8_kv), for a checkpoint with KV scales.
_VLLM_SWITCHES = (
    "--enable-prefix-caching",
    "--enable-chunked-prefill",
    "--max-num-batched-tokens", str(CHUNK_TOKENS),
    "--enable-prompt-tokens-details",
)  # fmt: skip
_SGLANG_SWITCHES = (
    "--chunked-prefill-size", str(CHUNK_TOKENS),
    "--enable-cache-report",
    "--enable-metrics",
)  # fmt: skip

VLLM = EngineProfile(
    name="vllm",
    label="vLLM",
    missing_report="vLLM does not report cached tokens: start it with --enable-prompt-tokens-details",
    owned_by=("vllm",),
    discover=_discover_vllm,
    tokenize_path="/tokenize",
    hit_counter="vllm:prefix_cache_hits_total",
    query_counter="vllm:prefix_cache_queries_total",
    tiers=(
        # 0.24.0 (the H200 runs; docs/benchmarks.md gpu-canary lists what its /metrics held): the
        # prompt's tokens by source (local_compute, local_cache_hit, external_kv_transfer: what a
        # connector, the host tier, supplied; prefix_cache_hits leaves those out) and the bytes moved,
        # both as vllm:kv_offload_total_bytes_total{transfer_type} and vllm:kv_offload_{load,store}_bytes.
        CacheTiers(
            "0.24",
            hits_by_source="vllm:prompt_tokens_by_source_total",
            metrics=(
                "vllm:prompt_tokens_by_source_total",
                "vllm:kv_offload_total_bytes_total",
                "vllm:kv_offload_total_time_total",
                "vllm:kv_offload_load_bytes_total",
                "vllm:kv_offload_store_bytes_total",
                "vllm:kv_offload_size",
            ),
            device_sources=("local_cache_hit",),
            host_sources=("external_kv_transfer",),
            connector_hits="vllm:prompt_tokens_by_source_total",
            connector_labels=(("source", "external_kv_transfer"),),
            load_bytes=_VLLM_LOAD_BYTES,
            store_bytes=_VLLM_STORE_BYTES,
        ),
        # 0.32.0 (the CPU build of the test suite, read from its sources): hits by tier
        # (device, host, p2p, disk, external_unspecified), summing to the local and external hits.
        CacheTiers(
            "0.32",
            hits_by_source="vllm:prompt_tokens_cached_by_source_total",
            metrics=(
                "vllm:external_prefix_cache_queries_total",
                "vllm:external_prefix_cache_hits_total",
                "vllm:prompt_tokens_by_source_total",
                "vllm:kv_offload_load_bytes_total",
                "vllm:kv_offload_store_bytes_total",
                "vllm:kv_offload_total_bytes_total",
            ),
            external_sources=("disk", "p2p", "external_unspecified"),
            # prefix_cache_hits counts the GPU's hits only; the responses count these too.
            connector_hits="vllm:external_prefix_cache_hits_total",
            load_bytes=_VLLM_LOAD_BYTES,
            store_bytes=_VLLM_STORE_BYTES,
        ),
    ),
    # OffloadingConnector's per-request cap (experimental in 0.32; an older vLLM ignores the key).
    offload_cap=("kv_transfer_params", "max_offload_tokens"),
    # return_token_ids on both routes: prompt_token_ids in the first chunk, token_ids per choice.
    chat_id_switches=("return_token_ids",),
    completions_id_switches=("return_token_ids",),
    # /v1/completions takes prompt as a list of ids (0.24.0 on the H200, 0.32.0 on the CPU).
    takes_prompt_ids=True,
    # docs/benchmarks.md "siblings-dispatch" (benchmarks/siblings.py, the CPU build of the test
    # suite) and vLLM 0.24.0 on one H200 (8 at once 8.15 s against 9.7-11.2 s lead-first, before
    # 2026-12-01; "gpu-siblings" of 2026-12-01: auto 10.79 s against lead 13.47 s at 126k). vLLM v1
    # shares an in-flight prefix, so sending together costs no prefill.
    # Typed answers: response_format json_schema since 0.6 (structured_outputs {"json": ...} takes the
    # same since 0.10.2). On the CPU build 0.32.0 both constrained the tiny model's answer the same;
    # its xgrammar backend reads disable_any_whitespace only from the server's
    # --structured-outputs-config, not from the request.
    schema_forms=(SchemaForm("0.6.0"),),
    dispatch=(
        Measured(
            "", "together", 8, "benchmarks/siblings.py (CPU) and gpu-siblings (H200, 0.24.0, 2026-12-01)"
        ),
    ),
    checks=(
        Check("warning", "enable_prefix_caching", _false, "--enable-prefix-caching", _AGAIN),
        Check("warning", "enable_prompt_tokens_details", _false, "--enable-prompt-tokens-details", _REPORTS),
        Check("warning", "enable_chunked_prefill", _false, _CHUNKED, _STALLS),
        Check("suggestion", "max_num_batched_tokens", _below_chunk, _BUDGET, _SMALL_CHUNKS),
        Check("warning", "cache_dtype", _eight_bit, "--kv-cache-dtype auto", _VLLM_UNSCALED, _unscaled),
        Check("suggestion", "cache_dtype", _sixteen_bit, "--kv-cache-dtype fp8", _HALVES, _scaled_gpu),
    ),
    # Images (0.32.0 CPU, tiny Qwen2-VL, 2026-12-06): /tokenize with chat messages expands an image
    # part to its tokens (154 for a 300 x 400 PNG, plus <|vision_start|> and <|vision_end|>) and
    # answers a text-only model 400 "... is not a multimodal model"; /v1/models says nothing of it.
    tokenize_expands_images=True,
    # The flag has no trace in vLLM's settings: a probe's answer stands for it.
    reporting_setting="enable_prompt_tokens_details",
    caching_setting="enable_prefix_caching",
    recipe=RecipeSwitches(
        launch=("vllm", "serve", "{model}"),
        tensor_parallel="--tensor-parallel-size",
        context="--max-model-len",
        switches=_VLLM_SWITCHES,
        fp8_kv=("--kv-cache-dtype", "fp8"),
        fp8_kv_unscaled=_VLLM_UNSCALED,
        mla_note="MLA model: every GPU holds the whole latent cache; --decode-context-parallel-size "
        "(up to {gpus}) splits it, where the attention backend supports it",
        host_tiers={
            "native": HostTierRecipe(
                flags=("--kv-offloading-backend", "native", "--kv-offloading-size", "{size}"),
                notes=(
                    "vLLM native offloading (OffloadingConnector with CPUOffloadingSpec), measured on "
                    "vLLM 0.24.0; pinned host memory: leave room for the OS (two 40 GiB servers on one "
                    "host failed to start)",
                ),
            ),
            "lmcache": HostTierRecipe(
                flags=("--kv-offloading-backend", "lmcache", "--kv-offloading-size", "{size}"),
                setup=(
                    f"pip install lmcache=={LMCACHE_VERSION}",
                    "lmcache server --l1-size-gb {size} --eviction-policy LRU --port 5555 &  # keep it up",
                ),
                notes=(
                    f"vLLM + LMCache {LMCACHE_VERSION}: vLLM's LMCacheMPConnector talks to the "
                    "`lmcache server` on tcp://localhost:5555, which holds the host tier (its "
                    "--l1-size-gb decides, not vLLM's)",
                ),
            ),
        },
    ),
)

SGLANG = EngineProfile(
    name="sglang",
    prefix_cache="radix",
    label="SGLang",
    missing_report="SGLang does not report cached tokens: start it with --enable-cache-report",
    owned_by=("sglang",),
    probe_path="/server_info",
    discover=_discover_sglang,
    context_setting="context_length",
    # Images (0.5.23 CPU, tiny Qwen2-VL, 2026-12-06): /model_info says has_image_understanding;
    # /v1/tokenize leaves an image part as one <|image_pad|>, so a one-token request counts it (its
    # usage also has prompt_tokens_details.image_tokens, the pads alone).
    image_flag=("/model_info", "has_image_understanding"),
    # The bare /tokenize 404s on 0.5.23; this route takes a list of texts.
    tokenize_path="/v1/tokenize",
    tokenize_batches=True,
    # Without the flag SGLang renders exactly as for a chat completion (which opens the assistant turn).
    tokenize_generation_flag=False,
    hit_counter="sglang:cached_tokens_total",
    query_counter="sglang:prompt_tokens_total",
    # HiCache: the hit counter itself is labelled by tier; host capacity in two gauges.
    tiers=(
        CacheTiers(
            "0",
            hits_by_source="sglang:cached_tokens_total",
            source_label="cache_source",
            metrics=("sglang:hicache_host_used_tokens", "sglang:hicache_host_total_tokens"),
            external_sources=("storage",),
            host_capacity_tokens="sglang:hicache_host_total_tokens",
        ),
    ),
    # Per request, with HiCache: sglext.cached_tokens_details {device, host, storage}.
    tier_detail_switches=("return_cached_tokens_details",),
    # return_token_ids on completions; its chat route refuses it when streaming, so there the
    # ids come in the last chunk's sglext.
    chat_id_switches=("return_input_ids_in_sglext", "return_output_ids_in_sglext"),
    completions_id_switches=("return_token_ids",),
    # /v1/completions takes prompt as a list of ids (0.5.17 on the H200, 0.5.23 on the CPU; its
    # /generate takes input_ids too, but answers in its own format).
    takes_prompt_ids=True,
    session_api=True,
    # docs/benchmarks.md "gpu-siblings-sglang" (H200, SGLang 0.5.17: fcfs, page 1, triton
    # attention, 99.7k-token pack): admitted 24.6 s, lead 25.4 s, together 26.2 s; the fastest
    # plain client (lead then 7) 24.8 s. SGLang does not share a prefix still being prefilled:
    # followers sent together waited for their own. The CPU build (0.5.23) agrees: admitted
    # (30.3 s) ahead of lead (45.8-49.4 s) and together (36-58 s, 98.4% cached). SGLang sends its
    # headers with the first token, so admitted waits about as long as lead. Only fcfs measured.
    # Typed answers: response_format json_schema (xgrammar by default). A server started with
    # --grammar-backend none (or whose tokenizer XGrammar refused: it then falls back to none)
    # would answer in free text: refused before anything is sent.
    schema_forms=(
        SchemaForm(
            "0",
            disabled_by=("grammar_backend", "none"),
            fix="start it with --grammar-backend xgrammar",
        ),
    ),
    dispatch=(
        Measured(
            "", "admitted", 8, "gpu-siblings-sglang (H200, 0.5.17, fcfs) and benchmarks/siblings.py (CPU)"
        ),
    ),
    checks=(
        Check("warning", "disable_radix_cache", _true, "remove --disable-radix-cache", _RADIX_OFF),
        Check("warning", "enable_cache_report", _false, "--enable-cache-report", _REPORTS),
        Check("warning", "chunked_prefill_size", _chunking_off, _CHUNK_SIZE, _NOT_CHUNKED),
        Check("suggestion", "enable_metrics", _false, "--enable-metrics", _COUNTERS),
        Check("warning", "kv_cache_dtype", _eight_bit, "--kv-cache-dtype auto", _SGLANG_UNSCALED, _unscaled),
        Check("suggestion", "kv_cache_dtype", _sixteen_bit, "--kv-cache-dtype fp8_e4m3", _HALVES, _scaled),
    ),
    caching_setting="disable_radix_cache",
    # /v1/models' root is the served name on SGLang; /server_info has the folder it loaded.
    checkpoint_setting="model_path",
    recipe=RecipeSwitches(
        launch=("python", "-m", "sglang.launch_server", "--model-path", "{model}"),
        tensor_parallel="--tp-size",
        context="--context-length",
        switches=_SGLANG_SWITCHES,
        fp8_kv=("--kv-cache-dtype", "fp8_e4m3"),
        fp8_kv_unscaled=_SGLANG_UNSCALED,
        notes=("SGLang's radix (prefix) cache is on by default: never pass --disable-radix-cache",),
        mla_note="MLA model: every GPU holds the whole latent cache; --dcp-size (up to {gpus}) splits it",
        host_tiers={
            "hicache": HostTierRecipe(
                flags=(
                    "--enable-hierarchical-cache",
                    "--hicache-size",
                    "{size}",
                    "--hicache-write-policy",
                    "write_through",
                ),
                notes=(
                    "SGLang HiCache: --hicache-size is host memory per rank in GB (it overrides "
                    "--hicache-ratio); write_through keeps a host copy of every block, so a revisit after "
                    "eviction is a load",
                ),
            ),
        },
    ),
)

GENERIC = EngineProfile(
    name="generic",
    label="OpenAI-compatible",
    missing_report="the server does not report cached tokens (usage.prompt_tokens_details.cached_tokens)",
    # Lead-first: the one strategy that caches whatever the scheduler does with simultaneous arrivals.
    # OpenAI's form; a server that ignores it answers in free text, which validation refuses.
    schema_forms=(SchemaForm("0"),),
    dispatch=(
        Measured("", "lead", DEFAULT_CONCURRENCY, "no measurement: lead-first caches on any scheduler"),
    ),
    doctor_note=Finding(
        "warning",
        "engine",
        "unknown",
        "(serve the model with vLLM or SGLang)",
        "longctx cannot check prefix caching or read cache counters on this server",
    ),
)

_PROFILES: dict[str, EngineProfile] = {profile.name: profile for profile in (VLLM, SGLANG, GENERIC)}


def register(profile: EngineProfile) -> None:
    """Make ``profile`` known (replacing the one of its name): discovery, doctor and recipes see it."""
    _PROFILES[profile.name] = profile


@contextmanager
def registered(profile: EngineProfile) -> Iterator[EngineProfile]:
    """``profile`` registered for the block; the one it replaced (if any) comes back after."""
    previous = _PROFILES.get(profile.name)
    register(profile)
    try:
        yield profile
    finally:
        if previous is None:
            _PROFILES.pop(profile.name, None)
        else:
            register(previous)


def profiles() -> tuple[EngineProfile, ...]:
    """Every registered profile, in registration order (the built-in ones first)."""
    return tuple(_PROFILES.values())


def recipe_engines() -> tuple[str, ...]:
    """The names of the registered engines that have a launch recipe."""
    return tuple(profile.name for profile in _PROFILES.values() if profile.recipe is not None)


def recipe_host_tiers() -> tuple[str, ...]:
    """The names of the host tiers the registered engines' launch recipes know, each once."""
    names = (name for profile in _PROFILES.values() if profile.recipe for name in profile.recipe.host_tiers)
    return tuple(dict.fromkeys(names))


def find_profile(name: str) -> EngineProfile | None:
    """The profile registered as ``name``, or None."""
    return _PROFILES.get(name)


def identify(endpoint: HttpEndpoint, owned_by: str | None) -> EngineProfile:
    """The engine behind ``endpoint``: by ``owned_by``, else by a probe route that answers, else generic."""
    known = profiles()
    for profile in known:
        if owned_by is not None and owned_by in profile.owned_by:
            return profile
    for profile in known:
        if profile.probe_path is not None and endpoint.status(profile.probe_path) == 200:
            return profile
    return GENERIC


# Routers in front of replicas, checked against vllm-router 0.1.17 and smg 1.13.0 over the test
# fleet's CPU vLLM replicas: both list their workers on GET /workers; vllm-router also answers
# GET /list_workers ({"urls": [...]}), which smg does not have.
VLLM_ROUTER = RouterProfile(
    name="vllm-router",
    keeping_policy="--policy consistent_hash",
    # kv_aware gives a request that carries cache_salt no KV score: it falls back to the policy
    # without affinity.
    salt_blind_policies=("kv_aware",),
    lists_workers=True,
    probe=("/list_workers", "urls"),
)
SMG = RouterProfile(name="smg", keeping_policy="--policy consistent_hashing", lists_workers=True)
DYNAMO = RouterProfile(
    name="dynamo", keeping_policy="--router-mode kv --router-session-affinity-ttl-secs 3600"
)
_ROUTERS: dict[str, RouterProfile] = {router.name: router for router in (VLLM_ROUTER, SMG, DYNAMO)}

#: Router policies (as any router spells them) that send one pack's requests to whichever replica
#: comes next: every replica prefills the pack again and each holds every pack, so a fleet caches
#: no more than one replica.
SPREADING_POLICIES = frozenset(
    {"round_robin", "roundrobin", "round-robin", "random", "power_of_two", "least_load"}
)


def routers() -> tuple[RouterProfile, ...]:
    """Every known router, in registration order."""
    return tuple(_ROUTERS.values())


def find_router(name: str) -> RouterProfile | None:
    """The router known as ``name``, or None."""
    return _ROUTERS.get(name)


def measured_dispatch(profile: EngineProfile, version: str | None) -> Measured:
    """The first of ``profile``'s measured dispatch rows for ``version``, else the generic one."""
    rows = (*profile.dispatch, *GENERIC.dispatch)
    return next(row for row in rows if (version or "").startswith(row.version_prefix))
