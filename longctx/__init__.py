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

# The public names, each with the module it comes from; ``__all__`` is these and
# ``__version__``. Imported on first use (PEP 562): `import longctx` stays cheap
# for the CLI, and the HTTP client (longctx.backends.client; httpx2 for async) is loaded
# only by code that talks to a server.
_EXPORTS: dict[str, str] = {
    "Answer": "longctx.sessions",
    "AnswerStream": "longctx.sessions",
    "AsyncAnswerStream": "longctx.sessions",
    "Backend": "longctx.backends.base",
    "BackendError": "longctx.errors",
    "Batch": "longctx.sessions",
    "BoundaryCheck": "longctx.packing",
    "Budget": "longctx.packing",
    "CacheCounters": "longctx.backends.profiles",
    "CachedByTier": "longctx.report",
    "Citation": "longctx.citations",
    "CitedAnswer": "longctx.citations",
    "HostTier": "longctx.backends.tiers",
    "PrefillRate": "longctx.backends.prefill_wait",
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
    "Corpus": "longctx.sources.corpus",
    "CorpusOptions": "longctx.options.groups",
    "CounterCheck": "longctx.report",
    "Diagnosis": "longctx.serving.doctor",
    "diagnose": "longctx.serving.doctor",
    "DocSession": "longctx.sessions",
    "Document": "longctx.documents",
    "EmptyCorpus": "longctx.errors",
    "EncodedImage": "longctx.backends.images",
    "EstimateTokenizer": "longctx.tokens.tokenizers",
    "FileChange": "longctx.sessions.changes",
    "Finding": "longctx.serving.advice",
    "ImageCounter": "longctx.backends.images",
    "ImageTokens": "longctx.backends.images",
    "ImagePart": "longctx.documents",
    "ImageTokenCounter": "longctx.tokens.images",
    "PatchImageCounter": "longctx.tokens.images",
    "estimate_image_counter": "longctx.tokens.images",
    "PlacedImage": "longctx.packing.image_parts",
    "InputError": "longctx.errors",
    "InsufficientMemory": "longctx.errors",
    "InvalidAnswer": "longctx.errors",
    "LeaseLost": "longctx.errors",
    "AnswerSchema": "longctx.schemas",
    "answer_schema": "longctx.schemas",
    "Limits": "longctx.options.groups",
    "Job": "longctx.jobs.job",
    "JobItem": "longctx.jobs.items",
    "JobOptions": "longctx.jobs.job",
    "JobProgress": "longctx.jobs.job",
    "JobReport": "longctx.jobs.job",
    "JobResult": "longctx.jobs.job",
    "LongctxError": "longctx.errors",
    "Manifest": "longctx.sources.corpus",
    "ManifestEntry": "longctx.sources.corpus",
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
    "RequestOptions": "longctx.options.groups",
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
    "ServerOptions": "longctx.options.groups",
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
    "StreamIncomplete": "longctx.errors",
    "StoredPack": "longctx.store",
    "TiktokenFileTokenizer": "longctx.tokens.tokenizers",
    "Tokenizer": "longctx.tokens.tokenizers",
    "TokenizerError": "longctx.errors",
    "TokenizerJsonTokenizer": "longctx.tokens.tokenizers",
    "TurnRecord": "longctx.store",
    "UnsupportedArchitecture": "longctx.errors",
    "Usage": "longctx.usage",
    "build_pack": "longctx.packing",
    "build_shards": "longctx.packing",
    "check_cache_boundary": "longctx.packing",
    "compare_packs": "longctx.packing",
    "connect": "longctx.backends.base",
    "count_image_tokens": "longctx.backends.images",
    "load_corpus": "longctx.sources.corpus",
    "pack": "longctx.packing",
    "read_job": "longctx.jobs.items",
    "resume": "longctx.sessions",
    "tokenizer_from_model_dir": "longctx.tokens.tokenizers",
}

