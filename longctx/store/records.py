"""The records the store keeps and returns: frozen values, no behaviour.

``RequestRecord``'s fields, with its :class:`~longctx.usage.Usage`'s
fields in place of ``usage``, are the ``requests`` table's columns, one for
one (``store.sessions.requests``, :meth:`longctx.store.SessionLog.requests`,
builds it from a row by name). The other records read back the same way
(:func:`record_from_row`): a field is the column of its name, but for the
few stored in another form (JSON).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from longctx.recordtypes import record_type
from longctx.store.blobs import StoredText
from longctx.usage import Usage

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "CounterCheckRecord",
    "CounterSkip",
    "Opening",
    "RequestRecord",
    "SessionRecord",
    "StoredImage",
    "StoredPack",
    "StoredPackIds",
    "StoredPackSnapshot",
    "TurnRecord",
    "record_from_row",
]

RecordT = TypeVar("RecordT", bound="DataclassInstance")


class _Row(Protocol):
    """A row's columns by name: a ``sqlite3.Row`` or a mapping."""

    def __getitem__(self, key: str, /) -> Any: ...


def record_from_row(cls: type[RecordT], row: _Row, **decoded: Any) -> RecordT:
    """The ``cls`` record a table row holds: each field the column of its name, but those in ``decoded``.

    ``decoded`` gives, already decoded, the fields stored in another form
    (a JSON column, a value spread over columns); columns no field names
    are left alone.
    """
    taken = {field.name: row[field.name] for field in dataclasses.fields(cls) if field.name not in decoded}
    return cls(**taken, **decoded)


@record_type
class SessionRecord:
    """A stored session: its settings and where it branched from."""

    id: str
    created_at: float
    kind: str
    title: str
    pack_fingerprint: str | None
    parent_id: str | None
    parent_turns: int | None
    settings: Mapping[str, Any] = field(default_factory=dict)


@record_type
class TurnRecord:
    """One completed question and answer.

    ``history_answer`` is the answer as the chat template will render it in
    later requests (reasoning removed where the template drops it); later
    prompts are built from it so their prefix matches what the server saw.
    ``preamble`` is what the user message carried before ``question``: the
    files of a living session that changed since the model last saw them
    (see :mod:`longctx.sessions.changes`); ``file_changes`` maps each such
    path to its new content hash (None: deleted). ``answer_ids`` is the
    answer as the token ids the model generated, when they were asked for
    (see :mod:`longctx.sessions.token_history`). ``instruction`` is what the
    user message carried after ``question`` (a cited question's
    :data:`~longctx.citations.CITE_INSTRUCTION`); ``citations`` are the
    answer's, checked, when they were asked for (None: not asked for), each
    as :meth:`longctx.citations.Citation.to_dict` writes it (the store keeps plain data).
    ``schema`` is the answer schema the question was asked with, as
    :meth:`longctx.schemas.AnswerSchema.to_dict` writes it (None: asked without one).
    """

    session_id: str
    position: int
    question: str
    answer: str
    history_answer: str
    reasoning: str | None
    request_id: str | None
    created_at: float
    preamble: str = ""
    file_changes: Mapping[str, str | None] = field(default_factory=dict)
    answer_ids: tuple[int, ...] | None = None
    instruction: str = ""
    citations: tuple[Mapping[str, Any], ...] | None = None
    schema: Mapping[str, Any] | None = None


@record_type
class RequestRecord:
    """One request to a server: where it went, what it was for, and its :class:`~longctx.usage.Usage`."""

    id: str
    session_id: str | None
    batch_id: str | None
    purpose: str
    started_at: float
    base_url: str
    engine: str
    model: str
    usage: Usage
    attempts: int

    def to_row(self) -> dict[str, Any]:
        """The ``requests`` row: every field, the usage's spread into its own columns."""
        row = {name: getattr(self, name) for name in _REQUEST_COLUMNS}
        row.update(self.usage.to_dict())
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RequestRecord:
        """The record a ``requests`` row holds."""
        return record_from_row(cls, row, usage=Usage.from_dict(row))


