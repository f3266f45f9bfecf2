"""What a session's report reads from the store besides its own requests.

- :func:`earlier_cold_rate`: the cold prefill rate of a session whose every
  request hit the cache, measured on the requests to the same server and
  model made before it (never after: a stored report reads the same
  however many sessions came later);
- :func:`sibling_questions`: the question each sibling request answered,
  for the report's table;
- :func:`caching_off_notes`: why nothing was cached, when the server said
  its prefix caching was off (the flag kept with the session's settings).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from longctx.report import cold_prefill_rate
from longctx.store import RequestRecord, Store

__all__ = ["CACHING_OFF_SETTING", "caching_off_notes", "earlier_cold_rate", "sibling_questions"]

CACHING_OFF_SETTING = "prefix_caching_off"
"""The session setting that holds the flag turning prefix caching on, where the server had it off."""


def earlier_cold_rate(store: Store, records: Sequence[RequestRecord]) -> float | None:
    """The cold prefill rate of requests to ``records``' servers and models made before the first of them.

    None when ``records`` measure a rate themselves (a cold request among
    them), are empty, or nothing earlier was cold.
    """
    if not records or cold_prefill_rate(records) is not None:
        return None
    began = min(record.started_at for record in records)
    servers = sorted({(record.base_url, record.model) for record in records})
    earlier = [
        record
        for url, model in servers
        for record in store.sessions.requests(base_url=url, model=model)
        if record.started_at < began
    ]
    return cold_prefill_rate(earlier)


def sibling_questions(
    records: Sequence[RequestRecord], branches: Sequence[str], store: Store
) -> dict[str, str]:
    """The question each sibling request answered (request id to question): its branch's one turn."""
    first: dict[str, str] = {}
    for branch in branches:
        turns = store.sessions.turns(branch)
        if turns:
            first[branch] = turns[0].question
    return {r.id: first[r.session_id] for r in records if r.purpose == "sibling" and r.session_id in first}


def caching_off_notes(settings: Mapping[str, Any], records: Sequence[RequestRecord]) -> list[str]:
    """Why nothing was cached, when nothing was and the session's server said its prefix caching was off."""
    fix = settings.get(CACHING_OFF_SETTING)
    prompt = sum(record.usage.prompt_tokens or 0 for record in records)
    cached = [record.usage.cached_tokens for record in records if record.usage.cached_tokens is not None]
    if fix is None or not prompt or not cached or any(cached):
        return []
    return [
        f"0% cached: the server reported prefix caching OFF when this session began; restart it with {fix}"
    ]
