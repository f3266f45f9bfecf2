"""Prompts as token ids against the real vLLM and SGLang servers.

The ids longctx sends equal the server's own tokenization of the same chat
messages (``/tokenize`` with the messages and the generation prompt),
the pack's boundary included, for a first turn, a sibling and a third turn
with history; and the ids path caches exactly what the text path caches.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_helpers import tokenize_messages
from test_session_engines import text_pack

from longctx.backends.base import Backend, connect
from longctx.backends.chat import ChatRequest
from longctx.options.groups import RequestOptions
from longctx.sessions import Session
from longctx.sessions.prompt_ids import PACK_IDS_PENDING, PromptIds
from longctx.store import Store, StoredPack, TurnRecord
from longctx.testing import LocalServer, TinyModel


@pytest.fixture
def backend(engine_server: LocalServer) -> Iterator[Backend]:
    backend = connect(engine_server.api_base)
    yield backend
    backend.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "home") as store:
        yield store


def _messages(pack: StoredPack, turns: list[tuple[str, str]], question: str) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": pack.system}]
    users = [turn[0] for turn in turns] + [question]
    users[0] = pack.prefix + users[0]
    for user, (_, answer) in zip(users, turns, strict=False):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    return [*messages, {"role": "user", "content": users[-1]}]


def _sent_ids(
    backend: Backend, store: Store, pack: StoredPack, turns: list[tuple[str, str]], question: str
) -> list[int]:
    """The ids longctx sends for ``question`` after ``turns`` (the path a session's requests take)."""
    tokenizer = backend.tokenizer()
    records = [TurnRecord("s", i, q, a, a, None, None, 0.0) for i, (q, a) in enumerate(turns)]
    messages = _messages(pack, turns, question)
    prompts = PromptIds(lambda: store, lambda: tokenizer)
    # The pack's ids are made on first need (beside a request that goes as text); then they are used.
    prompts.ids(tokenizer, pack)
    prompts.wait()
    request = prompts.request(
        ChatRequest(messages=tuple(messages)), records, server=backend.info, routed=False, pack=pack,
        options=RequestOptions(), first_messages=lambda: _messages(pack, [], turns[0][0]),
    )  # fmt: skip
    assert request.prompt_ids is not None, request.text_reason
    return list(request.prompt_ids)


def test_the_ids_sent_are_the_servers_own_tokens_of_the_messages(
    backend: Backend, store: Store, engine_server: LocalServer, tiny_model: TinyModel
) -> None:
    pack = text_pack(8_000)
    turns = [("What does the parser do?", "It parses arguments."), ("And the help?", "It formats it.")]
    for history, question in (([], "Which class is first?"), (turns, "Which option is last?")):
        expected = tokenize_messages(engine_server, tiny_model, _messages(pack, history, question))
        assert _sent_ids(backend, store, pack, history, question) == expected


def test_sessions_send_ids_and_cache_what_the_text_path_caches(
    backend: Backend, store: Store, engine_server: LocalServer, tiny_model: TinyModel
) -> None:
    pack = text_pack(8_000)
    seen: dict[bool, list[int | None]] = {}
    for ids in (False, True):
        # Each path under its own salt: both start cold on the same pack.
        options = RequestOptions(
            max_tokens=3, temperature=0.0, cache_salt=f"ids-{ids}", prompt_ids=ids, dispatch="lead"
        )
        session = Session(backend, pack, store=store, request=options)
        answers = [session.ask("Which class is first?")]
        session.settle()  # the pack's ids, made beside that request, are there for every later one
        answers.append(session.ask("And then?"))
        third = session.messages("Which option is last?")
        answers.append(session.ask("Which option is last?"))
        # The third turn's prompt, as the server counted what it was sent, is its tokens of the messages.
        assert answers[-1].usage.prompt_tokens == len(tokenize_messages(engine_server, tiny_model, third))
        answers += session.ask_many(["Where is help?", "Where are errors?"]).answers
        rows = store.sessions.requests(session_ids=[session.id, *session.branch_ids()])
        forms = [row.usage.prompt_form for row in rows]
        if ids:
            # The first request went as text while the pack's ids were made beside it; the rest as ids.
            assert forms[0] == f"text: {PACK_IDS_PENDING}" and set(forms[1:]) == {"ids"}, forms
        else:
            assert set(forms) == {None}
        seen[ids] = [value for a in answers for value in (a.usage.prompt_tokens, a.usage.cached_tokens)]
    assert seen[True] == seen[False]
