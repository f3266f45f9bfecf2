"""Images on the real CPU engines: the tiny Qwen2-VL served by vLLM and by SGLang.

A chat request whose user message is content parts (text, a PNG page as a
``data:`` URL, the document's text, the question): the image costs the tokens
:func:`~longctx.backends.images.count_image_tokens` says, a second question
over the same parts is served from the cache past the image, and the same
request with another image is a miss from the image on. The images are PNGs
written here (zlib), so their bytes are the same on any machine.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import httpx2

from longctx.backends.base import connect
from longctx.backends.images import EncodedImage, count_image_tokens, image_part
from longctx.testing import LocalServer

# About 600 tokens of document text after the image: the shared prefix reaches past vLLM's CPU
# cache blocks (128 tokens) that hold the image.
DOCUMENT = "".join(f"Clause {n}: the tenant pays the rent on day {n % 28 + 1}.\n" for n in range(40))
# A 300 x 400 page: Qwen2-VL resizes it to 308 x 392, (308 / 28) * (392 / 28) = 154 image tokens,
# and the chat template wraps them in <|vision_start|> ... <|vision_end|>.
PAGE_TOKENS = 154 + 2


def png(width: int, height: int, seed: int) -> EncodedImage:
    """A deterministic RGB PNG (stripes that depend on ``seed``), encoded without an image library."""
    row = bytes((x * 7 + seed * 29) % 256 for x in range(width * 3))
    raw = b"".join(b"\x00" + row[y % 3 :] + row[: y % 3] for y in range(height))

    def chunk(kind: bytes, payload: bytes) -> bytes:
        checksum = struct.pack(">I", zlib.crc32(kind + payload))
        return struct.pack(">I", len(payload)) + kind + payload + checksum

    data = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )
    return EncodedImage(data, width, height)


def chat(server: LocalServer, page: EncodedImage | None, question: str) -> dict[str, Any]:
    """The usage of a chat request over [text, page, document, question] (no page: the text alone)."""
    content = [
        {"type": "text", "text": "Page 1 of the lease, scanned:\n"},
        *([image_part(page)] if page is not None else []),
        {"type": "text", "text": f"\n{DOCUMENT}\n\n"},
        {"type": "text", "text": question},
    ]
    body = {
        "model": "tiny-qwen2-vl",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 2,
        "temperature": 0,
    }
    answer = httpx2.post(f"{server.api_base}/chat/completions", json=body, timeout=300)
    answer.raise_for_status()
    usage: dict[str, Any] = answer.json()["usage"]
    return usage


def check_counts_and_cache(server: LocalServer, seed: int) -> None:
    page = png(300, 400, seed)
    with connect(server.api_base) as backend:
        assert backend.image_counter().takes_images() is True
        (counted,) = count_image_tokens(backend, [page])
    assert counted.tokens == PAGE_TOKENS

    first = chat(server, page, "Who pays the rent?")
    second = chat(server, page, "On which day?")
    other = chat(server, png(300, 400, seed + 1), "Who pays the rent?")
    # The engine prefills the image part as the tokens counted.
    text_alone = chat(server, None, "Who pays the rent?")
    assert first["prompt_tokens"] - text_alone["prompt_tokens"] == counted.tokens
    # Where the image ends: the text before it is a dozen tokens; the prefix cached for the second
    # question reaches past it, into the document.
    image_end = 20 + PAGE_TOKENS
    assert second["prompt_tokens_details"]["cached_tokens"] > image_end
    # Another image: nothing from the image on is served from the cache.
    assert (other["prompt_tokens_details"]["cached_tokens"] or 0) < image_end - PAGE_TOKENS


def test_vllm_counts_an_image_and_caches_its_prefix(vllm_vision_server: LocalServer) -> None:
    check_counts_and_cache(vllm_vision_server, seed=1)


def test_sglang_counts_an_image_and_caches_its_prefix(sglang_vision_server: LocalServer) -> None:
    check_counts_and_cache(sglang_vision_server, seed=11)


def test_a_text_only_model_takes_no_images(engine_server: LocalServer) -> None:
    with connect(engine_server.api_base) as backend:
        assert backend.image_counter().takes_images() is False
