"""Images on a server: whether its model takes them, and what each costs in prompt tokens.

:func:`count_image_tokens` is the one entry: a :class:`~longctx.backends.base.Backend`
and images (encoded bytes with their pixel size) in, each image's tokens out,
asked of the server that serves the affinity key and cached by image digest
(per server and model, for the backend's life). The route is the engine
profile's (:mod:`longctx.backends.engines`):

- ``tokenize``, where the tokenize route expands an image part given in chat
  messages (vLLM): the count of ``[text, image]`` less that of ``[text]``. Nothing
  is generated and the model does not run.
- ``completion``, elsewhere (SGLang, whose tokenize route leaves one
  placeholder; any OpenAI-compatible server that reports usage): the
  ``prompt_tokens`` of a one-token chat request with the image, less those of
  the same request without it. The model runs over the image once; on an
  engine that caches multimodal prefixes the image is then cached too.

Either way the count is what one image part adds to a prompt: its image
tokens and the markers the chat template puts around them.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import threading
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import field
from functools import cached_property
from typing import Any, Literal, Protocol

from longctx.backends.http import HttpEndpoint
from longctx.backends.profiles import EngineProfile
from longctx.errors import BackendError, TokenizerError
from longctx.recordtypes import record_type
from longctx.tokens.images import SERVER_COUNTED

__all__ = [
    "EncodedImage",
    "ImageCounter",
    "ImageLike",
    "ImageServers",
    "ImageTokens",
    "count_image_tokens",
    "image_part",
]

# The text beside the image in a counting request: one token on any tokenizer worth the name.
_FILLER = "."
_COUNT_TIMEOUT_SECONDS = 120.0


class ImageLike(Protocol):
    """What counting needs of an image: its encoded bytes, pixel size and media type."""

    @property
    def data(self) -> bytes: ...

    @property
    def width(self) -> int: ...

    @property
    def height(self) -> int: ...

    @property
    def media_type(self) -> str: ...


@record_type
class EncodedImage:
    """An encoded image (PNG by default) and its size in pixels."""

    data: bytes = field(repr=False)
    width: int
    height: int
    media_type: str = "image/png"

    @cached_property
    def digest(self) -> str:
        return image_digest(self)


@record_type
class ImageTokens:
    """One image's cost in a prompt: ``tokens``, found by ``route`` (``tokenize`` or ``completion``)."""

    digest: str
    width: int
    height: int
    tokens: int
    route: Literal["tokenize", "completion"]


def image_digest(image: ImageLike) -> str:
    """sha256 of the media type and the bytes: the cache key of an image's count."""
    return hashlib.sha256(image.media_type.encode() + b"\0" + image.data).hexdigest()


def image_part(image: ImageLike) -> dict[str, Any]:
    """The OpenAI chat content part of ``image``: an ``image_url`` holding a base64 ``data:`` URL."""
    encoded = base64.b64encode(image.data).decode("ascii")
    return {"type": "image_url", "image_url": {"url": f"data:{image.media_type};base64,{encoded}"}}


