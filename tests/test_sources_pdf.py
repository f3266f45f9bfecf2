"""PDFs: text per page with page markers; encrypted, corrupt and scanned PDFs reported."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from corpus_fixtures import make_pdf

from longctx.sources import pdf as pdf_module
from longctx.sources.corpus import load_corpus
from longctx.sources.pdf import PdfFailure, PdfText, extract_pdf, page_marker
from longctx.store import Store


def test_text_is_extracted_per_page_after_a_marker() -> None:
    result = extract_pdf(make_pdf(["First page text", "Second page\nwith two lines", "Third"]))
    assert isinstance(result, PdfText)
    assert result.page_count == 3
    assert result.text == (
        "--- page 1 of 3 ---\nFirst page text\n"
        "--- page 2 of 3 ---\nSecond page\nwith two lines\n"
        "--- page 3 of 3 ---\nThird\n"
    )
    assert result.notes == ()


def test_a_page_without_text_keeps_its_marker_and_gets_a_note() -> None:
    result = extract_pdf(make_pdf(["Cover", None, "End"]))
    assert isinstance(result, PdfText)
    assert result.text == "--- page 1 of 3 ---\nCover\n--- page 2 of 3 ---\n--- page 3 of 3 ---\nEnd\n"
    assert result.notes == ("page 2: no extractable text",)


def test_page_marker_format() -> None:
    assert page_marker(3, 12) == "--- page 3 of 12 ---"


def test_an_encrypted_pdf_that_the_empty_password_opens_is_read() -> None:
    data = make_pdf(["Permissions only"], user_password="", owner_password="owner-secret")
    result = extract_pdf(data)
    assert isinstance(result, PdfText)
    assert "Permissions only" in result.text
    assert result.notes == ("encrypted; opened with the empty password",)


def test_an_encrypted_pdf_with_a_password_is_skipped() -> None:
    result = extract_pdf(make_pdf(["Hidden"], user_password="open-sesame"))
    assert result == PdfFailure("encrypted", "the empty password does not open it")


@pytest.mark.parametrize("keep", [0.5, 0.1])
def test_a_truncated_pdf_is_corrupt_with_pypdfs_message(keep: float) -> None:
    data = make_pdf(["Some text", "More text"])
    result = extract_pdf(data[: int(len(data) * keep)])
    assert isinstance(result, PdfFailure)
    assert result.reason == "corrupt"
    assert result.message.startswith(("PdfStreamError:", "PdfReadError:"))


def test_not_a_pdf_is_corrupt() -> None:
    result = extract_pdf(b"this is plain text, not a PDF\n")
    assert isinstance(result, PdfFailure)
    assert result.reason == "corrupt"


def test_pdfs_in_a_corpus(tmp_path: Path) -> None:
    (tmp_path / "paper.pdf").write_bytes(make_pdf(["Abstract", None]))
    (tmp_path / "locked.pdf").write_bytes(make_pdf(["Hidden"], user_password="pw"))
    (tmp_path / "truncated.pdf").write_bytes(make_pdf(["Cut"])[:200])
    (tmp_path / "renamed.bin").write_bytes(make_pdf(["Found by its header"]))
    (tmp_path / "text.pdf").write_text("not a pdf at all\n")
    corpus = load_corpus([tmp_path])

    by_path = {document.path: document for document in corpus.documents}
    assert set(by_path) == {"paper.pdf", "renamed.bin"}
    assert by_path["paper.pdf"].kind == "pdf"
    assert by_path["paper.pdf"].text == "--- page 1 of 2 ---\nAbstract\n--- page 2 of 2 ---\n"
    assert by_path["renamed.bin"].text == "--- page 1 of 1 ---\nFound by its header\n"

    manifest = corpus.manifest
    paper = manifest.get("paper.pdf")
    assert paper is not None and paper.notes == ("page 2: no extractable text",)
    locked = manifest.get("locked.pdf")
    assert locked is not None and (locked.status, locked.reason) == ("skipped", "encrypted")
    truncated = manifest.get("truncated.pdf")
    assert truncated is not None and (truncated.status, truncated.reason) == ("skipped", "corrupt")
    assert truncated.notes and truncated.notes[0]
    fake = manifest.get("text.pdf")
    assert fake is not None and fake.reason == "corrupt"


def test_a_pdf_passed_directly_is_named_by_its_base_name(tmp_path: Path) -> None:
    pdf = tmp_path / "deep" / "report.pdf"
    pdf.parent.mkdir()
    pdf.write_bytes(make_pdf(["Quarterly"]))
    corpus = load_corpus([pdf])
    assert [document.path for document in corpus.documents] == ["report.pdf"]
    assert corpus.root == "report.pdf"
    assert corpus.ordering == "path"
    assert corpus.head_sha is None
    assert str(tmp_path) not in corpus.manifest.to_json()


def _refuse_to_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    import pypdf

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("pypdf parsed a PDF whose text the store keeps")

    monkeypatch.setattr(pypdf, "PdfReader", refuse)


def test_a_pdf_read_before_is_taken_from_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "papers"
    folder.mkdir()
    (folder / "report.pdf").write_bytes(make_pdf(["Findings", None, "Ünïcödé conclusions"]))
    (folder / "notes.md").write_text("# Notes\n")
    with Store.open(tmp_path / "home") as store:
        first = load_corpus(folder, store=store)
        _refuse_to_parse(monkeypatch)

        again = load_corpus(folder, store=store)

    assert again.documents == first.documents
    assert again.manifest == first.manifest
    assert again.manifest.get("report.pdf").notes == ("page 2: no extractable text",)  # type: ignore[union-attr]


def test_a_changed_pdf_or_a_new_extractor_is_parsed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "papers"
    folder.mkdir()
    pdf = folder / "report.pdf"
    pdf.write_bytes(make_pdf(["First version"]))
    with Store.open(tmp_path / "home") as store:
        load_corpus(folder, store=store)
        pdf.write_bytes(make_pdf(["Second version"]))
        assert "Second version" in load_corpus(folder, store=store).documents[0].text

        monkeypatch.setattr(pdf_module, "extractor_identity", lambda: "pypdf 99.0; code 0000")
        parsed: list[bytes] = []
        real_extract = pdf_module.extract_pdf
        monkeypatch.setattr(pdf_module, "extract_pdf", lambda data: parsed.append(data) or real_extract(data))
        assert "Second version" in load_corpus(folder, store=store).documents[0].text
        assert parsed == [pdf.read_bytes()]


def test_a_kept_text_comes_back_from_the_store_as_it_was_extracted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Lone surrogates and notes survive the store's plain record (a blob and a JSON list).
    extracted = PdfText("--- page 1 of 1 ---\nodd \udcff byte\n", 1, ("pypdf: a note", "page 1: x"))
    monkeypatch.setattr(pdf_module, "extract_pdf", lambda data: extracted)
    with Store.open(tmp_path / "home") as store:
        assert pdf_module.extract_pdf_cached(b"%PDF", "b" * 64, store.caches) == extracted
        monkeypatch.setattr(pdf_module, "extract_pdf", lambda data: pytest.fail("parsed again"))
        kept = pdf_module.extract_pdf_cached(b"%PDF", "b" * 64, store.caches)
    assert kept == extracted and isinstance(kept, PdfText)


def test_a_pdf_that_fails_is_not_kept(tmp_path: Path) -> None:
    folder = tmp_path / "papers"
    folder.mkdir()
    (folder / "locked.pdf").write_bytes(make_pdf(["Hidden"], user_password="open-sesame"))
    (folder / "README.md").write_text("Papers.\n")  # a corpus of skips alone is an error (EmptyCorpus)
    with Store.open(tmp_path / "home") as store:
        for _ in range(2):
            entry = load_corpus(folder, store=store).manifest.get("locked.pdf")
            assert entry is not None and entry.status == "skipped" and entry.reason == "encrypted"
        rows = store.database.query("SELECT COUNT(*) AS kept FROM pdf_texts")
    assert rows[0]["kept"] == 0


def test_the_extractor_identity_names_pypdfs_version() -> None:
    import pypdf

    identity = pdf_module.extractor_identity()
    assert identity.startswith(f"pypdf {pypdf.__version__}; fonttools ")
    assert "fonttools none" not in identity  # a dependency: CFF and Type 1 encodings are decoded
    assert identity == pdf_module.extractor_identity()


def test_what_pypdf_logs_becomes_short_notes_not_terminal_lines(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    real_extract = pdf_module._extract
    font = "{'/BaseFont': '/CBDHGH+Mono', '/Widths': [" + ", ".join(["625"] * 200) + "]}"

    def noisy(data: bytes) -> PdfText | PdfFailure:
        # What pypdf's _cmap logs for a CFF font without fontTools, and more.
        font_logger = logging.getLogger("pypdf._cmap")
        for _ in range(2):
            font_logger.warning("fontTools is required to fully parse the font dictionary %s", font)
        for number in range(7):
            logging.getLogger("pypdf._reader").warning("damaged object %d worked around", number)
        return real_extract(data)

    monkeypatch.setattr(pdf_module, "_extract", noisy)
    caplog.set_level(logging.WARNING)

    result = extract_pdf(make_pdf(["Body"]))

    assert isinstance(result, PdfText) and "Body" in result.text
    assert len(result.notes) == 6
    assert result.notes[0].startswith("pypdf: fontTools is required to fully parse the font dictionary {")
    assert result.notes[0].endswith("...") and len(result.notes[0]) <= len("pypdf: ") + 200
    assert result.notes[1:5] == tuple(f"pypdf: damaged object {n} worked around" for n in range(4))
    assert result.notes[5] == "pypdf: 3 more messages"
    assert not [record for record in caplog.records if record.name.startswith("pypdf")]
    assert "fontTools" not in capfd.readouterr().err
    assert logging.getLogger("pypdf").propagate  # put back
