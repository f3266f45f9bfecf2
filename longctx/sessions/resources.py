"""What a session uses and may own: the connection to the server and the store.

A session given a backend or a store uses it and leaves it open for its
owner; one given neither connects (to :class:`~longctx.options.groups.ServerOptions`)
and opens the default store on first use, owns what it opened, and closes
it in :meth:`Resources.close`. Forks and branches borrow their parent's.
Once closed (or once what they borrow was closed by its owner), every use
raises :class:`~longctx.errors.SessionClosed`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from longctx.backends.base import Backend, connect
from longctx.backends.prefill_wait import PrefillRate
from longctx.errors import SessionClosed
from longctx.options.groups import ServerOptions
from longctx.report import cold_prefill_rate
from longctx.store import Store

__all__ = ["Progress", "Resources"]

Progress = Callable[[str], None]


def _expect_earlier_rates(backend: Backend, store: Store) -> None:
    """Hand each server the cold prefill rate the store measured there: how long a cold prefill waits."""
    for server in backend.servers:
        rate = cold_prefill_rate(store.sessions.requests(base_url=server.api_url, model=server.model))
        if rate is not None:
            backend.expect_prefill_rate(server.api_url, PrefillRate(rate, "measured earlier on this server"))


class Resources:
    """A backend and a store, made on first use unless given; closes only what it made."""

    def __init__(
        self,
        *,
        server: ServerOptions | None = None,
        backend: Backend | None = None,
        store: Store | None = None,
        on_progress: Progress | None = None,
        closed_message: str = "this session is closed: resume it by its id to go on",
    ) -> None:
        self.server = server or ServerOptions()
        self._backend = backend
        self._store = store
        self._made: list[Backend | Store] = []
        self._on_progress = on_progress
        self._closed = False
        self._closed_message = closed_message
        # Whose backend and store these are, when borrowed; and what those closed (see check_open).
        self._lender: Resources | None = None
        self._released: list[Backend | Store] = []
        # Reentrant: preparing a session (reading its pack) takes the backend and the store under it.
        self.lock = threading.RLock()
        self._rates_handed = False

    @classmethod
    @contextmanager
    def for_resume(cls, backend: Backend | None, store: Store | None) -> Iterator[Resources]:
        """Resources to read a stored session: the store given, else the default one, opened now and owned.

        What was opened here is closed again if the block fails (an unknown id, a missing pack).
        """
        resources = cls(backend=backend, store=store if store is not None else Store.open())
        if store is None:
            resources._made.append(resources.store)
        try:
            yield resources
        except BaseException:
            resources.close()
            raise

    def progress(self, message: str) -> None:
        """Tell the caller's ``on_progress`` (if any) what is happening."""
        if self._on_progress is not None:
            self._on_progress(message)

    @property
    def backend(self) -> Backend:
        with self.lock:
            self.check_open()
            if self._backend is None:
                self.progress(f"connecting to {', '.join(self.server.base_urls())}")
                self._backend = connect(self.server)  # which resolves the options once
                self._made.append(self._backend)
            if not self._rates_handed:
                # Given or made: how long a cold prefill may take there, from what the store measured.
                self._rates_handed = True
                _expect_earlier_rates(self._backend, self.store)
            return self._backend

    @property
    def given_backend(self) -> Backend | None:
        """The backend if one was given or already made (nothing is connected to find out)."""
        return self._backend

    @property
    def store(self) -> Store:
        with self.lock:
            self.check_open()
            if self._store is None:
                self._store = Store.open(database_url=self.server.store)
                self._made.append(self._store)
            return self._store

    def borrowed(self) -> Resources:
        """Resources for a fork, branch or shard: the same backend (once made) and store, owning neither."""
        borrower = Resources(server=self.server, backend=self._backend, store=self.store)
        borrower._lender = self
        return borrower

    def check_open(self) -> None:
        """Raise :class:`SessionClosed` once closed, or once a lender closed the backend or store lent."""
        if self._closed:
            raise SessionClosed(self._closed_message)
        lender = self._lender
        while lender is not None:
            if any(made is self._backend or made is self._store for made in lender._released):
                raise SessionClosed(
                    "the session this one was forked from (or is part of) is closed,"
                    " and with it the connection and store they share"
                )
            lender = lender._lender

    async def aclose(self) -> None:
        """:meth:`close` on the running event loop: a backend made here closes its async clients too."""
        with self.lock:
            backends = [made for made in self._made if isinstance(made, Backend)]
        for backend in backends:
            await backend.aclose()
        self.close()

    def close(self) -> None:
        """Close what was made here, newest first; idempotent."""
        with self.lock:
            self._closed = True
            while self._made:
                made = self._made.pop()
                made.close()
                self._released.append(made)
            self._backend = None
            self._store = None
