"""Batches and chats whose server goes away, against a fake server that stops answering and comes back.

A batch stopped by a dead server prints the answers it stored and its
session id, and ``batch --session`` asks only the rest; ``sessions show``
shows a batch's answers; a chat says the server went away and tries again
until it is back. The same with a real vLLM killed and restarted:
tests/test_outages_engines.py.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import httpx2
import pytest
from click.testing import CliRunner
from fake_engine import FakeEngine

from longctx.backends.base import Backend, connect
from longctx.cli import EXIT_OK, EXIT_UNREACHABLE, Runtime, main
from longctx.errors import ServerUnreachable
from longctx.retry import instant_retries
from longctx.sessions import RepoSession, Session
from longctx.sessions.siblings import batch_keys
from longctx.store import Store

URL = "http://fake-engine:8000/v1"
QUESTIONS = [f"question {n}: what does f{n} return?" for n in range(4)]


class _Outage:
    """A fake server in front of which chat requests fail (connection refused) after ``answers`` of them."""

    def __init__(self, fake: FakeEngine, answers: int | None = None) -> None:
        self.fake = fake
        self.answers = answers  # None: always up
        self.refused = 0

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        chat = request.url.path == "/v1/chat/completions"
        if chat and self.answers is not None and len(self.fake.chat_bodies) >= self.answers:
            self.refused += 1
            raise httpx2.ConnectError("connection refused (the test's outage)", request=request)
        return self.fake.handle(request)

    def backend(self) -> Backend:
        transport = httpx2.MockTransport(self.handle)
        return connect(URL, transport=transport, async_transport=transport)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "a.py").write_text("".join(f"def f{n}(x):\n    return x + {n}\n" for n in range(40)))
    return root


@pytest.fixture
def questions_file(tmp_path: Path) -> Path:
    path = tmp_path / "questions.txt"
    path.write_text("\n".join(QUESTIONS) + "\n")
    return path


def _home() -> Path:
    return Path(os.environ["LONGCTX_HOME"])


def test_a_batch_whose_server_died_prints_its_answers_and_id_and_batch_session_asks_the_rest(
    repository: Path, questions_file: Path
) -> None:
    fake = FakeEngine(engine="generic", block=1)
    outage = _Outage(fake, answers=2)
    runner = CliRunner()
    command = ["batch", str(repository), "--questions", str(questions_file), "--concurrency", "1"]
    with instant_retries():
        stopped = runner.invoke(main, command, obj=Runtime(backend=outage.backend()))
    assert stopped.exit_code == EXIT_UNREACHABLE, stopped.output
    assert outage.refused > 0
    # The two answers stored, each under its question, and how to ask the rest.
    assert stopped.stdout.count("## question") == 2 and stopped.stdout.count(fake.answer) == 2
    line = next(line for line in stopped.stderr.splitlines() if "answered and stored in session" in line)
    session_id = line.split("in session ")[1].split(";")[0]
    assert f"ask the rest with: longctx batch --session {session_id} --questions {questions_file}" in line
    with Store.open(_home()) as store:
        assert len(store.sessions.answered(batch_keys(session_id, QUESTIONS))) == 2

    # `sessions show` shows a batch's answers, not only its header.
    shown = runner.invoke(main, ["sessions", "show", session_id])
    assert shown.exit_code == EXIT_OK
    assert "batch of 2 sibling answers after 0 turns" in shown.stdout and shown.stdout.count(fake.answer) == 2
    as_json = json.loads(runner.invoke(main, ["sessions", "show", session_id, "--json"]).stdout)
    assert sorted(s["question"] for s in as_json["siblings"]) == sorted(QUESTIONS[:2])

    outage.answers = None  # the server is back
    sent = len(fake.chat_bodies)
    resumed = runner.invoke(
        main,
        ["batch", "--session", session_id, "--questions", str(questions_file), "--json"],
        obj=Runtime(backend=outage.backend()),
    )
    assert resumed.exit_code == EXIT_OK, resumed.output
    assert len(fake.chat_bodies) == sent + 2  # only the two without an answer
    result = json.loads(resumed.stdout)
    assert [answer["question"] for answer in result["answers"]] == QUESTIONS
    assert result["session_id"] == session_id
    assert "2 of 4 answers from an earlier run" in resumed.stderr
    with Store.open(_home()) as store:
        assert len(store.sessions.answered(batch_keys(session_id, QUESTIONS))) == 4
        siblings = store.sessions.children(session_id)
        assert sorted(store.sessions.turns(child.id)[0].question for child in siblings) == sorted(QUESTIONS)

    # Everything answered: a third run asks nothing.
    again = runner.invoke(
        main,
        ["batch", "--session", session_id, "--questions", str(questions_file)],
        obj=Runtime(backend=outage.backend()),
    )
    assert again.exit_code == EXIT_OK and len(fake.chat_bodies) == sent + 2
    assert again.stdout.count(fake.answer) == 4


def test_batch_session_refuses_paths_and_shard(repository: Path, questions_file: Path) -> None:
    fake = FakeEngine(engine="generic", block=1)
    backend = _Outage(fake).backend()
    runner = CliRunner()
    first = runner.invoke(
        main,
        ["batch", str(repository), "--questions", str(questions_file), "--json"],
        obj=Runtime(backend=backend),
    )
    session_id = json.loads(first.stdout)["session_id"]
    with_paths = runner.invoke(
        main,
        ["batch", str(repository), "--session", session_id, "--questions", str(questions_file)],
        obj=Runtime(backend=backend),
    )
    assert with_paths.exit_code != EXIT_OK and "PATHS cannot be given with --session" in with_paths.stderr
    sharded = runner.invoke(
        main,
        ["batch", "--shard", "--session", session_id, "--questions", str(questions_file)],
        obj=Runtime(backend=backend),
    )
    assert sharded.exit_code != EXIT_OK and "--shard cannot be given with --session" in sharded.stderr


def test_ask_many_reuse_answered_asks_only_the_questions_without_an_answer(
    repository: Path, tmp_path: Path
) -> None:
    fake = FakeEngine(engine="generic", block=1)
    outage = _Outage(fake, answers=1)
    store = Store.open(tmp_path / "store")
    session = RepoSession(repository, backend=outage.backend(), store=store)
    with instant_retries(), pytest.raises(ServerUnreachable):
        session.ask_many(QUESTIONS[:3], reuse_answered=True, concurrency=1)
    session.close()
    outage.answers = None
    with Session.resume(session.id, outage.backend(), store=store) as resumed:
        batch = resumed.ask_many(QUESTIONS[:3], reuse_answered=True)
    assert batch.reused == 1 and len(fake.chat_bodies) == 3
    assert [answer.question for answer in batch] == QUESTIONS[:3]
    assert any("1 of 3 answers stored by an earlier call" in note for note in batch.report.notes)
    # Keys of their text: another order, and one question more, find the same answers.
    with Session.resume(session.id, outage.backend(), store=store) as again:
        more = again.ask_many([QUESTIONS[3], *reversed(QUESTIONS[:3])], reuse_answered=True)
    assert more.reused == 3 and len(fake.chat_bodies) == 4
    assert [answer.question for answer in more] == [QUESTIONS[3], *reversed(QUESTIONS[:3])]


def test_a_chat_whose_server_went_away_says_so_and_continues_when_it_is_back(
    repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeEngine(engine="generic", block=1)
    outage = _Outage(fake, answers=1)
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:
            outage.answers = None  # back after three waits

    monkeypatch.setattr("longctx.cli.chat._wait", sleep)
    with instant_retries():
        result = CliRunner().invoke(
            main,
            ["chat", str(repository), "--json", "--no-warm-start"],
            obj=Runtime(backend=outage.backend()),
            input="first?\nsecond?\n\n",
        )
    assert result.exit_code == EXIT_OK, result.output
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert [a["question"] for a in answers] == ["first?", "second?"]
    assert answers[0]["session_id"] == answers[1]["session_id"]
    assert waits == [2.0, 4.0, 8.0]  # a growing wait between tries
    session_id = answers[0]["session_id"]
    # Said once, not once a try; its return said once too.
    went_away = [line for line in result.stderr.splitlines() if "the server went away" in line]
    assert len(went_away) == 1
    assert f"session {session_id} is kept" in went_away[0]
    assert f"resume with: longctx chat --session {session_id}" in went_away[0]
    assert result.stderr.count("the server is back; asked again after 3 failed tries") == 1
    with Store.open(_home()) as store:
        assert [turn.question for turn in store.sessions.turns(session_id)] == ["first?", "second?"]


def test_aask_many_reuses_answers_like_ask_many(repository: Path, tmp_path: Path) -> None:
    fake = FakeEngine(engine="generic", block=1)
    backend = _Outage(fake).backend()
    store = Store.open(tmp_path / "store")
    with RepoSession(repository, backend=backend, store=store) as session:
        session.ask_many(QUESTIONS[:2], reuse_answered=True)
        batch = asyncio.run(session.aask_many(QUESTIONS, reuse_answered=True))
    assert batch.reused == 2 and len(fake.chat_bodies) == 4
    assert [answer.question for answer in batch] == QUESTIONS
