"""Warm start against the fake server: a one-token request over the pack before the first question.

The same against the real engines: test_cli.py (`longctx chat` opened, the
first question typed 10 s later is served from the cache).
"""

from __future__ import annotations

import dataclasses
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fake_engine import FakeEngine, Fault

from longctx.backends.base import Backend, connect
from longctx.cli import Runtime, main
from longctx.options.groups import RequestOptions, ServerOptions
from longctx.retry import instant_retries
from longctx.sessions import RepoSession, Session
from longctx.sessions.warm import RECENT_SECONDS, WARM_QUESTION
from longctx.store import Store, StoredPack
from longctx.usage import Usage

URL = "http://fake-engine:8000/v1"
PACK = StoredPack("f" * 64, "test", "the system header", "<documents>...</documents>\n\n", {})


@dataclasses.dataclass
class _Started(FakeEngine):
    """A fake vLLM whose ``/metrics`` says when it started, as the Prometheus process collector does."""

    started: float = dataclasses.field(default_factory=lambda: time.time() - 3600)

    def metrics(self) -> str:
        return super().metrics() + f"process_start_time_seconds {self.started}\n"


def started_backend(fake: _Started) -> Backend:
    return connect(URL, transport=fake.transport(), async_transport=fake.transport())


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "home")


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "a.py").write_text("def a():\n    return 1\n" * 50)
    (root / "README.md").write_text("# project\n")
    return root


def test_a_session_that_asks_for_it_warms_its_pack_before_the_first_question(
    backend: Backend, fake: FakeEngine, store: Store, repository: Path
) -> None:
    with RepoSession(
        repository, backend=backend, store=store, request=RequestOptions(warm_start=True)
    ) as session:
        assert session.warming is not None
        answer = session.ask("what does a return?")
        result = session.warming.result
        report = session.report()
    assert result is not None and result.usage is not None and result.skipped is None
    warm_body, question_body = fake.chat_bodies
    assert warm_body["max_tokens"] == 1
    assert warm_body["messages"][-1]["content"].endswith(WARM_QUESTION)
    # Everything before the question is the same text in both requests, so
    # the question is served from what the warm request cached.
    pack_text = warm_body["messages"][-1]["content"].removesuffix(WARM_QUESTION)
    assert question_body["messages"][-1]["content"] == pack_text + "what does a return?"
    assert answer.usage.cached_tokens is not None
    assert answer.usage.cached_tokens >= (result.usage.prompt_tokens or 0) - 10
    assert [line.purpose for line in report.requests] == ["warm", "turn"]
    assert report.prompt_tokens == (result.usage.prompt_tokens or 0) + (answer.usage.prompt_tokens or 0)
    assert "warm start: pack prefilled" in result.summary_line()


def test_no_warm_start_unless_asked(
    backend: Backend, fake: FakeEngine, store: Store, repository: Path
) -> None:
    with RepoSession(repository, backend=backend, store=store) as session:
        session.ask("q?")
    assert session.warming is None
    assert [body["max_tokens"] for body in fake.chat_bodies] == [RequestOptions().max_tokens]


def test_warm_start_is_skipped_when_the_server_computed_the_pack_moments_ago_and_ran_since(
    store: Store,
) -> None:
    fake = _Started(engine="vllm", block=1)
    backend = started_backend(fake)
    with Session(backend, PACK, store=store) as first:
        first.ask("q?")
    second = Session(backend, PACK, store=store, request=RequestOptions(warm_start=True))
    with second:
        assert second.warming is not None
        result = second.warming.wait(10)
        second.ask("another?")
        purposes = [line.purpose for line in second.report().requests]
    assert result is not None and result.skipped is not None
    assert "computed this prefix" in result.summary_line() and "has run since" in result.summary_line()
    assert len(fake.chat_bodies) == 2  # the first session's question and the second's: no warm request
    assert purposes == ["turn"]


def test_a_server_restarted_since_the_pack_was_computed_is_warmed(store: Store) -> None:
    fake = _Started(engine="vllm", block=1)
    backend = started_backend(fake)
    with Session(backend, PACK, store=store) as first:
        first.ask("q?")
    fake.started = time.time()  # restarted after that request: its cache is empty
    with Session(backend, PACK, store=store, request=RequestOptions(warm_start=True)) as second:
        assert second.warming is not None
        result = second.warming.wait(10)
    assert result is not None and result.skipped is None and result.usage is not None
    assert "the server restarted" in result.summary_line() and "after it computed this prefix" in (
        result.why or ""
    )
    assert [body["max_tokens"] for body in fake.chat_bodies][-1] == 1


def test_a_server_that_cannot_say_when_it_started_is_warmed(
    backend: Backend, fake: FakeEngine, store: Store, repository: Path
) -> None:
    with RepoSession(repository, backend=backend, store=store) as first:
        first.ask("q?")
    assert backend.started_at() is None  # a generic server: no /metrics
    second = RepoSession(repository, backend=backend, store=store, request=RequestOptions(warm_start=True))
    with second:
        assert second.warming is not None
        result = second.warming.wait(10)
    assert result is not None and result.usage is not None
    assert "cannot say whether it still holds the prefix" in result.summary_line()


