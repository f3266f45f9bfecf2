"""The vLLM flags of every recipe are accepted by the real vLLM argument parser.

The parse runs in the vLLM environment's interpreter (the harness fixture
``vllm_python``); nothing is started. While developing without the harness,
``LONGCTX_TEST_VLLM_PYTHON=/path/to/venv/bin/python`` points at another vLLM
environment; when it is unset the harness fixture is used.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
from engine_parsers import VLLM_SCRIPT, ParseResult, parse_with
from serving_configs import DEEPSEEK_MLA, KIMI_LINEAR_48B, LLAMA_GQA, with_kv_scales

from longctx.serving import KIMI_K3_NVFP4, Recipe, recipe_for

pytestmark = pytest.mark.vllm

# Read at import: the autouse fixture of conftest.py clears LONGCTX_* for each test.
_OVERRIDE = os.environ.get("LONGCTX_TEST_VLLM_PYTHON")

# Flags the recipes use that vLLM documents but that are recent enough to be
# missing from some builds. Missing there, they are reported, not failed; any
# other flag the parser does not know is a misspelling and fails the test.
MAY_BE_ABSENT = frozenset(
    {"--moe-backend", "--attention-config", "--attention-backend", "--max-cudagraph-capture-size"}
)


@pytest.fixture(scope="module")
def vllm_interpreter(request: pytest.FixtureRequest) -> Path:
    """The override when set, else the harness's ``vllm_python``."""
    if _OVERRIDE:
        return Path(_OVERRIDE)
    python = request.getfixturevalue("vllm_python")
    assert isinstance(python, Path)
    return python


def _recipes() -> dict[str, Recipe]:
    return {
        "kimi-k3": recipe_for(KIMI_K3_NVFP4, "vllm"),
        "kimi-k3-long": recipe_for(KIMI_K3_NVFP4, "vllm", max_model_len=1_048_576),
        # Calibrated KV scales declared: the recipe launches fp8 KV.
        "gqa": recipe_for(
            "meta-llama/Llama-3.1-8B-Instruct", "vllm", gpus=2, config=with_kv_scales(LLAMA_GQA)
        ),
        "mla": recipe_for("deepseek-ai/DeepSeek-V3", "vllm", gpus=8, config={**DEEPSEEK_MLA, "auto_map": {}}),
        "hybrid": recipe_for(
            "moonshotai/Kimi-Linear-48B-A3B-Instruct", "vllm", gpus=4, config=KIMI_LINEAR_48B
        ),
        "native": recipe_for(
            "meta-llama/Llama-3.1-8B-Instruct",
            "vllm",
            config=LLAMA_GQA,
            host_tier="native",
            host_memory_gib=24,
        ),
        "lmcache": recipe_for(
            "meta-llama/Llama-3.1-8B-Instruct",
            "vllm",
            config=LLAMA_GQA,
            host_tier="lmcache",
            host_memory_gib=24,
        ),
        "k3-native": recipe_for(
            KIMI_K3_NVFP4, "vllm", max_model_len=1_048_576, host_tier="native", host_memory_gib=1024
        ),
    }


@pytest.fixture(scope="module")
def parsed(vllm_interpreter: Path) -> dict[str, ParseResult]:
    recipes = _recipes()
    # Everything after `vllm serve`; one extra list with a misspelt flag as a control.
    argvs = [r.argv[2:] for r in recipes.values()]
    argvs.append(("some/model", "--kv-cache-dtpye", "fp8", "--enable-prefix-caching"))
    results = parse_with(vllm_interpreter, VLLM_SCRIPT, argvs)
    return dict(zip([*recipes, "misspelt"], results, strict=True))


@pytest.mark.parametrize(
    "name", ["kimi-k3", "kimi-k3-long", "gqa", "mla", "hybrid", "native", "lmcache", "k3-native"]
)
def test_recipe_flags_parse(parsed: dict[str, ParseResult], name: str) -> None:
    result = parsed[name]
    misspelt = sorted(set(result.unknown) - MAY_BE_ABSENT)
    assert not misspelt, f"vLLM does not know {misspelt}: misspelt, or add to MAY_BE_ABSENT with a reason"
    if result.unknown:
        warnings.warn(
            f"{name}: flags absent on this vLLM build (not parsed): {sorted(result.unknown)}", stacklevel=1
        )
    assert result.error is None, result.error
    assert result.parsed is not None


def test_kimi_k3_values_as_vllm_reads_them(parsed: dict[str, ParseResult]) -> None:
    values = parsed["kimi-k3"].parsed
    assert values is not None
    assert values["model_tag"] == KIMI_K3_NVFP4
    assert values["tensor_parallel_size"] == 8
    assert values["quantization"] == "modelopt_mixed"
    assert values["load_format"] == "fastsafetensors"
    assert values["max_model_len"] == 196_608
    assert values["kv_cache_dtype"] == "fp8"
    assert values["enable_prefix_caching"] is True
    assert values["enable_chunked_prefill"] is True
    assert values["max_num_batched_tokens"] == 8192
    assert values["enable_prompt_tokens_details"] is True
    assert values["trust_remote_code"] is True
    assert parsed["kimi-k3-long"].parsed is not None
    assert parsed["kimi-k3-long"].parsed["max_model_len"] == 1_048_576


def test_generic_values_as_vllm_reads_them(parsed: dict[str, ParseResult]) -> None:
    gqa, mla = parsed["gqa"].parsed, parsed["mla"].parsed
    assert gqa is not None and mla is not None
    assert gqa["tensor_parallel_size"] == 2
    assert gqa["max_model_len"] == 131_072
    assert gqa["kv_cache_dtype"] == "fp8"
    assert gqa["trust_remote_code"] is False
    assert mla["trust_remote_code"] is True
    assert mla["max_model_len"] == 163_840
    # No KV scales in the MLA config: no flag, so vLLM keeps its default, the model's own type.
    assert mla["kv_cache_dtype"] == "auto"


def test_host_tier_values_as_vllm_reads_them(parsed: dict[str, ParseResult]) -> None:
    native, lmcache, k3 = parsed["native"].parsed, parsed["lmcache"].parsed, parsed["k3-native"].parsed
    assert native is not None and lmcache is not None and k3 is not None
    assert native["kv_offloading_backend"] == "native"
    assert native["kv_offloading_size"] == 24.0
    assert lmcache["kv_offloading_backend"] == "lmcache"
    assert lmcache["kv_offloading_size"] == 24.0
    assert k3["kv_offloading_size"] == 1024.0


def test_a_misspelt_flag_is_caught(parsed: dict[str, ParseResult]) -> None:
    # The control: the parser really reports options it does not have.
    assert parsed["misspelt"].unknown == ("--kv-cache-dtpye",)
