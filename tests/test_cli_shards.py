"""``--shard`` on ask and batch: map-reduce from the command line, against the fake server.

The same against the real engines: test_cli.py (a pack over the window).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from fake_engine import FakeEngine

from longctx.backends.base import Backend
from longctx.cli import EXIT_OK, EXIT_TOO_LONG, Runtime, main
from longctx.sessions import ShardedSession

URL = "http://fake-engine:8000/v1"


@pytest.fixture
def fake() -> FakeEngine:
    # A small window: the repository below needs several of them.
    return FakeEngine(engine="generic", block=1, context_length=3_000)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "big"
    root.mkdir()
    for index in range(6):
        (root / f"module_{index}.py").write_text(f"VALUE_{index} = {index}\n" * 200)
    return root


def invoke(backend: Backend, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), obj=Runtime(backend=backend), input=stdin)


def test_ask_over_the_budget_names_shard_and_shard_answers_it(
    backend: Backend, fake: FakeEngine, repository: Path
) -> None:
    refused = invoke(backend, "ask", str(repository), "What is defined?", "--max-tokens", "16")
    assert refused.exit_code == EXIT_TOO_LONG
    assert "--shard" in refused.stderr

    answered = invoke(
        backend, "ask", str(repository), "What is defined?", "--max-tokens", "16", "--shard", "--json"
    )
    assert answered.exit_code == EXIT_OK, answered.output
    data = json.loads(answered.stdout)
    shards = len(data["shard_answers"])
    assert shards >= 2
    assert f"map-reduce over {shards} shards" in answered.stderr
    # Every shard was asked (map), then one request combined them (reduce).
    purposes = [line["purpose"] for line in data["report"]["requests"]]
    assert purposes.count("reduce") == 1 and len(purposes) == shards + 1
    assert len(fake.chat_bodies) == shards + 1
    assert "partial-answer" in fake.chat_bodies[-1]["messages"][-1]["content"]
    session = ShardedSession.resume(data["session_id"], backend)
    assert len(session.shards) == shards


def test_batch_with_shard_answers_every_question_from_every_shard(
    backend: Backend, fake: FakeEngine, repository: Path, tmp_path: Path
) -> None:
    questions = tmp_path / "questions.txt"
    questions.write_text("First?\nSecond?\n")
    result = invoke(
        backend,
        "batch",
        str(repository),
        "--questions",
        str(questions),
        "--max-tokens",
        "16",
        "--shard",
        "--json",
    )
    assert result.exit_code == EXIT_OK, result.output
    data = json.loads(result.stdout)
    assert [answer["question"] for answer in data["answers"]] == ["First?", "Second?"]
    shards = len(data["answers"][0]["shard_answers"])
    assert shards >= 2
    assert len(fake.chat_bodies) == 2 * shards + 2
