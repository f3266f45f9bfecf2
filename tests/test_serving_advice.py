"""Flag advice from a server's observed settings."""

from __future__ import annotations

import pytest

from longctx.errors import ServingConfigError
from longctx.serving import suggest_server_flags


def test_vllm_without_the_switches_gets_every_flag_warnings_first() -> None:
    # Labels of vllm:cache_config_info are strings, as Prometheus exposes them.
    findings = suggest_server_flags(
        "vllm",
        {
            "enable_prefix_caching": "False",
            "cache_dtype": "auto",
            "block_size": "16",
            "enable_prompt_tokens_details": False,
            "max_num_batched_tokens": "2048",
        },
    )
    flags = [f.flag for f in findings]
    assert flags == [
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--max-num-batched-tokens 8192",
        "--kv-cache-dtype fp8",
    ]
    assert [f.severity for f in findings] == ["warning", "warning", "suggestion", "suggestion"]
    assert findings[0].observed == "False"


def test_vllm_that_is_already_tuned_gets_nothing() -> None:
    observed = {
        "enable_prefix_caching": "True",
        "cache_dtype": "fp8",
        "enable_prompt_tokens_details": True,
        "max_num_batched_tokens": 8192,
        "enable_chunked_prefill": "True",
    }
    assert suggest_server_flags("vllm", observed) == ()


def test_absent_settings_give_no_advice() -> None:
    assert suggest_server_flags("vllm", {}) == ()
    assert suggest_server_flags("sglang", {"chunked_prefill_size": None}) == ()


def test_sglang_server_info() -> None:
    findings = suggest_server_flags(
        "sglang",
        {
            "disable_radix_cache": True,
            "kv_cache_dtype": "auto",
            "enable_cache_report": False,
            "enable_metrics": False,
            "chunked_prefill_size": -1,
        },
    )
    assert [f.flag for f in findings] == [
        "remove --disable-radix-cache",
        "--enable-cache-report",
        "--chunked-prefill-size 8192",
        "--enable-metrics",
        "--kv-cache-dtype fp8_e4m3",
    ]


def test_unknown_engine() -> None:
    with pytest.raises(ServingConfigError) as info:
        suggest_server_flags("tgi", {})
    assert info.value.field == "engine"
