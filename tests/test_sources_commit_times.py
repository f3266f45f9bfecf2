"""Last-commit times kept in the store: history is walked once per commit, and nothing else changes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from corpus_fixtures import commit, git, init_repo, isolated_git

from longctx.options.groups import CorpusOptions
from longctx.sources import history as history_module
from longctx.sources.corpus import Corpus, load_corpus
from longctx.store import Store

__all__ = ["isolated_git"]  # imported so that it is autouse here

_T0 = 1_700_000_000


def _history(path: Path, commits: int) -> Path:
    """Ten files added at the start, then ``commits - 1`` commits that each touch one of them."""
    init_repo(path)
    for number in range(10):
        (path / f"module_{number}.py").write_text(f"# module {number}\n")
    git(path, "add", "-A")
    commit(path, "start", when=_T0)
    for number in range(1, commits):
        name = path / f"module_{number % 3}.py"
        name.write_text(name.read_text() + f"# change {number}\n")
        git(path, "add", "-A")
        commit(path, f"change {number}", when=_T0 + 100 * number)
    return path


def _order(corpus: Corpus) -> list[tuple[str, int | None, bool]]:
    return [(document.path, document.last_commit_time, document.earlier) for document in corpus.documents]


def _times(corpus: Corpus) -> dict[str, int | None]:
    return {document.path: document.last_commit_time for document in corpus.documents}


class _Walks:
    """Records each walk over history: the commit and the paths asked for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, frozenset[str]]] = []
        real = history_module._last_commit_times

        def recording(runner, wanted, pathspec, revision="HEAD"):  # type: ignore[no-untyped-def]
            self.calls.append((revision, frozenset(wanted)))
            return real(runner, wanted, pathspec, revision)

        monkeypatch.setattr(history_module, "_last_commit_times", recording)


@pytest.mark.parametrize("max_stale_share", [0.2, 0])
def test_a_second_load_walks_no_history_and_gives_the_same_corpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_stale_share: float
) -> None:
    repository = _history(tmp_path / "repo", 12)
    (repository / "module_5.py").write_text("# edited, not committed\n")  # layered: one changed file
    expected = _order(load_corpus(repository, CorpusOptions(max_stale_share=max_stale_share)))
    walks = _Walks(monkeypatch)
    with Store.open(tmp_path / "home") as store:
        first = load_corpus(repository, CorpusOptions(max_stale_share=max_stale_share), store=store)
        walked = len(walks.calls)
        second = load_corpus(repository, CorpusOptions(max_stale_share=max_stale_share), store=store)

    assert walked >= 1
    assert len(walks.calls) == walked  # the second load walked nothing
    assert _order(first) == _order(second) == expected


def test_edits_between_commits_walk_history_once_per_set_of_changed_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository = _history(tmp_path / "repo", 12)
    walks = _Walks(monkeypatch)
    store_walks: list[list[tuple[str, frozenset[str]]]] = []
    with Store.open(tmp_path / "home") as store:
        load_corpus(repository, store=store)
        for number in range(3):
            (repository / "module_7.py").write_text(f"# edit {number}\n")
            already = len(walks.calls)
            after = load_corpus(repository, store=store)
            store_walks.append(walks.calls[already:])
            assert _order(after) == _order(load_corpus(repository))  # as without a store

    # The first edit may move the base (the edit counts against
    # max_stale_share) and adds a file to the changed set: a walk for each.
    # Editing the same file again changes nothing git's history says.
    assert 1 <= len(store_walks[0]) <= 2
    assert any(wanted == {"module_7.py"} for _, wanted in store_walks[0])
    assert store_walks[1] == store_walks[2] == []


def test_a_new_commit_walks_again_and_the_times_follow_it(tmp_path: Path) -> None:
    repository = _history(tmp_path / "repo", 3)
    with Store.open(tmp_path / "home") as store:
        before = _times(load_corpus(repository, CorpusOptions(max_stale_share=0), store=store))
        (repository / "module_9.py").write_text("# now changed\n")
        git(repository, "add", "-A")
        commit(repository, "touch module 9", when=_T0 + 10_000)
        after = _times(load_corpus(repository, CorpusOptions(max_stale_share=0), store=store))

    assert before["module_9.py"] == _T0
    assert after["module_9.py"] == _T0 + 10_000
    assert after["module_1.py"] == before["module_1.py"]


def test_a_shallow_clone_keeps_no_times(tmp_path: Path) -> None:
    source = _history(tmp_path / "source", 6)
    clone = tmp_path / "clone"
    command = ["git", "clone", "-q", "--depth", "2", f"file://{source}", str(clone)]
    subprocess.run(command, check=True, capture_output=True)
    with Store.open(tmp_path / "home") as store:
        corpus = load_corpus(clone, store=store)
        kept = store.database.query("SELECT COUNT(*) AS kept FROM commit_times")[0]["kept"]

    assert kept == 0
    assert _order(corpus) == _order(load_corpus(clone))


def test_the_store_keeps_the_newest_sets_only(tmp_path: Path) -> None:
    with Store.open(tmp_path / "home") as store:
        for number in range(5):
            store.caches.save_commit_times(f"key-{number}", {"a.py": number}, keep=3)
        assert store.caches.commit_times("key-0") is None
        assert store.caches.commit_times("key-4") == {"a.py": 4}
        names = {"caf\udce9.py": 7}  # a name that is not UTF-8 on disk
        store.caches.save_commit_times("odd", names)
        assert store.caches.commit_times("odd") == names
