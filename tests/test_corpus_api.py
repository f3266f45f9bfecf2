"""load_corpus: arguments, several roots, globs, limits, the manifest's JSON form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from corpus_fixtures import commit, git, init_repo, isolated_git

from longctx.errors import ConfigError, InputError
from longctx.options.groups import CorpusOptions
from longctx.sources.corpus import MANIFEST_FORMAT_VERSION, Corpus, Limits, ManifestEntry, load_corpus

__all__ = ["isolated_git"]  # imported so that it is autouse here


def _tree(root: Path, files: dict[str, str]) -> Path:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


def _statuses(corpus: Corpus) -> dict[str, tuple[str, str | None]]:
    return {entry.path: (entry.status, entry.reason) for entry in corpus.manifest}


def test_limits_have_sensible_defaults_and_are_validated() -> None:
    limits = Limits()
    assert limits.max_file_bytes == 4 * 1024 * 1024
    assert limits.max_total_bytes == 128 * 1024 * 1024
    assert limits.max_files == 50_000
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(ConfigError, match=r"max_files must be (an integer )?at least 1, not "):
            Limits(max_files=bad)  # type: ignore[arg-type]


def test_the_file_count_limit_keeps_a_prefix_of_the_order(tmp_path: Path) -> None:
    _tree(tmp_path, {f"{name}.txt": name for name in "abcde"})
    corpus = load_corpus([tmp_path], CorpusOptions(limits=Limits(max_files=3)))
    assert [d.path for d in corpus.documents] == ["a.txt", "b.txt", "c.txt"]
    assert _statuses(corpus)["d.txt"] == ("skipped", "file-count-limit")
    entry = corpus.manifest.get("e.txt")
    assert entry is not None and entry.notes == ("the corpus already holds 3 files",)


def test_the_total_size_limit_stops_at_the_first_file_that_does_not_fit(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.txt": "x" * 40, "b.txt": "x" * 40, "c.txt": "x" * 40, "d.txt": "x"})
    corpus = load_corpus([tmp_path], CorpusOptions(limits=Limits(max_total_bytes=100)))
    assert [d.path for d in corpus.documents] == ["a.txt", "b.txt"]
    assert corpus.total_bytes == 80
    # d.txt would fit, but the corpus stays a prefix of the unlimited one.
    assert _statuses(corpus)["c.txt"] == ("skipped", "total-size-limit")
    assert _statuses(corpus)["d.txt"] == ("skipped", "total-size-limit")


def test_skipped_files_do_not_count_against_the_limits(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.txt": "a", "c.txt": "c"})
    (tmp_path / "b.bin").write_bytes(b"\x00" * 50)
    corpus = load_corpus([tmp_path], CorpusOptions(limits=Limits(max_files=2, max_total_bytes=10)))
    assert [d.path for d in corpus.documents] == ["a.txt", "c.txt"]


def test_include_and_exclude_globs(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "src/app.py": "",
            "src/app_test.py": "",
            "src/data.json": "",
            "tests/test_app.py": "",
            "docs/index.md": "",
            "setup.py": "",
        },
    )
    corpus = load_corpus(
        [tmp_path], CorpusOptions(include=["*.py", "docs/"], exclude=["tests/", "*_test.py"])
    )
    assert _statuses(corpus) == {
        "src/app.py": ("included", None),
        "setup.py": ("included", None),
        "docs/index.md": ("included", None),
        "src/app_test.py": ("skipped", "excluded-by-glob"),
        "src/data.json": ("skipped", "excluded-by-glob"),
        "tests/test_app.py": ("skipped", "excluded-by-glob"),
    }
    anchored = load_corpus([tmp_path], CorpusOptions(include=["/src/*.py"]))
    assert [d.path for d in anchored.documents] == ["src/app.py", "src/app_test.py"]


def test_globs_apply_to_repositories_too(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    _tree(repo, {"a.py": "", "b.md": "", "vendor/c.py": ""})
    git(repo, "add", ".")
    commit(repo, "c", when=1_500_000_000)
    corpus = load_corpus([repo], CorpusOptions(exclude=["vendor/"]))
    assert _statuses(corpus) == {
        "a.py": ("included", None),
        "b.md": ("included", None),
        "vendor/c.py": ("skipped", "excluded-by-glob"),
    }


def test_several_roots_get_distinct_stable_prefixes(tmp_path: Path) -> None:
    first = _tree(tmp_path / "one" / "project", {"main.py": "one\n"})
    second = _tree(tmp_path / "two" / "project", {"main.py": "two\n"})
    other = _tree(tmp_path / "lib", {"util.py": "util\n"})
    paper = tmp_path / "docs" / "notes.md"
    paper.parent.mkdir()
    paper.write_text("# Notes\n")
    corpus = load_corpus([first, second, other, paper, first])
    assert [d.path for d in corpus.documents] == [
        "lib/util.py",
        "notes.md",
        "project-2/main.py",
        "project/main.py",
    ]
    assert corpus.root is None
    assert corpus.head_sha is None
    texts = {d.path: d.text for d in corpus.documents}
    assert texts["project/main.py"] == "one\n" and texts["project-2/main.py"] == "two\n"


def test_a_repository_among_several_roots_makes_stability_the_default(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    _tree(repo, {"z.py": ""})
    git(repo, "add", ".")
    commit(repo, "c", when=1_500_000_000)
    folder = _tree(tmp_path / "folder", {"a.py": ""})
    corpus = load_corpus([folder, repo])
    assert corpus.ordering == "stability"
    # Committed files come before files without history.
    assert [d.path for d in corpus.documents] == ["repo/z.py", "folder/a.py"]
    assert load_corpus([folder, repo], CorpusOptions(ordering="path")).ordering == "path"


def test_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file or folder") as raised:
        load_corpus([tmp_path / "missing"])
    assert raised.value.path == str(tmp_path / "missing")
    with pytest.raises(InputError, match="no paths"):
        load_corpus([])
    with pytest.raises(ConfigError, match="unknown ordering 'newest'"):
        load_corpus([tmp_path], CorpusOptions(ordering="newest"))
    with pytest.raises(ConfigError, match="invalid pattern in exclude patterns"):
        load_corpus([tmp_path], CorpusOptions(exclude=["!"]))


def test_a_single_path_may_be_passed_bare(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.txt": "a\n"})
    assert load_corpus(tmp_path) == load_corpus([str(tmp_path)])


def test_manifest_json_is_deterministic_and_complete(tmp_path: Path) -> None:
    _tree(tmp_path, {"b.txt": "b\n", "a.md": "# a\n"})
    (tmp_path / "c.bin").write_bytes(b"\x00\x01")
    first = load_corpus([tmp_path]).manifest
    second = load_corpus([tmp_path]).manifest
    assert first.to_json() == second.to_json()
    data = json.loads(first.to_json())
    assert data["format_version"] == MANIFEST_FORMAT_VERSION
    assert data["summary"] == {
        "considered": 3,
        "included": 2,
        "skipped": 1,
        "skipped_by_reason": {"binary": 1},
    }
    assert [entry["path"] for entry in data["entries"]] == ["a.md", "b.txt", "c.bin"]
    assert data["entries"][2] == {
        "path": "c.bin",
        "status": "skipped",
        "reason": "binary",
        "size_bytes": 2,
        "sha256": None,
        "kind": None,
        "lossy": False,
        "notes": [],
    }
    assert list(data["entries"][0]) == list(ManifestEntry("x", "included").to_dict())
    assert first.to_json().isascii()
    assert len(first) == 3 and [entry.path for entry in first.included] == ["a.md", "b.txt"]