if TYPE_CHECKING:
    # The names again, for type checkers only (`X as X`: a re-export); a layout test holds them to _EXPORTS.
    from longctx.backends.base import Backend as Backend
    from longctx.backends.base import ReplicaStatus as ReplicaStatus
    from longctx.backends.base import Sent as Sent
    from longctx.backends.base import ServerInfo as ServerInfo
    from longctx.backends.base import connect as connect
    from longctx.backends.chat import ChatRequest as ChatRequest
    from longctx.backends.images import EncodedImage as EncodedImage
    from longctx.backends.images import ImageCounter as ImageCounter
    from longctx.backends.images import ImageTokens as ImageTokens
    from longctx.backends.images import count_image_tokens as count_image_tokens
    from longctx.backends.metrics import Sample as Sample
    from longctx.backends.prefill_wait import PrefillRate as PrefillRate
    from longctx.backends.profiles import CacheCounters as CacheCounters
    from longctx.backends.routers import RouterInfo as RouterInfo
    from longctx.backends.tiers import HostTier as HostTier
    from longctx.backends.tiers import TierReading as TierReading
    from longctx.backends.tokenizer import ServerTokenizer as ServerTokenizer
    from longctx.citations import Citation as Citation
    from longctx.citations import CitedAnswer as CitedAnswer
    from longctx.documents import Document as Document
    from longctx.documents import ImagePart as ImagePart
    from longctx.errors import BackendError as BackendError
    from longctx.errors import BudgetError as BudgetError
    from longctx.errors import CanaryDiverged as CanaryDiverged
    from longctx.errors import ConfigError as ConfigError
    from longctx.errors import ContextOverflow as ContextOverflow
    from longctx.errors import EmptyCorpus as EmptyCorpus
    from longctx.errors import InputError as InputError
    from longctx.errors import InsufficientMemory as InsufficientMemory
    from longctx.errors import InvalidAnswer as InvalidAnswer
    from longctx.errors import LeaseLost as LeaseLost
    from longctx.errors import LongctxError as LongctxError
    from longctx.errors import OutputError as OutputError
    from longctx.errors import PackError as PackError
    from longctx.errors import RateLimited as RateLimited
    from longctx.errors import ServerError as ServerError
    from longctx.errors import ServerUnreachable as ServerUnreachable
    from longctx.errors import ServingConfigError as ServingConfigError
    from longctx.errors import SessionClosed as SessionClosed
    from longctx.errors import SessionNotFound as SessionNotFound
    from longctx.errors import SourceError as SourceError
    from longctx.errors import StoreError as StoreError
    from longctx.errors import StreamIncomplete as StreamIncomplete
    from longctx.errors import TokenizerError as TokenizerError
    from longctx.errors import UnsupportedArchitecture as UnsupportedArchitecture
    from longctx.jobs.items import JobItem as JobItem
    from longctx.jobs.items import read_job as read_job
    from longctx.jobs.job import Job as Job
    from longctx.jobs.job import JobOptions as JobOptions
    from longctx.jobs.job import JobProgress as JobProgress
    from longctx.jobs.job import JobReport as JobReport
    from longctx.jobs.job import JobResult as JobResult
    from longctx.options.groups import CorpusOptions as CorpusOptions
    from longctx.options.groups import Limits as Limits
    from longctx.options.groups import RequestOptions as RequestOptions
    from longctx.options.groups import ServerOptions as ServerOptions
    from longctx.outputs import Saved as Saved
    from longctx.packing import BoundaryCheck as BoundaryCheck
    from longctx.packing import Budget as Budget
    from longctx.packing import Pack as Pack
    from longctx.packing import PackComparison as PackComparison
    from longctx.packing import PackResult as PackResult
    from longctx.packing import PromptCount as PromptCount
    from longctx.packing import Section as Section
    from longctx.packing import ShardedPack as ShardedPack
    from longctx.packing import build_pack as build_pack
    from longctx.packing import build_shards as build_shards
    from longctx.packing import check_cache_boundary as check_cache_boundary
    from longctx.packing import compare_packs as compare_packs
    from longctx.packing import pack as pack
    from longctx.packing.image_parts import PlacedImage as PlacedImage
    from longctx.report import CachedByTier as CachedByTier
    from longctx.report import CounterCheck as CounterCheck
    from longctx.report import Prices as Prices
    from longctx.report import RequestLine as RequestLine
    from longctx.report import SavingsReport as SavingsReport
    from longctx.retry import RetryPolicy as RetryPolicy
    from longctx.schemas import AnswerSchema as AnswerSchema
    from longctx.schemas import answer_schema as answer_schema
    from longctx.serving.advice import Finding as Finding
    from longctx.serving.doctor import Diagnosis as Diagnosis
    from longctx.serving.doctor import diagnose as diagnose
    from longctx.sessions import Answer as Answer
    from longctx.sessions import AnswerStream as AnswerStream
    from longctx.sessions import AsyncAnswerStream as AsyncAnswerStream
    from longctx.sessions import Batch as Batch
    from longctx.sessions import Conversation as Conversation
    from longctx.sessions import DocSession as DocSession
    from longctx.sessions import RepoSession as RepoSession
    from longctx.sessions import Session as Session
    from longctx.sessions import ShardedSession as ShardedSession
    from longctx.sessions import resume as resume
    from longctx.sessions.changes import Changes as Changes
    from longctx.sessions.changes import FileChange as FileChange
    from longctx.sessions.warm import WarmResult as WarmResult
    from longctx.sessions.warm import WarmStart as WarmStart
    from longctx.sources.corpus import Corpus as Corpus
    from longctx.sources.corpus import Manifest as Manifest
    from longctx.sources.corpus import ManifestEntry as ManifestEntry
    from longctx.sources.corpus import load_corpus as load_corpus
    from longctx.store import RequestRecord as RequestRecord
    from longctx.store import SessionRecord as SessionRecord
    from longctx.store import Store as Store
    from longctx.store import StoredPack as StoredPack
    from longctx.store import TurnRecord as TurnRecord
    from longctx.tokens.images import ImageTokenCounter as ImageTokenCounter
    from longctx.tokens.images import PatchImageCounter as PatchImageCounter
    from longctx.tokens.images import estimate_image_counter as estimate_image_counter
    from longctx.tokens.tokenizers import EstimateTokenizer as EstimateTokenizer
    from longctx.tokens.tokenizers import TiktokenFileTokenizer as TiktokenFileTokenizer
    from longctx.tokens.tokenizers import Tokenizer as Tokenizer
    from longctx.tokens.tokenizers import TokenizerJsonTokenizer as TokenizerJsonTokenizer
    from longctx.tokens.tokenizers import tokenizer_from_model_dir as tokenizer_from_model_dir
    from longctx.usage import Usage as Usage
    from longctx.verification.canary import CanaryComparison as CanaryComparison
    from longctx.verification.canary import CanaryOptions as CanaryOptions
    from longctx.verification.canary import CanaryResult as CanaryResult
    from longctx.verification.canary import CanaryRun as CanaryRun
    from longctx.verification.canary import CanarySampler as CanarySampler
    from longctx.verification.canary import acanary as acanary
    from longctx.verification.canary import canary as canary


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = list(_EXPORTS)
__all__ += ["__version__"]

__version__ = "0.1.0"
