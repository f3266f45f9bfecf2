"""One run's ownership of its job items (longctx.jobs.ownership.ItemOwnership), against a real store.

Another run is played by the store's leases themselves (another holder); an
answer another run stored is a turn under the item's key.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from longctx.errors import StoreError
from longctx.jobs.ownership import Deferred, ItemOwnership, Polled
from longctx.store import LeaseHolder, RequestRecord, SessionRecord, Store, TurnRecord
from longctx.usage import Usage

# Each test on both stores: the SQLite file, and a PostgreSQL server (tests/store_backends.py).
pytestmark = pytest.mark.usefixtures("store_backend")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "home") as opened:
        yield opened


def answer(store: Store, key: str, created_at: float) -> TurnRecord:
    """A turn stored under ``key``, as another run stores an item's answer."""
    session_id = f"s-{key}"
    store.sessions.create_session(SessionRecord(session_id, created_at, "job", "t", None, None, None))
    turn = TurnRecord(session_id, 0, "q?", f"answer of {key}", "a", None, None, created_at)
    usage = Usage(1, 0, None, 1, None, None)
    store.sessions.commit_turn(
        turn,
        RequestRecord(f"r-{key}", session_id, None, "turn", created_at, "u", "vllm", "m", usage, 1),
        key=key,
    )
    return turn


def test_the_latest_answer_since_the_run_began_is_the_items(store: Store) -> None:
    old = answer(store, "item:a", 0.5)
    assert ItemOwnership(store, 60).answer_of("item") == old  # by default every stored answer counts
    newer = answer(store, "item:b", 20.0)
    answer(store, "other-item:c", 30.0)
    assert ItemOwnership(store, 60).answer_of("item") == newer
    assert ItemOwnership(store, 60, answered_since=20.0).answer_of("item") == newer
    assert ItemOwnership(store, 60, answered_since=20.5).answer_of("item") is None
    assert ItemOwnership(store, 60).answer_of("nothing") is None


def test_a_claim_takes_free_items_defers_held_ones_and_leaves_answered_ones(store: Store) -> None:
    other = LeaseHolder.this_process("other")
    store.leases.take(["held"], other, 60)
    answer(store, "answered:n", time.time())
    answer(store, "before:n", 1.0)
    ownership = ItemOwnership(store, 60, answered_since=10.0)
    try:
        claims = ownership.claim({3: "free", 5: "held", 7: "answered", 9: "before"})
        assert {index: claim.state for index, claim in claims.items()} == {
            3: "taken", 5: "held", 7: "answered", 9: "taken",  # 9's answer is older than the run
        }  # fmt: skip
        assert ownership.deferred == {5: Deferred(5, "held", other)}
        assert set(store.leases.holders()) == {"free", "held", "before"}
        assert store.leases.holders()["free"] == ownership.holder
        ownership.release(["free"])  # answered: given back, the others kept
        assert set(store.leases.holders()) == {"held", "before"}
    finally:
        ownership.close()
    assert store.leases.holders() == {"held": other}  # closing gave back this run's leases only


def test_a_run_renews_its_leases_while_it_runs_and_only_then(store: Store) -> None:
    intruder = LeaseHolder.this_process("intruder")
    ownership = ItemOwnership(store, 0.3)
    try:
        ownership.claim({0: "a"})
        ownership.claim({1: "b"})
        time.sleep(0.7)  # past two lease spans: kept only by renewals
        assert store.leases.take(["a", "b"], intruder, 60)[0].state == "held"
        assert store.leases.take(["b"], intruder, 60)[0].state == "held"
    finally:
        ownership.close()
    assert store.leases.take(["a", "b"], intruder, 60)[1].state == "taken"


def test_polling_takes_answers_as_stored_and_items_given_back_and_keeps_waiting_for_the_rest(
    store: Store,
) -> None:
    other = LeaseHolder.this_process("other")
    store.leases.take(["answered", "given-back", "still-held"], other, 60)
    ownership = ItemOwnership(store, 60, answered_since=10.0)
    try:
        ownership.claim({0: "still-held", 1: "answered", 2: "given-back"})
        assert set(ownership.deferred) == {0, 1, 2}
        stored = answer(store, "answered:n", time.time())
        store.leases.release("other", ["answered", "given-back"])
        started = time.monotonic()
        polled = ownership.poll(0.2)
        assert time.monotonic() - started >= 0.2
        assert polled == Polled({1: (stored, other)}, (Deferred(2, "given-back", other),))
        assert set(ownership.deferred) == {0}
        assert store.leases.holders()["given-back"] == ownership.holder
        assert ownership.poll(0) == Polled()  # still held: nothing new, still waited for
        assert set(ownership.deferred) == {0}
        ownership.release(["given-back"])
        assert set(store.leases.holders()) == {"still-held"}
    finally:
        ownership.close()


def test_an_answer_key_without_a_turn_since_the_run_began_is_not_taken_as_answered(store: Store) -> None:
    """Answered before the run began: the claim asks it (taken), it is not polled as answered."""
    other = LeaseHolder.this_process("other")
    store.leases.take(["item"], other, 60)
    ownership = ItemOwnership(store, 60, answered_since=time.time())
    try:
        ownership.claim({0: "item"})
        answer(store, "item:old", 1.0)
        store.leases.release("other")
        polled = ownership.poll(0)
        assert polled.answered == {} and polled.taken_over == (Deferred(0, "item", other),)
    finally:
        ownership.close()


def test_a_store_that_fails_lets_the_leases_lapse_and_renewing_goes_on(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ownership = ItemOwnership(store, 0.3)
    ownership.claim({0: "a"})
    renewals: list[str] = []
    real_renew = store.leases.renew

    def locked(run_id: str, seconds: float) -> int:
        renewals.append(run_id)
        if len(renewals) == 1:
            raise StoreError("the store is locked")
        return real_renew(run_id, seconds)

    monkeypatch.setattr(store.leases, "renew", locked)
    time.sleep(0.45)
    assert len(renewals) >= 2  # the first failed; the thread went on
    monkeypatch.setattr(store.leases, "release", _failing_release)
    ownership.close()  # no error: the leases lapse instead
    assert set(store.leases.holders()) == {"a"}


def _failing_release(run_id: str, keys: object = None) -> None:
    raise StoreError("the disk is gone")


def test_the_renewing_thread_is_named_never_keeps_the_process_alive_and_ends_with_the_run(
    store: Store,
) -> None:
    ownership = ItemOwnership(store, 60)
    ownership.claim({0: "a"})
    renewing = [thread for thread in threading.enumerate() if thread.name == "longctx-job-leases"]
    assert len(renewing) == 1 and renewing[0].daemon
    ownership.close()
    assert not renewing[0].is_alive()
