"""Image token counting (longctx.backends.images) against fake vLLM and SGLang servers.

The fakes answer as the real CPU engines did (vLLM 0.32.0, SGLang 0.5.23, a
tiny Qwen2-VL; tests/test_vision_engines.py checks the real ones): vLLM's
``/tokenize`` expands an image part, a text-only vLLM model answers it 400,
SGLang says ``has_image_understanding`` in ``/model_info`` and counts an
image only in a chat answer's usage.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from longctx.backends.base import connect
from longctx.backends.engines import GENERIC, SGLANG, VLLM
from longctx.backends.http import HttpEndpoint
from longctx.backends.images import EncodedImage, ImageCounter, count_image_tokens, image_part
from longctx.errors import TokenizerError

TEXT_TOKENS = 7


def image_tokens(part: dict[str, Any]) -> int:
    """The fake's cost of an image: 2 markers and 1 token per 10 bytes of its data URL."""
    return 2 + len(part["image_url"]["url"]) // 10


def prompt_tokens(body: dict[str, Any]) -> int:
    content = body["messages"][0]["content"]
    return TEXT_TOKENS + sum(image_tokens(part) for part in content if part["type"] == "image_url")


class FakeServer:
    """One engine's answers to image questions, and the requests it got."""

    def __init__(self, engine: str, *, takes_images: bool = True) -> None:
        self.engine = engine
        self.takes_images = takes_images
        self.posts: list[tuple[str, dict[str, Any]]] = []

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        if request.method == "GET":
            if path == "/v1/models":
                return httpx2.Response(200, json={"data": [{"id": "tiny-vl", "owned_by": self.engine}]})
            if path == "/model_info" and self.engine == "sglang":
                return httpx2.Response(200, json={"has_image_understanding": self.takes_images})
            return httpx2.Response(404, json={"detail": "Not Found"})
        body = json.loads(request.content)
        self.posts.append((path, body))
        with_image = any(part["type"] == "image_url" for part in body["messages"][0]["content"])
        if with_image and not self.takes_images:
            return httpx2.Response(400, json={"error": {"message": "tiny-vl is not a multimodal model"}})
        if path == "/tokenize" and self.engine == "vllm":
            return httpx2.Response(200, json={"tokens": list(range(prompt_tokens(body))), "count": 0})
        if path == "/v1/chat/completions":
            usage = {"prompt_tokens": prompt_tokens(body), "completion_tokens": 1}
            choice = {"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}
            return httpx2.Response(200, json={"choices": [choice], "usage": usage})
        return httpx2.Response(404, json={"detail": "Not Found"})


def counter(fake: FakeServer, profile: Any) -> ImageCounter:
    endpoint = HttpEndpoint("http://fake/v1", timeout=5.0, transport=httpx2.MockTransport(fake.handle))
    return ImageCounter(endpoint, profile, "tiny-vl")


def page(size: int, fill: bytes = b"p") -> EncodedImage:
    return EncodedImage(fill * size, width=300, height=400)


def test_vllm_counts_through_its_tokenize_route_and_asks_once_per_image() -> None:
    fake = FakeServer("vllm")
    images = counter(fake, VLLM)
    first, second = page(300), page(600)
    counts = images.count([first, second, first])
    expected = [image_tokens(image_part(image)) for image in (first, second, first)]
    assert [c.tokens for c in counts] == expected
    assert {c.route for c in counts} == {"tokenize"}
    assert counts[0].digest == first.digest and (counts[0].width, counts[0].height) == (300, 400)
    # One request without an image, one per distinct image; nothing is generated.
    assert [path for path, _ in fake.posts] == ["/tokenize"] * 3
    images.count([second])
    assert len(fake.posts) == 3


def test_sglang_counts_with_a_one_token_chat_request() -> None:
    fake = FakeServer("sglang")
    counts = counter(fake, SGLANG).count([page(500)])
    assert counts[0].tokens == image_tokens(image_part(page(500)))
    assert counts[0].route == "completion"
    assert {path for path, _ in fake.posts} == {"/v1/chat/completions"}
    assert all(body["max_tokens"] == 1 for _, body in fake.posts)


def test_an_image_part_is_a_base64_data_url() -> None:
    part = image_part(EncodedImage(b"\x89PNG", 1, 1))
    assert part == {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}}


def test_the_same_bytes_under_another_media_type_are_another_image() -> None:
    assert EncodedImage(b"x", 1, 1).digest != EncodedImage(b"x", 1, 1, media_type="image/jpeg").digest


@pytest.mark.parametrize(
    ("engine", "profile", "takes", "expected"),
    [
        ("vllm", VLLM, True, True),
        ("vllm", VLLM, False, False),
        ("sglang", SGLANG, True, True),
        ("sglang", SGLANG, False, False),
        ("generic", GENERIC, True, None),
    ],
)
def test_whether_a_model_takes_images(engine: str, profile: Any, takes: bool, expected: bool | None) -> None:
    fake = FakeServer(engine, takes_images=takes)
    assert counter(fake, profile).takes_images() is expected


def test_sglang_is_asked_its_flag_and_sent_no_image() -> None:
    fake = FakeServer("sglang")
    assert counter(fake, SGLANG).takes_images() is True
    assert fake.posts == []


def test_a_text_only_model_cannot_count_an_image() -> None:
    with pytest.raises(TokenizerError, match="not a multimodal model"):
        counter(FakeServer("vllm", takes_images=False), VLLM).count([page(100)])


def test_count_image_tokens_keeps_the_counts_in_the_backend() -> None:
    fake = FakeServer("vllm")
    with connect("http://fake/v1", transport=httpx2.MockTransport(fake.handle)) as backend:
        first = count_image_tokens(backend, [page(400)])
        asked = len(fake.posts)
        again = count_image_tokens(backend, [page(400)])
    assert first == again
    assert first[0].tokens == image_tokens(image_part(page(400)))
    assert len(fake.posts) == asked
