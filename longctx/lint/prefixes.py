"""Common prefixes of token sequences, and which earlier request each request shares most with."""

from __future__ import annotations

from collections.abc import Sequence

from longctx.recordtypes import record_type

__all__ = ["Ancestor", "Ancestry", "common_prefix"]

_CHUNK = 512


def common_prefix(left: Sequence[object], right: Sequence[object]) -> int:
    """How many leading items ``left`` and ``right`` share (compared a chunk at a time, then one by one)."""
    limit = min(len(left), len(right))
    position = 0
    while (
        position + _CHUNK <= limit
        and left[position : position + _CHUNK] == right[position : position + _CHUNK]
    ):
        position += _CHUNK
    while position < limit and left[position] == right[position]:
        position += 1
    return position


@record_type
class Ancestor:
    """The earlier request a request shares the longest token prefix with (the latest among equals)."""

    index: int
    shared_tokens: int


class Ancestry:
    """The requests seen so far, to find each new one's :class:`Ancestor`."""

    def __init__(self) -> None:
        self._seen: list[tuple[int, ...]] = []

    def add(self, tokens: Sequence[int]) -> Ancestor | None:
        """The ancestor of ``tokens`` among the requests added before (None for the first), then add it."""
        best: Ancestor | None = None
        key = tuple(tokens)
        for index in range(len(self._seen) - 1, -1, -1):
            shared = common_prefix(self._seen[index], key)
            if best is None or shared > best.shared_tokens:
                best = Ancestor(index, shared)
        self._seen.append(key)
        return best
