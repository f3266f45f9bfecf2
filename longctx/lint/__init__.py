"""Linting request logs for prefix-cache reuse, recording an application's traffic, measuring retention.

Modules:

- ``logs``: the log formats read (OpenAI chat and completions bodies, batch
  files, longctx's recorder and proxy lines) into :class:`LoggedRequest`.
- ``rendering``: a request as the served model's tokens (the server's
  tokenize route, or a model folder offline) and as text.
- ``prefixes``: common prefixes; each request's ancestor.
- ``vllm_cache``: vLLM's block-hash prefix cache, simulated.
- ``sglang_cache``: SGLang's radix cache, simulated.
- ``causes``: why a request parts from its ancestor, and the fix.
- ``explain``: each break proved by undoing it and tokenizing again.
- ``analysis``: :func:`lint_requests`, the lint of a log.
- ``report``: :class:`LintReport` and its renderings.
- ``replay``: a log replayed against a live server, against its counters.
- ``recording``: the lines longctx records of an application's requests.
- ``proxy``: :class:`RecordingProxy`, ``longctx proxy``.
"""

from __future__ import annotations

from longctx.lint.analysis import DEFAULT_BLOCK_TOKENS, kv_tokens_of_plan, lint_requests
from longctx.lint.causes import CAUSES, FIXES, Divergence
from longctx.lint.logs import LoggedRequest, ReportedUsage, read_log, requests_from_lines
from longctx.lint.proxy import RecordingProxy
from longctx.lint.rendering import ModelFolderRenderer, Rendered, Renderer, ServerRenderer
from longctx.lint.replay import ReplayedRequest, ReplayReport, replay
from longctx.lint.report import CacheModel, Finding, LintReport, RequestLint, fail_selection
from longctx.lint.sglang_cache import SglangCache
from longctx.lint.vllm_cache import VllmCache

__all__ = [
    "CAUSES",
    "DEFAULT_BLOCK_TOKENS",
    "FIXES",
    "CacheModel",
    "Divergence",
    "Finding",
    "LintReport",
    "LoggedRequest",
    "ModelFolderRenderer",
    "RecordingProxy",
    "Rendered",
    "Renderer",
    "ReplayReport",
    "ReplayedRequest",
    "ReportedUsage",
    "RequestLint",
    "ServerRenderer",
    "SglangCache",
    "VllmCache",
    "fail_selection",
    "kv_tokens_of_plan",
    "lint_requests",
    "read_log",
    "replay",
    "requests_from_lines",
]
