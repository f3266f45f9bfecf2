"""Counter checks on the real CPU engines while another process asks the same server.

A session's window sees every request the server counts, its own and any
other client's. The other client here is a raw request sent from the
network under the session (another process, as far as the session can
tell) just before each of the session's own: it reads the session's pack
from the cache, so the hit counter grows by more than the session's
responses reported. Before the query counter was compared, the check said
``matches=False`` ("counted N tokens more"); it now makes no check and
says why, while the turn before it, with no other traffic, still matches.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx2

from longctx.backends.base import connect
from longctx.options.groups import RequestOptions
from longctx.sessions import Session, resume
from longctx.store import Store, StoredPack
from longctx.testing import LocalServer

# About 2,500 tokens: enough blocks to be cached on both engines, quick to prefill on a CPU.
BODY = "".join(f"def handler_{n}(request):\n    return request.reply({n})\n\n" for n in range(240))


def small_pack() -> StoredPack:
    """A pack the server has not seen (a nonce in its system prompt), so the first turn is cold."""
    nonce = uuid.uuid4().hex
    return StoredPack(
        fingerprint=nonce + nonce,
        format_version="test/1",
        system=f"Answer questions about the documents. [{nonce}]",
        prefix=f"<documents>\n{BODY}</documents>\n\n",
        summary={"title": "handlers"},
    )


class OtherProcess(httpx2.BaseTransport):
    """The network under the session; while :attr:`active`, another client asks first, past the ledger."""

    def __init__(self, api_base: str, model: str) -> None:
        self.inner = httpx2.HTTPTransport()
        self.api_base, self.model = api_base, model
        self.messages: list[dict[str, str]] = []
        self.active = False
        self.sent = 0

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        if self.active and request.method == "POST" and request.url.path.endswith("/completions"):
            body = {"model": self.model, "messages": self.messages, "max_tokens": 2, "temperature": 0}
            answer = httpx2.post(f"{self.api_base}/chat/completions", json=body, timeout=120)
            answer.raise_for_status()
            self.sent += 1
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def test_another_processs_request_in_the_window_skips_the_check_instead_of_a_mismatch(
    engine_server: LocalServer, tmp_path: Path
) -> None:
    network = OtherProcess(engine_server.api_base, "")
    with (
        connect(engine_server.api_base, transport=network) as backend,
        Store.open(tmp_path / "home") as store,
    ):
        network.model = backend.info.model
        session = Session(backend, small_pack(), store=store, request=RequestOptions(max_tokens=4))
        session.ask("What does handler_3 return?")
        alone = session.report().counter_check
        assert alone is not None and alone.matches is True, alone  # no other traffic: a normal check

        network.messages = session.messages("Another process asks: what does handler_7 return?")
        network.active = True
        session.ask("What does handler_5 return?")
        assert network.sent == 1
        check = session.report().counter_check  # waits for the turn's check to be stored
        (skip,) = store.sessions.counter_skips([session.id])
        url = backend.server_for(None).api_url
        assert skip.note.startswith(f"no counter check on {url}: other clients' requests reached it"), skip
        assert len(store.sessions.counter_checks([session.id])) == 1  # the first turn's only
        assert check is not None and check.matches is True and skip.note in check.note, check
        assert "more than the responses reported" not in check.note
        resumed = resume(session.id, store=store).report().counter_check
        assert resumed is not None and skip.note in resumed.note