@record_type
class CounterCheckRecord:
    """A server counter read before and after one call's requests (and those that overlapped it)."""

    session_id: str
    batch_id: str | None
    base_url: str
    counter: str
    before: int
    after: int
    reported: int | None
    requests: int
    #: Cached tokens reported by the other calls of this process in the same
    #: window (longctx.verification.counters); None when one of them reported none.
    others_reported: int | None = 0
    #: The window shared with those calls; None: the call had it alone.
    window_id: str | None = None
    #: Of the window's cached tokens, those the server loaded from host memory
    #: and from storage (longctx.backends.tiers); None: it does not count them.
    host_tokens: int | None = None
    external_tokens: int | None = None
    #: Bytes the server moved host -> GPU in the window (its offloading counters).
    loaded_bytes: int | None = None
    #: How the tiers were counted: by_source, cache_source, transfers (inferred); None: no tier.
    tier_source: str | None = None


@record_type
class CounterSkip:
    """Why one call of a session got no counter check: the note its report gives.

    Kept so a resumed session's report says it too (see
    :func:`longctx.verification.counters.combine_checks`).
    """

    session_id: str
    note: str
    #: The sibling batch whose check it was, as in :class:`CounterCheckRecord`; None: a turn's.
    batch_id: str | None = None


@record_type
class StoredPack:
    """What a session needs of its pack to resume without the original files.

    ``images`` are the pack's images in place (a pack of format
    ``longctx-pack/5``): :class:`longctx.packing.image_parts.PlacedImage` values
    in a session (the store, keeping plain data, does not import them), a
    :class:`StoredImage` each as read back from the store, which keeps their
    bytes (one copy per sha256) so a session resumed from it sends the same
    images (:func:`longctx.sessions.recording.placed_images`).
    """

    fingerprint: str
    format_version: str
    system: str
    prefix: str
    summary: Mapping[str, Any]
    images: tuple[Any, ...] = field(default=(), repr=False, compare=False)


@record_type
class StoredImage:
    """An image of a stored pack: ``length`` characters from ``offset`` of its prefix, and what it is.

    The fields of a :class:`longctx.packing.image_parts.PlacedImage` and its
    :class:`longctx.documents.ImagePart`, flat; ``data`` was checked against
    ``sha256`` when it was read.
    """

    offset: int
    length: int
    media_type: str
    data: bytes = field(repr=False)
    sha256: str
    width: int
    height: int
    source: str
    reason: str


@record_type
class Opening:
    """What a new session writes in its first transaction: its pack, its record, what it did before.

    ``requests``, ``counter_checks`` and ``counter_skips`` are those made
    before the session was stored (a warm start, a batch): they refer to the
    session, so they are written with it (see :mod:`longctx.sessions.recording`).
    """

    pack: StoredPack | None
    session: SessionRecord
    requests: tuple[RequestRecord, ...] = ()
    counter_checks: tuple[CounterCheckRecord, ...] = ()
    counter_skips: tuple[CounterSkip, ...] = ()


@record_type
class StoredPackIds:
    """A pack's prompt as token ids of one server tokenizer (:mod:`longctx.sessions.prompt_ids`).

    ``head``: the ids of the system message and the first user message up
    to where the question starts (the pack ends at a fixed delimiter and a
    blank line); ``after_user``: the chat template's ids after a user
    message's content through the generation prompt.
    """

    head: tuple[int, ...]
    after_user: tuple[int, ...]


@record_type
class StoredPackSnapshot:
    """A stored pack snapshot: its summary (see :mod:`longctx.packing.snapshots`) and its sections' text.

    ``text`` is the UTF-8 of every section in order, open and mapped from
    its file; ``section_sizes`` the byte length of each section;
    ``manifest_json`` the manifest as it was saved, not yet decoded.
    """

    slot: str
    state: str
    fingerprint: str
    summary: Mapping[str, Any]
    text: StoredText
    section_sizes: tuple[int, ...]
    manifest_json: str = field(repr=False)


_REQUEST_COLUMNS: tuple[str, ...] = tuple(
    field.name for field in dataclasses.fields(RequestRecord) if field.name != "usage"
)
