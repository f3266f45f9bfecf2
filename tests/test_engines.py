"""The real engines of the harness: prefix caching, cache salts, offline serving.

These talk HTTP directly, below longctx's own client, so they pin what the
engines themselves do on this machine.
"""

from __future__ import annotations

import json
import sysconfig
import uuid
from pathlib import Path
from typing import Any

import httpx2
import pytest
from engine_helpers import common_prefix_length, tokenize_messages

from longctx.testing import EngineHarness, LocalServer, TinyModel, build_tiny_model

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def long_document(min_chars: int = 24_000) -> str:
    """Standard-library source, headed by a nonce so the first request is cold.

    24,000 characters are about 6,000 tokens: two of SGLang's 4,096-token prefill chunks and
    dozens of vLLM's 128-token blocks (48,000 cost each engine twice the prefill and showed
    nothing more).
    """
    parts = [f"# document {uuid.uuid4()}\n"]
    for name in ("typing.py", "dataclasses.py", "argparse.py"):
        parts.append((STDLIB / name).read_text())
        if sum(map(len, parts)) >= min_chars:
            break
    return "".join(parts)[:min_chars]


def chat(server: LocalServer, model: TinyModel, content: str, **extra: Any) -> dict[str, Any]:
    body = {
        "model": model.served_name,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        **extra,
    }
    response = httpx2.post(server.api_base + "/chat/completions", json=body, timeout=300)
    response.raise_for_status()
    usage: dict[str, Any] = response.json()["usage"]
    return usage


def cached(usage: dict[str, Any]) -> int:
    details = usage.get("prompt_tokens_details")
    assert details is not None, f"the server reported no prompt_tokens_details: {usage}"
    value: int = details["cached_tokens"]
    return value


def test_second_request_reuses_the_shared_prefix_and_a_salt_isolates_it(
    engine_server: LocalServer, tiny_model: TinyModel
) -> None:
    document = long_document()
    first, second = document + "\n\nWhat does this module define?", document + "\n\nWhich names are exported?"
    shared = common_prefix_length(
        tokenize_messages(engine_server, tiny_model, [{"role": "user", "content": first}]),
        tokenize_messages(engine_server, tiny_model, [{"role": "user", "content": second}]),
    )
    assert shared >= 4096, f"the shared prefix is only {shared} tokens"

    cold = chat(engine_server, tiny_model, first)
    warm = chat(engine_server, tiny_model, second)
    salted = chat(engine_server, tiny_model, second, cache_salt="another-tenant")

    assert cached(cold) < 0.05 * shared, cold
    assert cached(warm) >= 0.95 * shared, f"{cached(warm)} of {shared} shared tokens cached: {warm}"
    assert cached(warm) <= warm["prompt_tokens"]
    assert cached(salted) == 0, salted


def test_engines_run_offline_on_the_local_model(
    engine_server: LocalServer, tiny_model: TinyModel, longctx_harness: EngineHarness
) -> None:
    environ = dict(
        entry.split("=", 1)
        for entry in Path(f"/proc/{engine_server.pid}/environ").read_text(errors="replace").split("\0")
        if "=" in entry
    )
    assert environ["HF_HUB_OFFLINE"] == "1"
    hf_home = Path(environ["HF_HOME"])
    assert hf_home.is_relative_to(longctx_harness.base_dir)

    models = httpx2.get(engine_server.api_base + "/models", timeout=30).json()["data"]
    assert [model["id"] for model in models] == [tiny_model.served_name]
    assert models[0]["owned_by"] == engine_server.name
    assert models[0]["max_model_len"] == 32768
    chat(engine_server, tiny_model, "one more request after start")

    # Nothing was fetched into the private hub cache.
    downloaded = [p for p in hf_home.rglob("*") if p.is_file() and "models--" in p.as_posix()]
    assert downloaded == []
    assert "huggingface.co" not in engine_server.log_tail(400)


def test_vllm_reports_prefix_caching_on(vllm_server: LocalServer) -> None:
    metrics = httpx2.get(vllm_server.base_url + "/metrics", timeout=30).text
    info = next(line for line in metrics.splitlines() if line.startswith("vllm:cache_config_info"))
    assert 'enable_prefix_caching="True"' in info


def test_sglang_reports_cache_settings(sglang_server: LocalServer) -> None:
    info = httpx2.get(sglang_server.base_url + "/server_info", timeout=30).json()
    assert info["version"] == "0.5.23"
    assert info["disable_radix_cache"] is False
    assert info["enable_cache_report"] is True


@pytest.mark.vllm
def test_the_tiny_model_builds_identically_twice(
    vllm_python: Path, tmp_path: Path, tiny_model: TinyModel
) -> None:
    again = build_tiny_model(vllm_python, tmp_path)
    assert again.file_digests() == tiny_model.file_digests()
    config = json.loads((again.path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 128
    assert json.loads((again.path / "tokenizer.json").read_text())["model"]["type"] == "BPE"
