"""The order of a corpus depends on the files only: not on listing order, hash seed or locale."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from corpus_fixtures import commit, git, init_repo, isolated_git
from hypothesis import given
from hypothesis import strategies as st

from longctx.documents import path_sort_key
from longctx.sources import git as git_source
from longctx.sources.corpus import Corpus, load_corpus

__all__ = ["isolated_git"]  # imported so that it is autouse here

_NAMES = [
    "B.txt",
    "a.txt",
    "_x.txt",
    "Z.txt",
    "é.txt",
    "e.txt",
    "ß.md",
    "10.txt",
    "9.txt",
    "a b.txt",
    "A.txt",
]


def _build_folder(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for directory in ("", "sub", "sub/deeper", "Ω", "zeta", "alpha"):
        for name in _NAMES:
            path = root / directory / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{directory}/{name}\r\n")
    (root / os.fsdecode(b"raw\xff.txt")).write_text("undecodable name\n")
    (root / ".gitignore").write_text("*.md\n")
    (root / "sub" / ".gitignore").write_text("!ß.md\n")
    os.symlink("sub", root / "link-to-sub")
    os.symlink("..", root / "alpha" / "loop")
    (root / "binary.bin").write_bytes(b"\x00\x01\x02")
    return root


def _build_repository(root: Path) -> Path:
    init_repo(root)
    for number, name in enumerate(_NAMES):
        (root / name).write_text(f"{name}\n")
        git(root, "add", name)
        # Several files per commit time, so ties are broken by path.
        commit(root, f"add {name}", when=1_500_000_000 + (number // 3) * 1000)
    (root / "A.txt").write_text("changed\n")
    (root / "untracked é.txt").write_text("new\n")
    return root


def _digest(corpus: Corpus) -> str:
    digest = hashlib.sha256()
    for document in corpus.documents:
        for part in (document.path, document.text, document.kind, document.sha256, str(document.dirty)):
            digest.update(part.encode("utf-8", "surrogateescape") + b"\0")
    digest.update(corpus.manifest.to_json().encode())
    return digest.hexdigest()


class _ShuffledListing:
    """What os.scandir returns (an iterable context manager), in a random order."""

    def __init__(self, entries: list[os.DirEntry[str]]) -> None:
        self._entries = entries

    def __iter__(self) -> Iterator[os.DirEntry[str]]:
        return iter(self._entries)

    def __enter__(self) -> _ShuffledListing:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


def test_folder_order_does_not_depend_on_listing_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _build_folder(tmp_path / "folder")
    reference = load_corpus([root])
    real_scandir = os.scandir
    calls = 0

    for seed in range(5):
        rng = random.Random(seed)

        def shuffled_scandir(path: Any, rng: random.Random = rng) -> _ShuffledListing:
            nonlocal calls
            calls += 1
            with real_scandir(path) as listing:
                entries = list(listing)
            rng.shuffle(entries)
            return _ShuffledListing(entries)

        with monkeypatch.context() as patch:
            patch.setattr(os, "scandir", shuffled_scandir)
            shuffled = load_corpus([root])
        assert shuffled == reference
    assert calls > 5 * 6
    assert [d.path for d in reference.documents] == sorted(
        (d.path for d in reference.documents), key=os.fsencode
    )


def test_repository_order_does_not_depend_on_gits_listing_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _build_repository(tmp_path / "repo")
    reference = load_corpus([root])
    real_run = git_source.GitRunner.run

    for seed in range(5):
        rng = random.Random(seed)

        def shuffled_run(
            self: Any, *arguments: str, rng: random.Random = rng, **options: Any
        ) -> git_source.GitResult:
            result = real_run(self, *arguments, **options)
            if arguments[0] not in ("ls-files", "status"):
                return result
            records = [record for record in result.stdout.split(b"\0") if record]
            rng.shuffle(records)
            return dataclasses.replace(result, stdout=b"".join(record + b"\0" for record in records))

        with monkeypatch.context() as patch:
            patch.setattr(git_source.GitRunner, "run", shuffled_run)
            assert load_corpus([root]) == reference


def test_stability_order_of_the_fixture_repository(tmp_path: Path) -> None:
    corpus = load_corpus([_build_repository(tmp_path / "repo")])
    assert [d.path for d in corpus.documents] == [
        "B.txt",  # 1_500_000_000: B.txt, a.txt, _x.txt, by bytes
        "_x.txt",
        "a.txt",
        "Z.txt",  # 1_500_001_000: Z.txt, é.txt, e.txt
        "e.txt",
        "é.txt",
        "10.txt",  # 1_500_002_000: ß.md, 10.txt, 9.txt
        "9.txt",
        "ß.md",
        "a b.txt",  # 1_500_003_000: a b.txt (A.txt is dirty)
        "A.txt",  # dirty, then untracked, by path
        "untracked é.txt",
    ]


_SCRIPT = """
import hashlib, sys
from longctx.sources.corpus import load_corpus
for path in sys.argv[1:]:
    corpus = load_corpus([path])
    digest = hashlib.sha256()
    for document in corpus.documents:
        for part in (document.path, document.text, document.kind, document.sha256, str(document.dirty)):
            digest.update(part.encode("utf-8", "surrogateescape") + b"\\0")
    digest.update(corpus.manifest.to_json().encode())
    print(digest.hexdigest())
