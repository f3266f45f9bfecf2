"""What a job's stored answer is keyed by: everything that changes the answer.

An item's answer is reused by a later run of the same job only when
nothing that shapes it changed: the pack's content (its fingerprint, which
covers the files and the corpus options), the model, the server that
answers (engine and version, and the URLs the job was given), and the
request options that shape an answer (:data:`ANSWER_OPTIONS`), and the
schema the item's answer is typed by, if any. These are an
item's :class:`AnswerFacts`; their digest is part of the key the answer is
stored under::

    job:<job id>:<item index>:<facts digest>:<nonce>

The nonce makes every answer's key new, so an item asked again (its facts
changed, or the run was ``fresh``) never collides with the answer it
replaces; a run reuses the latest stored answer whose digest matches. When
none matches, :func:`decide` says why the item is asked (again), comparing
with the latest answer stored for it: the facts an older answer was made
under are read back from its session's record (pack fingerprint, model,
URLs and request options are kept there).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import field, replace
from typing import Any, Final

from longctx.backends.base import ServerInfo
from longctx.errors import LongctxError
from longctx.options.groups import RequestOptions
from longctx.recordtypes import record_type
from longctx.schemas import AnswerSchema
from longctx.store import Store, TurnRecord

__all__ = [
    "ANSWER_OPTIONS",
    "NEW",
    "AnswerFacts",
    "Decision",
    "StoredAnswer",
    "decide",
    "item_key",
    "item_lease_key",
    "job_prefix",
    "stored_for_job",
]

ANSWER_OPTIONS: Final = ("max_tokens", "temperature", "seed", "extra_body")
"""The request options that shape an answer (the cache salt, the dispatch and concurrency do not)."""

NEW: Final = "new"
"""The reason of an item that has no stored answer at all."""


@record_type
class AnswerFacts:
    """What an item's answer is made of, besides its question; see the module docstring."""

    content: str
    model: str
    server: str
    urls: tuple[str, ...]
    options: Mapping[str, Any] = field(default_factory=dict)
    #: The digest of the schema the answer is typed by (:attr:`AnswerSchema.digest`); None: untyped.
    schema: str | None = None

    @classmethod
    def of(
        cls, fingerprint: str, server: ServerInfo, urls: Sequence[str], request: RequestOptions
    ) -> AnswerFacts:
        """The facts of the pack ``fingerprint`` answered by ``server`` (one of ``urls``) with ``request``."""
        options = request.to_dict()
        return cls(
            content=fingerprint,
            model=server.model,
            server=f"{server.engine} {server.version or '(version unknown)'}",
            urls=tuple(sorted(urls)),
            options={name: options[name] for name in ANSWER_OPTIONS},
        )

    def with_schema(self, schema: AnswerSchema | None) -> AnswerFacts:
        """These facts for an item typed by ``schema`` (None: untyped)."""
        return replace(self, schema=None if schema is None else schema.digest)

    @property
    def digest(self) -> str:
        """16 hex digits over every fact, in a canonical form (an untyped answer's as before schemas)."""
        facts: list[Any] = [self.content, self.model, self.server, list(self.urls), dict(self.options)]
        canonical = json.dumps(facts + ([self.schema] if self.schema is not None else []), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def changes_from(self, stored: Mapping[str, Any]) -> list[str]:
        """What differs from the facts ``stored`` (read back by :func:`_facts_of`), one phrase each."""
        changes = []
        if stored.get("content") != self.content:
            changes.append("the pack's content changed")
        if stored.get("model") != self.model:
            changes.append(f"the model changed ({stored.get('model')} -> {self.model})")
        if tuple(sorted(stored.get("urls") or ())) != self.urls:
            changes.append("the server URLs changed")
        for name in ANSWER_OPTIONS:
            before, now = (stored.get("options") or {}).get(name), self.options.get(name)
            if before != now:
                changes.append(f"{name} changed ({before} -> {now})")
        if stored.get("schema") != self.schema:
            changes.append("the schema changed")
        return changes


def job_prefix(job_id: str) -> str:
    """The start of every answer key of job ``job_id``."""
    return f"job:{job_id}:"


def item_lease_key(job_id: str, index: int, facts: AnswerFacts) -> str:
    """Item ``index`` under ``facts``, whoever asks it: its answer keys without their nonce.

    Two runs asking the same item under the same facts share this key, so
    one lease on it (:mod:`longctx.store.leases`) gives the item one owner.
    """
    return f"{job_prefix(job_id)}{index}:{facts.digest}"


def item_key(job_id: str, index: int, facts: AnswerFacts) -> str:
    """A new key for item ``index``'s answer under ``facts`` (never one an earlier answer has)."""
    return f"{item_lease_key(job_id, index, facts)}:{uuid.uuid4().hex[:8]}"


@record_type
class StoredAnswer:
    """One answer stored for an item: its key, the digest of its facts (None: an older key), its turn."""

    key: str
    digest: str | None
    turn: TurnRecord


def stored_for_job(store: Store, job_id: str) -> dict[int, list[StoredAnswer]]:
    """Every answer stored for job ``job_id``, by item index, oldest first (one store query)."""
    prefix = job_prefix(job_id)
    found: dict[int, list[StoredAnswer]] = {}
    for key, turn in store.sessions.answered_under(prefix).items():
        parts = key[len(prefix) :].split(":")
        if not parts[0].isdigit():
            continue  # another job whose id starts with this one's and a colon
        # A key of an earlier longctx is ``job:ID:INDEX``: no facts, never reused.
        digest = parts[1] if len(parts) >= 3 else None
        found.setdefault(int(parts[0]), []).append(StoredAnswer(key, digest, turn))
    for answers in found.values():
        answers.sort(key=lambda answer: answer.turn.created_at)
    return found


@record_type
class Decision:
    """For one item: the stored answer to reuse, or why it is asked (``reason``)."""

    reuse: StoredAnswer | None
    reason: str | None = None


def decide(
    store: Store, facts: AnswerFacts, stored: Sequence[StoredAnswer], *, fresh: bool, question: str
) -> Decision:
    """Reuse the latest answer stored under ``facts`` for ``question``; otherwise say why the item is asked.

    ``fresh`` asks it whatever is stored. The reason of an item with an
    older answer names what changed since (or ``the server changed`` when
    only the engine or its version can have: those are not kept in the
    session's record). An answer stored at the item's index for another
    question is another item's (a job file edited, or a file of the failed
    items run under the same ``--job-id``): never reused, never compared.
    """
    stored = [answer for answer in stored if answer.turn.question == question]
    if not stored:
        return Decision(None, NEW)
    if fresh:
        return Decision(None, "asked fresh (--fresh)")
    matching = [answer for answer in stored if answer.digest == facts.digest]
    if matching:
        return Decision(matching[-1])
    latest = stored[-1]
    if latest.digest is None:
        return Decision(None, "stored by an earlier longctx without the answer's facts")
    before = _facts_of(store, latest.turn)
    if before is None:
        return Decision(None, "the earlier answer's session is gone")
    changes = facts.changes_from(before)
    return Decision(None, "; ".join(changes) if changes else "the server changed (engine or version)")


def _facts_of(store: Store, turn: TurnRecord) -> dict[str, Any] | None:
    """The facts a stored answer was made under, as far as its session's record keeps them."""
    try:
        record = store.sessions.session(turn.session_id)
    except LongctxError:
        return None
    settings = record.settings
    return {
        "content": record.pack_fingerprint,
        "model": settings.get("model"),
        "urls": settings.get("base_urls") or (),
        "options": {name: settings.get(name) for name in ANSWER_OPTIONS},
        "schema": None if turn.schema is None else AnswerSchema.from_dict(turn.schema).digest,
    }
