"""Flag advice from a server's observed settings."""

from __future__ import annotations

import pytest

from longctx.backends.profiles import CHECKPOINT_KV_SCALES
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
            CHECKPOINT_KV_SCALES: True,
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
            CHECKPOINT_KV_SCALES: True,
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


@pytest.mark.parametrize(
    ("engine", "setting", "fp8"), [("vllm", "cache_dtype", "fp8"), ("sglang", "kv_cache_dtype", "fp8_e4m3")]
)
def test_fp8_kv_is_suggested_only_for_a_checkpoint_with_kv_scales(
    engine: str, setting: str, fp8: str
) -> None:
    def kv_flags(observed: dict[str, object]) -> list[str]:
        return [f.flag for f in suggest_server_flags(engine, observed) if f.setting == setting]

    with_scales = suggest_server_flags(engine, {setting: "auto", CHECKPOINT_KV_SCALES: True})
    assert [(f.severity, f.flag) for f in with_scales] == [("suggestion", f"--kv-cache-dtype {fp8}")]
    assert "calibrated k/v scales" in with_scales[0].reason
    assert kv_flags({setting: "auto", CHECKPOINT_KV_SCALES: False}) == []
    assert kv_flags({setting: "auto", CHECKPOINT_KV_SCALES: None}) == []  # unknown is not found
    assert kv_flags({setting: "bfloat16"}) == []


@pytest.mark.parametrize(("engine", "setting", "measured"), [
    ("vllm", "cache_dtype", "vLLM 0.24.0"), ("sglang", "kv_cache_dtype", "SGLang 0.5.17"),
])  # fmt: skip
def test_fp8_kv_without_kv_scales_is_a_warning_with_the_measurement(
    engine: str, setting: str, measured: str
) -> None:
    served = "fp8" if engine == "vllm" else "fp8_e4m3"
    findings = suggest_server_flags(engine, {setting: served, CHECKPOINT_KV_SCALES: False})
    assert [(f.severity, f.flag, f.observed) for f in findings] == [
        ("warning", "--kv-cache-dtype auto", served)
    ]
    assert "2026-12-06, H100" in findings[0].reason and measured in findings[0].reason
    assert "9/10 facts with bf16 KV" in findings[0].reason
    # With scales, or when doctor could not read the checkpoint, fp8 is left alone.
    assert suggest_server_flags(engine, {setting: served, CHECKPOINT_KV_SCALES: True}) == ()
    assert suggest_server_flags(engine, {setting: served, CHECKPOINT_KV_SCALES: None}) == ()
