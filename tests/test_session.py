"""Session logic against the fake engine: history, siblings, forks, store, report."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import threading
from pathlib import Path

import httpx2
import pytest
from fake_engine import FakeEngine, Fault

from longctx.backends.base import Backend, connect
from longctx.errors import ConfigError, ServerError, SessionNotFound, StoreError
from longctx.options.groups import RequestOptions, ServerOptions
from longctx.retry import instant_retries
from longctx.sessions import Session
from longctx.sessions.answers import history_form
from longctx.sessions.siblings import Dispatch, choose_dispatch
from longctx.store import Store, StoredPack

URL = "http://fake-engine:8000/v1"
PACK = StoredPack(
    fingerprint="f" * 64,
    format_version="test/1",
    system="You answer questions about the documents.",
    prefix="<documents>\n" + "lorem ipsum dolor sit amet\n" * 400 + "</documents>\n\n",
    summary={"title": "fixture"},
)


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(block=1)


@pytest.fixture
def backend(fake: FakeEngine) -> Backend:
    return connect(URL, transport=fake.transport(), async_transport=fake.transport())


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "home")


def test_history_form_drops_reasoning_like_reasoning_templates() -> None:
    assert history_form("<think>\nlet me see\n</think>\n\nThe answer.") == "The answer."
    assert history_form("plain answer") == "plain answer"
    assert history_form("a</think>b</think>\nc") == "c"


def test_turns_append_and_every_request_starts_with_the_previous_one(
    backend: Backend, fake: FakeEngine, store: Store
) -> None:
    session = Session(backend, PACK, store=store)
    for question in ("first?", "second?", "third?"):
        session.ask(question)
    prompts = [body["messages"] for body in fake.chat_bodies]
    assert prompts[0][0] == {"role": "system", "content": PACK.system}
    assert prompts[0][1]["content"] == PACK.prefix + "first?"
    for earlier, later in itertools.pairwise(prompts):
        assert later[: len(earlier)] == earlier
        assert later[len(earlier)]["role"] == "assistant"
    assert [turn.question for turn in session.turns] == ["first?", "second?", "third?"]


def test_later_turns_are_cached_in_the_fake(backend: Backend, store: Store) -> None:
    session = Session(backend, PACK, store=store)
    first = session.ask("first?")
    second = session.ask("second?")
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens is not None and second.usage.cached_tokens > 0.9 * (
        first.usage.prompt_tokens or 0
    )


def test_reasoning_is_dropped_from_history(fake: FakeEngine, backend: Backend, store: Store) -> None:
    fake.answer = "<think>secret chain</think>\nVisible."
    session = Session(backend, PACK, store=store)
    answer = session.ask("q1")
    assert answer.text == "<think>secret chain</think>\nVisible."
    session.ask("q2")
    assert fake.chat_bodies[1]["messages"][2] == {"role": "assistant", "content": "Visible."}


def test_resume_has_every_committed_turn(backend: Backend, store: Store) -> None:
    session = Session(
        backend, PACK, store=store, title="resumable", request=RequestOptions(cache_salt="tenant-1")
    )
    session.ask("one?")
    session.ask("two?")
    resumed = Session.resume(session.id, backend, store=Store.open(store.path.parent))
    assert [turn.question for turn in resumed.turns] == ["one?", "two?"]
    assert resumed.request.cache_salt == "tenant-1"
    assert resumed.pack == PACK
    resumed.ask("three?")
    assert len(Session.resume(session.id, backend, store=store).turns) == 3


def test_unknown_session_is_session_not_found(backend: Backend, store: Store) -> None:
    with pytest.raises(SessionNotFound):
        Session.resume("nope", backend, store=store)


def test_a_failed_request_leaves_no_turn(fake: FakeEngine, backend: Backend, store: Store) -> None:
    session = Session(backend, PACK, store=store)
    session.ask("kept?")
    fake.faults.extend([Fault(status=400, body={"error": {"message": "bad"}})])
    with pytest.raises(ServerError):
        session.ask("lost?")
    assert [turn.question for turn in Session.resume(session.id, backend, store=store).turns] == ["kept?"]


def test_retried_turns_are_stored_once(fake: FakeEngine, backend: Backend, store: Store) -> None:
    session = Session(backend, PACK, store=store)
    fake.faults.extend([Fault(drop=True), Fault(status=503), Fault(status=429, headers={"Retry-After": "0"})])
    with instant_retries():
        answer = session.ask("retried?")
    assert answer.attempts == 4
    stored = store.sessions.turns(session.id)
    assert [turn.question for turn in stored] == ["retried?"]
    assert store.sessions.requests(session_ids=[session.id])[0].attempts == 4


def test_a_turn_position_cannot_be_stored_twice(backend: Backend, store: Store) -> None:
    session = Session(backend, PACK, store=store)
    session.ask("once")
    turn = store.sessions.turns(session.id)[0]
    request = store.sessions.requests(session_ids=[session.id])[0]
    with pytest.raises(StoreError, match="already stored"):
        store.sessions.commit_turn(turn, dataclasses.replace(request, id="another"))
    assert len(store.sessions.turns(session.id)) == 1


def test_ask_many_sends_the_lead_first_and_branches_each_sibling(
    fake: FakeEngine, backend: Backend, store: Store
) -> None:
    session = Session(backend, PACK, store=store, request=RequestOptions(dispatch="lead"))
    session.ask("shared history?")
    questions = [f"sibling {i}?" for i in range(6)]
    batch = session.ask_many(questions, concurrency=3)
    assert batch.report.dispatch == "lead, up to 3 in flight (asked for)"
    assert [answer.question for answer in batch] == questions
    # The lead went out before any other sibling.
    sibling_bodies = fake.chat_bodies[1:]
    assert sibling_bodies[0]["messages"][-1]["content"] == "sibling 0?"
    for answer in batch:
        assert answer.usage.cached_tokens is not None
    for answer in batch.answers[1:]:
        assert answer.usage.cached_tokens and answer.usage.cached_tokens >= 0.95 * (
            answer.usage.prompt_tokens or 0
        )
    # The main line is unchanged; each sibling is a branch holding the history.
    assert len(session.turns) == 1
    branch = session.branch(batch[3])
    assert [turn.question for turn in branch.turns] == ["shared history?", "sibling 3?"]
    branch.ask("follow-up on sibling 3")
    assert fake.chat_bodies[-1]["messages"][-3]["content"] == "sibling 3?"
    assert batch.report.cached_tokens == sum(a.usage.cached_tokens or 0 for a in batch)
    assert batch.report.counter_check is not None and batch.report.counter_check.matches


def test_async_twins(backend: Backend, store: Store) -> None:
    session = Session(backend, PACK, store=store)

    async def run() -> tuple[str, int]:
        answer = await session.aask("async first?")
        batch = await session.aask_many(["a?", "b?", "c?"])
        return answer.text, len(batch)

    text, count = asyncio.run(run())
    assert text == "a fake answer" and count == 3
    assert len(store.sessions.requests(session_ids=[session.id])) == 1


def test_fork_branches_at_a_turn(fake: FakeEngine, backend: Backend, store: Store) -> None:
    session = Session(backend, PACK, store=store)
    for question in ("a?", "b?", "c?"):
        session.ask(question)
    fork = session.fork(at=1)
    fork.ask("b-prime?")
    assert [turn.question for turn in fork.turns] == ["a?", "b-prime?"]
    assert [turn.question for turn in session.turns] == ["a?", "b?", "c?"]
    assert fake.chat_bodies[-1]["messages"][:3] == fake.chat_bodies[1]["messages"][:3]
    with pytest.raises(ConfigError):
        session.fork(at=7)
    assert [t.question for t in Session.resume(fork.id, backend, store=store).turns] == ["a?", "b-prime?"]


def test_affinity_key_is_the_packs(fake: FakeEngine, backend: Backend, store: Store) -> None:
    one = Session(backend, PACK, store=store)
    two = Session(backend, PACK, store=store)
    one.ask("x")
    two.ask("y")
    keys = {headers["x-session-id"] for headers in fake.chat_headers}
    assert keys == {f"longctx-{PACK.fingerprint[:32]}"}


def test_bad_settings_are_refused(backend: Backend, store: Store) -> None:
    with pytest.raises(ConfigError, match="cache_salt"):
        Session(backend, PACK, store=store, request=RequestOptions(cache_salt="a/b"))
    with pytest.raises(ConfigError):
        Session(backend, PACK, store=store, request=RequestOptions(max_tokens=0))
    with pytest.raises(ConfigError, match="empty"):
        Session(backend, PACK, store=store).ask("   ")


def test_report_sums_requests_and_checks_counters(backend: Backend, store: Store) -> None:
    session = Session(backend, PACK, store=store)
    session.ask("one")
    session.ask("two")
    session.ask_many(["x", "y"])
    report = session.report()
    assert len(report.requests) == 4
    assert report.cached_tokens == sum(line.usage.cached_tokens or 0 for line in report.requests)
    assert report.counter_check is not None and report.counter_check.matches is True
    assert report.counter_check.server_delta == report.cached_tokens
    data = json.loads(report.to_json())
    assert data["cached_tokens"] == report.cached_tokens
    assert "cached" in report.to_text() and "<table" in report.to_html() and "|" in report.to_markdown()


def test_report_says_which_flag_is_missing(store: Store) -> None:
    fake = FakeEngine(engine="sglang", report_cached=False)
    session = Session(connect(URL, transport=fake.transport()), PACK, store=store)
    session.ask("one")
    report = session.report()
    assert report.cached_tokens is None
    assert report.missing_reason is not None and "--enable-cache-report" in report.missing_reason
    assert "--enable-cache-report" in report.to_text()
    assert "0 of" not in report.summary_line()


def test_an_all_cached_session_estimates_savings_from_earlier_cold_requests(
    backend: Backend, store: Store
) -> None:
    Session(backend, PACK, store=store).ask("cold first")
    warm = Session(backend, PACK, store=store)
    warm.ask("same pack again")
    report = warm.report()
    assert report.requests[0].usage.cached_tokens and report.requests[0].usage.cached_tokens > 0
    assert report.cold_prefill_tokens_per_second is not None
    assert report.prefill_seconds_saved is not None
    assert any("earlier requests" in note for note in report.notes)


def test_store_filters_requests_and_lists_branches(backend: Backend, store: Store) -> None:
    session = Session(backend, PACK, store=store)
    session.ask("main line")
    batch = session.ask_many(["a?", "b?"])
    fork = session.fork(at=0)
    assert {child.id for child in store.sessions.children(session.id)} == {a.session_id for a in batch} | {
        fork.id
    }
    assert len(store.sessions.requests(base_url=URL, model="fake-model")) == 3
    assert store.sessions.requests(base_url="http://elsewhere:1/v1") == []
    assert (
        len(
            store.sessions.requests(
                batch_id=store.sessions.requests(session_ids=[batch[0].session_id])[0].batch_id
            )
        )
        == 2
    )


def test_a_sharded_session_connects_with_its_api_key(
    fake: FakeEngine, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from longctx.packing import build_pack
    from longctx.sessions import ShardedSession, resources
    from longctx.sources.corpus import load_corpus

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n")
    built = build_pack(load_corpus(tmp_path / "docs"))
    seen: list[ServerOptions] = []

    def recording_connect(server: ServerOptions) -> Backend:
        seen.append(server)
        return connect(URL, transport=fake.transport(), async_transport=fake.transport())

    monkeypatch.setattr(resources, "connect", recording_connect)
    options = ServerOptions(URL, model="m", api_key="sk-test")
    session = ShardedSession(tmp_path / "docs", server=options, store=store, sharded=built)

    assert seen == []  # constructing contacts no server
    assert session.ask("What is A?").text
    assert seen == [options]
    assert seen[0].api_key == "sk-test"


def test_a_sharded_sessions_report_checks_the_server_counter_over_every_part(
    backend: Backend, store: Store, tmp_path: Path
) -> None:
    """Map steps (overlapping, so sharing a window) and reduces: one check, the same once resumed."""
    from longctx.packing import Budget, ShardedPack, build_pack
    from longctx.sessions import ShardedSession, resume
    from longctx.sources.corpus import load_corpus

    packs = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.md").write_text(f"# {name}\n" + f"A line of the {name} part.\n" * 60)
        packs.append(build_pack(load_corpus(tmp_path / name)))
    sharded = ShardedPack(tuple(packs), Budget(context_length=32768), "f" * 64)
    with ShardedSession(tmp_path, backend=backend, store=store, sharded=sharded) as session:
        session.ask("What is here?")
        session.ask("And what else?")
        batch = session.ask_many(["One?", "Two?"])
        report = session.report()
    # The batch's own report: its shards' sibling batches and its reduces, nothing earlier.
    batch_check = batch.report.counter_check
    assert batch_check is not None and batch_check.matches is True, batch_check
    assert batch_check.reported == batch.report.cached_tokens and batch_check.reported, batch.report
    assert [line.purpose for line in batch.report.requests].count("reduce") == 2
    assert [line.purpose for line in report.requests].count("reduce") == 4
    check = report.counter_check
    assert check is not None and check.matches is True, check
    assert check.reported == report.cached_tokens and check.reported, (check, report)
    with resume(session.id, backend, store=store) as resumed:
        assert resumed.report().counter_check == check


@pytest.mark.parametrize(
    ("engine", "strategy", "concurrency"),
    [("vllm", "together", 8), ("sglang", "admitted", 8), ("generic", "lead", 4)],
)
def test_auto_dispatch_follows_the_measured_table_and_the_report_says_so(
    tmp_path: Path, engine: str, strategy: str, concurrency: int
) -> None:
    fake = FakeEngine(block=1, engine=engine)
    with connect("http://fake.test/v1", transport=fake.transport()) as backend:
        session = Session(backend, PACK, store=Store.open(tmp_path / "home"))
        batch = session.ask_many([f"sibling {i}?" for i in range(10)])
    assert batch.report.dispatch is not None
    assert batch.report.dispatch.startswith(f"{strategy}, up to {concurrency} in flight (auto for {engine}")
    assert f"dispatch {batch.report.dispatch}" in " ".join(batch.report.to_text().split())
    assert batch.report.to_dict()["dispatch"] == batch.report.dispatch
    # Ten questions over fewer slots: every one but the first to arrive still read the prefix.
    cached = sorted(answer.usage.cached_tokens or 0 for answer in batch.answers)
    assert all(value > 0 for value in cached[1:]), cached


def test_explicit_dispatch_and_concurrency_win_over_the_table() -> None:
    fake = FakeEngine(block=1, engine="vllm")
    with connect("http://fake.test/v1", transport=fake.transport()) as backend:
        info = backend.info
    assert choose_dispatch(info, RequestOptions()).strategy == "together"
    assert choose_dispatch(info, RequestOptions(dispatch="admitted", concurrency=2)) == Dispatch(
        "admitted", 2, "asked for"
    )
    assert choose_dispatch(info, RequestOptions(concurrency=2), concurrency=5).concurrency == 5
    with pytest.raises(ConfigError, match="unknown dispatch"):
        RequestOptions(dispatch="waves")
    assert RequestOptions.from_dict(RequestOptions(dispatch="lead").to_dict()).dispatch == "lead"
    assert RequestOptions.from_dict({"max_tokens": 5}).concurrency is None


def test_a_turns_counter_check_settles_off_the_answers_path(store: Store) -> None:
    """ask returns while the server's counter is still being read; report waits for the check."""
    fake = FakeEngine()
    gate = threading.Event()
    reads = [0]

    def handle(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/metrics":
            reads[0] += 1
            # The reading before the call passes; those after it wait until the test opens the gate.
            if reads[0] > 2:
                gate.wait(timeout=30)
        return fake.handle(request)

    session = Session(connect(URL, transport=httpx2.MockTransport(handle)), PACK, store=store)
    session.ask("one")  # returns although the counter after it cannot be read yet
    assert not gate.is_set() and store.sessions.counter_checks([session.id]) == []
    gate.set()
    report = session.report()
    assert report.counter_check is not None and report.counter_check.matches
    assert len(store.sessions.counter_checks([session.id])) == 1