def test_no_start_time_is_read_behind_a_declared_router() -> None:
    fake = _Started(engine="vllm", block=1)
    routed = connect(
        ServerOptions(base_url=URL, router_policy="vllm-router:consistent_hash"), transport=fake.transport()
    )
    assert started_backend(fake).started_at() == pytest.approx(fake.started)
    assert routed.started_at() is None  # the router's /metrics are not the worker's


def test_a_pack_used_long_ago_is_warmed_again(
    backend: Backend, fake: FakeEngine, store: Store, repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with RepoSession(repository, backend=backend, store=store) as first:
        first.ask("q?")
    later = time.time() + RECENT_SECONDS + 60
    monkeypatch.setattr("longctx.sessions.warm.time.time", lambda: later)
    with RepoSession(repository, backend=backend, store=store, request=RequestOptions(warm_start=True)) as s:
        assert s.warming is not None
        result = s.warming.wait(10)
    assert result is not None and result.skipped is None and result.usage is not None


def test_a_failed_warm_start_is_reported_and_the_question_still_goes_out(
    backend: Backend, fake: FakeEngine, store: Store, repository: Path
) -> None:
    session = RepoSession(repository, backend=backend, store=store)
    session.full_pack  # noqa: B018 - the pack is read before the fault is queued
    fake.faults.append(Fault(status=400, body={"error": {"message": "refused", "code": 400}}))
    with instant_retries():
        warming = session.warm_start()
        answer = session.ask("still answered?")
    result = warming.result
    assert result is not None and result.failed is not None
    assert "the first question prefills the pack" in result.summary_line()
    assert answer.text == fake.answer
    session.close()


def test_chat_warms_the_pack_and_says_so_and_no_warm_start_turns_it_off(
    backend: Backend, fake: FakeEngine, tmp_path: Path, repository: Path
) -> None:
    runner = CliRunner()
    result = runner.invoke(
        main, ["chat", str(repository), "--json"], obj=Runtime(backend=backend), input="first?\n\n"
    )
    assert result.exit_code == 0, result.output
    assert [body["max_tokens"] for body in fake.chat_bodies] == [1, RequestOptions().max_tokens]
    assert "[warm start: pack prefilled" in result.stderr
    turn = json.loads(result.stdout.splitlines()[0])
    report = Session.resume(turn["session_id"], backend).report()
    assert [line.purpose for line in report.requests] == ["warm", "turn"]

    fake.chat_bodies.clear()
    result = runner.invoke(
        main,
        ["chat", str(repository), "--no-warm-start", "--cache-salt", "other"],
        obj=Runtime(backend=backend),
        input="first?\n\n",
    )
    assert result.exit_code == 0, result.output
    assert [body["max_tokens"] for body in fake.chat_bodies] == [RequestOptions().max_tokens]
    assert "warm start" not in result.stderr


def test_an_empty_chat_waits_for_its_warm_start_and_leaves_no_session(
    backend: Backend, fake: FakeEngine, repository: Path
) -> None:
    result = CliRunner().invoke(main, ["chat", str(repository)], obj=Runtime(backend=backend), input="\n")
    assert result.exit_code == 0, result.output
    assert "no question asked" in result.stderr
    assert Store.open().sessions.sessions() == []


def test_answer_reuse_is_what_the_next_turn_cached_past_the_previous_prompt() -> None:
    from longctx.sessions.reuse import answer_reuse

    def usage(prompt: int, cached: int | None, completion: int | None = None) -> Usage:
        return Usage(prompt, cached, None, completion, None, None)

    previous = usage(2_536, 0, 1_000)
    whole = answer_reuse(previous, usage(3_660, 3_456))
    none = answer_reuse(previous, usage(3_659, 2_432))
    assert whole is not None and none is not None
    assert (whole.reused_tokens, whole.answer_tokens) == (920, 1_000)
    assert (none.reused_tokens, none.share) == (0, 0.0)
    assert whole.summary_line() == "920 of 1,000 tokens of the previous answer from the cache (92%)"
    assert answer_reuse(previous, usage(3_659, None)) is None


def test_chat_turn_lines_and_the_report_say_how_much_of_the_previous_answer_was_cached(
    backend: Backend, fake: FakeEngine, repository: Path
) -> None:
    fake.answer = "an answer " * 40
    result = CliRunner().invoke(
        main,
        ["chat", str(repository), "--no-warm-start"],
        obj=Runtime(backend=backend),
        input="one?\ntwo?\n\n",
    )
    assert result.exit_code == 0, result.output
    # The fake engine counts 3 completion tokens and caches only prompts it saw: none of the answer.
    assert (
        "[turn 1: " in result.stderr
        and "0 of 3 tokens of the previous answer from the cache (0%)" in result.stderr
    )
    session_id = json.loads(CliRunner().invoke(main, ["sessions", "list", "--json"]).stdout)[0]["id"]
    notes = Session.resume(session_id, backend).report().notes
    assert "turn 2: 0 of 3 tokens of the previous answer from the cache (0%)" in notes


# -- no empty sessions: a session reaches the store with its first answer ------------


def _nothing_stored(store: Store) -> bool:
    return store.sessions.sessions(include_branches=True) == [] and store.sessions.requests() == []


def test_a_warmed_session_closed_before_a_question_leaves_nothing_in_the_store(
    backend: Backend, fake: FakeEngine, store: Store, repository: Path
) -> None:
    with RepoSession(
        repository, backend=backend, store=store, request=RequestOptions(warm_start=True)
    ) as session:
        assert session.warming is not None
        result = session.warming.wait(10)
        # The warm request's cost is still the session's, in memory.
        assert [line.purpose for line in session.report().requests] == ["warm"]
    assert result is not None and result.usage is not None
    assert len(fake.chat_bodies) == 1
    assert _nothing_stored(store)
    assert store.sessions.counter_checks([session.id]) == []


def test_the_first_answer_stores_the_session_with_its_warm_start_and_counter_check(
    store: Store, repository: Path
) -> None:
    fake = _Started(engine="vllm", block=1)  # one with prefix-cache counters (and no tokenize route)
    backend = started_backend(fake)
    with Session(backend, PACK, store=store, request=RequestOptions(warm_start=True)) as session:
        assert session.warming is not None
        session.warming.wait(10)
        assert _nothing_stored(store)
        session.ask("what does a return?")
        assert [record.id for record in store.sessions.sessions()] == [session.id]
        assert [r.purpose for r in store.sessions.requests(session_ids=[session.id])] == ["warm", "turn"]
        # The warm start's check and the turn's (settled off the answer's path: the report
        # waits for it): both refer to the session, stored with it.
        session.report()
        assert len(store.sessions.counter_checks([session.id])) == 2
        # Stored, the requests tell a later warm start that the server holds the prefix.
        again = session.warm_start().wait(10)
        assert again is not None and again.skipped is not None


def test_an_empty_question_or_a_failed_first_request_leaves_no_session(
    backend: Backend, fake: FakeEngine, store: Store, repository: Path
) -> None:
    from longctx.errors import ConfigError, ServerError

    session = RepoSession(repository, backend=backend, store=store, request=RequestOptions(warm_start=True))
    session.warm_start().wait(10)
    with pytest.raises(ConfigError):
        session.ask("   ")
    fake.faults.extend([Fault(status=400, body={"error": {"message": "refused", "code": 400}})] * 5)
    with instant_retries(), pytest.raises(ServerError):
        session.ask("refused?")
    session.close()
    assert _nothing_stored(store)


def test_a_batch_whose_every_question_failed_leaves_no_parent(
    backend: Backend, fake: FakeEngine, store: Store, repository: Path
) -> None:
    from longctx.errors import ServerError

    session = RepoSession(repository, backend=backend, store=store)
    session.full_pack  # noqa: B018 - the pack is read before the faults are queued
    fake.faults.extend([Fault(status=400, body={"error": {"message": "refused", "code": 400}})] * 10)
    with instant_retries(), pytest.raises(ServerError):
        session.ask_many(["one?", "two?"])
    session.close()
    assert _nothing_stored(store)


class _CtrlC(io.RawIOBase):
    """A terminal whose user presses Ctrl-C instead of typing the first question."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if len(buffer):
            raise KeyboardInterrupt
        return 0


def test_a_chat_interrupted_before_its_first_question_leaves_no_session(
    backend: Backend, fake: FakeEngine, repository: Path
) -> None:
    result = CliRunner().invoke(
        main, ["chat", str(repository)], obj=Runtime(backend=backend), input=io.BufferedReader(_CtrlC())
    )
    assert result.exit_code != 0
    assert [body["max_tokens"] for body in fake.chat_bodies] == [1]  # the warm start went out
    assert _nothing_stored(Store.open())


def test_chat_token_history_is_kept_with_the_session_and_applied_on_resume(
    backend: Backend, fake: FakeEngine, repository: Path
) -> None:
    runner = CliRunner()
    first = runner.invoke(
        main,
        ["chat", str(repository), "--token-history", "--no-warm-start", "--json"],
        obj=Runtime(backend=backend),
        input="one?\n\n",
    )
    assert first.exit_code == 0, first.output
    session_id = json.loads(first.stdout.splitlines()[0])["session_id"]
    assert Store.open().sessions.session(session_id).settings["token_history"] is True
    # A server without a tokenize route (this one) gets plain chat requests.
    assert all("messages" in body and "return_token_ids" not in body for body in fake.chat_bodies)
    resumed = runner.invoke(
        main,
        ["chat", "--session", session_id, "--no-token-history", "--no-warm-start"],
        obj=Runtime(backend=backend),
        input="two?\n\n",
    )
    assert resumed.exit_code == 0, resumed.output
    assert "applying --token-history False to the resumed session" in resumed.stderr
