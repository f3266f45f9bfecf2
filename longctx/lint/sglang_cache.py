"""SGLang's prefix cache, simulated: a radix tree of token pages, LRU eviction of leaves.

As SGLang's ``RadixCache`` (``srt/mem_cache/radix_cache.py``) does it: every
prompt is inserted into a tree whose edges are runs of tokens; a request
reuses the longest prefix the tree holds, in whole pages of ``page_size``
tokens (default 1), capped at prompt length - 1; when the tokens held pass
``capacity_tokens`` the least recently used leaves are evicted first.

Requests are replayed one after another (the log's order); answers are not
inserted (the log has the prompts, not every answer's tokens).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

from longctx.lint.prefixes import common_prefix

__all__ = ["SglangCache"]


class _Node:
    __slots__ = ("children", "key", "last_access", "parent")

    def __init__(self, key: tuple[int, ...], parent: _Node | None, last_access: int) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[tuple[int, ...], _Node] = {}
        self.last_access = last_access


class SglangCache:
    """The radix cache of one SGLang engine: ``page_size`` tokens a page, ``capacity_tokens`` held."""

    def __init__(self, page_size: int = 1, capacity_tokens: int | None = None) -> None:
        if page_size < 1:
            raise ValueError("page_size is at least 1")
        self.page_size = page_size
        self.capacity_tokens = capacity_tokens
        self._clock = itertools.count(1)
        self._root = _Node((), None, 0)
        self.held_tokens = 0
        self._salted: dict[str, SglangCache] = {}

    def _page(self, tokens: Sequence[int], start: int) -> tuple[int, ...]:
        return tuple(tokens[start : start + self.page_size])

    def _aligned(self, length: int) -> int:
        return length - length % self.page_size

    def cached_tokens(self, tokens: Sequence[int]) -> int:
        """The tokens of ``tokens`` the tree would serve now, without sending the request."""
        return self._match(tuple(tokens), touch=False)

    def _match(self, tokens: tuple[int, ...], *, touch: bool) -> int:
        limit = self._aligned(len(tokens) - 1)
        node, position = self._root, 0
        now = next(self._clock) if touch else 0
        while position < limit:
            child = node.children.get(self._page(tokens, position))
            if child is None:
                break
            shared = self._aligned(common_prefix(child.key, tokens[position:limit]))
            position += shared
            if shared < len(child.key):
                break  # only a part of it matched: SGLang splits it and touches that part (at the insert)
            if touch:
                child.last_access = now
            node = child
        return min(position, limit)

    def send(self, tokens: Sequence[int], cache_salt: str | None = None) -> int:
        """Run one request: the tokens it finds cached; its whole pages are in the tree afterwards.

        A ``cache_salt`` puts the request in a tree of its own (SGLang keys the radix tree's root
        by it, so requests of different salts never share).
        """
        if cache_salt is not None:
            return self._salted.setdefault(
                cache_salt, SglangCache(self.page_size, self.capacity_tokens)
            ).send(tokens)
        key = tuple(tokens)
        hit = self._match(key, touch=True)
        stored = key[: self._aligned(len(key))]
        if self.capacity_tokens is not None:
            if len(key) > self.capacity_tokens:
                return 0
            new = len(stored) - hit
            self._evict(self.held_tokens + new + (len(key) - len(stored)) - self.capacity_tokens)
            # The matched path was touched last, so it goes last; SGLang locks it: match again in case.
            hit = self._match(key, touch=True)
        self._insert(stored)
        return hit

    def _insert(self, tokens: tuple[int, ...]) -> None:
        node, position = self._root, 0
        now = next(self._clock)
        while position < len(tokens):
            page = self._page(tokens, position)
            child = node.children.get(page)
            if child is None:
                leaf = _Node(tokens[position:], node, now)
                node.children[page] = leaf
                self.held_tokens += len(leaf.key)
                return
            shared = self._aligned(common_prefix(child.key, tokens[position:]))
            if shared < len(child.key):
                self._split(child, shared)  # the part past the match keeps its own last use
            node = node.children[page]
            node.last_access = now
            position += shared

    def _split(self, child: _Node, at: int) -> None:
        parent = child.parent
        assert parent is not None
        middle = _Node(child.key[:at], parent, child.last_access)
        parent.children[self._page(child.key, 0)] = middle
        child.key = child.key[at:]
        child.parent = middle
        middle.children[self._page(child.key, 0)] = child

    def _evict(self, tokens: int) -> None:
        if tokens <= 0:
            return
        leaves = [(node.last_access, id(node), node) for node in self._leaves()]
        heapq.heapify(leaves)
        freed = 0
        while leaves and freed < tokens:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            assert parent is not None
            del parent.children[self._page(leaf.key, 0)]
            freed += len(leaf.key)
            self.held_tokens -= len(leaf.key)
            if parent is not self._root and not parent.children:
                heapq.heappush(leaves, (parent.last_access, id(parent), parent))

    def _leaves(self) -> list[_Node]:
        found: list[_Node] = []
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node is not self._root and not node.children:
                found.append(node)
            stack.extend(node.children.values())
        return found