"""


def _locales() -> list[str]:
    wanted = ["C", "C.UTF-8", "POSIX", "en_US.UTF-8", "de_DE.UTF-8", "sv_SE.UTF-8", "tr_TR.UTF-8"]
    try:
        available = subprocess.run(
            ["locale", "-a"], capture_output=True, text=True, check=False
        ).stdout.split()
    except OSError:
        available = []
    normalised = {name.lower().replace("-", "") for name in available}
    return [name for name in wanted if name in ("C", "POSIX") or name.lower().replace("-", "") in normalised]


def test_order_does_not_depend_on_hash_seed_or_locale(tmp_path: Path) -> None:
    folder = _build_folder(tmp_path / "folder")
    repository = _build_repository(tmp_path / "repo")
    expected = [_digest(load_corpus([folder])), _digest(load_corpus([repository]))]
    locales = _locales()
    assert len(locales) >= 3
    runs: list[dict[str, str]] = [
        {"PYTHONHASHSEED": seed, "LC_ALL": locale, "LANG": locale}
        for seed, locale in zip(["0", "1", "4242", "random"] * 3, locales * 2, strict=False)
    ]
    # Without UTF-8 mode and locale coercion, the C locale makes Python decode
    # file names as ASCII: names must still come out the same.
    runs.append(
        {"PYTHONHASHSEED": "7", "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    )
    for overrides in runs:
        result = subprocess.run(
            [sys.executable, "-c", _SCRIPT, str(folder), str(repository)],
            capture_output=True,
            text=True,
            env={**os.environ, **overrides},
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == expected, overrides


@given(st.lists(st.text(max_size=12), max_size=30))
def test_path_sort_key_is_utf8_byte_order(paths: list[str]) -> None:
    clean = [path for path in paths if not any("\ud800" <= char <= "\udfff" for char in path)]
    assert sorted(clean, key=path_sort_key) == sorted(clean, key=lambda path: path.encode("utf-8"))


@given(st.lists(st.binary(min_size=1, max_size=12), max_size=30))
def test_path_sort_key_orders_undecodable_names_by_their_bytes(names: list[bytes]) -> None:
    decoded = [name.decode("utf-8", "surrogateescape") for name in names]
    assert [path_sort_key(path) for path in sorted(decoded, key=path_sort_key)] == sorted(names)


def test_path_sort_key_ignores_case_folding_and_collation() -> None:
    assert sorted(["b", "B", "a", "A", "_", "é", "e", "Z"], key=path_sort_key) == [
        "A",
        "B",
        "Z",
        "_",
        "a",
        "b",
        "e",
        "é",
    ]
