"""An adversarial repository: every path gets its expected manifest status, and nothing raises."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from corpus_fixtures import (
    AdversarialRepository,
    build_adversarial_repository,
    isolated_git,
    refusing_to_open,
)

from longctx.sources.corpus import Corpus, load_corpus

__all__ = ["isolated_git"]  # imported so that it is autouse here


@pytest.fixture
def adversarial(tmp_path: Path) -> AdversarialRepository:
    return build_adversarial_repository(tmp_path)


@pytest.fixture
def corpus(adversarial: AdversarialRepository, monkeypatch: pytest.MonkeyPatch) -> Corpus:
    with refusing_to_open(monkeypatch, adversarial.unreadable):
        return load_corpus([adversarial.root])


def test_every_path_gets_its_expected_status(adversarial: AdversarialRepository, corpus: Corpus) -> None:
    actual = {entry.path: (entry.status, entry.reason) for entry in corpus.manifest}
    mismatches = {
        path: (actual.get(path), expected)
        for path, expected in adversarial.expected.items()
        if actual.get(path) != expected
    }
    assert mismatches == {}
    # Nothing else was considered: ignored files are not listed, and nothing appears from nowhere.
    assert set(actual) == set(adversarial.expected)


def test_documents_are_exactly_the_included_entries(corpus: Corpus) -> None:
    # The repository has history, so its pack is layered: the base's copies
    # of files changed since are documents too, but the manifest describes
    # the current files.
    assert corpus.layer_base is not None
    current = [document for document in corpus.documents if not document.earlier]
    included = {entry.path for entry in corpus.manifest.included}
    assert {document.path for document in current} == included
    assert len(current) == len(included)
    for document in current:
        entry = corpus.manifest.get(document.path)
        assert entry is not None
        assert (entry.sha256, entry.size_bytes, entry.kind, entry.lossy) == (
            document.sha256,
            document.size_bytes,
            document.kind,
            document.lossy,
        )


def test_every_skip_has_a_reason_and_the_manifest_is_in_byte_order(corpus: Corpus) -> None:
    for entry in corpus.manifest.skipped:
        assert entry.reason is not None
        assert entry.sha256 is None and entry.kind is None
    paths = [entry.path.encode("utf-8", "surrogateescape") for entry in corpus.manifest]
    assert paths == sorted(paths)


def test_decoding_results(corpus: Corpus) -> None:
    by_path = {document.path: document for document in corpus.documents}
    latin = by_path["data/latin1.txt"]
    assert not latin.lossy and latin.text == "café crème\n"  # its encoding detected
    latin_entry = corpus.manifest.get("data/latin1.txt")
    assert latin_entry is not None and not latin_entry.lossy
    assert latin_entry.notes == ("decoded from cp1252 (detected: not valid UTF-8)",)
    stray = by_path["data/stray.txt"]  # UTF-8 with one bad byte stays UTF-8
    assert stray.lossy and stray.text == "naïve\n\ufffd\n"
    stray_entry = corpus.manifest.get("data/stray.txt")
    assert stray_entry is not None and stray_entry.lossy
    assert by_path["docs/bom8.md"].text == "# Títle\n"
    assert by_path["docs/utf16le.txt"].text == "utf-16 le ✓\n"
    assert by_path["docs/utf16be.txt"].text == "utf-16 be ✓\n"
    assert by_path["crlf.txt"].text == "one\ntwo\nthree\n"
    assert by_path["empty.txt"].text == ""
    assert by_path["empty.txt"].sha256 == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert by_path["picture.png"].text == "this .png holds text\n"
    assert by_path["main-link.py"].text == by_path["src/main.py"].text
    assert by_path[os.fsdecode(b"latin\xe9-name.txt")].text == "undecodable name\n"
    assert by_path["nb/analysis.ipynb"].kind == "notebook"
    assert "OUTPUT-MUST-NOT-APPEAR" not in by_path["nb/analysis.ipynb"].text
    assert by_path["papers/paper.pdf"].text == (
        "--- page 1 of 3 ---\nIntroduction\n--- page 2 of 3 ---\n--- page 3 of 3 ---\nConclusion\n"
    )


def test_notes_explain_the_skips(corpus: Corpus) -> None:
    def notes(path: str) -> tuple[str, ...]:
        entry = corpus.manifest.get(path)
        assert entry is not None
        return entry.notes

    assert notes("locked.txt") == ("Permission denied",)
    assert notes("gone.txt") == ("deleted in the working tree",)
    assert notes("pipe") == ("a FIFO",)
    assert notes("papers/paper.pdf") == ("page 2: no extractable text",)
    assert notes("papers/locked.pdf") == ("the empty password does not open it",)
    assert notes("main-link.py") == ("symbolic link to src/main.py",)
    assert notes("docs/utf16le.txt") == ("decoded from utf-16-le",)
    assert notes(".env") == ("file name matches dotenv-file",)
    assert notes("config/settings.py") == (
        "content matches aws-access-key-id at line 2, github-token at line 3, "
        "aws-secret-access-key at line 4",
    )
    assert notes("big.txt") == (f"{4 * 1024 * 1024 + 1} bytes; the limit is {4 * 1024 * 1024}",)


def test_git_facts(adversarial: AdversarialRepository, corpus: Corpus) -> None:
    by_path = {document.path: document for document in corpus.documents}
    assert corpus.head_sha is not None and len(corpus.head_sha) == 40
    assert by_path["src/main.py"].last_commit_time == 1_500_000_000
    assert not by_path["src/main.py"].dirty
    assert by_path["src/util.py"].dirty
    assert by_path["scratch.py"].dirty and by_path["scratch.py"].last_commit_time is None
    dirty = [document.path for document in corpus.documents if document.dirty]
    assert [document.path for document in corpus.documents][-len(dirty) :] == dirty


def test_no_absolute_path_of_this_machine_leaks(adversarial: AdversarialRepository, corpus: Corpus) -> None:
    base = str(adversarial.root.parent)
    assert base not in corpus.manifest.to_json()
    # .gitmodules holds the submodule's URL, which the test gave as a local path: content, not a leak.
    assert all(base not in document.text for document in corpus.documents if document.path != ".gitmodules")
    assert corpus.root == "repo"
