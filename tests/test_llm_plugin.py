"""The ``llm`` plugin: ``llm -f longctx:PATH`` packs a repository as a fragment whose tokens stay cached.

The real test runs the installed ``llm`` command against the harness's vLLM
server, configured through ``extra-openai-models.yaml`` in a temporary
``LLM_USER_PATH`` (so nothing reaches OpenAI and the user's own llm folder
is untouched), and reads the cached tokens two ways: what vLLM reported in
each response's usage (``llm logs --json``) and the server's own counter
``vllm:prefix_cache_hits_total``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import llm
import pytest
from corpus_fixtures import committed_repo
from engine_helpers import common_prefix_length, tokenize_messages

from longctx.backends.base import connect
from longctx.backends.metrics import parse_metrics, total
from longctx.llm_plugin import fragment_text, load_fragment
from longctx.packing import pack
from longctx.testing import LocalServer, TinyModel

STDLIB = Path(sysconfig.get_paths()["stdlib"])
LLM = Path(sys.executable).parent / "llm"
MODEL_ID = "longctx-test"


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    files = {name: (STDLIB / name).read_text() for name in ("textwrap.py", "bisect.py")}
    return committed_repo(tmp_path / "project", {**files, "NOTES.md": f"# notes {uuid.uuid4()}\n"})


@pytest.fixture
def llm_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """llm's user folder for this test only; no OpenAI key anywhere."""
    home = tmp_path / "llm-home"
    home.mkdir()
    monkeypatch.setenv("LLM_USER_PATH", str(home))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("LLM_OPENAI_SHOW_RESPONSES", raising=False)
    return home


def run_llm(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(LLM), *args], check=False, capture_output=True, text=True, env=dict(os.environ), timeout=600
    )
    assert result.returncode == 0, result.stderr
    return result


def test_the_plugin_is_installed_and_registers_the_prefix(llm_home: Path) -> None:
    plugins = json.loads(run_llm("plugins").stdout)
    # llm names a plugin by its distribution (longctx-sdk: "longctx" on PyPI is another project).
    assert {"name": "longctx-sdk", "hooks": ["register_fragment_loaders"]}.items() <= next(
        plugin for plugin in plugins if plugin["name"] == "longctx-sdk"
    ).items()
    assert "longctx:" in run_llm("fragments", "loaders").stdout


def test_llm_sends_the_fragment_then_the_question_as_longctx_would(repository: Path, llm_home: Path) -> None:
    packed = pack(repository).pack
    fragment = load_fragment(str(repository))
    assert str(fragment) == fragment_text(packed.system, packed.prefix)
    assert fragment.source.endswith(str(repository))
    # llm's own assembly of the prompt text: the fragments, a line break, the prompt.
    # (A model object only to build the prompt: nothing is sent.)
    prompt = llm.Prompt("Where is dedent?", model=llm.get_model("gpt-4o-mini"), fragments=[fragment])
    assert prompt.prompt == packed.system + "\n" + packed.user_content("Where is dedent?")
    # The same bytes on the next load: the fragment is a stable prefix.
    assert str(load_fragment(str(repository))) == str(fragment)


def write_models(llm_home: Path, model_name: str, api_base: str) -> None:
    """Point llm at an OpenAI-compatible server, as docs/agents.md tells users to."""
    (llm_home / "extra-openai-models.yaml").write_text(
        f"- model_id: {MODEL_ID}\n  model_name: {model_name}\n  api_base: {api_base}\n"
    )


def test_a_missing_path_is_reported_by_llm(tmp_path: Path, llm_home: Path) -> None:
    # A server nobody listens on: the fragment fails before any request is made.
    write_models(llm_home, "tiny-llama", "http://127.0.0.1:9/v1")
    missing = tmp_path / "nothing-here"
    result = subprocess.run(
        [str(LLM), "-m", MODEL_ID, "-f", f"longctx:{missing}", "hi"],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert f"Could not load fragment longctx:{missing}: no such file or folder" in result.stderr, (
        result.stderr
    )


def prefix_cache_hits(server: LocalServer) -> float:
    with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=30) as response:
        value = total(parse_metrics(response.read().decode()), "vllm:prefix_cache_hits_total")
    assert value is not None
    return value


def usage_of(entry: dict[str, Any]) -> tuple[int, int]:
    """(prompt tokens, cached tokens) of one ``llm logs --json`` entry (llm drops zero counts)."""
    details = entry.get("token_details") or {}
    if isinstance(details, str):
        details = json.loads(details)
    cached = (details.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return entry["input_tokens"], cached


def test_a_second_question_over_the_fragment_is_served_from_vllms_cache(
    vllm_server: LocalServer, tiny_model: TinyModel, repository: Path, llm_home: Path
) -> None:
    write_models(llm_home, tiny_model.served_name, vllm_server.api_base)
    with connect(vllm_server.api_base) as backend:
        block = backend.info.cache_block_tokens or 1
    questions = ["What does textwrap.dedent do?", "Which file defines insort?"]
    # The most a cache of whole blocks can hold for the second question: the tokens both prompts share.
    content = str(load_fragment(str(repository)))
    shared = common_prefix_length(
        *(
            tokenize_messages(vllm_server, tiny_model, [{"role": "user", "content": f"{content}\n{q}"}])
            for q in questions
        )
    )
    reachable = shared - shared % block

    fragment = f"longctx:{repository}"
    run_llm("-m", MODEL_ID, "-f", fragment, "-o", "max_tokens", "8", questions[0])
    hits_before = prefix_cache_hits(vllm_server)
    run_llm("-m", MODEL_ID, "-f", fragment, "-o", "max_tokens", "8", questions[1])
    hits_after = prefix_cache_hits(vllm_server)
    run_llm("-c", "-o", "max_tokens", "8", "And bisect_left?")

    entries = json.loads(run_llm("logs", "--json", "-n", "3").stdout)
    # llm lists the newest last.
    first, second, follow_up = (usage_of(entry) for entry in entries)
    print(
        f"llm over vLLM (prompt, cached): first {first}, second {second}, follow-up with -c {follow_up}; "
        f"shared {shared} tokens, {block}-token blocks"
    )
    assert first[1] < first[0] // 2, first
    # Everything the two prompts share is read from the cache, up to the last whole block.
    assert shared >= first[0] - 16, (shared, first)
    assert second[1] >= reachable, (second, shared, block)
    assert hits_after - hits_before == second[1], (hits_before, hits_after, second)
    # A continued conversation (-c) resends the second exchange byte for byte.
    assert follow_up[1] >= second[0] - block, (second, follow_up)
