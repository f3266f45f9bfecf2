"""Small helpers for tests that talk to the real engines directly."""

from __future__ import annotations

import httpx2

from longctx.testing import LocalServer, TinyModel


def tokenize_messages(server: LocalServer, model: TinyModel, messages: list[dict[str, str]]) -> list[int]:
    """The token ids the server's chat template and tokenizer make of ``messages``."""
    # vLLM serves /tokenize at the root; SGLang 0.5.23 only under /v1.
    path = "/tokenize" if server.name == "vllm" else "/v1/tokenize"
    body = {"model": model.served_name, "messages": messages, "add_generation_prompt": True}
    response = httpx2.post(server.base_url + path, json=body, timeout=120)
    response.raise_for_status()
    tokens: list[int] = response.json()["tokens"]
    return tokens


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length
