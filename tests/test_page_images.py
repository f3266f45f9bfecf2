"""Pages as images: the text-layer rule, the renderer's stable bytes, image documents in corpus and pack."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import zlib
from pathlib import Path

import PIL.Image
import pytest
from corpus_fixtures import make_pdf

from longctx.errors import BudgetError
from longctx.options.groups import CorpusOptions
from longctx.packing import build_pack
from longctx.packing.budget import build_shards
from longctx.packing.model import Budget
from longctx.packing.rendering import (
    FORMAT_VERSION,
    IMAGES_FORMAT_VERSION,
    IMAGES_SYSTEM_HEADER,
    SYSTEM_HEADER,
)
from longctx.sources.corpus import load_corpus
from longctx.sources.page_images import render_pages
from longctx.sources.pdf import PdfText, extract_pdf
from longctx.sources.png import encode_gray_png, image_data, image_size
from longctx.sources.text_layer import judge_page
from longctx.testing.pdfs import scanned_pdf
from longctx.tokens.images import PatchImageCounter, estimate_image_counter
from longctx.tokens.tokenizers import EstimateTokenizer

LETTER = (612.0, 792.0)
BODY = "The invoice total is 4,210 euros, due on the first of March.\n" * 30
# Page 1 of make_pdf([BODY]) rendered by pypdfium2 5.13.0 (PDFium 153.0.7999.0) at the default side:
# its PNG's sha256, the same on any machine with that wheel.
GOLDEN_PAGE_SHA256 = "eeecff5ae88925b97d662d5fe53c08ee9abb3d3656ed2ef2a8f05039d00180b8"


# -- the rule -----------------------------------------------------------------


def test_a_page_of_body_text_is_usable() -> None:
    assert judge_page(BODY, *LETTER).usable


def test_no_visible_character_is_no_text_layer() -> None:
    assert judge_page(" \n\t\u00a0", *LETTER).reason == "no text layer"
    assert judge_page("\ufffd\ufffd", *LETTER).reason == "no text layer"


def test_a_caption_alone_on_a_page_is_too_little_text() -> None:
    # 0.5 characters per square inch: 47 on a Letter page (93.5 square inches).
    assert judge_page("x" * 46, *LETTER).reason == "too little text (46 characters)"
    assert judge_page("x" * 47, *LETTER).usable
    assert judge_page("x" * 47, 612.0 * 2, 792.0).reason == "too little text (47 characters)"


def test_mostly_unmapped_glyphs_are_not_usable() -> None:
    text = "a" * 70 + "\ufffd" * 30
    assert judge_page(text, *LETTER).reason == "mostly unmapped glyphs (30 of 100 characters)"
    assert judge_page("a" * 71 + "\ufffd" * 29, *LETTER).usable


def test_the_rule_on_real_pdfs() -> None:
    text_and_caption = extract_pdf(make_pdf([BODY, None, "Figure 3"]))
    assert isinstance(text_and_caption, PdfText)
    assert [(page.number, page.reason) for page in text_and_caption.unusable_pages] == [
        (2, "no text layer"),
        (3, "too little text (7 characters)"),
    ]
    scanned = extract_pdf(scanned_pdf(["Invoice 4711\nTotal: 4,210 euros"]))
    assert isinstance(scanned, PdfText)
    assert [(page.number, page.reason) for page in scanned.unusable_pages] == [(1, "no text layer")]
    garbled = extract_pdf(make_pdf(["\x00\x01\x02 ab \x03\x04\x05" * 40]))
    assert isinstance(garbled, PdfText)
    assert garbled.unusable_pages[0].reason.startswith("mostly unmapped glyphs")


# -- the PNG and the renderer ---------------------------------------------------


def test_the_png_holds_the_pixels_in_stored_blocks() -> None:
    width, height = 300, 260  # 78,260 bytes of rows: two stored blocks
    pixels = bytes((x * 7 + y * 3) % 256 for y in range(height) for x in range(width))
    png = encode_gray_png(width, height, pixels)
    stream = image_data(png)
    rows = zlib.decompress(stream)
    assert rows == b"".join(b"\x00" + pixels[y * width : (y + 1) * width] for y in range(height))
    assert stream[2] == 0  # BTYPE 00 (stored), not final: no compressor chose anything
    assert image_size(png) is not None and image_size(png) == image_size(
        encode_gray_png(width, height, pixels)
    )
    assert encode_gray_png(width, height, pixels) == png


def test_a_png_decoder_reads_it() -> None:
    pixels = bytes(range(256)) * 4
    decoded = PIL.Image.open(io.BytesIO(encode_gray_png(64, 16, pixels)))
    assert decoded.mode == "L" and decoded.size == (64, 16) and decoded.tobytes() == pixels


def test_wrong_pixel_counts_are_refused() -> None:
    with pytest.raises(ValueError):
        encode_gray_png(3, 3, b"\x00" * 8)


def test_a_real_pdf_page_renders_to_the_pinned_bytes() -> None:
    (page,) = render_pages(make_pdf([BODY]), {1: "asked"})
    assert page.image is not None
    assert (page.image.width, page.image.height) == (866, 1120)
    assert page.image.sha256 == hashlib.sha256(page.image.data).hexdigest() == GOLDEN_PAGE_SHA256
    (again,) = render_pages(make_pdf([BODY]), {1: "asked"})
    assert again.image is not None and again.image.data == page.image.data


def test_the_side_sets_the_longer_side() -> None:
    (page,) = render_pages(make_pdf([BODY]), {1: "asked"}, side=560)
    assert page.image is not None and max(page.image.width, page.image.height) == 560


def test_a_blank_page_is_not_sent_and_a_broken_pdf_is_a_note() -> None:
    (blank,) = render_pages(make_pdf([None]), {1: "no text layer"})
    assert blank.image is None and blank.note == "blank: nothing to send"
    (broken,) = render_pages(b"%PDF-1.4 nothing", {1: "asked"})
    assert broken.image is None and broken.note is not None and broken.note.startswith("not rendered (")


# -- the corpus -------------------------------------------------------------------


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "report.pdf").write_bytes(make_pdf([BODY, None, "Figure 3"]))
    (folder / "scan.pdf").write_bytes(scanned_pdf(["Invoice 4711\nTotal: 4,210 euros"]))
    (folder / "notes.txt").write_text("plain notes\n")
    return folder


def test_text_mode_sends_no_image_and_keeps_the_manifest(tmp_path: Path) -> None:
    corpus = load_corpus(_folder(tmp_path))
    assert [document.kind for document in corpus.documents] == ["text", "pdf", "pdf"]
    entry = corpus.manifest.get("scan.pdf")
    assert entry is not None and entry.notes == ("page 1: no extractable text",)


def test_auto_mode_sends_the_pages_without_a_usable_text_layer_after_their_pdf(tmp_path: Path) -> None:
    corpus = load_corpus(_folder(tmp_path), CorpusOptions(pdf_pages="auto"))
    assert [document.path for document in corpus.documents] == [
        "notes.txt",
        "report.pdf",
        "report.pdf#page=3",
        "scan.pdf",
        "scan.pdf#page=1",
    ]
    report = corpus.manifest.get("report.pdf")
    assert report is not None
    assert "page 2: not sent as an image (blank: nothing to send)" in report.notes
    assert (
        "page 3: sent as an image (no usable text layer: too little text (7 characters); 866x1120)"
        in report.notes
    )
    page = corpus.documents[-1]
    assert page.kind == "image" and page.image is not None
    assert page.image.source == "page 1 of 1" and page.image.reason == "no usable text layer: no text layer"
    assert page.text == f"[image image/png 866x1120 sha256:{page.image.sha256}]\n"


def test_images_mode_sends_every_page_that_is_not_blank(tmp_path: Path) -> None:
    corpus = load_corpus(_folder(tmp_path), CorpusOptions(pdf_pages="images"))
    pages = [document.path for document in corpus.documents if document.kind == "image"]
    assert pages == ["report.pdf#page=1", "report.pdf#page=3", "scan.pdf#page=1"]
    report = corpus.manifest.get("report.pdf")
    assert (
        report is not None
        and "page 1: sent as an image (asked: pdf_pages='images'; 866x1120)" in report.notes
    )


def test_image_files_and_notebook_outputs_go_only_when_asked(tmp_path: Path) -> None:
    folder = tmp_path / "repo"
    folder.mkdir()
    png = encode_gray_png(40, 30, b"\x80" * 1200)
    (folder / "logo.png").write_bytes(png)
    (folder / "fake.png").write_bytes(b"\x00\x01 not an image")
    output = {"output_type": "display_data", "data": {"image/png": base64.b64encode(png).decode()}}
    notebook = {"cells": [{"cell_type": "code", "source": "plot()", "outputs": [output]}], "nbformat": 4}
    (folder / "plot.ipynb").write_text(json.dumps(notebook))
    plain = load_corpus(folder)
    assert [document.path for document in plain.documents] == ["plot.ipynb"]
    corpus = load_corpus(folder, CorpusOptions(image_files=True))
    assert [(document.path, document.kind) for document in corpus.documents] == [
        ("logo.png", "image"),
        ("plot.ipynb", "notebook"),
        ("plot.ipynb#cell=1,output=1", "image"),
    ]
    fake = corpus.manifest.get("fake.png")
    assert fake is not None and fake.status == "skipped" and fake.notes == ("not a readable PNG or JPEG",)
    assert corpus.documents[0].image is not None and corpus.documents[0].image.data == png
    notebook_entry = corpus.manifest.get("plot.ipynb")
    assert notebook_entry is not None and notebook_entry.notes == (
        "cell 1, output 1: sent as an image (40x30)",
    )


# -- the pack -----------------------------------------------------------------------


def test_a_pack_without_images_is_the_text_pack_byte_for_byte(tmp_path: Path) -> None:
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "a.pdf").write_bytes(make_pdf([BODY]))
    text_pack = build_pack(load_corpus(folder))
    auto_pack = build_pack(load_corpus(folder, CorpusOptions(pdf_pages="auto")))
    assert auto_pack.format_version == text_pack.format_version == FORMAT_VERSION
    assert (auto_pack.system, auto_pack.prefix, auto_pack.fingerprint) == (
        text_pack.system,
        text_pack.prefix,
        text_pack.fingerprint,
    )
    assert auto_pack.messages("Why?")[1]["content"] == text_pack.prefix + "Why?"
    assert "images" not in auto_pack.to_dict()


def test_a_pack_with_images_sends_them_as_content_parts_in_place(tmp_path: Path) -> None:
    corpus = load_corpus(_folder(tmp_path), CorpusOptions(pdf_pages="auto"))
    pack = build_pack(corpus)
    assert pack.format_version == IMAGES_FORMAT_VERSION and pack.system == IMAGES_SYSTEM_HEADER
    assert IMAGES_SYSTEM_HEADER.endswith(f"({IMAGES_FORMAT_VERSION})\n") and SYSTEM_HEADER in (
        IMAGES_SYSTEM_HEADER.replace(IMAGES_FORMAT_VERSION, FORMAT_VERSION).replace(
            IMAGES_SYSTEM_HEADER[
                IMAGES_SYSTEM_HEADER.index("Some documents") : IMAGES_SYSTEM_HEADER.index("Answer")
            ],
            "",
        )
    )
    parts = pack.messages("Total?")[1]["content"]
    assert [part["type"] for part in parts] == ["text", "image_url", "text", "image_url", "text"]
    assert parts[0]["text"].endswith("``` report.pdf#page=3\n") and parts[2]["text"].startswith("```\n")
    assert parts[-1]["text"].endswith("Question:\nTotal?")
    images = [document.image for document in corpus.documents if document.image is not None]
    for part, image in zip((parts[1], parts[3]), images, strict=True):
        assert part["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(image.data).decode()
    # The text parts are the prefix without the placeholder lines.
    rebuilt = "".join(part["text"] for part in parts if part["type"] == "text")
    placeholders = "".join(document.text for document in corpus.documents if document.image is not None)
    assert len(rebuilt) == len(pack.prefix + "Total?") - len(placeholders)
    assert [listed["sha256"] for listed in pack.to_dict()["images"]] == [image.sha256 for image in images]


def test_a_document_that_spells_a_placeholder_does_not_move_an_image(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    first = load_corpus(folder, CorpusOptions(pdf_pages="auto"))
    forged = first.documents[-1].text
    (folder / "notes.txt").write_text(f"plain notes\n{forged}")
    pack = build_pack(load_corpus(folder, CorpusOptions(pdf_pages="auto")))
    parts = pack.messages("Q")[1]["content"]
    assert forged in parts[0]["text"]  # the copy in notes.txt stays text
    assert parts[2]["text"].endswith("``` scan.pdf#page=1\n")


def test_the_fingerprint_covers_the_image_digests(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    before = build_pack(load_corpus(folder, CorpusOptions(pdf_pages="auto")))
    (folder / "scan.pdf").write_bytes(scanned_pdf(["Invoice 4712\nTotal: 4,210 euros"]))
    after = build_pack(load_corpus(folder, CorpusOptions(pdf_pages="auto")))
    assert before.fingerprint != after.fingerprint
    changed = [
        old.name
        for old, new in zip(before.sections, after.sections, strict=True)
        if old.fingerprint != new.fingerprint
    ]
    assert changed == ["document:scan.pdf#page=1"]


def test_image_tokens_count_in_the_total_and_the_budget(tmp_path: Path) -> None:
    corpus = load_corpus(_folder(tmp_path), CorpusOptions(pdf_pages="auto"))
    counter = PatchImageCounter()
    pack = build_pack(corpus, tokenizer=EstimateTokenizer(), image_counter=counter)
    assert pack.image_tokens == 2 * 1242  # two Letter pages of 866 x 1120
    assert pack.total_tokens == (pack.prefix_tokens or 0) + 2 * 1242
    assert pack.image_counter == counter.identity
    text_only = (pack.prefix_tokens or 0) + 4096 + 1024
    with pytest.raises(BudgetError):
        build_pack(corpus, budget=Budget(text_only + 1242 + 100))
    assert build_pack(corpus, budget=Budget(text_only + 2 * 1242 + 200)).image_tokens == 2 * 1242
    uncounted = build_pack(corpus)
    assert uncounted.image_tokens is None and uncounted.image_counter is None


def test_shards_count_images_and_carry_them(tmp_path: Path) -> None:
    corpus = load_corpus(_folder(tmp_path), CorpusOptions(pdf_pages="auto"))
    whole = build_pack(corpus, tokenizer=EstimateTokenizer())
    one = build_shards(corpus, budget=Budget((whole.total_tokens or 0) + 4096 + 1024 + 50))
    assert len(one.shards) == 1 and one.shards[0].fingerprint == whole.fingerprint
    assert len(one.shards[0].images) == 2
    split = build_shards(corpus, budget=Budget((whole.total_tokens or 0) - 1000 + 4096 + 1024))
    assert len(split.shards) == 2
    assert sum(len(shard.images) for shard in split.shards) == 2
    assert all((shard.total_tokens or 0) <= split.budget.prompt_budget for shard in split.shards)


# -- counting -----------------------------------------------------------------------


def test_the_qwen2_vl_arithmetic() -> None:
    counter = PatchImageCounter()
    assert counter.resized(866, 1120) == (868, 1120) and counter.tokens_for(866, 1120) == 31 * 40 + 2
    assert counter.tokens_for(10, 10) == 4 + 2  # up to min_pixels: 56 x 56
    small = PatchImageCounter(max_pixels=28 * 28 * 256)
    assert small.resized(2000, 2000) == (448, 448) and small.tokens_for(2000, 2000) == 256 + 2


def test_the_counter_from_a_processor_config(tmp_path: Path) -> None:
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps(
            {"patch_size": 14, "merge_size": 2, "size": {"shortest_edge": 3136, "longest_edge": 200704}}
        )
    )
    counter = PatchImageCounter.from_processor_config(tmp_path)
    assert (counter.max_pixels, counter.estimated) == (200704, False)
    assert not PatchImageCounter.from_processor_config({"max_pixels": 1003520}).estimated
    assert estimate_image_counter().estimated


def test_a_session_sends_the_images_in_its_first_user_message(tmp_path: Path) -> None:
    from fake_engine import FakeEngine

    from longctx.backends.base import connect
    from longctx.options.groups import ServerOptions
    from longctx.sessions import Session
    from longctx.store import Store

    pack = build_pack(load_corpus(_folder(tmp_path), CorpusOptions(pdf_pages="auto")))
    fake = FakeEngine(context_length=4_000_000)  # it counts the data URLs' characters as tokens
    backend = connect(ServerOptions(base_url="http://fake/v1"), transport=fake.transport())
    with Store.open(tmp_path / "store") as store, backend:
        Session(backend, pack, store=store).ask("Total?")
    content = fake.chat_bodies[0]["messages"][1]["content"]
    assert content == pack.user_parts("Total?")


def test_the_pages_to_render_come_back_from_the_store_with_a_kept_text(tmp_path: Path) -> None:
    from longctx.store import Store

    folder = _folder(tmp_path)
    with Store.open(tmp_path / "store") as store:
        first = load_corpus(folder, CorpusOptions(pdf_pages="auto"), store=store)
        again = load_corpus(folder, CorpusOptions(pdf_pages="auto"), store=store)
    assert [document.path for document in again.documents] == [document.path for document in first.documents]
    assert again.manifest == first.manifest
    assert "scan.pdf#page=1" in [document.path for document in again.documents]
