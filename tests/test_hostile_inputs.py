"""Real-world input: messy PDFs, a path named twice, a corpus with nothing to pack."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from corpus_fixtures import make_pdf
from fake_engine import FakeEngine

from longctx.backends.base import Backend, connect
from longctx.cli import main
from longctx.cli.app import EXIT_EMPTY_CORPUS, EXIT_OK, Runtime
from longctx.errors import EmptyCorpus
from longctx.packing import Budget, build_pack, build_shards
from longctx.sources import pdf as pdf_module
from longctx.sources.corpus import load_corpus
from longctx.store import Store
from longctx.tokens.tokenizers import EstimateTokenizer

_C0 = re.compile("[\x00-\x08\x0b-\x1f]")


def _invoke(home: Path, *args: str, backend: Backend | None = None) -> Result:
    runtime = Runtime(backend=backend, open_store=lambda: Store.open(home))
    return CliRunner().invoke(main, list(args), obj=runtime)


def _pdf_folder(root: Path) -> Path:
    folder = root / "papers"
    folder.mkdir(parents=True)
    # Control characters where a font's glyphs could not be mapped, a page without text.
    (folder / "math.pdf").write_bytes(make_pdf(["Let x\x00\x01 be\x07 a value\x0c.", None, "QED\ttab"]))
    (folder / "scan.pdf").write_bytes(make_pdf([None]))
    (folder / "plain.pdf").write_bytes(make_pdf(["Hello PDF"]))
    return folder


def test_pack_json_of_pdfs_is_identical_across_runs_and_stores(tmp_path: Path) -> None:
    folder = _pdf_folder(tmp_path)
    runs = []
    for home in ("home-1", "home-2"):
        output = tmp_path / f"{home}.txt"
        result = _invoke(tmp_path / home, "pack", str(folder), "--json", "-q")
        assert result.exit_code == EXIT_OK, result.output
        written = _invoke(tmp_path / home, "pack", str(folder), "-q", "-o", str(output))
        assert written.exit_code == EXIT_OK, written.output
        runs.append((result.stdout, output.read_bytes()))
    assert runs[0] == runs[1]
    manifest = json.loads(runs[0][0])["manifest"]["entries"]
    notes = {entry["path"]: entry["notes"] for entry in manifest}
    assert "4 control characters (glyphs pypdf could not map) replaced by U+FFFD" in notes["math.pdf"]
    pack = runs[0][1].decode("utf-8")
    assert _C0.search(pack) is None
    assert "QED\ttab" in pack
    # Pages without text are named in the listing, where the model sees them.
    assert "[no text on page 2] math.pdf\n" in pack
    assert "[no text on page 1] scan.pdf\n" in pack
    assert "\nplain.pdf\n" in pack


def test_no_control_character_in_a_pack_of_pdfs(tmp_path: Path) -> None:
    pack = build_pack(load_corpus(_pdf_folder(tmp_path)))
    assert _C0.search(pack.system + pack.prefix) is None


def test_pypdf_notes_carry_no_object_address() -> None:
    message = "Object IndirectObject(8, 0, 140435891653584) is not a font: <Reader object at 0x7f3a9c12ab40>"
    assert pdf_module._stable(message) == "Object IndirectObject(8, 0) is not a font: <Reader object>"


def test_a_file_named_and_inside_a_named_folder_is_packed_once(tmp_path: Path) -> None:
    folder = _pdf_folder(tmp_path)
    corpus = load_corpus([folder / "plain.pdf", folder, folder / "math.pdf"])
    paths = [document.path for document in corpus.documents]
    assert sorted(paths) == ["math.pdf", "plain.pdf", "scan.pdf"]
    assert corpus == load_corpus(folder)


def test_the_same_file_twice_is_packed_once(tmp_path: Path) -> None:
    folder = _pdf_folder(tmp_path)
    corpus = load_corpus([folder / "plain.pdf", folder / ".." / "papers" / "plain.pdf"])
    assert [document.path for document in corpus.documents] == ["plain.pdf"]


@pytest.fixture
def nothing_to_pack(tmp_path: Path) -> Path:
    folder = tmp_path / "assets"
    folder.mkdir()
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0" * 10)
    (folder / "icon.bin").write_bytes(b"\0\1\2" * 100)
    (folder / ".env").write_text("A=1\n")
    (folder / "locked.pdf").write_bytes(make_pdf(["Hidden"], user_password="open-sesame"))
    return folder


def test_a_corpus_with_no_document_is_an_error_naming_what_was_skipped(nothing_to_pack: Path) -> None:
    with pytest.raises(EmptyCorpus) as caught:
        load_corpus(nothing_to_pack)
    message = str(caught.value)
    assert message.startswith(f"nothing to pack in {nothing_to_pack}: every file was skipped: ")
    assert "2 binary (icon.bin, logo.png)" in message
    assert "1 secret (.env)" in message and "1 encrypted (locked.pdf)" in message
    assert caught.value.skipped == {"binary": 2, "secret": 1, "encrypted": 1}


def test_an_empty_folder_is_an_error_too(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(EmptyCorpus, match="no file found"):
        load_corpus(tmp_path / "empty")


@pytest.fixture
def fake_backend() -> Iterator[Backend]:
    fake = FakeEngine(engine="generic", block=1)
    backend = connect(
        "http://fake-engine:8000/v1", transport=fake.transport(), async_transport=fake.transport()
    )
    yield backend
    backend.close()


def test_pack_and_ask_exit_with_their_own_code_for_nothing_to_pack(
    nothing_to_pack: Path, tmp_path: Path, fake_backend: Backend
) -> None:
    packed = _invoke(tmp_path / "home", "pack", str(nothing_to_pack))
    assert packed.exit_code == EXIT_EMPTY_CORPUS == 8
    assert packed.stderr.startswith("longctx: error: nothing to pack in ")
    assert "2 binary (icon.bin, logo.png)" in packed.stderr
    asked = _invoke(tmp_path / "home", "ask", str(nothing_to_pack), "What is here?", backend=fake_backend)
    assert asked.exit_code == EXIT_EMPTY_CORPUS, asked.output
    assert "every file was skipped" in asked.stderr


def test_a_shards_listing_names_the_pages_without_text_and_stays_in_budget(tmp_path: Path) -> None:
    folder = _pdf_folder(tmp_path)
    for name in ("a.txt", "b.txt", "c.txt"):
        (folder / name).write_text(f"{name} " * 400)
    corpus = load_corpus(folder)
    whole = build_pack(corpus, tokenizer=EstimateTokenizer()).total_tokens or 0
    assert whole > 1000
    budget = Budget(whole // 2 + 300, reserved_output_tokens=0, reserved_question_tokens=0)
    shards = build_shards(corpus, budget=budget, tokenizer=EstimateTokenizer()).shards
    assert len(shards) >= 2
    assert all((shard.total_tokens or 0) <= budget.prompt_budget for shard in shards)
    listings = "".join(shard.prefix.split("<listing", 1)[1] for shard in shards)
    assert "[no text on page 2] math.pdf\n" in listings and "[no text on page 1] scan.pdf\n" in listings


def test_a_repository_nested_in_a_given_repository_is_no_repeat(tmp_path: Path) -> None:
    outer = tmp_path / "outer"
    inner = outer / "inner"
    inner.mkdir(parents=True)
    (outer / "top.md").write_text("top\n")
    (inner / "deep.md").write_text("deep\n")
    for repository in (outer, inner):
        subprocess.run(["git", "init", "-q", str(repository)], check=True)
    corpus = load_corpus([outer, inner])
    assert sorted(document.path for document in corpus.documents) == ["inner/deep.md", "outer/top.md"]
    # In a plain folder the nested repository's files are the folder's own: packed once.
    shutil.rmtree(outer / ".git")
    assert sorted(document.path for document in load_corpus([outer, inner]).documents) == [
        "inner/deep.md",
        "top.md",
    ]
