"""vLLM's prefix cache, simulated: full blocks chained by hash, reuse up to the first miss, LRU eviction.

As vLLM v1's KV cache manager does it (``vllm/v1/core/kv_cache_utils.py``,
``block_pool.py``): a prompt is cut into blocks of ``block_size`` tokens;
each *full* block is named by a hash of its parent block's hash, its tokens
and (for the first block) the request's ``cache_salt``; a request reuses the
blocks of its chain up to the first one the cache lacks, and never its last
token (the hit is capped at prompt length - 1, so a whole-prompt hit
recomputes one block). A partial last block is never cached. Freed blocks
stay cached until their memory is needed, evicted least recently used
first; a request's blocks are freed tail first, so its first blocks are
evicted last.

The requests are replayed one after another (the log's order), each freeing
its blocks before the next starts: concurrency is not simulated.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["VllmCache"]


class VllmCache:
    """The block cache of one vLLM engine: ``block_size`` tokens a block, ``capacity_blocks`` of them."""

    def __init__(self, block_size: int = 16, capacity_blocks: int | None = None) -> None:
        if block_size < 1:
            raise ValueError("block_size is at least 1")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        # Cached blocks by hash, least recently freed first: the order of eviction.
        self._free: OrderedDict[int, None] = OrderedDict()

    def block_hashes(self, tokens: Sequence[int], cache_salt: str | None = None) -> list[int]:
        """The hash chain of ``tokens``' full blocks."""
        hashes: list[int] = []
        parent = hash(("longctx-lint-root", cache_salt))
        size = self.block_size
        for start in range(0, len(tokens) - size + 1, size):
            parent = hash((parent, tuple(tokens[start : start + size])))
            hashes.append(parent)
        return hashes

    def cached_tokens(self, tokens: Sequence[int], cache_salt: str | None = None) -> int:
        """The tokens of ``tokens`` the cache would serve now, without sending the request."""
        return self._hits(self.block_hashes(tokens, cache_salt), len(tokens)) * self.block_size

    def _hits(self, hashes: Sequence[int], length: int) -> int:
        usable = (length - 1) // self.block_size  # never the last token
        hits = 0
        for block in hashes[:usable]:
            if block not in self._free:
                break
            hits += 1
        return hits

    def send(self, tokens: Sequence[int], cache_salt: str | None = None) -> int:
        """Run one request: the tokens it finds cached; its full blocks are cached afterwards."""
        hashes = self.block_hashes(tokens, cache_salt)
        hits = self._hits(hashes, len(tokens))
        for block in hashes[:hits]:
            del self._free[block]  # in use now
        needed = -(-len(tokens) // self.block_size) + 1 - hits  # every block of the prompt and an answer's
        capacity = self.capacity_blocks
        if capacity is not None:
            if needed + hits > capacity:  # the request cannot run at all
                for block in reversed(hashes[:hits]):
                    self._free[block] = None
                return 0
            while self._free and len(self._free) + hits + needed > capacity:
                self._free.popitem(last=False)
        # Freed tail first: the first blocks are the last to be evicted.
        for block in reversed(hashes):
            self._free.pop(block, None)
            self._free[block] = None
        if capacity is not None:
            while len(self._free) > capacity:
                self._free.popitem(last=False)
        return hits * self.block_size

    @property
    def cached_blocks(self) -> int:
        return len(self._free)
