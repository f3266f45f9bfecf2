"""Small helpers for tests that talk to the real engines directly."""

from __future__ import annotations

import uuid

import httpx2

from longctx.backends.base import rendezvous_order
from longctx.sessions.session import affinity_key
from longctx.store import StoredPack
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


def make_packs(tag: str, count: int) -> list[StoredPack]:
    """``count`` distinct packs of about 1,500 tokens; ``tag`` keeps runs from sharing a cache."""
    packs = []
    for index in range(count):
        body = "".join(
            f"file {tag}/{index}/{line}.py: def f{line}(x): return x * {line}\n" for line in range(110)
        )
        packs.append(
            StoredPack(
                fingerprint=uuid.uuid5(uuid.NAMESPACE_URL, f"{tag}-{index}").hex * 2,
                format_version="test/1",
                system="You answer questions about the repository.",
                prefix=f"<repository {tag}-{index}>\n{body}</repository>\n\n",
                summary={"title": f"{tag}-{index}"},
            )
        )
    return packs


def packs_homed_on(url: str, urls: list[str], count: int) -> tuple[list[StoredPack], list[StoredPack]]:
    """``count`` packs whose first replica of ``urls`` is ``url``, and ``count`` whose first is another."""
    mine: list[StoredPack] = []
    others: list[StoredPack] = []
    index = 0
    while len(mine) < count or len(others) < count:
        pack = make_packs(f"kill-{index}", 1)[0]
        index += 1
        # A session's affinity key is its pack's fingerprint (see affinity_key).
        first = rendezvous_order(affinity_key(pack.fingerprint, "unused"), urls)[0]
        target = mine if first == url else others
        if len(target) < count:
            target.append(pack)
    return mine, others


def whitespace_ban(model: TinyModel) -> dict[str, dict[str, int]]:
    """A ``logit_bias`` body field that bans ``model``'s whitespace-only tokens.

    Under constrained decoding the tiny random-weight model fills JSON with
    whitespace until max_tokens, and neither engine takes a per-request switch
    against it (tests/test_schemas_engines.py's docstring has the measurement).
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model.path / "tokenizer.json"))
    blank = [i for i in range(tokenizer.get_vocab_size()) if (t := tokenizer.decode([i])) and not t.strip()]
    return {"logit_bias": dict.fromkeys(map(str, blank), -100)}
