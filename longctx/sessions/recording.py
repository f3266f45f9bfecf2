"""When a session reaches the store: with its first committed turn, never before.

The rule and what it buys (a chat killed before its first answer leaves
nothing) are in docs/api.md ("When a session is stored"). A new session is
written in the transaction that commits its first turn (for a batch's
parent, its first sibling's branch) with its pack and what it did before: a
warm start's request and counter check (or why there was none), which
refer to the session and so wait for it (those of a session that never
asks are lost with it).
Sessions that must be found before they ask (a fork, the parts of a
sharded session) are written at once by :meth:`Recording.store_now`.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from longctx.documents import ImagePart
from longctx.packing.image_parts import PlacedImage
from longctx.store import (
    CounterCheckRecord,
    CounterSkip,
    Opening,
    RequestRecord,
    SessionRecord,
    Store,
    StoredImage,
    StoredPack,
)

if TYPE_CHECKING:
    from longctx.packing import Pack

__all__ = ["Recording", "branch_record", "placed_images", "stored_pack"]


class Recording:
    """Whether one session is in the store yet, and what waits to be written with it.

    Safe between threads: sibling commits and a warm start may race for
    the first write; exactly one of them carries the :class:`Opening`.
    """

    def __init__(self, *, stored: bool = False) -> None:
        self._lock = threading.RLock()
        self._stored = stored
        self._requests: list[RequestRecord] = []
        self._checks: list[CounterCheckRecord] = []
        self._skips: list[CounterSkip] = []

    @property
    def stored(self) -> bool:
        """True once the session's row is in the store."""
        return self._stored

    @property
    def pending_requests(self) -> tuple[RequestRecord, ...]:
        """Requests made but not stored yet (the session is not): a report still counts them."""
        with self._lock:
            return tuple(self._requests)

    @property
    def pending_checks(self) -> tuple[CounterCheckRecord, ...]:
        """Counter checks kept with :attr:`pending_requests`."""
        with self._lock:
            return tuple(self._checks)

    @property
    def pending_skips(self) -> tuple[CounterSkip, ...]:
        """Why calls kept with :attr:`pending_requests` got no counter check."""
        with self._lock:
            return tuple(self._skips)

    def keep(
        self,
        store: Store,
        requests: Iterable[RequestRecord] = (),
        checks: Iterable[CounterCheckRecord] = (),
        skips: Iterable[CounterSkip] = (),
    ) -> None:
        """Store records of requests that answered no turn now, or with the session once it is stored."""
        with self._lock:
            if not self._stored:
                self._requests.extend(requests)
                self._checks.extend(checks)
                self._skips.extend(skips)
                return
            store.sessions.record(*requests, *checks, *skips)

    @contextmanager
    def first_write(self, pack: StoredPack | None, record: SessionRecord) -> Iterator[Opening | None]:
        """The :class:`Opening` the write in this block must carry, or None when the session is stored.

        The block is the transaction that commits a turn; the session counts
        as stored only if it ends without an exception.
        """
        with self._lock:
            if self._stored:
                yield None
                return
            yield Opening(pack, record, tuple(self._requests), tuple(self._checks), tuple(self._skips))
            self._stored = True
            self._requests.clear()
            self._checks.clear()
            self._skips.clear()

    def store_now(self, store: Store, pack: StoredPack | None, record: SessionRecord) -> None:
        """Write the session before any turn (a fork's parent, a sharded session's parts); idempotent."""
        with self.first_write(pack, record) as opening:
            if opening is not None:
                store.sessions.record_opening(opening)


def branch_record(parent: SessionRecord, kind: str, title: str, parent_turns: int) -> SessionRecord:
    """A new record branched from ``parent`` after its first ``parent_turns`` turns (a fork, a sibling)."""
    return SessionRecord(
        id=uuid.uuid4().hex[:16],
        created_at=time.time(),
        kind=kind,
        title=title,
        pack_fingerprint=parent.pack_fingerprint,
        parent_id=parent.id,
        parent_turns=parent_turns,
        settings=parent.settings,
    )


def stored_pack(pack: Pack | StoredPack) -> StoredPack:
    """``pack`` as a session keeps it: its bytes and its facts (a stored pack as it is)."""
    if isinstance(pack, StoredPack):
        return pack
    return StoredPack(
        fingerprint=pack.fingerprint,
        format_version=pack.format_version,
        system=pack.system,
        prefix=pack.prefix,
        summary=pack.to_dict(),
        images=pack.images,
    )


def placed_images(pack: StoredPack) -> StoredPack:
    """``pack`` as read back from the store, its images placed again (``PlacedImage``) for the requests."""
    if not pack.images:
        return pack
    placed = tuple(
        PlacedImage(
            image.offset,
            image.length,
            ImagePart(
                image.media_type,
                image.data,
                image.sha256,
                image.width,
                image.height,
                image.source,
                image.reason,
            ),
        )
        if isinstance(image, StoredImage)
        else image
        for image in pack.images
    )
    return replace(pack, images=placed)
