"""longctx: cache-friendly long-context question answering on vLLM and SGLang.

    from longctx import RepoSession, ServerOptions

    session = RepoSession("path/to/repo", server=ServerOptions("http://127.0.0.1:8000/v1"))
    print(session.ask("Where is the retry policy defined?"))
    batch = session.ask_many(["What does the store hold?", "How are turns committed?"])
    print(session.report().to_text())

The pieces, in the order data flows: :func:`load_corpus` (paths to ordered
documents and a manifest), :func:`pack` (the byte-stable prompt prefix),
:func:`connect` (a server and what it reports), :class:`Session` (turns,
siblings, forks, stored in SQLite), :class:`SavingsReport` (what the cache
saved, checked against the server's counters). Options travel as one object
per concern: :class:`CorpusOptions`, :class:`RequestOptions`,
:class:`ServerOptions`. Everything a public call returns or raises is
importable from here; the exception tree is drawn in :mod:`longctx.errors`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from longctx.exports import lazy_exports

# Imported on first use (PEP 562): `import longctx` stays cheap for the CLI,
# and the HTTP client (httpx2, in longctx.backends.http) is loaded only by code
# that talks to a server.
_EXPORTS: dict[str, str] = {
    "Answer": "longctx.sessions",
    "Backend": "longctx.backends.base",
    "BackendError": "longctx.errors",
    "Batch": "longctx.sessions",
    "BoundaryCheck": "longctx.packing",
    "Budget": "longctx.packing",
    "CacheCounters": "longctx.backends.profiles",
    "CachedByTier": "longctx.report",
    "HostTier": "longctx.backends.tiers",
    "TierReading": "longctx.backends.tiers",
    "CanaryComparison": "longctx.verification.canary",
    "CanaryDiverged": "longctx.errors",
    "CanaryOptions": "longctx.verification.canary",
    "CanaryResult": "longctx.verification.canary",
    "CanaryRun": "longctx.verification.canary",
    "CanarySampler": "longctx.verification.canary",
    "acanary": "longctx.verification.canary",
    "canary": "longctx.verification.canary",
    "ChatRequest": "longctx.backends.chat",
    "Changes": "longctx.sessions.changes",
    "WarmResult": "longctx.sessions.warm",
    "WarmStart": "longctx.sessions.warm",
    "BudgetError": "longctx.errors",
    "ConfigError": "longctx.errors",
    "ContextOverflow": "longctx.errors",
    "Conversation": "longctx.sessions",
    "Corpus": "longctx.corpus",
    "CorpusOptions": "longctx.config",
    "CounterCheck": "longctx.report",
    "Diagnosis": "longctx.serving.doctor",
    "diagnose": "longctx.serving.doctor",
    "DocSession": "longctx.sessions",
    "Document": "longctx.documents",
    "EmptyCorpus": "longctx.errors",
    "EstimateTokenizer": "longctx.tokens",
    "FileChange": "longctx.sessions.changes",
    "Finding": "longctx.serving.advice",
    "InputError": "longctx.errors",
    "InsufficientMemory": "longctx.errors",
    "Limits": "longctx.config",
    "Job": "longctx.jobs.job",
    "JobItem": "longctx.jobs.job",
    "JobOptions": "longctx.jobs.job",
    "JobProgress": "longctx.jobs.job",
    "JobReport": "longctx.jobs.job",
    "JobResult": "longctx.jobs.job",
    "LongctxError": "longctx.errors",
    "Manifest": "longctx.corpus",
    "ManifestEntry": "longctx.corpus",
    "OutputError": "longctx.errors",
    "Pack": "longctx.packing",
    "PackComparison": "longctx.packing",
    "PackError": "longctx.errors",
    "PackResult": "longctx.packing",
    "Prices": "longctx.report",
    "PromptCount": "longctx.packing",
    "RateLimited": "longctx.errors",
    "RepoSession": "longctx.sessions",
    "RequestLine": "longctx.report",
    "RequestOptions": "longctx.config",
    "RequestRecord": "longctx.store",
    "RetryPolicy": "longctx.retry",
    "RouterInfo": "longctx.backends.routers",
    "Sample": "longctx.backends.metrics",
    "Saved": "longctx.outputs",
    "SavingsReport": "longctx.report",
    "ReplicaStatus": "longctx.backends.base",
    "Sent": "longctx.backends.base",
    "Section": "longctx.packing",
    "ServerError": "longctx.errors",
    "ServerInfo": "longctx.backends.base",
    "ServerOptions": "longctx.config",
    "ServerTokenizer": "longctx.backends.tokenizer",
    "ServerUnreachable": "longctx.errors",
    "ServingConfigError": "longctx.errors",
    "Session": "longctx.sessions",
    "SessionClosed": "longctx.errors",
    "SessionNotFound": "longctx.errors",
    "SessionRecord": "longctx.store",
    "ShardedPack": "longctx.packing",
    "ShardedSession": "longctx.sessions",
    "SourceError": "longctx.errors",
    "Store": "longctx.store",
    "StoreError": "longctx.errors",
    "StoredPack": "longctx.store",
    "TiktokenFileTokenizer": "longctx.tokens",
    "Tokenizer": "longctx.tokens",
    "TokenizerError": "longctx.errors",
    "TokenizerJsonTokenizer": "longctx.tokens",
    "TurnRecord": "longctx.store",
    "UnsupportedArchitecture": "longctx.errors",
    "Usage": "longctx.usage",
    "build_pack": "longctx.packing",
    "build_shards": "longctx.packing",
    "check_cache_boundary": "longctx.packing",
    "compare_packs": "longctx.packing",
    "connect": "longctx.backends.base",
    "load_corpus": "longctx.corpus",
    "pack": "longctx.packing",
    "read_job": "longctx.jobs.job",
    "resume": "longctx.sessions",
    "tokenizer_from_model_dir": "longctx.tokens",
}

if TYPE_CHECKING:
    from longctx.backends.base import Backend, ReplicaStatus, Sent, ServerInfo, connect
    from longctx.backends.chat import ChatRequest
    from longctx.backends.metrics import Sample
    from longctx.backends.profiles import CacheCounters
    from longctx.backends.routers import RouterInfo
    from longctx.backends.tiers import HostTier, TierReading
    from longctx.backends.tokenizer import ServerTokenizer
    from longctx.config import CorpusOptions, Limits, RequestOptions, ServerOptions
    from longctx.corpus import Corpus, Manifest, ManifestEntry, load_corpus
    from longctx.documents import Document
    from longctx.errors import (
        BackendError,
        BudgetError,
        CanaryDiverged,
        ConfigError,
        ContextOverflow,
        EmptyCorpus,
        InputError,
        InsufficientMemory,
        LongctxError,
        OutputError,
        PackError,
        RateLimited,
        ServerError,
        ServerUnreachable,
        ServingConfigError,
        SessionClosed,
        SessionNotFound,
        SourceError,
        StoreError,
        TokenizerError,
        UnsupportedArchitecture,
    )
    from longctx.jobs.job import Job, JobItem, JobOptions, JobProgress, JobReport, JobResult, read_job
    from longctx.outputs import Saved
    from longctx.packing import (
        BoundaryCheck,
        Budget,
        Pack,
        PackComparison,
        PackResult,
        PromptCount,
        Section,
        ShardedPack,
        build_pack,
        build_shards,
        check_cache_boundary,
        compare_packs,
        pack,
    )
    from longctx.report import CachedByTier, CounterCheck, Prices, RequestLine, SavingsReport
    from longctx.retry import RetryPolicy
    from longctx.serving.advice import Finding
    from longctx.serving.doctor import Diagnosis, diagnose
    from longctx.sessions import (
        Answer,
        Batch,
        Conversation,
        DocSession,
        RepoSession,
        Session,
        ShardedSession,
        resume,
    )
    from longctx.sessions.changes import Changes, FileChange
    from longctx.sessions.warm import WarmResult, WarmStart
    from longctx.store import RequestRecord, SessionRecord, Store, StoredPack, TurnRecord
    from longctx.tokens import (
        EstimateTokenizer,
        TiktokenFileTokenizer,
        Tokenizer,
        TokenizerJsonTokenizer,
        tokenizer_from_model_dir,
    )
    from longctx.usage import Usage
    from longctx.verification.canary import (
        CanaryComparison,
        CanaryOptions,
        CanaryResult,
        CanaryRun,
        CanarySampler,
        acanary,
        canary,
    )


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "Answer",
    "Backend",
    "BackendError",
    "Batch",
    "BoundaryCheck",
    "Budget",
    "BudgetError",
    "CacheCounters",
    "CachedByTier",
    "CanaryComparison",
    "CanaryDiverged",
    "CanaryOptions",
    "CanaryResult",
    "CanaryRun",
    "CanarySampler",
    "Changes",
    "ChatRequest",
    "ConfigError",
    "ContextOverflow",
    "Conversation",
    "Corpus",
    "CorpusOptions",
    "CounterCheck",
    "Diagnosis",
    "DocSession",
    "Document",
    "EmptyCorpus",
    "EstimateTokenizer",
    "FileChange",
    "Finding",
    "HostTier",
    "InputError",
    "InsufficientMemory",
    "Job",
    "JobItem",
    "JobOptions",
    "JobProgress",
    "JobReport",
    "JobResult",
    "Limits",
    "LongctxError",
    "Manifest",
    "ManifestEntry",
    "OutputError",
    "Pack",
    "PackComparison",
    "PackError",
    "PackResult",
    "Prices",
    "PromptCount",
    "RateLimited",
    "ReplicaStatus",
    "RepoSession",
    "RequestLine",
    "RequestOptions",
    "RequestRecord",
    "RetryPolicy",
    "RouterInfo",
    "Sample",
    "Saved",
    "SavingsReport",
    "Section",
    "Sent",
    "ServerError",
    "ServerInfo",
    "ServerOptions",
    "ServerTokenizer",
    "ServerUnreachable",
    "ServingConfigError",
    "Session",
    "SessionClosed",
    "SessionNotFound",
    "SessionRecord",
    "ShardedPack",
    "ShardedSession",
    "SourceError",
    "Store",
    "StoreError",
    "StoredPack",
    "TierReading",
    "TiktokenFileTokenizer",
    "Tokenizer",
    "TokenizerError",
    "TokenizerJsonTokenizer",
    "TurnRecord",
    "UnsupportedArchitecture",
    "Usage",
    "WarmResult",
    "WarmStart",
    "__version__",
    "acanary",
    "build_pack",
    "build_shards",
    "canary",
    "check_cache_boundary",
    "compare_packs",
    "connect",
    "diagnose",
    "load_corpus",
    "pack",
    "read_job",
    "resume",
    "tokenizer_from_model_dir",
]

__version__ = "0.1.0"
