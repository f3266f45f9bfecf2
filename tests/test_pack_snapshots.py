"""longctx.packing.pack: an unchanged repository is read back from the store, anything else is rebuilt.

Every test compares with what load_corpus + build_pack give on the same
files: a pack read back from the store must be that pack, and any change
that could alter it must be seen (real git repositories in temporary
folders).
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from corpus_fixtures import commit, git, init_repo, isolated_git

from longctx.errors import BudgetError, StoreError
from longctx.options.groups import CorpusOptions
from longctx.packing import Budget, PackResult, build, build_pack, counting, pack
from longctx.sources.corpus import Limits, Manifest, load_corpus
from longctx.store import Store
from longctx.tokens.tokenizers import EstimateTokenizer, TiktokenFileTokenizer, Tokenizer, fast_openai_counter

__all__ = ["isolated_git"]  # imported so that it is autouse here

T0 = 1_700_000_000


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = init_repo(tmp_path / "repo")
    (path / "src").mkdir()
    (path / "README.md").write_text("# Demo\n\nA small project.\n")
    (path / "src" / "core.py").write_text("def core():\n    return 1\n")
    (path / ".gitignore").write_text("build/\n")
    git(path, "add", "-A")
    commit(path, "first", when=T0)
    (path / "src" / "app.py").write_text("from src.core import core\n\nprint(core())\n")
    git(path, "add", "-A")
    commit(path, "second", when=T0 + 100)
    return path


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "home") as opened:
        yield opened


_CORPUS_KEYS = {field.name for field in dataclasses.fields(CorpusOptions)}


def _corpus_options(options: dict[str, Any]) -> CorpusOptions:
    """The corpus options among ``options`` (taken out of it)."""
    return CorpusOptions(**{key: options.pop(key) for key in list(options) if key in _CORPUS_KEYS})


def packed(repo: Path | Sequence[Path], store: Store, **options: Any) -> PackResult:
    options.setdefault("tokenizer", EstimateTokenizer())
    corpus_options = _corpus_options(options)
    return pack(repo, corpus_options, store=store, **options)


def fresh(repo: Path, **options: Any) -> PackResult:
    """What the files give now: load_corpus then build_pack, no store."""
    options = dict(options)
    tokenizer: Tokenizer | None = options.pop("tokenizer", EstimateTokenizer())
    corpus = load_corpus(repo, _corpus_options(options))
    return PackResult(build_pack(corpus, tokenizer=tokenizer), corpus.manifest, corpus.ordering, reused=False)


def written(result: PackResult) -> bytes:
    stream = io.BytesIO()
    count = result.pack.write_to(stream)
    assert count == len(stream.getvalue())
    return stream.getvalue()


def assert_same(result: PackResult, expected: PackResult) -> None:
    assert result.pack == expected.pack
    assert result.manifest == expected.manifest
    assert result.ordering == expected.ordering
    assert written(result) == written(expected)
    assert written(result) == (expected.pack.system + expected.pack.prefix).encode("utf-8")


def test_an_unchanged_repository_is_read_back_and_equals_a_fresh_build(repo: Path, store: Store) -> None:
    first = packed(repo, store)
    assert not first.reused
    assert_same(first, fresh(repo))
    again = packed(repo, store)
    assert again.reused
    assert_same(again, fresh(repo))
    assert [section.name for section in again.pack.sections] == [
        section.name for section in first.pack.sections
    ]
    assert [section.tokens for section in again.pack.sections] == [
        section.tokens for section in first.pack.sections
    ]
    assert again.pack.to_dict() == first.pack.to_dict()


def test_reuse_false_and_no_store_always_build(repo: Path, store: Store) -> None:
    packed(repo, store)
    assert not packed(repo, store, reuse=False).reused
    assert not pack(repo, tokenizer=EstimateTokenizer()).reused


def _edit_tracked(repo: Path) -> None:
    (repo / "src" / "core.py").write_text("def core():\n    return 2\n")  # same size, right after the commit


def _edit_twice(repo: Path) -> None:
    (repo / "src" / "core.py").write_text("def core():\n    return 3\n")


def _new_untracked(repo: Path) -> None:
    (repo / "src" / "new.py").write_text("NEW = 1\n")


def _stage(repo: Path) -> None:
    (repo / "src" / "core.py").write_text("def core():\n    return 4\n")
    git(repo, "add", "src/core.py")


def _ignore_more(repo: Path) -> None:
    (repo / ".gitignore").write_text("build/\nsrc/app.py\n")


def _checkout_first(repo: Path) -> None:
    git(repo, "checkout", "-q", "HEAD~1")


def _commit_change(repo: Path) -> None:
    (repo / "README.md").write_text("# Demo\n\nA small project, changed.\n")
    git(repo, "commit", "-qam", "third")


def _exclude_untracked(repo: Path) -> None:
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("*.tmp\n")


def _delete_tracked(repo: Path) -> None:
    (repo / "src" / "app.py").unlink()


MUTATIONS: dict[str, Callable[[Path], None]] = {
    "edit a tracked file (same size, same second)": _edit_tracked,
    "new untracked file": _new_untracked,
    "staged change": _stage,
    ".gitignore change": _ignore_more,
    "checkout": _checkout_first,
    "new commit": _commit_change,
    "deleted tracked file": _delete_tracked,
}


@pytest.mark.parametrize("mutation", list(MUTATIONS), ids=list(MUTATIONS))
def test_any_change_is_rebuilt_then_kept_again(repo: Path, store: Store, mutation: str) -> None:
    (repo / "scratch.tmp").write_text("untracked before\n")
    packed(repo, store)
    assert packed(repo, store).reused
    MUTATIONS[mutation](repo)
    changed = packed(repo, store)
    assert not changed.reused
    assert_same(changed, fresh(repo))
    again = packed(repo, store)
    assert again.reused
    assert_same(again, fresh(repo))


def test_a_repository_edited_while_its_files_are_read_is_not_kept(
    repo: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    loading = build.stream_corpus
    original = (repo / "src" / "core.py").read_text()

    def edited_while_read(paths: Any, options: Any, on_document: Any, **keywords: Any) -> Any:
        def edit_once(document: Any) -> None:
            if (repo / "src" / "core.py").read_text() == original:
                _edit_tracked(repo)  # the first file is read: the others may be read before or after
            on_document(document)

        return loading(paths, options, edit_once, **keywords)

    monkeypatch.setattr(build, "stream_corpus", edited_while_read)
    assert not packed(repo, store).reused
    monkeypatch.setattr(build, "stream_corpus", loading)
    (repo / "src" / "core.py").write_text(original)
    # Back in the state the pack started from: it was not kept for that state.
    restored = packed(repo, store)
    assert not restored.reused
    assert_same(restored, fresh(repo))
    assert packed(repo, store).reused


def test_a_modified_file_edited_again_is_rebuilt(repo: Path, store: Store) -> None:
    # git status says " M src/core.py" both times: the content decides.
    _edit_tracked(repo)
    assert not packed(repo, store).reused
    assert packed(repo, store).reused
    _edit_twice(repo)
    changed = packed(repo, store)
    assert not changed.reused
    assert_same(changed, fresh(repo))


def test_an_untracked_file_edited_again_is_rebuilt(repo: Path, store: Store) -> None:
    _new_untracked(repo)
    packed(repo, store)
    (repo / "src" / "new.py").write_text("NEW = 2\n")
    changed = packed(repo, store)
    assert not changed.reused
    assert_same(changed, fresh(repo))


def test_info_exclude_change_is_rebuilt(repo: Path, store: Store) -> None:
    (repo / "notes.tmp").write_text("scratch\n")
    packed(repo, store)
    _exclude_untracked(repo)
    changed = packed(repo, store)
    assert not changed.reused
    assert "notes.tmp" not in [entry.path for entry in changed.manifest]
    assert_same(changed, fresh(repo))


def test_an_ignored_longctxignore_at_the_top_is_watched(repo: Path, store: Store) -> None:
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text(".longctxignore\n")
    (repo / ".longctxignore").write_text("README.md\n")
    first = packed(repo, store)
    assert "README.md" not in [entry.path for entry in first.manifest]
    (repo / ".longctxignore").write_text("src/app.py\n")
    changed = packed(repo, store)
    assert not changed.reused
    assert_same(changed, fresh(repo))


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({}, {"ordering": "path"}),
        ({}, {"include": ["src/**"]}),
        ({}, {"exclude": ["README.md"]}),
        ({}, {"limits": Limits(max_files=1)}),
        ({}, {"allow_secrets": True}),
        ({}, {"tokenizer": None}),
        ({}, {"tokenizer": EstimateTokenizer(bytes_per_token=3)}),
    ],
    ids=["ordering", "include", "exclude", "limits", "allow_secrets", "no tokenizer", "other tokenizer"],
)
def test_other_options_are_another_snapshot(
    repo: Path, store: Store, first: dict[str, Any], second: dict[str, Any]
) -> None:
    packed(repo, store, **first)
    other = packed(repo, store, **second)
    assert not other.reused
    assert_same(other, fresh(repo, **second))
    assert packed(repo, store, **second).reused
    assert packed(repo, store, **first).reused  # each set of options keeps its own


def test_a_subfolder_is_its_own_snapshot(repo: Path, store: Store) -> None:
    whole = packed(repo, store)
    sub = packed(repo / "src", store)
    assert not sub.reused
    assert_same(sub, fresh(repo / "src"))
    assert packed(repo / "src", store).reused
    (repo / "README.md").write_text("outside the folder\n")
    assert packed(repo / "src", store).reused  # a change outside the folder does not matter
    assert whole.pack != sub.pack


def test_a_link_to_an_ignored_file_is_reused_until_its_target_changes(repo: Path, store: Store) -> None:
    # git does not watch the target: the snapshot keeps its content digest.
    (repo / "build").mkdir()
    (repo / "build" / "out.txt").write_text("generated 1\n")
    os.symlink("build/out.txt", repo / "out-link.txt")
    first = packed(repo, store)
    assert packed(repo, store).reused
    (repo / "build" / "out.txt").write_text("generated 2\n")
    second = packed(repo, store)
    assert not second.reused
    assert_same(second, fresh(repo))
    assert first.pack != second.pack
    assert packed(repo, store).reused


def test_an_unchanged_repository_with_internal_links_is_read_back(repo: Path, store: Store) -> None:
    """Tracked links, as in node_modules/.bin or a docs folder: the re-pack comes from the store."""
    (repo / "bin").mkdir()
    os.symlink("../src/core.py", repo / "bin" / "core")
    os.symlink("README.md", repo / "README-link.md")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "links")
    first = packed(repo, store)
    notes = {entry.path: entry.notes for entry in first.manifest.included}
    assert notes["bin/core"] == ("symbolic link to src/core.py",)
    again = packed(repo, store)
    assert again.reused
    assert_same(again, fresh(repo))
    # Retargeting a link (a change git sees) and editing a target both miss.
    os.remove(repo / "README-link.md")
    os.symlink("src/core.py", repo / "README-link.md")
    retargeted = packed(repo, store)
    assert not retargeted.reused
    assert_same(retargeted, fresh(repo))


def test_a_link_out_of_the_repository_stays_skipped_and_the_pack_is_reused(
    repo: Path, store: Store, tmp_path: Path
) -> None:
    (tmp_path / "outside.txt").write_text("secret-ish\n")
    os.symlink(tmp_path / "outside.txt", repo / "outside-link.txt")
    first = packed(repo, store)
    entry = first.manifest.get("outside-link.txt")
    assert entry is not None and entry.reason == "symlink-outside-root"
    assert packed(repo, store).reused


def test_assume_unchanged_entries_disable_reuse(repo: Path, store: Store) -> None:
    git(repo, "update-index", "--assume-unchanged", "src/core.py")
    packed(repo, store)
    (repo / "src" / "core.py").write_text("def core():\n    return 9\n")
    changed = packed(repo, store)
    assert not changed.reused
    assert_same(changed, fresh(repo))


def test_plain_folders_and_several_paths_are_not_kept(tmp_path: Path, repo: Path, store: Store) -> None:
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "a.txt").write_text("a\n")
    packed(folder, store)
    assert not packed(folder, store).reused
    packed([repo, folder], store)
    assert not packed([repo, folder], store).reused


def test_a_damaged_snapshot_file_is_rebuilt(repo: Path, store: Store, tmp_path: Path) -> None:
    packed(repo, store)
    [text_file] = (tmp_path / "home" / "pack-snapshots").iterdir()
    text_file.write_bytes(text_file.read_bytes()[:-5])
    result = packed(repo, store)
    assert not result.reused
    assert_same(result, fresh(repo))
    assert packed(repo, store).reused


def test_the_budget_is_checked_on_a_reused_pack(repo: Path, store: Store) -> None:
    packed(repo, store)
    with pytest.raises(BudgetError):
        packed(repo, store, budget=Budget(64, reserved_output_tokens=0, reserved_question_tokens=0))
    assert packed(repo, store, budget=Budget(100_000)).reused


def test_old_snapshots_are_dropped(repo: Path, store: Store, tmp_path: Path) -> None:
    for bytes_per_token in range(1, 12):
        packed(repo, store, tokenizer=EstimateTokenizer(bytes_per_token=bytes_per_token))
    assert len(list((tmp_path / "home" / "pack-snapshots").iterdir())) == 8


def test_the_first_pack_of_a_large_repository_starts_its_counting_worker_early(
    repo: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    if fast_openai_counter("cl100k_base") is None:
        pytest.skip("cl100k offline needs bpe-openai (optional) here")
    early: list[bool] = []
    start_worker = counting.SectionCounter.start_worker

    def spy(counter: counting.SectionCounter) -> None:
        early.append(True)
        start_worker(counter)

    monkeypatch.setattr(counting.SectionCounter, "start_worker", spy)
    monkeypatch.setattr(build, "_EARLY_WORKER_FILES", 3)  # the fixture tracks 4 files
    tokenizer = TiktokenFileTokenizer.named("cl100k_base")
    first = packed(repo, store, tokenizer=tokenizer)
    assert early == [True]
    assert_same(first, fresh(repo, tokenizer=tokenizer))
    (repo / "src" / "core.py").write_text("def core():\n    return 2\n")
    second = packed(repo, store, tokenizer=tokenizer)  # the slot has a snapshot: counts are likely stored
    assert early == [True]
    assert not second.reused
    assert_same(second, fresh(repo, tokenizer=tokenizer))


def test_a_reused_pack_is_written_the_same_to_files_pipes_and_wrapping_streams(
    repo: Path, store: Store, tmp_path: Path
) -> None:
    packed(repo, store)
    again = packed(repo, store)
    assert again.reused
    expected = written(again)
    with open(tmp_path / "out.txt", "wb") as file:  # a file written around the pack
        file.write(b"<")
        assert again.pack.write_to(file) == len(expected)
        file.write(b">")
    assert (tmp_path / "out.txt").read_bytes() == b"<" + expected + b">"
    # A compressing stream's fileno() is the compressed file's: the pack must go through it.
    with gzip.open(tmp_path / "out.gz", "wb") as compressed:
        again.pack.write_to(compressed)
    assert gzip.decompress((tmp_path / "out.gz").read_bytes()) == expected
    reading, writing = os.pipe()
    with open(writing, "wb") as pipe:
        collected: list[bytes] = []
        reader = threading.Thread(target=lambda: collected.append(_read_all(reading)))
        reader.start()
        again.pack.write_to(pipe)
    reader.join()
    assert collected == [expected]


def _read_all(descriptor: int) -> bytes:
    with open(descriptor, "rb") as stream:
        return stream.read()


def test_a_damaged_stored_manifest_is_a_clear_error_when_read(repo: Path, store: Store) -> None:
    packed(repo, store)
    with store.database.transaction() as connection:
        connection.execute("UPDATE pack_snapshots SET manifest_json = '{\"entries\": 3}'")
    again = packed(repo, store)
    assert again.reused
    assert again.pack == fresh(repo).pack  # the pack itself is intact and still served
    with pytest.raises(StoreError, match="cannot be read back"):
        _ = again.manifest


def test_a_reused_packs_summary_line_is_the_built_ones_without_decoding_the_manifest(
    repo: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    (repo / "latin1.txt").write_bytes("café\n".encode() + b"\xff")  # decoded with U+FFFD: named on the line
    (repo / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))  # skipped: binary
    git(repo, "add", "-A")
    commit(repo, "third", when=T0 + 200)
    built = packed(repo, store)
    again = packed(repo, store)
    assert again.reused and not built.reused
    assert "1 binary" in built.summary_line() and "latin1.txt" in built.summary_line()

    def undecodable(self: Any) -> Any:
        raise AssertionError("the summary line decoded the stored manifest")

    monkeypatch.setattr(Manifest, "from_dict", classmethod(undecodable))
    # The same line, but for the reuse and the layer note (a reused pack has none, see PackResult).
    expected = built.summary_line().replace(": ", " (unchanged: reused): ", 1)
    assert again.summary_line() == expected.replace(f"; {built.layer_note}", "")
