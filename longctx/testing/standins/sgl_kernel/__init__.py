"""Test-harness stand-in for ``sgl_kernel``: NOT the real package.

longctx's test harness installs this into its SGLang virtual environment
because no CPU build of ``sgl_kernel`` exists on PyPI. SGLang's CPU engine
imports the package at start and, for Llama models on a CPU where its AMX
kernels are unavailable, calls exactly one function from it,
``assign_req_to_token_pool_cpu``, written here in plain torch. Every other
name imports (SGLang imports some at module level) but raises
``NotImplementedError`` when called, so a model that needs a real kernel
fails loudly instead of computing something wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import torch  # type: ignore[import-not-found]

__version__ = "0.0.0+longctx.standin"
IS_LONGCTX_STANDIN = True


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new cache locations into its row of the pool.

    For request row ``r`` with range ``[s, e)``, the next ``e - s`` entries of
    ``out_cache_loc`` go to ``req_to_token[r, s:e]``; rows consume
    ``out_cache_loc`` in order.
    """
    consumed = 0
    for row, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True
    ):
        if end > pool_len:
            raise ValueError(f"request range {start}:{end} exceeds the pool length {pool_len}")
        count = end - start
        req_to_token[row, start:end] = out_cache_loc[consumed : consumed + count].to(req_to_token.dtype)
        consumed += count


def _missing_kernel(name: str) -> Callable[..., NoReturn]:
    def missing(*args: object, **kwargs: object) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name} is not provided by longctx's test-harness stand-in; "
            "only assign_req_to_token_pool_cpu is (enough for Llama models on the CPU)"
        )

    missing.__name__ = name
    return missing


def __getattr__(name: str) -> Any:
    # SGLang imports some kernels at module level that a Llama model never
    # calls; importing succeeds, calling fails loudly.
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing_kernel(name)
