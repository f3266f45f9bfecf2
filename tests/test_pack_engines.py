"""Packs against the real vLLM and SGLang servers: exact counts, additivity, the cache boundary."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from longctx.backends.http import HttpEndpoint
from longctx.backends.tokenizer import ServerTokenizer
from longctx.packing import Pack, build_pack, check_cache_boundary
from longctx.sources.corpus import load_corpus
from longctx.store import Store
from longctx.testing import LocalServer, TinyModel

STDLIB = Path(sysconfig.get_paths()["stdlib"])
QUESTIONS = [
    "What does the decoder do with a trailing comma?",
    " Which module defines JSONDecodeError?",
    "¿Dónde está el codificador?",
    "(1) list the public functions",
]


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """The standard library's json package plus documents with awkward ends: well over 8k tokens."""
    root = tmp_path / "repo"
    shutil.copytree(STDLIB / "json", root / "json", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "notes").mkdir()
    (root / "notes" / "spaces.txt").write_text("trailing spaces   ")
    (root / "notes" / "blank lines.md").write_text("# Title\n\n\n\n")
    (root / "notes" / "fences.md").write_text("```\n</documents>\nQuestion:\n```` fake.py\n")
    (root / "notes" / "specials.txt").write_text("<|im_end|>\n<|im_start|>system\nhello\n")
    return root


@pytest.fixture
def server_tokenizer(engine_server: LocalServer, tiny_model: TinyModel) -> Iterator[ServerTokenizer]:
    endpoint = HttpEndpoint(engine_server.base_url, timeout=60.0)
    yield ServerTokenizer(endpoint, engine_server.name, tiny_model.served_name)  # type: ignore[arg-type]
    endpoint.close()


def _chat_usage(server: LocalServer, model: TinyModel, pack: Pack, question: str) -> dict[str, Any]:
    body = {
        "model": model.served_name,
        "messages": pack.messages(question),
        "max_tokens": 2,
        "temperature": 0,
    }
    response = httpx2.post(server.api_base + "/chat/completions", json=body, timeout=600)
    response.raise_for_status()
    usage: dict[str, Any] = response.json()["usage"]
    return usage


def test_pack_counts_equal_the_servers_prompt_tokens(
    engine_server: LocalServer, tiny_model: TinyModel, server_tokenizer: ServerTokenizer, repository: Path
) -> None:
    with Store.open() as store:
        pack = build_pack(load_corpus(repository), tokenizer=server_tokenizer, store=store)
    assert pack.prefix_tokens is not None and pack.prefix_tokens >= 8000
    assert pack.template_overhead_tokens is not None and pack.template_overhead_tokens > 0
    assert pack.sections_additive is True
    assert pack.prefix_tokens == sum(section.tokens or 0 for section in pack.sections)
    assert not pack.estimated
    for question in QUESTIONS[:2]:
        usage = _chat_usage(engine_server, tiny_model, pack, question)
        count = pack.prompt_count(question, server_tokenizer)
        assert usage["prompt_tokens"] == count.total, (engine_server.name, question, usage, count)


def test_cache_boundary_holds_for_the_default_layout(
    server_tokenizer: ServerTokenizer, repository: Path
) -> None:
    pack = build_pack(load_corpus(repository))
    default = check_cache_boundary(pack, server_tokenizer)
    assert default.ok, default
    for question in QUESTIONS:
        check = check_cache_boundary(pack, server_tokenizer, question)
        assert check.ok, check
        assert check.divergent_position is None
        assert check.prompt_tokens > check.prefix_tokens


def test_boundary_check_reports_where_tokens_part(
    server_tokenizer: ServerTokenizer, repository: Path
) -> None:
    pack = build_pack(load_corpus(repository))
    # A question opening with a line break merges with the boundary's own line break.
    check = check_cache_boundary(pack, server_tokenizer, "\n\nwhy?")
    assert not check.ok
    assert check.divergent_position == check.prefix_tokens - 1


def test_section_counts_add_up_on_the_servers_tokenizer(
    server_tokenizer: ServerTokenizer, repository: Path
) -> None:
    pack = build_pack(load_corpus(repository), tokenizer=server_tokenizer)
    texts = [section.text for section in pack.sections]
    assert server_tokenizer.count_many(texts) == [server_tokenizer.count(text) for text in texts]
    assert server_tokenizer.count(pack.prefix) == sum(section.tokens or 0 for section in pack.sections[1:])


def test_a_layered_pack_counts_exactly_and_keeps_the_boundary(
    engine_server: LocalServer, tiny_model: TinyModel, server_tokenizer: ServerTokenizer, repository: Path
) -> None:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(repository)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    scanner = repository / "json" / "scanner.py"  # small: its earlier copy stays under a fifth of the bytes
    scanner.write_text(scanner.read_text() + "# one more line\n")
    subprocess.run([*git, "commit", "-qam", "edit the scanner"], check=True)
    (repository / "notes" / "spaces.txt").write_text("edited in the work tree   ")

    with Store.open() as store:
        pack = build_pack(load_corpus(repository), tokenizer=server_tokenizer, store=store)

    names = [section.name for section in pack.sections]
    assert {"earlier:json/scanner.py", "earlier:notes/spaces.txt", "changes"} <= set(names)
    assert pack.sections_additive is True
    for question in QUESTIONS[:2]:
        usage = _chat_usage(engine_server, tiny_model, pack, question)
        assert usage["prompt_tokens"] == pack.prompt_count(question, server_tokenizer).total, usage
    for question in QUESTIONS:
        check = check_cache_boundary(pack, server_tokenizer, question)
        assert check.ok, check
