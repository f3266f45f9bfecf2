"""A scanned PDF asked about end to end, on the real CPU engines serving the tiny Qwen2-VL.

A one-page PDF with no text layer (:func:`longctx.testing.pdfs.scanned_pdf`),
a :class:`~longctx.sessions.DocSession` with ``pdf_pages="auto"``: the page
goes as an image (the manifest says so, and why), its tokens in the budget
are the server's own count, the request carries the image part and goes as
chat (token ids cannot carry an image, and the usage says so), and a second
question is served from the cache past the image. The page is rendered at
448 pixels on its longer side, so the image costs about 200 tokens and the
tests stay fast on two CPU cores.
"""

from __future__ import annotations

from pathlib import Path

from longctx.backends.base import connect
from longctx.backends.images import count_image_tokens
from longctx.options.groups import CorpusOptions, RequestOptions
from longctx.sessions import DocSession
from longctx.store import Store
from longctx.testing import LocalServer
from longctx.testing.pdfs import write_scanned_pdf
from longctx.tokens.images import SERVER_COUNTED

PAGE_SIDE = 448


def ask_a_scanned_pdf(server: LocalServer, tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    write_scanned_pdf(folder / "invoice.pdf", ["Invoice 4711\nTotal: 4,210 euros\nDue: 1 March"])
    (folder / "terms.txt").write_text(
        "".join(f"Clause {n}: payment is due on day {n % 28 + 1}.\n" for n in range(30))
    )
    options = CorpusOptions(pdf_pages="auto", page_image_side=PAGE_SIDE)
    with (
        Store.open(tmp_path / "home") as store,
        connect(server.api_base) as backend,
        DocSession(
            folder, backend=backend, store=store, corpus=options, request=RequestOptions(max_tokens=2)
        ) as session,
    ):
        pack = session.full_pack
        entry = session.corpus.manifest.get("invoice.pdf")
        assert entry is not None
        assert any(
            note.startswith("page 1: sent as an image (no usable text layer: no text layer")
            for note in entry.notes
        ), entry.notes
        (placed,) = pack.images
        # The budget's image tokens are the server's own count.
        (counted,) = count_image_tokens(backend, [placed.image])
        assert pack.image_tokens == counted.tokens
        assert pack.image_counter is not None and pack.image_counter.startswith(SERVER_COUNTED)
        parts = session.messages("What is the total?")[1]["content"]
        assert [part["type"] for part in parts].count("image_url") == 1
        first = session.ask("What is the total?")
        second = session.ask("When is it due?")
    assert first.usage.prompt_form == "text: the prompt holds images (token ids cannot carry them)"
    assert first.usage.prompt_tokens > counted.tokens
    # The second question's cached prefix covers the header, the image and the text after it.
    assert (second.usage.cached_tokens or 0) > counted.tokens


def test_vllm_answers_a_scanned_pdf_with_its_page_as_an_image(
    vllm_vision_server: LocalServer, tmp_path: Path
) -> None:
    ask_a_scanned_pdf(vllm_vision_server, tmp_path)


def test_sglang_answers_a_scanned_pdf_with_its_page_as_an_image(
    sglang_vision_server: LocalServer, tmp_path: Path
) -> None:
    ask_a_scanned_pdf(sglang_vision_server, tmp_path)
