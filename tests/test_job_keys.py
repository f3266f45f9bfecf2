"""A job item's answer key and the decision to reuse or ask again (longctx.jobs.keys), without a server.

The facts are made by hand; the stored answers are real turns in a store,
under the keys a run writes, with the session records it keeps.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from longctx.backends.base import ServerInfo
from longctx.backends.engines import SGLANG, VLLM
from longctx.jobs.keys import (
    ANSWER_OPTIONS,
    NEW,
    AnswerFacts,
    StoredAnswer,
    decide,
    item_key,
    item_lease_key,
    job_prefix,
    stored_for_job,
)
from longctx.options.groups import RequestOptions
from longctx.schemas import answer_schema
from longctx.store import Opening, RequestRecord, SessionRecord, Store, StoredPack, TurnRecord
from longctx.usage import Usage

OPTIONS = {"max_tokens": 512, "temperature": 0.0, "seed": None, "extra_body": {}}
FACTS = AnswerFacts("fp", "m", "vllm 0.32.0", ("http://a/v1", "http://b/v1"), OPTIONS)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "home") as opened:
        yield opened


def server(version: str | None, profile: object = VLLM) -> ServerInfo:
    return ServerInfo(
        "http://b/v1",
        "http://b",
        profile,
        version,
        "m",
        32768,
        True,
        True,
        True,
        16,  # type: ignore[arg-type]
    )


def test_the_facts_of_a_pack_name_the_server_sorted_urls_and_the_answer_options_only() -> None:
    request = RequestOptions(max_tokens=512, temperature=0.0, cache_salt="tenant", dispatch="lead")
    facts = AnswerFacts.of("fp", server("0.32.0"), ["http://b/v1", "http://a/v1"], request)
    assert facts == FACTS
    assert set(facts.options) == set(ANSWER_OPTIONS) == {"max_tokens", "temperature", "seed", "extra_body"}
    unknown = AnswerFacts.of("fp", server(None, SGLANG), ["http://a/v1"], request)
    assert unknown.server == "sglang (version unknown)" and unknown.urls == ("http://a/v1",)


def test_the_digest_is_16_hex_digits_over_every_fact_in_canonical_form() -> None:
    facts = [FACTS.content, FACTS.model, FACTS.server, list(FACTS.urls), dict(FACTS.options)]
    canonical = json.dumps(facts, sort_keys=True)
    assert FACTS.digest == hashlib.sha256(canonical.encode()).hexdigest()[:16]
    assert re.fullmatch("[0-9a-f]{16}", FACTS.digest)
    reordered = AnswerFacts("fp", "m", "vllm 0.32.0", FACTS.urls, dict(reversed(list(OPTIONS.items()))))
    assert reordered.digest == FACTS.digest
    schema = answer_schema("name, age int")
    typed = FACTS.with_schema(schema)
    assert typed.schema == schema.digest and FACTS.with_schema(None) == FACTS
    assert (
        typed.digest
        == hashlib.sha256(json.dumps([*facts, schema.digest], sort_keys=True).encode()).hexdigest()[:16]
    )
    assert typed.with_schema(None).digest == FACTS.digest


def test_each_changed_fact_is_named_with_before_and_after() -> None:
    stored = {"content": "fp", "model": "m", "urls": ["http://b/v1", "http://a/v1"], "options": dict(OPTIONS)}
    assert FACTS.changes_from(stored) == []
    changed = {
        "content": "old", "model": "small", "urls": ["http://a/v1"],
        "options": {"max_tokens": 99, "temperature": 0.0, "seed": 3, "extra_body": {}}, "schema": "abc",
    }  # fmt: skip
    assert FACTS.changes_from(changed) == [
        "the pack's content changed",
        "the model changed (small -> m)",
        "the server URLs changed",
        "max_tokens changed (99 -> 512)",
        "seed changed (3 -> None)",
        "the schema changed",
    ]
    assert FACTS.changes_from({}) == [
        "the pack's content changed",
        "the model changed (None -> m)",
        "the server URLs changed",
        "max_tokens changed (None -> 512)",
        "temperature changed (None -> 0.0)",
        "extra_body changed (None -> {})",
    ]


def test_an_items_keys_share_its_lease_key_and_differ_by_their_nonce() -> None:
    lease = item_lease_key("job1", 3, FACTS)
    assert job_prefix("job1") == "job:job1:" and lease == f"job:job1:3:{FACTS.digest}"
    first, second = item_key("job1", 3, FACTS), item_key("job1", 3, FACTS)
    assert first != second
    for key in (first, second):
        assert re.fullmatch(re.escape(lease) + ":[0-9a-f]{8}", key), key


def store_answer(store: Store, key: str, question: str, when: float, **settings: object) -> TurnRecord:
    session_id = f"s-{key}"
    fingerprint = str(settings.pop("fingerprint", "fp"))
    record = SessionRecord(session_id, when, "job", "t", fingerprint, None, None, settings)
    store.sessions.record_opening(Opening(StoredPack(fingerprint, "7", "s", "p", {}), record))
    turn = TurnRecord(session_id, 0, question, f"answer at {when}", "a", None, None, when)
    request = RequestRecord(
        f"r-{key}", session_id, None, "turn", when, "u", "vllm", "m", Usage(1, 0, None, 1, None, None), 1
    )
    store.sessions.commit_turn(turn, request, key=key)
    return turn


def test_the_answers_stored_for_a_job_by_item_oldest_first_and_no_other_jobs(store: Store) -> None:
    store_answer(store, "job:j:other:0:d:n", "q", 5.0)  # job "j:other", whose id starts with j and a colon
    late = store_answer(store, "job:j:0:d1:n1", "q0", 30.0)
    early = store_answer(store, "job:j:0:d2:n2", "q0", 10.0)
    legacy = store_answer(store, "job:j:1", "q1", 20.0)
    store_answer(store, "job:j:x:1:d:n", "q", 5.0)
    store_answer(store, "job:jj:0:d:n", "q", 5.0)
    found = stored_for_job(store, "j")
    assert found == {
        0: [StoredAnswer("job:j:0:d2:n2", "d2", early), StoredAnswer("job:j:0:d1:n1", "d1", late)],
        1: [StoredAnswer("job:j:1", None, legacy)],
    }


def test_the_latest_answer_under_the_same_facts_is_reused(store: Store) -> None:
    one = StoredAnswer("k1", FACTS.digest, store_answer(store, "k1", "q", 1.0))
    two = StoredAnswer("k2", FACTS.digest, store_answer(store, "k2", "q", 2.0))
    other = StoredAnswer("k3", "0" * 16, store_answer(store, "k3", "q", 3.0))
    assert decide(store, FACTS, [one, two, other], fresh=False, question="q").reuse == two
    assert decide(store, FACTS, [one, two], fresh=True, question="q").reason == "asked fresh (--fresh)"
    assert decide(store, FACTS, [], fresh=False, question="q").reason == NEW == "new"
    # Another question stored at the item's index is another item's: never reused, never compared.
    assert decide(store, FACTS, [one, two], fresh=False, question="another?").reason == "new"


def test_why_an_item_is_asked_again_compares_with_its_latest_answer(store: Store) -> None:
    kept = {"model": "m", "base_urls": ["http://a/v1", "http://b/v1"], **OPTIONS}
    same = StoredAnswer("k1", "0" * 16, store_answer(store, "k1", "q", 1.0, **kept))
    assert (
        decide(store, FACTS, [same], fresh=False, question="q").reason
        == "the server changed (engine or version)"
    )
    longer = StoredAnswer("k2", "1" * 16, store_answer(store, "k2", "q", 2.0, **{**kept, "max_tokens": 99}))
    decision = decide(store, FACTS, [same, longer], fresh=False, question="q")
    assert decision.reuse is None and decision.reason == "max_tokens changed (99 -> 512)"
    moved = {**kept, "base_urls": None, "model": "small", "fingerprint": "old"}
    both = StoredAnswer("k3", "2" * 16, store_answer(store, "k3", "q", 3.0, **moved))
    assert decide(store, FACTS, [both], fresh=False, question="q").reason == (
        "the pack's content changed; the model changed (small -> m); the server URLs changed"
    )
    legacy = StoredAnswer("k4", None, store_answer(store, "k4", "q", 4.0))
    assert decide(store, FACTS, [same, legacy], fresh=False, question="q").reason == (
        "stored by an earlier longctx without the answer's facts"
    )


def test_an_answer_whose_session_is_gone_or_typed_is_compared_as_far_as_kept(store: Store) -> None:
    kept = {"model": "m", "base_urls": ["http://a/v1", "http://b/v1"], **OPTIONS}
    turn = store_answer(store, "k1", "q", 1.0, **kept)
    store.sessions.delete_session(turn.session_id)
    gone = StoredAnswer("k1", "0" * 16, turn)
    assert (
        decide(store, FACTS, [gone], fresh=False, question="q").reason
        == "the earlier answer's session is gone"
    )
    schema = answer_schema("name, age int")
    session_id = "typed"
    record = SessionRecord(session_id, 2.0, "job", "t", "fp", None, None, kept)
    store.sessions.record_opening(Opening(StoredPack("fp", "7", "s", "p", {}), record))
    typed_turn = TurnRecord(session_id, 0, "q", "{}", "{}", None, None, 2.0, schema=schema.to_dict())
    request = RequestRecord(
        "rt", session_id, None, "turn", 2.0, "u", "vllm", "m", Usage(1, 0, None, 1, None, None), 1
    )
    store.sessions.commit_turn(typed_turn, request, key="k2")
    typed = StoredAnswer("k2", "0" * 16, typed_turn)
    assert decide(store, FACTS, [typed], fresh=False, question="q").reason == "the schema changed"
    assert decide(store, FACTS.with_schema(schema), [typed], fresh=False, question="q").reason == (
        "the server changed (engine or version)"
    )
