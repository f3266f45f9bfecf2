"""The public surface: longctx.__all__, the CLI reference, the README's commands."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import longctx

ROOT = Path(__file__).resolve().parent.parent

PUBLIC = {
    "Answer",
    "Backend",
    "BackendError",
    "Batch",
    "BoundaryCheck",
    "Budget",
    "BudgetError",
    "ConfigError",
    "ContextOverflow",
    "Conversation",
    "Corpus",
    "CorpusOptions",
    "CounterCheck",
    "Diagnosis",
    "DocSession",
    "Document",
    "EnvironmentBuildError",
    "EstimateTokenizer",
    "Finding",
    "HarnessError",
    "InputError",
    "InsufficientMemory",
    "Limits",
    "LongctxError",
    "Manifest",
    "ManifestEntry",
    "ModelBuildError",
    "OutputError",
    "Pack",
    "PackComparison",
    "PackError",
    "PackResult",
    "Prices",
    "PromptCount",
    "RepoSession",
    "RequestLine",
    "RequestOptions",
    "RequestRecord",
    "RetryPolicy",
    "Saved",
    "SavingsReport",
    "Section",
    "ServerDiedError",
    "ServerError",
    "ServerInfo",
    "ServerOptions",
    "ServerStartError",
    "ServerTokenizer",
    "ServerUnreachable",
    "ServingConfigError",
    "Session",
    "SessionNotFound",
    "SessionRecord",
    "ShardedPack",
    "ShardedSession",
    "SourceError",
    "Store",
    "StoreError",
    "StoredPack",
    "TiktokenFileTokenizer",
    "Tokenizer",
    "TokenizerError",
    "TokenizerJsonTokenizer",
    "TurnRecord",
    "UnsupportedArchitecture",
    "Usage",
    "__version__",
    "build_pack",
    "build_shards",
    "check_cache_boundary",
    "compare_packs",
    "connect",
    "load_corpus",
    "pack",
    "resume",
    "tokenizer_from_model_dir",
}


def test_all_is_exactly_the_public_surface() -> None:
    assert set(longctx.__all__) == PUBLIC
    assert len(longctx.__all__) == len(PUBLIC)


def test_every_public_name_resolves() -> None:
    for name in longctx.__all__:
        assert getattr(longctx, name) is not None, name
    assert issubclass(longctx.ContextOverflow, longctx.LongctxError)
    assert issubclass(longctx.RepoSession, longctx.Session)


def test_the_cli_reference_is_current() -> None:
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (ROOT / "docs" / "cli.md").read_text() == module.reference(), (
        "docs/cli.md is stale: run `python scripts/cli_reference.py --write`"
    )


def test_readme_has_the_two_commands_and_ci_runs_the_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```sh\n(.+?)\n```", readme)
    assert "scripts/demo" in commands and "scripts/test" in commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert "scripts/test" in ci
    for linked in re.findall(r"\]\((docs/[^)]+)\)", readme):
        assert (ROOT / linked).exists(), linked
