"""Usage of one request: the one definition of what a response says about its cost.

:class:`Usage` is what one response said about its prompt: prompt, cached
and created-cache tokens, completion tokens, time to first token and in
all. A count the server did not report is ``None``, never a made-up zero,
and ``cached_reason`` says why (usually the launch flag that turns
reporting on).

Its fields are written here once. The store's request rows
(:mod:`longctx.store`), the report's request lines
(:mod:`longctx.report`) and the JSON the CLI prints are derived from
:data:`USAGE_FIELDS`, so a new field is added here and in one schema
migration, nowhere else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["USAGE_FIELDS", "Usage"]


@dataclass(frozen=True)
class Usage:
    """Token counts and timings of one request, as the server reported them."""

    prompt_tokens: int | None
    cached_tokens: int | None
    created_cache_tokens: int | None
    completion_tokens: int | None
    ttft_seconds: float | None
    total_seconds: float | None
    cached_reason: str | None = None

    @property
    def uncached_tokens(self) -> int | None:
        """Prompt tokens the server had to prefill."""
        if self.prompt_tokens is None or self.cached_tokens is None:
            return None
        return self.prompt_tokens - self.cached_tokens

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (the JSON form, and the store's columns)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Usage:
        """The usage :meth:`to_dict` (or a store row with these columns) holds."""
        return cls(**{name: data[name] for name in USAGE_FIELDS})

    def summary_line(self) -> str:
        """``X of Y prompt tokens cached``, for a turn's line on a terminal."""
        cached = "unknown" if self.cached_tokens is None else f"{self.cached_tokens:,}"
        return f"{cached} of {self.prompt_tokens or 0:,} prompt tokens cached"


USAGE_FIELDS: Final[tuple[str, ...]] = tuple(field.name for field in dataclasses.fields(Usage))
"""The names of :class:`Usage`'s fields, in order: also the store's column names."""
