"""Lifecycles like httpx: a session is cheap to build, connects on first use, and closes what it opened."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import httpx2
import pytest
from fake_engine import FakeEngine

from longctx import (
    Conversation,
    DocSession,
    RepoSession,
    RequestOptions,
    ServerOptions,
    Session,
    ShardedSession,
)
from longctx.backends.base import Backend, connect
from longctx.errors import ConfigError, ServerUnreachable, SessionClosed, SessionNotFound
from longctx.retry import instant_retries
from longctx.sessions import resume
from longctx.store import Store, StoredPack

URL = "http://fake-engine:8000/v1"
PACK = StoredPack(
    fingerprint="e" * 64,
    format_version="test/1",
    system="You answer questions about the documents.",
    prefix="<documents>\n" + "lorem ipsum\n" * 200 + "</documents>\n\n",
    summary={"title": "fixture"},
)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "a.py").write_text("x = 1\n")
    return root


def test_a_session_against_an_unreachable_server_is_built_and_fails_on_first_ask(repository: Path) -> None:
    home = Path(os.environ["LONGCTX_HOME"])
    session = RepoSession(repository, server=ServerOptions("http://127.0.0.1:9/v1"))
    assert not home.exists()  # nothing opened, read or written yet
    progress: list[str] = []
    session = RepoSession(
        repository, server=ServerOptions("http://127.0.0.1:9/v1"), on_progress=progress.append
    )
    with instant_retries(), pytest.raises(ServerUnreachable):
        session.ask("anything?")
    assert any(message.startswith("connecting to http://127.0.0.1:9/v1") for message in progress)
    session.close()


_WATCHING: list[list[tuple[str, str]]] = []


def _audit(event: str, arguments: tuple[object, ...]) -> None:
    # Audit hooks cannot be removed: this one records only while a test watches.
    if _WATCHING and event in {"open", "os.listdir", "os.scandir", "os.mkdir", "socket.connect"}:
        _WATCHING[-1].append((event, str(arguments[0] if event != "socket.connect" else arguments[1])))


sys.addaudithook(_audit)


def test_constructing_reads_no_file(tmp_path: Path, repository: Path) -> None:
    home = Path(os.environ["LONGCTX_HOME"])
    seen: list[tuple[str, str]] = []
    _WATCHING.append(seen)
    try:
        # A path that does not exist is found out by the first call, not the constructor.
        missing = RepoSession(tmp_path / "not-yet-there")
        present = RepoSession(repository, server=ServerOptions("http://127.0.0.1:9/v1"))
        bare = Session(pack=PACK)
    finally:
        _WATCHING.remove(seen)
    touched = [(event, path) for event, path in seen if str(tmp_path) in path or event == "socket.connect"]
    assert touched == [], touched
    assert not home.exists()  # the store is opened on first use
    assert missing.paths and present.paths and bare.pack == PACK
    # The watch sees a read when there is one.
    control: list[tuple[str, str]] = []
    _WATCHING.append(control)
    try:
        (repository / "a.py").read_text()
    finally:
        _WATCHING.remove(control)
    assert ("open", str(repository / "a.py")) in control


def test_a_session_closes_the_backend_and_store_it_opened_and_only_those(
    backend: Backend, fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[Backend] = []

    def connecting(server: ServerOptions) -> Backend:
        made = connect(URL, transport=fake.transport())
        opened.append(made)
        return made

    monkeypatch.setattr("longctx.sessions.resources.connect", connecting)
    closed: list[object] = []

    def record(self: object) -> None:
        closed.append(self)

    monkeypatch.setattr(Backend, "close", record)
    monkeypatch.setattr(Store, "close", record)

    owner = Session(pack=PACK)
    owner.ask("first?")
    fork = owner.fork()
    fork.ask("in the fork?")
    fork.close()
    assert closed == []  # a fork shares its parent's backend and store
    owner.close()
    assert len(closed) == 2 and opened[0] in closed and any(isinstance(item, Store) for item in closed)
    owner.close()
    assert len(closed) == 2  # closing twice closes nothing twice

    closed.clear()
    given_store = Store.open(Path(os.environ["LONGCTX_HOME"]) / "given")
    with Session(backend, PACK, store=given_store) as borrowed:
        borrowed.ask("q?")
    assert closed == []  # given backend and store stay open for their owner


def test_async_with_closes_the_async_connections_of_a_backend_it_made_and_only_those(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    made: list[Backend] = []

    def connecting(server: ServerOptions) -> Backend:
        made.append(connect(URL, transport=fake.transport(), async_transport=fake.transport()))
        return made[-1]

    monkeypatch.setattr("longctx.sessions.resources.connect", connecting)
    given = connect(URL, transport=fake.transport(), async_transport=fake.transport())

    async def conversations() -> None:
        async with Session(pack=PACK, store=Store.open(tmp_path / "home")) as owner:
            await owner.aask("first?")
            await owner.aask_many(["a?", "b?"])
            assert not made[0].is_closed
        async with Session(given, PACK, store=Store.open(tmp_path / "home")) as borrower:
            await borrower.aask("borrowed?")

    asyncio.run(conversations())
    assert made[0].is_closed  # the async client too: close() alone would leave it open
    assert not given.is_closed  # a given backend stays open for its owner


def test_aask_waits_for_a_turn_in_flight(backend: Backend, tmp_path: Path) -> None:
    store = Store.open(tmp_path / "home")
    session = Session(backend, PACK, store=store)

    async def both() -> None:
        await asyncio.gather(
            asyncio.to_thread(session.ask, "from a thread"),
            session.aask("from the loop"),
            session.aask("and again"),
        )

    asyncio.run(both())
    stored = store.sessions.turns(session.id)
    assert sorted(turn.position for turn in stored) == [0, 1, 2]
    assert len(session.turns) == 3


def test_every_session_kind_has_the_one_interface(backend: Backend, repository: Path, tmp_path: Path) -> None:
    store = Store.open(tmp_path / "home")
    sharded = ShardedSession(repository, backend=backend, store=store)
    plain = RepoSession(repository, backend=backend, store=store)
    for session in (sharded, plain):
        assert isinstance(session, Conversation)
        first = session.ask("What is x?")
        batch = session.ask_many(["one?", "two?"])
        assert [answer.question for answer in batch] == ["one?", "two?"]
        assert asyncio.run(session.aask("async?")).text
        assert len(asyncio.run(session.aask_many(["a?", "b?"]))) == 2
        assert session.fork().ask("forked?").text
        assert session.report().requests
        again = resume(session.id, backend, store=store)
        assert type(again) is type(session) or isinstance(again, Session)
        assert again.report().prompt_tokens == session.report().prompt_tokens
        session.close()
        assert first.text


def test_a_sharded_answer_is_an_answer_with_its_shards(
    backend: Backend, repository: Path, tmp_path: Path
) -> None:
    store = Store.open(tmp_path / "home")
    session = ShardedSession(repository, backend=backend, store=store)
    answer = session.ask("What is x?")
    assert answer.shard_answers and answer.question == "What is x?"
    assert answer.to_dict()["shard_answers"][0]["question"] == "What is x?"


def test_resume_opens_the_default_store_once_and_the_session_owns_it(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Session(backend, PACK) as first:
        first.ask("one?")
    opened: list[Store] = []
    closed: list[Store] = []
    real_open, real_close = Store.open.__func__, Store.close  # type: ignore[attr-defined]

    def counting_open(cls: type[Store], home: Path | None = None) -> Store:
        opened.append(real_open(cls, home))
        return opened[-1]

    def counting_close(self: Store) -> None:
        closed.append(self)
        real_close(self)

    monkeypatch.setattr(Store, "open", classmethod(counting_open))
    monkeypatch.setattr(Store, "close", counting_close)
    resumed = resume(first.id, backend)
    assert len(opened) == 1 and not closed
    assert isinstance(resumed, Session) and [turn.question for turn in resumed.turns] == ["one?"]
    resumed.close()
    assert closed == opened  # the resumed session owned the one store and closed it
    with pytest.raises(SessionNotFound):
        resume("no-such-session", backend)
    assert len(opened) == 2 and closed == opened  # a failed lookup closes what it opened


def test_an_unknown_keyword_is_a_type_error_naming_it(repository: Path) -> None:
    for kind in (RepoSession, DocSession, ShardedSession):
        with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
            kind(repository, base_url="http://host:9/v1", model="m", bogus=3)  # type: ignore[call-arg]


def test_base_url_model_and_api_key_are_taken_where_a_user_reaches_for_them(
    repository: Path, fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = "http://other-host:7/v1"
    reached: list[ServerOptions] = []
    seen_hosts: list[str] = []

    def connecting(server: ServerOptions) -> Backend:
        reached.append(server)

        def handler(request: httpx2.Request) -> httpx2.Response:
            seen_hosts.append(f"{request.url.host}:{request.url.port}")
            return fake.handle(request)

        return connect(server, transport=httpx2.MockTransport(handler))

    monkeypatch.setattr("longctx.sessions.resources.connect", connecting)
    with RepoSession(repository, base_url=other, model="fake-model", api_key="secret") as session:
        assert session.ask("what is x?").text == fake.answer
    assert reached[0].base_urls() == (other,) and reached[0].model == "fake-model"
    assert reached[0].resolved_api_key() == "secret"
    assert seen_hosts and set(seen_hosts) == {"other-host:7"}  # never the default 127.0.0.1:8000
    # A URL given as server= is that server, as connect() takes it.
    with RepoSession(repository, server=other) as session:
        session.ask("and again?")
    assert reached[-1].base_urls() == (other,)


def test_server_and_base_url_together_or_an_option_of_the_wrong_type_are_refused_at_once(
    repository: Path,
) -> None:
    with pytest.raises(TypeError, match="not both"):
        RepoSession(repository, server=ServerOptions("http://a:1/v1"), base_url="http://b:2/v1")
    with pytest.raises(TypeError, match=r"request=\.\.\.\) takes a RequestOptions, not dict"):
        RepoSession(repository, request={"max_tokens": 8})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes a CorpusOptions"):
        DocSession(repository, corpus={"include": ["*.py"]})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes a ServerOptions or a URL, not int"):
        ShardedSession(repository, server=8000)  # type: ignore[arg-type]


def test_a_closed_session_refuses_every_call_that_needs_the_server_or_the_store(
    backend: Backend, fake: FakeEngine, tmp_path: Path
) -> None:
    store = Store.open(tmp_path / "home")
    session = Session(backend, PACK, store=store, request=RequestOptions(warm_start=True))
    answer = session.ask_many(["first?", "second?"])[0]
    session.close()
    sent = len(fake.chat_bodies)
    calls = {
        "ask": lambda: session.ask("again?"),
        "aask": lambda: asyncio.run(session.aask("again?")),
        "ask_many": lambda: session.ask_many(["a?", "b?"]),
        "aask_many": lambda: asyncio.run(session.aask_many(["a?", "b?"])),
        "canary": session.canary,
        "warm_start": session.warm_start,
        "with": session.__enter__,  # a warm start on entering
        "fork": session.fork,
        "branch": lambda: session.branch(answer),
        "report": session.report,
        "persist": session.persist,
        "backend": lambda: session.backend,
        "store": lambda: session.store,
    }
    for name, call in calls.items():
        with pytest.raises(SessionClosed, match="this session is closed") as raised:
            call()
        assert not isinstance(raised.value, ConfigError), name  # its own error, not a bad argument
    assert len(fake.chat_bodies) == sent  # nothing was sent
    assert session.id and session.title and len(session.turns) == 0  # what it holds can still be read
    assert store.sessions.session(session.id).id == session.id  # the given store stays open for its owner
    session.close()  # closing again is fine


def test_forks_and_shards_of_a_closed_session_that_owned_the_connection_are_closed_too(
    fake: FakeEngine, repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "longctx.sessions.resources.connect", lambda server: connect(URL, transport=fake.transport())
    )
    owner = Session(pack=PACK)  # connects and opens the default store itself: it owns both
    owner.ask("first?")
    fork = owner.fork()
    owner.close()
    with pytest.raises(SessionClosed, match="forked from"):
        fork.ask("in the fork?")

    sharded = ShardedSession(repository)
    sharded.ask("What is x?")
    shard = sharded.shards[0]
    sharded.close()
    for call in (lambda: sharded.ask("x?"), sharded.report, sharded.fork, lambda: shard.ask("x?")):
        with pytest.raises(SessionClosed):
            call()


def test_a_fork_of_a_closed_session_that_owned_nothing_goes_on(
    backend: Backend, fake: FakeEngine, tmp_path: Path
) -> None:
    store = Store.open(tmp_path / "home")
    parent = Session(backend, PACK, store=store)
    parent.ask("first?")
    fork = parent.fork()
    parent.close()  # closes nothing: the backend and the store are the caller's
    assert fork.ask("in the fork?").text == fake.answer
