"""longctx: cache-friendly long-context question answering on vLLM and SGLang.

    from longctx import RepoSession

    session = RepoSession("path/to/repo", base_url="http://127.0.0.1:8000/v1")
    print(session.ask("Where is the retry policy defined?"))
    batch = session.ask_many(["What does the store hold?", "How are turns committed?"])
    print(session.report().to_text())

The pieces, in the order data flows: :func:`load_corpus` (paths to ordered
documents and a manifest), :func:`pack` (the byte-stable prompt prefix),
:func:`connect` (a server and what it reports), :class:`Session` (turns,
siblings, forks, stored in SQLite), :class:`SavingsReport` (what the cache
saved, checked against the server's counters).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Imported on first use (PEP 562): `import longctx` stays cheap for the CLI,
# and the openai client is loaded only by code that talks to a server.
_EXPORTS: dict[str, str] = {
    "Answer": "longctx.session",
    "Backend": "longctx.backends.base",
    "BackendError": "longctx.errors",
    "Batch": "longctx.session",
    "Budget": "longctx.pack",
    "BudgetError": "longctx.errors",
    "ConfigError": "longctx.errors",
    "ContextOverflow": "longctx.errors",
    "Corpus": "longctx.corpus",
    "Diagnosis": "longctx.backends.base",
    "DocSession": "longctx.session",
    "Document": "longctx.documents",
    "InputError": "longctx.errors",
    "Limits": "longctx.corpus",
    "LongctxError": "longctx.errors",
    "Manifest": "longctx.corpus",
    "MapReduceAnswer": "longctx.mapreduce",
    "OutputError": "longctx.errors",
    "Pack": "longctx.pack",
    "Prices": "longctx.usage",
    "RepoSession": "longctx.session",
    "RetryPolicy": "longctx.retry",
    "SavingsReport": "longctx.usage",
    "ServerInfo": "longctx.backends.base",
    "ServerUnreachable": "longctx.errors",
    "Session": "longctx.session",
    "SessionNotFound": "longctx.errors",
    "ShardedPack": "longctx.pack",
    "ShardedSession": "longctx.mapreduce",
    "Store": "longctx.store",
    "Usage": "longctx.usage",
    "build_pack": "longctx.pack",
    "build_shards": "longctx.pack",
    "compare_packs": "longctx.pack",
    "connect": "longctx.backends.base",
    "load_corpus": "longctx.corpus",
    "pack": "longctx.pack",
}

if TYPE_CHECKING:
    from longctx.backends.base import Backend, Diagnosis, ServerInfo, connect
    from longctx.corpus import Corpus, Limits, Manifest, load_corpus
    from longctx.documents import Document
    from longctx.errors import (
        BackendError,
        BudgetError,
        ConfigError,
        ContextOverflow,
        InputError,
        LongctxError,
        OutputError,
        ServerUnreachable,
        SessionNotFound,
    )
    from longctx.mapreduce import MapReduceAnswer, ShardedSession
    from longctx.pack import Budget, Pack, ShardedPack, build_pack, build_shards, compare_packs, pack
    from longctx.retry import RetryPolicy
    from longctx.session import Answer, Batch, DocSession, RepoSession, Session
    from longctx.store import Store
    from longctx.usage import Prices, SavingsReport, Usage

# The subpackage longctx.pack shares its name with the function pack(), and
# the import system sets a package's attribute to a subpackage when it first
# loads it: whoever imported longctx.pack first would decide what
# `longctx.pack` is. Loading it now (it is lazy, so this costs nothing) and
# dropping that attribute leaves `pack` to __getattr__, the function.
import_module("longctx.pack")
del globals()["pack"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'longctx' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "Answer",
    "Backend",
    "BackendError",
    "Batch",
    "Budget",
    "BudgetError",
    "ConfigError",
    "ContextOverflow",
    "Corpus",
    "Diagnosis",
    "DocSession",
    "Document",
    "InputError",
    "Limits",
    "LongctxError",
    "Manifest",
    "MapReduceAnswer",
    "OutputError",
    "Pack",
    "Prices",
    "RepoSession",
    "RetryPolicy",
    "SavingsReport",
    "ServerInfo",
    "ServerUnreachable",
    "Session",
    "SessionNotFound",
    "ShardedPack",
    "ShardedSession",
    "Store",
    "Usage",
    "__version__",
    "build_pack",
    "build_shards",
    "compare_packs",
    "connect",
    "load_corpus",
    "pack",
]

__version__ = "0.1.0"
