"""The public surface: longctx.__all__, the CLI reference, the README's commands."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import longctx

ROOT = Path(__file__).resolve().parent.parent

PUBLIC = {
    "Answer",
    "AnswerStream",
    "AsyncAnswerStream",
    "StreamIncomplete",
    "Backend",
    "PrefillRate",
    "BackendError",
    "Batch",
    "BoundaryCheck",
    "Budget",
    "CacheCounters",
    "CachedByTier",
    "Citation",
    "CitedAnswer",
    "HostTier",
    "TierReading",
    "Sample",
    "RouterInfo",
    "CanaryComparison",
    "CanaryDiverged",
    "CanaryOptions",
    "CanaryResult",
    "CanaryRun",
    "CanarySampler",
    "acanary",
    "canary",
    "ChatRequest",
    "Changes",
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
    "EmptyCorpus",
    "EncodedImage",
    "EstimateTokenizer",
    "FileChange",
    "Finding",
    "ImageCounter",
    "ImageTokens",
    "ImagePart",
    "ImageTokenCounter",
    "PatchImageCounter",
    "PlacedImage",
    "InputError",
    "InsufficientMemory",
    "InvalidAnswer",
    "LeaseLost",
    "AnswerSchema",
    "answer_schema",
    "Limits",
    "Job",
    "JobItem",
    "JobOptions",
    "JobProgress",
    "JobReport",
    "JobResult",
    "LongctxError",
    "Manifest",
    "ManifestEntry",
    "OutputError",
    "Pack",
    "PackComparison",
    "PackError",
    "RateLimited",
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
    "ReplicaStatus",
    "Sent",
    "Section",
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
    "build_pack",
    "build_shards",
    "check_cache_boundary",
    "compare_packs",
    "connect",
    "count_image_tokens",
    "estimate_image_counter",
    "diagnose",
    "load_corpus",
    "pack",
    "read_job",
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


def _longctx_classes() -> dict[str, type]:
    """Every class defined in a longctx module (the testing harness aside), by name."""
    import pkgutil

    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(longctx.__path__, "longctx."):
        if info.name.startswith(("longctx.testing", "longctx.cli")) or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, type) and value.__module__ == info.name and not name.startswith("_"):
                found.setdefault(name, value)
    return found


def test_everything_a_public_call_returns_is_exported() -> None:
    classes = _longctx_classes()
    missing: set[str] = set()

    def check(annotation: object, where: str) -> None:
        for name in re.findall(r"[A-Za-z_]\w*", str(annotation)):
            if name in classes and name not in longctx.__all__ and not name.startswith("_"):
                missing.add(f"{name} (returned by {where})")

    for public in longctx.__all__:
        value = getattr(longctx, public)
        if callable(value) and not isinstance(value, type):
            check(getattr(value, "__annotations__", {}).get("return"), public)
        if isinstance(value, type) and not issubclass(value, BaseException):
            for attribute, member in vars(value).items():
                if attribute.startswith("_"):
                    continue
                function = (
                    member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                )
                if callable(function):
                    check(getattr(function, "__annotations__", {}).get("return"), f"{public}.{attribute}")
    assert not missing, sorted(missing)


def test_every_error_is_exported_and_drawn_in_the_tree() -> None:
    from longctx import errors

    defined = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.LongctxError)
    }
    assert set(errors.__all__) == defined
    tree = errors.__doc__ or ""
    assert all(re.search(rf"[─ ]{name}\b", tree) for name in defined), defined - set(re.findall(r"\w+", tree))


def _tree(docstring: str) -> list[tuple[str, str]]:
    """``(error, parent)`` of each line of an error tree drawn with box characters, in its order."""
    rows: list[tuple[str, str]] = []
    parents: list[str] = []  # the open branch, by depth
    root_column = None
    for line in docstring.splitlines():
        if root_column is None:
            if line.strip() == "LongctxError":
                root_column = line.index("LongctxError")
                rows.append(("LongctxError", ""))
                parents.append("LongctxError")
            continue
        match = re.search(r"[├└]── (\w+)", line)
        if not match:
            continue
        depth = (match.start() - root_column) // 4 + 1
        del parents[depth:]
        rows.append((match.group(1), parents[-1]))
        parents.append(match.group(1))
    return rows


def _api_error_table() -> list[tuple[str, str, int]]:
    """``(error, parent, exit code)`` of each row of docs/api.md's error table, in its order."""
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 5:
            rows.append((cells[0].strip("`"), cells[1].strip("`"), int(cells[4])))
    return rows


def test_the_error_table_of_the_docs_the_tree_and_all_agree() -> None:
    from longctx import errors
    from longctx.cli import exit_code

    table = _api_error_table()
    tree = _tree(errors.__doc__ or "")
    assert [(name, parent) for name, parent, _ in table] == tree, "docs/api.md's table vs the tree"
    assert sorted(name for name, _ in tree) == sorted(errors.__all__), "the tree vs errors.__all__"
    assert set(errors.__all__) <= set(longctx.__all__), "every error is exported from longctx"
    for name, parent, code in table:
        error = getattr(errors, name)
        assert (error.__bases__[0].__name__ if name != "LongctxError" else "") == parent, name
        assert exit_code(error.__new__(error)) == code, f"{name}: the CLI exits with another code"


def test_the_tree_reader_finds_each_parent_by_its_column() -> None:
    drawn = """
    LongctxError
    ├── ConfigError            bad arguments
    │   └── ServingConfigError     a config
    └── BackendError           talking to a server failed
        └── RateLimited        429
    """
    assert _tree(drawn) == [
        ("LongctxError", ""),
        ("ConfigError", "LongctxError"),
        ("ServingConfigError", "ConfigError"),
        ("BackendError", "LongctxError"),
        ("RateLimited", "BackendError"),
    ]
    assert len(_api_error_table()) == len(_tree(longctx.errors.__doc__ or "")) > 10
