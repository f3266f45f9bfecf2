"""Requests that continue a stored prompt in an SGLang session, against the real SGLang (CPU, tiny model).

A session's turns and siblings, sent as ids in a server session (the lead
whole, the rest as their own ids after the lead's), are the same prompts as
the id path and the text path sends: the server counts the same prompt
tokens (and those equal its own tokenization of the chat messages), finds
the same cached tokens, and answers the same under greedy decoding. A
continuation whose session the server closed is sent whole, its prompt form
saying why.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from engine_helpers import tokenize_messages
from test_session_engines import text_pack

from longctx.backends.base import Backend, connect
from longctx.backends.chat import ChatRequest
from longctx.options.groups import RequestOptions
from longctx.sessions import Session
from longctx.sessions.prompt_ids import PACK_IDS_PENDING
from longctx.store import Store
from longctx.testing import LocalServer, TinyModel

pytestmark = pytest.mark.sglang


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "home") as store:
        yield store


def _run(
    backend: Backend, store: Store, server: LocalServer, model: TinyModel, *, ids: bool
) -> tuple[list, list]:
    """A session's three turns and two siblings; each request's (prompt, cached) tokens, form and answer."""
    pack = _PACK
    options = RequestOptions(
        max_tokens=6, temperature=0.0, cache_salt=f"path-{uuid.uuid4().hex}", prompt_ids=ids, dispatch="lead"
    )
    session = Session(backend, pack, store=store, request=options)
    answers = [session.ask("Which class is first?")]
    session.settle()  # the pack's ids, made beside that request, are there for every later one
    answers.append(session.ask("And then?"))
    third = session.messages("Which option is last?")
    answers.append(session.ask("Which option is last?"))
    assert answers[-1].usage.prompt_tokens == len(tokenize_messages(server, model, third))
    answers += session.ask_many(["Where is help?", "Where are errors?"]).answers
    rows = store.sessions.requests(session_ids=[session.id, *session.branch_ids()])
    counts = [(a.usage.prompt_tokens, a.usage.cached_tokens, a.text) for a in answers]
    return counts, [row.usage.prompt_form for row in rows]


_PACK = text_pack(8_000)


def test_turns_and_siblings_in_a_session_are_the_id_paths_prompts(
    sglang_server: LocalServer, tiny_model: TinyModel, store: Store
) -> None:
    with connect(sglang_server.api_base) as plain:
        by_ids, forms = _run(plain, store, sglang_server, tiny_model, ids=True)
        assert forms[0] == f"text: {PACK_IDS_PENDING}" and set(forms[1:]) == {"ids"}, forms
        by_text, _ = _run(plain, store, sglang_server, tiny_model, ids=False)
    with connect(sglang_server.api_base) as backend:
        assert backend.continue_in_sessions() == [backend.info.api_url]
        in_session, forms = _run(backend, store, sglang_server, tiny_model, ids=True)
    # The pack's ids are in the store (the id path made them): the first request opens a server session
    # and goes in it whole; every later one continues it with its own ids only.
    assert forms[0] == "ids: session", forms
    assert all(form.startswith("ids: session, ") and form.endswith(" ids kept") for form in forms[1:]), forms
    # The same prompt and cached tokens, request by request, and the same greedy answers.
    assert [row[:2] for row in in_session] == [row[:2] for row in by_ids] == [row[:2] for row in by_text]
    assert [row[2] for row in in_session] == [row[2] for row in by_ids]


def test_a_continuation_whose_session_is_gone_is_sent_whole_with_its_reason(
    sglang_server: LocalServer, store: Store
) -> None:
    with connect(sglang_server.api_base) as backend:
        backend.continue_in_sessions()
        options = RequestOptions(max_tokens=4, temperature=0.0, cache_salt=uuid.uuid4().hex, prompt_ids=True)
        session = Session(backend, text_pack(8_000), store=store, request=options)
        session.ask("Which class is first?")  # text: the pack's ids are made beside it
        session.ask("And then?")  # the lead, in a new server session
        chat = backend._replicas[backend.info.api_url].chat
        assert chat is not None and chat.continuations is not None
        (lead,) = chat.continuations._leads.values()
        # The server closes the session (as a restart would lose it); the client still names it.
        closed = httpx2.post(f"{sglang_server.base_url}/close_session", json={"session_id": lead.session_id})
        assert closed.status_code == 200, closed.text
        answer = session.ask("Which option is last?")
        rows = store.sessions.requests(session_ids=[session.id])
        assert rows[-1].usage.prompt_form is not None
        assert rows[-1].usage.prompt_form.startswith("ids: session continuation refused: "), rows[-1].usage
        assert answer.usage.prompt_tokens is not None and answer.usage.prompt_tokens > 1024


def test_the_async_path_continues_a_session_too(sglang_server: LocalServer) -> None:
    async def main() -> list[tuple[str | None, int | None, int | None]]:
        backend = connect(sglang_server.api_base)
        try:
            backend.continue_in_sessions()
            pack = list(backend.tokenizer().encode(text_pack(8_000).prefix))
            salt = uuid.uuid4().hex
            found = []
            for tail in ([11, 12, 13], [14, 15], [16]):
                request = ChatRequest(
                    messages=(), prompt_ids=tuple(pack + tail), max_tokens=3, temperature=0.0, cache_salt=salt
                )
                sent = await backend.acomplete(request)
                usage = sent.completion.usage
                found.append((usage.prompt_form, usage.prompt_tokens, usage.cached_tokens))
            return found
        finally:
            await backend.aclose()

    rows = asyncio.run(main())
    assert rows[0][0] == "ids: session"
    assert [form for form, _, _ in rows[1:]] == [f"ids: session, {rows[0][1] - 3} ids kept"] * 2
    assert [prompt for _, prompt, _ in rows] == [rows[0][1], rows[0][1] - 1, rows[0][1] - 2]
    assert all(cached is not None and cached >= rows[0][1] - 4 for _, _, cached in rows[1:]), rows
