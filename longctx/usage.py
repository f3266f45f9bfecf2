"""Usage of one request: the one definition of what a response says about its cost.

:class:`Usage` is what one response said about its prompt: prompt, cached
and created-cache tokens, completion tokens, time to first token and in
all. A count the server did not report is ``None``, never a made-up zero,
and ``cached_reason`` says why (usually the launch flag that turns
reporting on). Where the server keeps a tier below GPU memory and says
per request where the cached tokens came from (SGLang's
``cached_tokens_details``), ``host_cached_tokens`` and
``external_cached_tokens`` hold the share loaded from host memory and from
storage (disk, a cache server, another instance); the rest came from the
GPU. None: not reported per request (vLLM says it only in its counters,
which the report's counter check reads). ``prompt_form`` is how the prompt
travelled: ``"ids"`` (token ids, :mod:`longctx.sessions.prompt_ids`),
``"text: <why>"`` where ids were wanted but could not be used, None for
text as asked.

Its fields are written here once. The store's request rows
(:mod:`longctx.store`), the report's request lines
(:mod:`longctx.report`) and the JSON the CLI prints are derived from
:data:`USAGE_FIELDS`, so a new field is added here and in one schema
migration, nowhere else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from longctx.recordtypes import record_type

__all__ = ["USAGE_FIELDS", "Usage"]


@record_type
class Usage:
    """Token counts and timings of one request, as the server reported them."""

    prompt_tokens: int | None
    cached_tokens: int | None
    created_cache_tokens: int | None
    completion_tokens: int | None
    ttft_seconds: float | None
    total_seconds: float | None
    cached_reason: str | None = None
    host_cached_tokens: int | None = None
    external_cached_tokens: int | None = None
    prompt_form: str | None = None

    @property
    def device_cached_tokens(self) -> int | None:
        """Cached tokens found in GPU memory, where the response split them by tier."""
        if self.cached_tokens is None or self.host_cached_tokens is None:
            return None
        return self.cached_tokens - self.host_cached_tokens - (self.external_cached_tokens or 0)

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (the JSON form, and the store's columns)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Usage:
        """The usage :meth:`to_dict` (or a store row with these columns) holds."""
        return cls(**{name: data[name] for name in USAGE_FIELDS if name in data})

    def summary_line(self) -> str:
        """``X of Y prompt tokens cached``, for a turn's line on a terminal."""
        cached = "unknown" if self.cached_tokens is None else f"{self.cached_tokens:,}"
        line = f"{cached} of {self.prompt_tokens or 0:,} prompt tokens cached"
        if self.host_cached_tokens:
            line += f" ({self.host_cached_tokens:,} from host memory)"
        if self.external_cached_tokens:
            line += f" ({self.external_cached_tokens:,} from storage)"
        return line


USAGE_FIELDS: Final[tuple[str, ...]] = tuple(field.name for field in dataclasses.fields(Usage))
"""The names of :class:`Usage`'s fields, in order: also the store's column names."""
