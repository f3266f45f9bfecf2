"""Git repositories: exactly what git lists, HEAD, last-commit times, dirty files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from corpus_fixtures import LFS_POINTER, commit, git, init_repo, isolated_git

from longctx.errors import SourceError
from longctx.options.groups import CorpusOptions
from longctx.sources import git as git_module
from longctx.sources import repo as repo_module
from longctx.sources.corpus import Corpus, load_corpus

__all__ = ["isolated_git"]  # imported so that it is autouse here


def _write(root: Path, relative: str, content: str | bytes = "x\n") -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def _git_listing(repo: Path) -> set[str]:
    output = git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    return {path for path in output.split("\0") if path}


def _considered(corpus: Corpus) -> set[str]:
    return {entry.path for entry in corpus.manifest}


def test_the_files_considered_are_exactly_what_git_lists(tmp_path: Path, isolated_git: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    global_excludes = tmp_path / "global-excludes"
    global_excludes.write_text("*.globalignore\n")
    with isolated_git.open("a") as config:
        config.write(f"[core]\n\texcludesFile = {global_excludes}\n")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("*.localexclude\n")
    _write(repo, ".gitignore", "*.log\n/build/\n")
    _write(repo, "src/.gitignore", "generated_*\n!generated_keep.py\n")
    for relative in (
        "src/main.py",
        "src/generated_a.py",
        "src/generated_keep.py",
        "src/deep/generated_b.py",
        "app.log",
        "build/out.js",
        "src/build/kept.js",  # /build/ is anchored at the root
        "notes.globalignore",
        "scratch.localexclude",
        "README.md",
    ):
        _write(repo, relative)
    git(repo, "add", ".gitignore", "src/.gitignore", "src/main.py", "README.md")
    git(repo, "add", "-f", "app.log")  # tracked although ignored: git lists it
    commit(repo, "first", when=1_600_000_000)
    _write(repo, "untracked.py")

    corpus = load_corpus([repo])
    assert _considered(corpus) == _git_listing(repo)
    assert {"app.log", "untracked.py", "src/generated_keep.py", "src/build/kept.js"} <= _considered(corpus)
    assert corpus.head_sha == git(repo, "rev-parse", "HEAD").strip()
    assert corpus.ordering == "stability"
    assert corpus.root == "repo"


def test_last_commit_times_dirty_files_and_stability_order(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    _write(repo, "old.py", "old\n")
    _write(repo, "also_old.py", "old too\n")
    _write(repo, "changed.py", "v1\n")
    _write(repo, "staged.py", "v1\n")
    _write(repo, "deleted.py", "v1\n")
    git(repo, "add", ".")
    commit(repo, "one", when=1_000_000_000)
    _write(repo, "middle.py", "middle\n")
    _write(repo, "changed.py", "v2\n")
    git(repo, "add", ".")
    commit(repo, "two", when=1_100_000_000)
    commit(repo, "empty commit", when=1_150_000_000)
    _write(repo, "new.py", "new\n")
    git(repo, "add", ".")
    commit(repo, "three", when=1_200_000_000)
    # Working tree changes.
    _write(repo, "changed.py", "v3, not committed\n")
    _write(repo, "staged.py", "v2, staged\n")
    git(repo, "add", "staged.py")
    (repo / "deleted.py").unlink()
    _write(repo, "untracked.py", "untracked\n")

    corpus = load_corpus([repo])
    facts = {d.path: (d.last_commit_time, d.dirty) for d in corpus.documents}
    assert facts == {
        "also_old.py": (1_000_000_000, False),
        "old.py": (1_000_000_000, False),
        "middle.py": (1_100_000_000, False),
        "new.py": (1_200_000_000, False),
        "changed.py": (1_100_000_000, True),
        "staged.py": (1_000_000_000, True),
        "untracked.py": (None, True),
    }
    assert [d.path for d in corpus.documents] == [
        "also_old.py",
        "old.py",
        "middle.py",
        "new.py",
        "changed.py",  # dirty files last, by path
        "staged.py",
        "untracked.py",
    ]
    deleted = corpus.manifest.get("deleted.py")
    assert deleted is not None
    assert (deleted.status, deleted.reason, deleted.notes) == (
        "skipped",
        "unreadable",
        ("deleted in the working tree",),
    )
    path_order = load_corpus([repo], CorpusOptions(ordering="path"))
    assert [d.path for d in path_order.documents] == sorted(facts)


def test_history_is_read_back_to_the_oldest_file(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    _write(repo, "ancient.txt", "a\n")
    git(repo, "add", ".")
    commit(repo, "ancient", when=1_000_000_000)
    for number in range(60):
        _write(repo, "busy.txt", f"{number}\n")
        _write(repo, f"file{number:02d}.txt", f"{number}\n")
        git(repo, "add", ".")
        commit(repo, f"change {number}", when=1_000_000_100 + number)
    times = {d.path: d.last_commit_time for d in load_corpus([repo]).documents}
    assert times["ancient.txt"] == 1_000_000_000
    assert times["busy.txt"] == 1_000_000_159
    assert times["file00.txt"] == 1_000_000_100
    assert times["file59.txt"] == 1_000_000_159


def test_a_folder_inside_a_repository_is_the_repository_restricted_to_it(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    _write(repo, ".gitignore", "*.tmp\n")
    _write(repo, "pkg/[literal]/mod.py", "m\n")
    _write(repo, "pkg/l/other.py", "o\n")  # would match "[literal]" taken as a glob
    _write(repo, "pkg/[literal]/junk.tmp")
    _write(repo, "outside.py")
    git(repo, "add", ".")
    commit(repo, "c", when=1_500_000_000)
    corpus = load_corpus([repo / "pkg" / "[literal]"])
    assert [(d.path, d.last_commit_time) for d in corpus.documents] == [("mod.py", 1_500_000_000)]
    assert _considered(corpus) == {"mod.py"}
    assert corpus.root == "[literal]"
    assert corpus.head_sha == git(repo, "rev-parse", "HEAD").strip()


def test_a_folder_git_could_find_no_repository_from_is_told_without_starting_git(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = tmp_path / "plain" / "docs"
    plain.mkdir(parents=True)
    repo = init_repo(tmp_path / "repo")
    _write(repo, "pkg/mod.py")
    git(repo, "add", ".")
    commit(repo, "c", when=1_500_000_000)
    git(repo, "worktree", "add", "-q", str(tmp_path / "linked"))  # a work tree whose .git is a file
    git(tmp_path, "init", "-q", "--bare", "bare.git")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folders = [plain, repo, repo / "pkg", repo / ".git", repo / ".git" / "refs", tmp_path / "linked" / "pkg"]
    folders += [tmp_path / "bare.git", tmp_path / "bare.git" / "refs", elsewhere]

    def found(folder: Path) -> repo_module.RepositoryRoot | None:
        return repo_module.find_repository(str(folder))

    with_check = [found(folder) for folder in folders]
    with monkeypatch.context() as always:
        always.setattr(repo_module, "could_find_repository", lambda target: True)
        assert [found(folder) for folder in folders] == with_check  # what git itself says, folder by folder
    assert with_check[1:3] == [
        repo_module.RepositoryRoot(str(repo.resolve()), ""),
        repo_module.RepositoryRoot(str(repo.resolve()), "pkg"),
    ]
    assert with_check[5] == repo_module.RepositoryRoot(str((tmp_path / "linked").resolve()), "pkg")

    started: list[tuple[str, ...]] = []
    real_probe = git_module.probe

    def probe(*args: str) -> git_module.GitResult | None:
        started.append(args)
        return real_probe(*args)

    monkeypatch.setattr(repo_module, "probe", probe)
    assert found(plain) is None and found(elsewhere) is None and started == []
    assert repo_module.repository_state(str(plain)) is None and started == []
    assert found(repo / "pkg") == with_check[2] and len(started) == 1
    # A variable can name a repository from anywhere: then git is asked.
    monkeypatch.setenv("GIT_DIR", str(repo / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(tmp_path))
    assert found(elsewhere) == repo_module.RepositoryRoot(str(tmp_path.resolve()), "elsewhere")


def test_a_folder_git_ignores_is_read_as_a_plain_folder(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    _write(repo, ".gitignore", "build/\n")
    _write(repo, "build/report.txt", "generated\n")
    git(repo, "add", ".")
    commit(repo, "c", when=1_500_000_000)
    corpus = load_corpus([repo / "build"])
    assert [d.path for d in corpus.documents] == ["report.txt"]
    assert corpus.ordering == "path"
    assert corpus.head_sha is None


def test_a_repository_without_commits(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    _write(repo, "a.py")
    _write(repo, "b.py")
    git(repo, "add", "a.py")
    corpus = load_corpus([repo])
    assert corpus.head_sha is None
    assert corpus.ordering == "stability"
    assert [(d.path, d.last_commit_time, d.dirty) for d in corpus.documents] == [
        ("a.py", None, True),
        ("b.py", None, True),
    ]


def test_names_with_spaces_newlines_unicode_and_undecodable_bytes_survive(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    names = [
        "with space.txt",
        "new\nline.txt",
        "ünïcödé.md",
        "tab\there.txt",
        '"quoted".txt',
        "back\\slash.txt",
    ]
    for name in names:
        _write(repo, name, f"{name!r}\n")
    undecodable = os.fsdecode(b"latin\xe9.txt")
    (repo / undecodable).write_text("latin\n")
    git(repo, "add", ".")
    commit(repo, "names", when=1_500_000_000)
    _write(repo, "untracked new\nline.txt")
    corpus = load_corpus([repo])
    paths = {d.path for d in corpus.documents}
    assert paths == {*names, undecodable, "untracked new\nline.txt"}
    assert all(d.last_commit_time == 1_500_000_000 for d in corpus.documents if d.path in names)
    assert "\\udce9" in corpus.manifest.to_json()


def test_submodules_and_nested_repositories_are_listed_not_entered(tmp_path: Path) -> None:
    library = init_repo(tmp_path / "library")
    _write(library, "lib.py", "library code\n")
    git(library, "add", ".")
    commit(library, "lib", when=1_400_000_000)
    repo = init_repo(tmp_path / "repo")
    _write(repo, "main.py")
    git(repo, "add", ".")
    commit(repo, "main", when=1_500_000_000)
    git(repo, "submodule", "add", "-q", str(library), "vendor/library")
    commit(repo, "add submodule", when=1_500_000_100)
    nested = init_repo(repo / "experiments")
    _write(nested, "trial.py")

    corpus = load_corpus([repo])
    statuses = {entry.path: (entry.status, entry.reason) for entry in corpus.manifest}
    assert statuses == {
        ".gitmodules": ("included", None),
        "main.py": ("included", None),
        "vendor/library/": ("skipped", "submodule"),
        "experiments/": ("skipped", "submodule"),
    }


def test_lfs_pointers_and_links_to_folders(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    _write(repo, "weights.bin", LFS_POINTER)
    _write(repo, "docs/guide.md", "# Guide\n")
    os.symlink("docs", repo / "docs-link")
    os.symlink("docs/guide.md", repo / "guide-link.md")
    git(repo, "add", ".")
    commit(repo, "c", when=1_500_000_000)
    corpus = load_corpus([repo])
    statuses = {entry.path: (entry.status, entry.reason) for entry in corpus.manifest}
    assert statuses == {
        "weights.bin": ("skipped", "lfs-pointer"),
        "docs/guide.md": ("included", None),
        "docs-link": ("skipped", "not-a-regular-file"),
        "guide-link.md": ("included", None),
    }
    folder_link = corpus.manifest.get("docs-link")
    assert folder_link is not None and folder_link.notes == ("link to the folder docs/",)


def test_longctxignore_applies_inside_a_repository(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    _write(repo, ".longctxignore", "fixtures/\n")
    _write(repo, "pkg/.longctxignore", "*.snap\n")
    _write(repo, "fixtures/data.json", "{}\n")
    _write(repo, "pkg/test.snap")
    _write(repo, "pkg/code.py")
    git(repo, "add", ".")
    commit(repo, "c", when=1_500_000_000)
    assert _considered(load_corpus([repo])) == {".longctxignore", "pkg/.longctxignore", "pkg/code.py"}
    # The root's .longctxignore also applies when only a folder below is loaded.
    _write(repo, "pkg/fixtures/x.py")
    assert _considered(load_corpus([repo / "pkg"])) == {".longctxignore", "code.py"}


def test_a_broken_repository_raises_source_error(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    _write(repo, "a.py")
    git(repo, "add", ".")
    commit(repo, "c", when=1_500_000_000)
    (repo / ".git" / "index").write_bytes(b"garbage, not an index")
    with pytest.raises(SourceError, match=r"git ls-files failed \(exit 128\): .*index") as raised:
        load_corpus([repo])
    assert raised.value.path == str(repo)
    # str() is the CLI's line: the repository, then what failed.
    assert str(raised.value) == f"{repo}: {raised.value.message}"
    assert raised.value.message.startswith("git ls-files failed (exit 128): ")
