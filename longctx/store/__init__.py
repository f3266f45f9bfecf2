"""The store: sessions, turns, requests, packs, token counts; an embedded SQLite file, or a PostgreSQL server.

By default one database file, ``longctx.db`` under the longctx home folder
(``$LONGCTX_HOME``, else the user data folder). With ``LONGCTX_STORE`` (or
``store`` in ``.longctx.toml``) set to a ``postgresql://`` URL
(:mod:`longctx.options.store_location`) the same parts live on that server
(:mod:`longctx.store.postgres`, its SQL translated in one place,
:mod:`longctx.store.dialect`), shared by every client machine that names
it; the files that are a machine's own (pack snapshot texts) stay in its
home folder. Every write is one
transaction: a turn and the request that produced it are committed
together after the response arrived, so after a crash a session holds every
completed turn and no half turn.

Schema changes are migrations, applied in order and recorded in
``PRAGMA user_version``; a database written by a newer longctx is refused
rather than misread.

:class:`Store` is composed of parts, each with its own small interface,
sharing one connection (:mod:`longctx.store.db`):

- ``store.sessions`` (:class:`~longctx.store.sessions.SessionLog`): sessions,
  turns, requests, counter checks, answer keys, and the packs they were asked over;
  old ones pruned by :mod:`~longctx.store.pruning` (by age, count or size, never one in use);
- ``store.caches`` (:class:`~longctx.store.caches.ContentCaches`): token counts,
  PDF texts, last-commit times, special tokens, pack snapshot rows;
- ``store.blobs`` (:class:`~longctx.store.blobs.SnapshotTexts`): the pack
  snapshot texts, files beside the database, mapped when read;
- ``store.leases`` (:class:`~longctx.store.leases.ItemLeases`): the job items
  runs are asking now, one owner each;
- ``store.database`` (:class:`~longctx.store.db.Database`, or
  :class:`~longctx.store.postgres.PostgresDatabase`): the connection the
  parts share (transactions, migrations).

Every failure of the database (a full disk, a read-only, locked or damaged
file) is one :class:`~longctx.errors.StoreError` naming the file and what to
do (:mod:`longctx.store.failures`).

Only the user may read the store: :mod:`longctx.store.permissions` creates
its folders ``0700`` and its files ``0600``, and warns (one line, with the
``chmod`` that fixes it) about an existing store that is looser.

The values the parts return are in :mod:`longctx.store.records`; :class:`Store`
itself, its lifecycle, in :mod:`longctx.store.lifecycle`. The store
knows no source type: what it keeps for the sources is plain data.
"""

from __future__ import annotations

from longctx.options.groups import default_home
from longctx.store.blobs import SnapshotTexts, StoredText
from longctx.store.caches import ContentCaches
from longctx.store.db import DATABASE_NAME, Database
from longctx.store.leases import ItemLeases, LeaseClaim, LeaseHolder
from longctx.store.lifecycle import Store
from longctx.store.pruning import PrunedTree, PruneResult, PruneRule
from longctx.store.records import (
    CounterCheckRecord,
    CounterSkip,
    Opening,
    RequestRecord,
    SessionRecord,
    StoredImage,
    StoredPack,
    StoredPackIds,
    StoredPackSnapshot,
    TurnRecord,
)
from longctx.store.sessions import SessionLog

__all__ = [
    "DATABASE_NAME",
    "ContentCaches",
    "CounterCheckRecord",
    "CounterSkip",
    "Database",
    "ItemLeases",
    "LeaseClaim",
    "LeaseHolder",
    "Opening",
    "PruneResult",
    "PruneRule",
    "PrunedTree",
    "RequestRecord",
    "SessionLog",
    "SessionRecord",
    "SnapshotTexts",
    "Store",
    "StoredImage",
    "StoredPack",
    "StoredPackIds",
    "StoredPackSnapshot",
    "StoredText",
    "TurnRecord",
    "default_home",
]
