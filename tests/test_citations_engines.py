"""Cited answers against the real vLLM and SGLang servers: the instruction rides after the cached prefix.

The tiny random-weight model does not cite sensibly, so these hold the plumbing:
a cited sibling reads as much of the cache as a plain one, its request carries
the instruction after the pack, and whatever the model wrote is read and every
citation marked verified or not. The reading itself is tested with crafted
answers in tests/test_citations.py.
"""

from __future__ import annotations

import sysconfig
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from longctx.backends.base import Backend, connect
from longctx.citations import CITE_INSTRUCTION
from longctx.options.groups import RequestOptions
from longctx.packing.rendering import DOCUMENTS_OPENING, render_document, render_listing
from longctx.sessions import Session
from longctx.store import Store, StoredPack
from longctx.testing import LocalServer

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def small_pack() -> StoredPack:
    """Two documents in the pack's own format, about 2,500 tokens, new to the server (a nonce)."""
    nonce = uuid.uuid4().hex
    text = (STDLIB / "textwrap.py").read_text()[:8_000]
    prefix = (
        DOCUMENTS_OPENING
        + render_document("lib/textwrap.py", text)
        + render_document("README.md", f"# fixture {nonce}\n")
        + render_listing([])
        + "Question:\n"
    )
    return StoredPack(
        fingerprint=nonce + nonce,
        format_version="test/1",
        system="You answer questions about the documents.",
        prefix=prefix,
        summary={"title": "cited"},
    )


@pytest.fixture
def backend(engine_server: LocalServer) -> Iterator[Backend]:
    backend = connect(engine_server.api_base)
    yield backend
    backend.close()


def test_a_cited_sibling_reads_the_plain_prefix_and_its_citations_are_checked(
    backend: Backend, tmp_path: Path
) -> None:
    store = Store.open(tmp_path / "home")
    session = Session(backend, small_pack(), store=store, request=RequestOptions(max_tokens=32))
    session.ask_many(["Alpha: what does wrap do?"])  # cold: prefills the pack
    plain = session.ask_many(["Beta: what does fill do?"])[0]
    cited = session.ask_many(["Gamma: what does dedent do?"], cite=True)[0]
    assert plain.usage.cached_tokens is not None and plain.usage.cached_tokens > 0
    assert cited.usage.cached_tokens == plain.usage.cached_tokens  # the instruction is after the prefix
    assert cited.usage.prompt_tokens is not None and plain.usage.prompt_tokens is not None
    assert cited.usage.prompt_tokens > plain.usage.prompt_tokens  # it carried the instruction
    (turn,) = store.sessions.turns(cited.session_id)
    assert turn.instruction == CITE_INSTRUCTION and plain.citations is None
    assert cited.citations is not None  # read, whatever the random weights wrote
    assert all(c.verified or c.reason for c in cited.citations)


def test_a_cited_turn_is_read_and_the_next_turn_reads_it_from_the_cache(
    backend: Backend, tmp_path: Path
) -> None:
    store = Store.open(tmp_path / "home")
    session = Session(backend, small_pack(), store=store, request=RequestOptions(max_tokens=16))
    first = session.ask("Where is the text wrapped?", cite=True)
    assert first.citations is not None and all(c.verified or c.reason for c in first.citations)
    second = session.ask("And filled?")
    block = backend.info.cache_block_tokens or 1
    assert first.usage.prompt_tokens is not None and second.usage.cached_tokens is not None
    reachable = first.usage.prompt_tokens - first.usage.prompt_tokens % block
    assert second.usage.cached_tokens >= 0.99 * reachable, (second.usage, first.usage)
