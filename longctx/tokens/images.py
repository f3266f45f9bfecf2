"""How many tokens an image costs the served model: the counter interface and the offline counters.

:class:`ImageTokenCounter` is what a pack's budget asks: images in, one
count each out. Three kinds satisfy it:

- the server's own count (exact: the served model's processor;
  :meth:`longctx.backends.base.Backend.image_counter`, whose identity starts
  with :data:`SERVER_COUNTED`);
- :class:`PatchImageCounter` built from the model's processor config
  (``preprocessor_config.json`` of a Qwen2-VL / Qwen2.5-VL-style model:
  ``patch_size``, ``merge_size``, ``min_pixels``, ``max_pixels``), which
  redoes the processor's arithmetic: the image is resized to multiples of
  ``patch_size * merge_size`` pixels within the pixel bounds
  (``smart_resize``), then costs one token per ``merge_size`` x
  ``merge_size`` patches, plus the two tokens that open and close an image
  in the chat template;
- :func:`estimate_image_counter`: the same arithmetic with Qwen2-VL's
  defaults (patch 14, merge 2, 3,136 to 12,845,056 pixels), flagged
  ``estimated``: the documented guess when neither the server nor a
  processor config is at hand. Other families price images otherwise
  (Gemma 3: 256 tokens an image; Llama 4 and Kimi-VL: tiles), so an
  estimate is only that.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol, runtime_checkable

from longctx.documents import ImagePart
from longctx.errors import ConfigError
from longctx.recordtypes import record_type

__all__ = ["ESTIMATED", "SERVER_COUNTED", "ImageTokenCounter", "PatchImageCounter", "estimate_image_counter"]

# How a pack's image tokens were counted, as its summary and the CLI say it: the start of a
# counter's identity.
SERVER_COUNTED: Final = "counted by the server"
ESTIMATED: Final = "estimated: Qwen2-VL formula, default processor"

_QWEN2_VL_PATCH: Final = 14
_QWEN2_VL_MERGE: Final = 2
_QWEN2_VL_MIN_PIXELS: Final = 56 * 56
_QWEN2_VL_MAX_PIXELS: Final = 28 * 28 * 16384
_FRAME_TOKENS: Final = 2  # <|vision_start|> and <|vision_end|> around the image's pad tokens


@runtime_checkable
class ImageTokenCounter(Protocol):
    """Counts the tokens each image costs the served model.

    ``identity`` names what counts (the server and model, or the processor
    config), ``estimated`` says whether the counts are a guess.
    """

    @property
    def identity(self) -> str: ...

    @property
    def estimated(self) -> bool: ...

    def count_images(self, images: Sequence[ImagePart]) -> list[int]:
        """The token count of each of ``images``, in order."""
        ...


@record_type
class PatchImageCounter:
    """Image tokens by a Qwen2-VL-style processor's arithmetic (see the module docstring)."""

    patch_size: int = _QWEN2_VL_PATCH
    merge_size: int = _QWEN2_VL_MERGE
    min_pixels: int = _QWEN2_VL_MIN_PIXELS
    max_pixels: int = _QWEN2_VL_MAX_PIXELS
    frame_tokens: int = _FRAME_TOKENS
    estimated: bool = False
    source: str = "processor config"

    def __post_init__(self) -> None:
        for name in ("patch_size", "merge_size", "min_pixels", "max_pixels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"PatchImageCounter.{name} must be a positive integer, not {value!r}")
        if self.min_pixels > self.max_pixels:
            raise ConfigError(f"min_pixels {self.min_pixels} is above max_pixels {self.max_pixels}")

    @property
    def identity(self) -> str:
        if self.estimated and self.source == ESTIMATED:
            return ESTIMATED
        return (
            f"patches {self.patch_size}x{self.merge_size} pixels {self.min_pixels}-{self.max_pixels}"
            f" ({self.source})"
        )

    @classmethod
    def from_processor_config(cls, config: Mapping[str, Any] | str | os.PathLike[str]) -> PatchImageCounter:
        """The counter of a processor config: its mapping, a ``preprocessor_config.json``, or a model folder.

        Reads ``patch_size``, ``merge_size`` and the pixel bounds, which are
        ``min_pixels``/``max_pixels`` or ``size.shortest_edge``/``size.longest_edge``
        (newer transformers); a key it lacks keeps Qwen2-VL's default.
        Raises :class:`~longctx.errors.ConfigError` for a file that cannot be read.
        """
        if not isinstance(config, Mapping):
            path = os.fspath(config)
            if os.path.isdir(path):
                path = os.path.join(path, "preprocessor_config.json")
            try:
                with open(path, encoding="utf-8") as file:
                    config = json.load(file)
            except (OSError, ValueError) as error:
                raise ConfigError(f"cannot read the processor config {path}: {error}") from None
            if not isinstance(config, Mapping):
                raise ConfigError(f"the processor config {path} is not a JSON object")
        given = config.get("size")
        size: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
        return cls(
            patch_size=int(config.get("patch_size", _QWEN2_VL_PATCH)),
            merge_size=int(config.get("merge_size", _QWEN2_VL_MERGE)),
            min_pixels=int(config.get("min_pixels", size.get("shortest_edge", _QWEN2_VL_MIN_PIXELS))),
            max_pixels=int(config.get("max_pixels", size.get("longest_edge", _QWEN2_VL_MAX_PIXELS))),
        )

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) the processor resizes a ``width`` x ``height`` image to (``smart_resize``)."""
        factor = self.patch_size * self.merge_size
        new_height = max(factor, round(height / factor) * factor)
        new_width = max(factor, round(width / factor) * factor)
        if new_height * new_width > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            new_height = max(factor, math.floor(height / beta / factor) * factor)
            new_width = max(factor, math.floor(width / beta / factor) * factor)
        elif new_height * new_width < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            new_height = math.ceil(height * beta / factor) * factor
            new_width = math.ceil(width * beta / factor) * factor
        return new_width, new_height

    def tokens_for(self, width: int, height: int) -> int:
        """The tokens of one ``width`` x ``height`` image, the frame tokens included."""
        new_width, new_height = self.resized(width, height)
        patches = (new_width // self.patch_size) * (new_height // self.patch_size)
        return patches // (self.merge_size * self.merge_size) + self.frame_tokens

    def count_images(self, images: Sequence[ImagePart]) -> list[int]:
        return [self.tokens_for(image.width, image.height) for image in images]


def estimate_image_counter() -> PatchImageCounter:
    """The documented estimate: Qwen2-VL's processor defaults, flagged ``estimated``."""
    return PatchImageCounter(estimated=True, source=ESTIMATED)
