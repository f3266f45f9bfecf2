"""Sessions over packs with images: counted by the server, and resumed with the same images.

A fake server (tests/fake_engine.py) prices a prompt by its characters, data
URLs included, so the server's count of an image differs from the offline
estimate: a pack counted by the server carries the server's count. The store
keeps a pack's image bytes (one copy per sha256): a resumed session sends
the images the first one sent, and a store that lost or damaged them is
refused with a clear error rather than sending placeholders as text.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_engine import FakeEngine

from longctx.backends.base import Backend
from longctx.backends.images import count_image_tokens
from longctx.cli import main
from longctx.errors import StoreError
from longctx.options.groups import CorpusOptions
from longctx.sessions import DocSession, Session
from longctx.store import Store
from longctx.store.db import DATABASE_NAME
from longctx.testing.pdfs import scanned_pdf
from longctx.tokens.images import ESTIMATED, SERVER_COUNTED


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    root.mkdir()
    (root / "scan.pdf").write_bytes(scanned_pdf(["Invoice 4711\nTotal: 4,210 euros"]))
    (root / "notes.txt").write_text("plain notes\n")
    return root


@pytest.fixture
def fake() -> FakeEngine:
    """A server without a tokenize route, with a window that holds a data URL priced by its characters."""
    return FakeEngine(engine="generic", block=1, context_length=4_000_000)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "home")


def first_user_content(fake: FakeEngine, index: int) -> object:
    return fake.chat_bodies[index]["messages"][1]["content"]


def streamed(fake: FakeEngine) -> list[int]:
    """The indexes of the session's own requests (streamed), not the image counts."""
    return [index for index, body in enumerate(fake.chat_bodies) if body.get("stream")]


def test_a_doc_session_counts_its_images_through_the_server(
    folder: Path, backend: Backend, fake: FakeEngine, store: Store
) -> None:
    with DocSession(folder, backend=backend, store=store, corpus=CorpusOptions(pdf_pages="auto")) as session:
        pack = session.full_pack
        images = [placed.image for placed in pack.images]
        assert len(images) == 1
        server = count_image_tokens(backend, images)
        assert pack.image_tokens == server[0].tokens
        assert pack.image_counter is not None and pack.image_counter.startswith(SERVER_COUNTED)
        assert pack.to_dict()["image_counter"] == pack.image_counter
        assert pack.total_tokens == (pack.prefix_tokens or 0) + server[0].tokens


def test_pack_offline_says_the_images_are_estimated(folder: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        main,
        ["pack", str(folder), "--pdf-pages", "auto", "--json"],
        env={"LONGCTX_HOME": str(tmp_path / "h")},
    )
    assert result.exit_code == 0, result.output
    assert f"1 image: 1,242 tokens, {ESTIMATED}" in result.stderr
    assert '"image_counter": "estimated: Qwen2-VL formula, default processor"' in result.stdout


def test_a_resumed_session_sends_the_same_images(
    folder: Path, backend: Backend, fake: FakeEngine, store: Store
) -> None:
    with DocSession(folder, backend=backend, store=store, corpus=CorpusOptions(pdf_pages="auto")) as session:
        session.ask("What is the total?")
        sent = first_user_content(fake, streamed(fake)[-1])
    assert isinstance(sent, list) and [part["type"] for part in sent].count("image_url") == 1
    # The files go: the store alone holds what the resumed session sends.
    (folder / "scan.pdf").unlink()
    resumed = Session.resume(session.id, backend, store=store)
    resumed.ask("And the invoice number?")
    again = first_user_content(fake, streamed(fake)[-1])
    assert again == sent
    assert resumed.pack is not None and len(resumed.pack.images) == 1


def test_a_store_that_lost_or_damaged_the_image_bytes_is_refused(
    folder: Path, backend: Backend, fake: FakeEngine, store: Store, tmp_path: Path
) -> None:
    with DocSession(folder, backend=backend, store=store, corpus=CorpusOptions(pdf_pages="auto")) as session:
        session.ask("What is the total?")
    database = sqlite3.connect(tmp_path / "home" / DATABASE_NAME)
    with database:
        database.execute("UPDATE image_blobs SET data = x'00'")
    with pytest.raises(StoreError, match="are missing from the store or damaged"):
        Session.resume(session.id, backend, store=store)
    # A listing reads the pack's summary only: it still works.
    fingerprint = store.sessions.session(session.id).pack_fingerprint
    assert fingerprint is not None and store.sessions.pack(fingerprint, images=False) is not None
    with database:
        database.execute("DELETE FROM pack_images")
    with pytest.raises(StoreError, match="holds 1 images but the store keeps 0"):
        Session.resume(session.id, backend, store=store)
    database.close()


def test_pack_with_reuse_says_a_pack_with_images_is_packed_from_the_files(folder: Path, store: Store) -> None:
    from longctx.packing import pack
    from longctx.packing.build import IMAGES_NOT_REUSED

    first = pack(folder, CorpusOptions(pdf_pages="auto"), store=store)
    again = pack(folder, CorpusOptions(pdf_pages="auto"), store=store)
    assert not again.reused and again.reuse_note == IMAGES_NOT_REUSED
    assert IMAGES_NOT_REUSED in again.summary_line() and again.to_dict()["reuse_note"] == IMAGES_NOT_REUSED
    assert again.pack.fingerprint == first.pack.fingerprint and len(again.pack.images) == 1
    assert pack(folder, CorpusOptions(pdf_pages="auto"), store=store, reuse=False).reuse_note is None
    assert pack(folder, store=store).reuse_note is None
