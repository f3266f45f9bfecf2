"""The context a pack needs, read from its summary, for ``longctx plan --pack``.

A pack's summary (what ``longctx pack --json`` writes, or a pack's own
``to_dict()``) says what the pack costs the window before any question:
``total_tokens`` is its text, the chat template's tokens and, for a pack
with images, ``image_tokens``, counted as ``image_counter`` says (by the
server, or estimated). The planner answers for that context.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from longctx.errors import ConfigError
from longctx.recordtypes import record_type

__all__ = ["PlannedPack"]


@record_type
class PlannedPack:
    """A pack's context: ``total_tokens`` in all, of which ``image_tokens`` for its ``images``.

    ``image_counter`` says how the images were counted; ``estimated`` that
    some count is a guess.
    """

    fingerprint: str
    total_tokens: int
    image_tokens: int
    images: int
    image_counter: str | None
    estimated: bool

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any], source: str = "the pack") -> PlannedPack:
        """The context of ``summary``: a pack's ``to_dict()``, or what ``longctx pack --json`` writes.

        Raises :class:`~longctx.errors.ConfigError` naming ``source`` when it is no
        pack summary or its tokens were not counted.
        """
        facts = summary.get("pack", summary)
        if not isinstance(facts, Mapping) or "fingerprint" not in facts:
            raise ConfigError(f"{source} is not a pack's summary (write one with `longctx pack --json`)")
        total = facts.get("total_tokens")
        if not isinstance(total, int) or isinstance(total, bool):
            raise ConfigError(f"{source}: the pack's tokens were not counted (pack it with a --tokenizer)")
        image_tokens = facts.get("image_tokens") or 0
        return cls(
            fingerprint=str(facts["fingerprint"]),
            total_tokens=total,
            image_tokens=int(image_tokens),
            images=len(facts.get("images") or ()),
            image_counter=facts.get("image_counter"),
            estimated=bool(facts.get("estimated")),
        )

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> PlannedPack:
        """The context of the pack summary in the JSON file ``path``; raises :class:`ConfigError`."""
        try:
            with open(path, encoding="utf-8") as file:
                summary = json.load(file)
        except (OSError, ValueError) as error:
            raise ConfigError(f"cannot read the pack summary {os.fspath(path)}: {error}") from None
        if not isinstance(summary, Mapping):
            raise ConfigError(
                f"{os.fspath(path)} is not a pack's summary (write one with `longctx pack --json`)"
            )
        return cls.from_summary(summary, os.fspath(path))

    def line(self) -> str:
        """One line: the pack's context and what its images take of it."""
        line = f"pack {self.fingerprint[:16]}: {self.total_tokens:,} tokens"
        if self.images:
            line += (
                f", of which {self.image_tokens:,} for {self.images} image{'' if self.images == 1 else 's'}"
                f" ({self.image_counter or 'not counted'})"
            )
        return line + (" (estimated)" if self.estimated else "")

    def to_dict(self) -> dict[str, Any]:
        """The fields, JSON-ready."""
        return {
            "fingerprint": self.fingerprint,
            "total_tokens": self.total_tokens,
            "image_tokens": self.image_tokens,
            "images": self.images,
            "image_counter": self.image_counter,
            "estimated": self.estimated,
        }
