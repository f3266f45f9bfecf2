"""Linting a request log: each request rendered, both engines' caches simulated, every break named.

:func:`lint_requests` is the API behind ``longctx lint``: it renders every
request exactly (:mod:`longctx.lint.rendering`), replays the log through a
simulated vLLM block cache and a simulated SGLang radix cache
(:mod:`longctx.lint.vllm_cache`, :mod:`longctx.lint.sglang_cache`), finds
each request's ancestor (the earlier request sharing the most tokens) and
names why they part (:mod:`longctx.lint.causes`). The result is a
:class:`~longctx.lint.report.LintReport`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from longctx.backends.engines import profiles
from longctx.errors import ConfigError
from longctx.lint.causes import CAUSES, FIXES, Divergence
from longctx.lint.explain import explain
from longctx.lint.logs import LoggedRequest
from longctx.lint.prefixes import Ancestry
from longctx.lint.rendering import Rendered, Renderer, render
from longctx.lint.report import CacheModel, Finding, LintReport, RequestLint
from longctx.lint.sglang_cache import SglangCache
from longctx.lint.vllm_cache import VllmCache

__all__ = ["DEFAULT_BLOCK_TOKENS", "kv_tokens_of_plan", "lint_requests", "simulated_engines"]

DEFAULT_BLOCK_TOKENS = 16
"""vLLM's block size on a GPU (the CPU build uses 128: ``longctx doctor`` shows a server's)."""


def simulated_engines() -> tuple[str, str]:
    """The registered engines simulated: the first with a block cache, the first with a radix tree."""

    def first(kind: str) -> str:
        found = [p for p in profiles() if p.prefix_cache == kind and p.hit_counter is not None]
        return found[0].name if found else kind

    return first("blocks"), first("radix")


def lint_requests(
    requests: Sequence[LoggedRequest],
    renderer: Renderer,
    *,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    page_tokens: int = 1,
    kv_tokens: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> LintReport:
    """Lint ``requests`` in their order: cached tokens per request on both engines, and every break.

    ``block_tokens`` is vLLM's block size, ``page_tokens`` SGLang's page
    size, ``kv_tokens`` the KV cache both simulations hold (None: unbounded;
    ``longctx plan`` gives it, :func:`kv_tokens_of_plan`).
    """
    if block_tokens < 1 or page_tokens < 1:
        raise ConfigError("the block and page sizes are at least one token")
    if kv_tokens is not None and kv_tokens < 1:
        raise ConfigError("the KV budget is at least one token")
    blocks_engine, radix_engine = simulated_engines()
    vllm = VllmCache(block_tokens, None if kv_tokens is None else kv_tokens // block_tokens)
    sglang = SglangCache(page_tokens, kv_tokens)
    ancestry = Ancestry()
    rendered: list[Rendered] = []
    rows: list[RequestLint] = []
    for position, request in enumerate(requests):
        current = render(renderer, request)
        rendered.append(current)
        ancestor = ancestry.add(current.tokens)
        vllm_cached = vllm.send(current.tokens, request.cache_salt)
        sglang_cached = sglang.send(current.tokens, request.cache_salt)
        explained: list[Divergence] = []
        breaks: list[Divergence] = []
        ancestor_label: str | None = None
        if ancestor is not None and ancestor.shared_tokens > 0:
            old = requests[ancestor.index]
            ancestor_label = old.label
            explained = explain(
                request, current, old, rendered[ancestor.index], ancestor.shared_tokens, renderer.tokens
            )
            breaks = [d for d in explained if d.severity == "break"]
        row = RequestLint(
            index=request.index,
            label=request.label,
            line=request.line,
            prompt_tokens=len(current.tokens),
            ancestor=ancestor_label,
            shared_tokens=0 if ancestor is None else ancestor.shared_tokens,
            cached={blocks_engine: vllm_cached, radix_engine: sglang_cached},
            reported_cached=request.reported.cached_tokens,
            cause=breaks[0].cause if breaks else explained[-1].cause if explained else "first",
            findings=tuple(
                _findings(
                    request,
                    current,
                    explained,
                    ancestor_label,
                    ((blocks_engine, vllm_cached, block_tokens), (radix_engine, sglang_cached, page_tokens)),
                )
            ),
        )
        rows.append(row)
        if on_progress is not None:
            on_progress(position + 1, len(requests))
    models = (
        CacheModel(blocks_engine, "blocks", block_tokens, kv_tokens, "block hash chain, full blocks, LRU"),
        CacheModel(radix_engine, "radix", page_tokens, kv_tokens, "radix tree, LRU leaves"),
    )
    return LintReport(tuple(rows), models, renderer.identity)


def _findings(
    request: LoggedRequest,
    rendered: Rendered,
    explained: Sequence[Divergence],
    ancestor: str | None,
    simulations: tuple[tuple[str, int, int], tuple[str, int, int]],
) -> list[Finding]:
    """The findings of one request: its breaks, and what each engine lost beside them."""
    if not explained:
        return []
    found: list[Finding] = []
    blocks = simulations[0]

    def finding(divergence: Divergence, cause: str, lost: int, engine: str | None = None) -> Finding:
        return Finding(
            request=request.label,
            ancestor=ancestor,
            cause=cause,
            severity=CAUSES[cause],
            engine=engine,
            token_offset=divergence.token_offset,
            lost_tokens=lost,
            part=divergence.part,
            before=divergence.before,
            after=divergence.after,
            ancestor_after=divergence.ancestor_after,
            fix=FIXES.get(cause),
        )

    first = explained[0]
    found.extend(finding(d, d.cause, d.lost_tokens) for d in explained if d.severity == "break")
    if first.cause == "cache_salt":
        return found
    reusable = min(first.token_offset, len(rendered.tokens) - 1)
    for engine, served, unit in simulations:
        whole = reusable - reusable % unit
        if served < whole:
            found.append(finding(first, "evicted", whole - served, engine))
    if first.cause == "question":
        engine, _, block_tokens = blocks
        whole = reusable - reusable % block_tokens
        if whole == 0 and reusable > 0:
            found.append(finding(first, "short_prefix", reusable, engine))
        elif reusable > whole:
            found.append(finding(first, "block_straddle", reusable - whole, engine))
    return found


def kv_tokens_of_plan(plan: Any) -> int | None:
    """The KV tokens one GPU holds in a ``longctx plan`` result or its JSON; None without memory."""
    data = plan if isinstance(plan, dict) else plan.to_dict()
    memory, per_token = data.get("kv_memory_per_gpu_bytes"), data.get("token_bytes_per_gpu")
    if not isinstance(memory, int) or not isinstance(per_token, int) or per_token <= 0:
        return None
    return memory // per_token
