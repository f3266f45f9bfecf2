"""store.sessions (longctx.store.sessions): what is kept of a session reads back whole, in order, once.

Each test writes through the public methods and reads back through them: a
field lost, reordered or decoded wrongly on the way is a session resumed
differently from how it ran.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from longctx.errors import SessionNotFound, StoreError
from longctx.store import (
    CounterCheckRecord,
    CounterSkip,
    Opening,
    RequestRecord,
    SessionRecord,
    Store,
    StoredPack,
    TurnRecord,
)
from longctx.usage import Usage

# Each test on both stores: the SQLite file, and a PostgreSQL server (tests/store_backends.py).
pytestmark = pytest.mark.usefixtures("store_backend")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "home") as opened:
        yield opened


def session(
    session_id: str, created_at: float = 1.0, *, kind: str = "session", parent: str | None = None
) -> SessionRecord:
    return SessionRecord(
        session_id, created_at, kind, f"title of {session_id}", None, parent, None if parent is None else 2,
        {"model": "m", "base_urls": ["http://a/v1"], "temperature": 0.5},
    )  # fmt: skip


def request(
    request_id: str, session_id: str | None, started_at: float = 1.0, **fields: object
) -> RequestRecord:
    values: dict[str, object] = {
        "batch_id": None, "purpose": "turn", "base_url": "http://a/v1", "engine": "vllm", "model": "m",
        "usage": Usage(1000, 640, None, 12, 0.25, 1.5, None, 128, 64, "ids"), "attempts": 2,
    }  # fmt: skip
    values.update(fields)
    return RequestRecord(request_id, session_id, started_at=started_at, **values)  # type: ignore[arg-type]


def turn(session_id: str, position: int, request_id: str | None = None, **fields: object) -> TurnRecord:
    values: dict[str, object] = {
        "question": f"question {position}?", "answer": f"<think>x</think>answer {position}",
        "history_answer": f"answer {position}", "reasoning": "x", "created_at": 10.0 + position,
    }  # fmt: skip
    values.update(fields)
    return TurnRecord(session_id, position, request_id=request_id, **values)  # type: ignore[arg-type]


def test_a_session_with_its_pack_and_earlier_calls_reads_back_whole(store: Store) -> None:
    pack = StoredPack("fp1", "7", "system text", "prefix text", {"documents": 3, "paths": ["a.py", "b.py"]})
    record = SessionRecord("s", 5.0, "repo", "title", "fp1", None, None, {"model": "m", "seed": 7})
    warm = request("warm", "s", purpose="warm")
    check = CounterCheckRecord(
        "s", "b1", "http://a/v1", "prefix_cache_hits", 10, 50, 40, 2, 0, "w1", 8, 4, 4096, "by_source"
    )
    skip = CounterSkip("s", "no counter check: a router", "b1")
    assert store.sessions.pack("fp1") is None
    store.sessions.record_opening(Opening(pack, record, (warm,), (check,), (skip,)))
    assert store.sessions.pack("fp1") == pack
    assert store.sessions.session("s") == record
    assert store.sessions.requests() == [warm]
    assert store.sessions.counter_checks(["s"]) == [check]
    assert store.sessions.counter_skips(["s"]) == [skip]
    assert store.sessions.turns("s") == []
    # A session without a pack, made alone.
    store.sessions.create_session(session("t"))
    assert store.sessions.session("t") == session("t")
    with pytest.raises(store.database.conflicts):  # its id is taken: the caller's to explain
        store.sessions.create_session(session("t", 9.0))
    assert store.sessions.session("t") == session("t")


def test_every_field_of_a_turn_reads_back_as_it_was_stored(store: Store) -> None:
    store.sessions.create_session(session("s"))
    full = turn(
        "s", 0, "r0", preamble="changed: a.py\n", file_changes={"a.py": "h1", "gone.py": None},
        answer_ids=(5, 6, 7), instruction="\n\ncite your sources",
        citations=({"path": "a.py", "lines": [1, 2], "ok": True},),
        schema={"name": "x", "schema": {}, "multi": False},
    )  # fmt: skip
    bare = turn("s", 1, "r1", reasoning=None)
    store.sessions.commit_turn(bare, request("r1", "s", 2.0))
    store.sessions.commit_turn(full, request("r0", "s", 1.0))
    assert store.sessions.turns("s") == [full, bare]  # by position, not as committed
    (back, _) = store.sessions.turns("s")
    assert back.answer_ids == (5, 6, 7) and back.citations == full.citations and back.schema == full.schema
    assert bare.answer_ids is None and bare.citations is None and bare.schema is None
    assert store.sessions.turns("s")[1] == bare
    assert [r.id for r in store.sessions.requests(session_ids=["s"])] == ["r0", "r1"]


def test_a_turn_is_stored_once_with_its_request_or_not_at_all(store: Store) -> None:
    store.sessions.create_session(session("s"))
    store.sessions.commit_turn(turn("s", 0), request("r0", "s"), key="job:j:0:d:n")
    with pytest.raises(StoreError, match="turn 0 of session s is already stored"):
        store.sessions.commit_turn(turn("s", 0, answer="again"), request("r0b", "s"))
    with pytest.raises(StoreError, match="turn 1 of session s is already stored"):
        store.sessions.commit_turn(turn("s", 1), request("r1", "s"), key="job:j:0:d:n")  # the key is taken
    # Neither failed commit left its request or its turn.
    assert [r.id for r in store.sessions.requests()] == ["r0"]
    assert [t.position for t in store.sessions.turns("s")] == [0]
    assert store.sessions.turns("s")[0].answer == turn("s", 0).answer


def test_a_first_turn_stores_its_session_or_branch_in_the_same_transaction(store: Store) -> None:
    opening = Opening(
        StoredPack("fp", "7", "s", "p", {}), SessionRecord("s", 1.0, "repo", "t", "fp", None, None)
    )
    store.sessions.commit_turn(turn("s", 0), request("r0", "s"), opening=opening)
    assert store.sessions.session("s") == opening.session and store.sessions.pack("fp") == opening.pack
    branch = session("b", 2.0, kind="sibling", parent="s")
    store.sessions.commit_turn(turn("b", 0), request("r1", "b"), new_session=branch, key="k")
    assert store.sessions.session("b") == branch
    assert store.sessions.answered(["k"]) == {"k": turn("b", 0)}


def test_sessions_are_listed_newest_first_without_siblings_and_children_oldest_first(store: Store) -> None:
    for record in [
        session("old", 1.0),
        session("new", 3.0),
        session("tie-b", 2.0),
        session("tie-a", 2.0),
        session("sib-2", 5.0, kind="sibling", parent="old"),
        session("sib-1", 4.0, kind="sibling", parent="old"),
        session("fork", 4.0, kind="fork", parent="old"),
    ]:
        store.sessions.create_session(record)
    listed = [record.id for record in store.sessions.sessions()]
    assert listed == ["fork", "new", "tie-a", "tie-b", "old"]
    every = [record.id for record in store.sessions.sessions(include_branches=True)]
    assert every == ["sib-2", "fork", "sib-1", "new", "tie-a", "tie-b", "old"]
    assert [record.id for record in store.sessions.children("old")] == ["fork", "sib-1", "sib-2"]
    assert store.sessions.children("new") == []
    assert store.sessions.session("sib-1").parent_id == "old"


def test_deleting_a_session_takes_its_turns_requests_and_checks_and_its_branches_keep_theirs(
    store: Store,
) -> None:
    store.sessions.create_session(session("s"))
    store.sessions.commit_turn(turn("s", 0), request("r0", "s"), key="ks")
    store.sessions.commit_turn(
        turn("b", 0), request("r1", "b"), new_session=session("b", kind="fork", parent="s")
    )
    store.sessions.record(CounterCheckRecord("s", None, "u", "c", 0, 1, 1, 1), CounterSkip("s", "why"))
    store.sessions.delete_session("s")
    with pytest.raises(SessionNotFound):
        store.sessions.session("s")
    assert store.sessions.turns("s") == [] and store.sessions.answered(["ks"]) == {}
    assert store.sessions.counter_checks(["s"]) == [] and store.sessions.counter_skips(["s"]) == []
    assert [r.id for r in store.sessions.requests()] == ["r1"]
    assert store.sessions.session("b").parent_id is None and store.sessions.turns("b") == [turn("b", 0)]
    with pytest.raises(SessionNotFound, match="'gone'"):
        store.sessions.delete_session("gone")


def test_answers_are_found_by_key_past_the_parameter_limit_and_by_prefix(store: Store) -> None:
    store.sessions.create_session(session("s"))
    keys = [f"job:a:{index}:d:n" for index in range(1203)]
    for position, key in enumerate(keys):
        store.sessions.commit_turn(turn("s", position), request(f"r{position}", "s"), key=key)
    store.sessions.create_session(session("t"))
    store.sessions.commit_turn(turn("t", 0), request("t0", "t"), key="job:ab:0:d:n")
    asked = ["job:a:1202:d:n", "missing", "job:a:0:d:n", "job:a:0:d:n", "job:a:500:d:n", "job:a:1000:d:n"]
    found = store.sessions.answered(asked)
    assert found == {
        "job:a:1202:d:n": turn("s", 1202),
        "job:a:0:d:n": turn("s", 0),
        "job:a:500:d:n": turn("s", 500),
        "job:a:1000:d:n": turn("s", 1000),
    }
    assert len(store.sessions.answered(keys)) == 1203
    under = store.sessions.answered_under("job:a:")
    assert len(under) == 1203 and under["job:a:7:d:n"] == turn("s", 7)
    assert store.sessions.answered_under("job:ab:") == {"job:ab:0:d:n": turn("t", 0)}
    assert store.sessions.answered_under("job:b:") == {}


def test_what_a_session_did_besides_its_turns_is_kept_in_order_and_a_repeated_note_once(store: Store) -> None:
    for name in ("s", "t", "u"):
        store.sessions.create_session(session(name))
    first = CounterCheckRecord("s", None, "http://a/v1", "hits", 0, 10, 10, 1)
    other = CounterCheckRecord("t", "b", "http://b/v1", "hits", 5, 9, None, 3, None, None, None, 7)
    later = CounterCheckRecord("s", "b", "http://a/v1", "hits", 10, 30, 15, 2, 5, "w")
    note, note_batch = CounterSkip("s", "a router"), CounterSkip("s", "a router", "b")
    store.sessions.record(later, request("w", "s", purpose="warm"), note, first, note_batch, other)
    store.sessions.record(note, CounterSkip("t", "a router"), CounterSkip("u", "u's"))
    store.sessions.record(note_batch)
    assert store.sessions.counter_checks(["s"]) == [later, first]
    assert store.sessions.counter_checks(["t", "s"]) == [later, first, other]
    assert store.sessions.counter_checks(["u"]) == []
    assert store.sessions.counter_skips(["s"]) == [note, note_batch]
    assert store.sessions.counter_skips(["s", "t"]) == [note, note_batch, CounterSkip("t", "a router")]
    assert [r.id for r in store.sessions.requests(session_ids=["s"])] == ["w"]


def test_requests_are_filtered_by_every_filter_given_and_ordered_by_start_then_id(store: Store) -> None:
    for name in ("s", "t"):
        store.sessions.create_session(session(name))
    made = [
        request("b", "s", 2.0, batch_id="x"),
        request("a", "s", 2.0, batch_id="x", model="other"),
        request("c", "t", 1.0, base_url="http://b/v1"),
        request("d", None, 3.0, batch_id="x", base_url="http://b/v1"),
    ]
    store.sessions.record(*made)
    by_id = {r.id: r for r in made}

    def ids(**filters: object) -> list[str]:
        found = store.sessions.requests(**filters)  # type: ignore[arg-type]
        assert found == [by_id[r.id] for r in found]  # every field, the usage's too, as stored
        return [r.id for r in found]

    assert ids() == ["c", "a", "b", "d"]
    assert ids(session_ids=["s"]) == ["a", "b"]
    assert ids(session_ids=["s", "t"]) == ["c", "a", "b"]
    assert ids(session_ids=[]) == []
    assert ids(batch_id="x") == ["a", "b", "d"]
    assert ids(base_url="http://b/v1") == ["c", "d"]
    assert ids(model="other") == ["a"]
    assert ids(batch_id="x", base_url="http://b/v1") == ["d"]
    assert ids(session_ids=["s"], model="m") == ["b"]
