"""The plan of requests continued in SGLang sessions (longctx.backends.continuation), without a server."""

from __future__ import annotations

from longctx.backends.chat import ChatRequest
from longctx.backends.continuation import Continuations, _shared, generate_chunk, refusal


def _request(ids: list[int], salt: str = "s", **fields: object) -> ChatRequest:
    return ChatRequest(messages=(), prompt_ids=tuple(ids), cache_salt=salt, max_tokens=4, **fields)  # type: ignore[arg-type]


PACK = list(range(5000))


def test_the_shared_prefix_is_found_past_and_within_blocks() -> None:
    assert _shared(PACK, PACK) == 5000
    assert _shared(PACK, [*PACK[:3001], -1, *PACK[3002:]]) == 3001
    assert _shared(PACK, [*PACK, 7]) == 5000
    assert _shared([1], [2]) == 0


def test_a_lead_opens_a_session_then_later_requests_send_only_their_own_ids() -> None:
    continuations = Continuations()
    lead = continuations.plan(_request([*PACK, 1, 2]))
    assert lead is not None and lead.opens and lead.continues is None
    assert lead.body["input_ids"] == [*PACK, 1, 2] and lead.body["session_params"] == {"id": lead.session_id}
    # While the lead runs, a sibling goes whole (None: /v1/completions as before).
    assert continuations.plan(_request([*PACK, 3])) is None
    continuations.finished(lead)
    sibling = continuations.plan(_request([*PACK, 3, 4]))
    assert sibling is not None and sibling.continues == lead.rid and sibling.offset == 5000
    assert sibling.body["input_ids"] == [3, 4]
    assert sibling.body["session_params"] == {
        "id": lead.session_id, "rid": lead.rid, "offset": 5000, "drop_previous_output": True,
    }  # fmt: skip
    # Another salt has its own lead; a request sharing too little goes whole.
    assert continuations.plan(_request(PACK, salt="t")).opens  # type: ignore[union-attr]
    assert continuations.plan(_request([9, *PACK])) is None


def test_what_generate_is_not_asked_for_goes_whole() -> None:
    continuations = Continuations()
    assert continuations.plan(ChatRequest(messages=({"role": "user", "content": "x"},))) is None
    assert continuations.plan(_request(PACK, logprobs=2)) is None
    assert continuations.plan(_request(PACK, token_ids=True)) is None
    assert continuations.plan(_request(PACK, extra_body={"top_k": 3})) is None


def test_a_lead_is_retired_after_its_children_and_a_refused_one_forgotten() -> None:
    continuations = Continuations(max_children=2)
    lead = continuations.plan(_request(PACK))
    assert lead is not None
    continuations.finished(lead)
    children = [continuations.plan(_request([*PACK, n])) for n in range(2)]
    assert all(child is not None and child.continues for child in children)
    renewed = continuations.plan(_request([*PACK, 9]))
    assert renewed is not None and renewed.opens and renewed.session_id != lead.session_id
    assert continuations.to_close() == [lead.session_id]
    continuations.failed(renewed)
    assert continuations.close_all() == [renewed.session_id]


def test_generate_events_become_completions_chunks() -> None:
    first, seen = generate_chunk({"text": "He", "meta_info": {"finish_reason": None}}, "")
    assert first == {"choices": [{"index": 0, "text": "He"}]} and seen == "He"
    meta = {
        "finish_reason": {"type": "length"},
        "prompt_tokens": 9,
        "completion_tokens": 2,
        "cached_tokens": 8,
    }
    last, _ = generate_chunk({"text": "Hello", "meta_info": meta}, seen)
    assert last["choices"][0] == {"index": 0, "text": "llo", "finish_reason": "length"}
    assert last["usage"] == {
        "prompt_tokens": 9,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 8},
    }
    aborted = {"meta_info": {"finish_reason": {"type": "abort", "message": "session id x does not exist"}}}
    assert refusal(aborted) == "session id x does not exist" and refusal({"text": ""}) is None