class ImageCounter:
    """Image questions to one server (``endpoint``, its ``profile``, the served ``model``); counts cached.

    An :class:`~longctx.tokens.images.ImageTokenCounter` (``identity``,
    ``estimated`` False, :meth:`count_images`), so a pack's budget counts
    its images through the server. Thread-safe. Raises :class:`~longctx.errors.TokenizerError` when the
    server cannot count an image (a text-only model, an unreadable image),
    with the server's answer.
    """

    def __init__(self, endpoint: HttpEndpoint, profile: EngineProfile, model: str) -> None:
        self.endpoint = endpoint
        self.profile = profile
        self.model = model
        self._counts: dict[str, int] = {}
        self._without_image: int | None = None
        self._takes_images: bool | None = None
        self._lock = threading.Lock()

    @property
    def identity(self) -> str:
        """What counts: the server's engine, URL and model, and the route (see the module docstring)."""
        return f"{SERVER_COUNTED} ({self.profile.label} {self.endpoint.root_url}, {self.model}, {self.route})"

    @property
    def estimated(self) -> bool:
        """False: the served model's own processor counts."""
        return False

    def count_images(self, images: Sequence[ImageLike]) -> list[int]:
        """Each image's tokens in a prompt, in order (:meth:`count` without the details)."""
        return [counted.tokens for counted in self.count(images)]

    @property
    def route(self) -> Literal["tokenize", "completion"]:
        if self.profile.tokenize_expands_images and self.profile.tokenize_path is not None:
            return "tokenize"
        return "completion"

    def takes_images(self) -> bool | None:
        """Whether the served model takes images; None when the server does not say (asked once).

        The profile's ``image_flag`` route where it has one (SGLang's
        ``/model_info``); else, where its tokenize route expands images
        (vLLM), a tokenize request with a 28 x 28 image: counted means yes,
        an HTTP 400 no.
        """
        if self._takes_images is None:
            self._takes_images = self._ask_takes_images()
        return self._takes_images

    def _ask_takes_images(self) -> bool | None:
        if self.profile.image_flag is not None:
            path, key = self.profile.image_flag
            try:
                answer = self.endpoint.get_json(path)
            except BackendError:
                return None
            flag = answer.get(key) if isinstance(answer, dict) else None
            return flag if isinstance(flag, bool) else None
        if self.route != "tokenize":
            return None
        probe = EncodedImage(_probe_png(), 28, 28)
        try:
            self._measure(probe)
        except TokenizerError as error:
            if isinstance(error.__cause__, BackendError) and error.__cause__.status == 400:
                return False
            raise
        return True

    def count(self, images: Sequence[ImageLike]) -> list[ImageTokens]:
        """Each image's tokens in a prompt, in order; an image seen before is not asked again."""
        counted: list[ImageTokens] = []
        for image in images:
            digest = image_digest(image)
            with self._lock:
                tokens = self._counts.get(digest)
            if tokens is None:
                tokens = self._measure(image)
                with self._lock:
                    self._counts[digest] = tokens
            counted.append(ImageTokens(digest, image.width, image.height, tokens, self.route))
        return counted

    def _measure(self, image: ImageLike) -> int:
        with self._lock:
            without = self._without_image
        if without is None:
            without = self._prompt_tokens([{"type": "text", "text": _FILLER}])
            with self._lock:
                self._without_image = without
        return self._prompt_tokens([{"type": "text", "text": _FILLER}, image_part(image)]) - without

    def _prompt_tokens(self, content: list[dict[str, Any]]) -> int:
        messages = [{"role": "user", "content": content}]
        try:
            if self.route == "tokenize":
                assert self.profile.tokenize_path is not None
                body = {"model": self.model, "messages": messages, "add_generation_prompt": True}
                answer = self.endpoint.post_json(
                    self.profile.tokenize_path, body, timeout=_COUNT_TIMEOUT_SECONDS
                )
                tokens = answer.get("tokens") if isinstance(answer, Mapping) else None
                if isinstance(tokens, list):
                    return len(tokens)
            else:
                chat = self.endpoint.api_url.removeprefix(self.endpoint.root_url) + "/chat/completions"
                body = {"model": self.model, "messages": messages, "max_tokens": 1, "temperature": 0}
                answer = self.endpoint.post_json(chat, body, timeout=_COUNT_TIMEOUT_SECONDS)
                usage = answer.get("usage") if isinstance(answer, Mapping) else None
                prompt = usage.get("prompt_tokens") if isinstance(usage, Mapping) else None
                if isinstance(prompt, int):
                    return prompt
        except BackendError as error:
            label = self.profile.label
            raise TokenizerError(f"the {label} server could not count an image: {error}") from error
        raise TokenizerError(
            f"the {self.profile.label} server answered an image count ({self.route}) without a token count: "
            f"{str(answer)[:200]}"
        )


class ImageServers(Protocol):
    """What holds a counter per server: a :class:`~longctx.backends.base.Backend`."""

    def image_counter(self, affinity_key: str | None = None) -> ImageCounter: ...


def count_image_tokens(
    backend: ImageServers, images: Sequence[ImageLike], *, affinity_key: str | None = None
) -> list[ImageTokens]:
    """Each image's prompt tokens on the server that serves ``affinity_key`` (see the module's routes).

    Counts are cached by image digest in the backend's counter for that
    server (:meth:`~longctx.backends.base.Backend.image_counter`), so a page
    counted once costs nothing again while the backend is open.
    """
    return backend.image_counter(affinity_key).count(images)


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def _probe_png(size: int = 28) -> bytes:
    """A ``size`` x ``size`` mid-grey RGB PNG, written here so that probing needs no image library."""
    rows = b"".join(b"\x00" + b"\x80" * (3 * size) for _ in range(size))
    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(rows, 9))
        + _png_chunk(b"IEND", b"")
    )
