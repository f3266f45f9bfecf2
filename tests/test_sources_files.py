"""Plain folders: ignore files, links, special files, unreadable files."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from corpus_fixtures import LFS_POINTER

from longctx.errors import SourceError
from longctx.options.groups import CorpusOptions
from longctx.sources import Candidate, Skip
from longctx.sources.corpus import Corpus, Limits, SkipReason, load_corpus
from longctx.sources.reading import FileReader


def _statuses(corpus: Corpus) -> dict[str, tuple[str, str | None]]:
    return {entry.path: (entry.status, entry.reason) for entry in corpus.manifest}


def _write(root: Path, relative: str, content: str | bytes = "x\n") -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def test_nested_gitignore_and_longctxignore_follow_git_precedence(tmp_path: Path) -> None:
    _write(tmp_path, ".gitignore", "*.log\nbuild/\n/top-only.txt\n")
    _write(tmp_path, "app.log")
    _write(tmp_path, "build/out.js")
    _write(tmp_path, "top-only.txt")
    _write(tmp_path, "sub/top-only.txt")  # anchored pattern: only at the root
    _write(tmp_path, "sub/.gitignore", "!keep.log\n")
    _write(tmp_path, "sub/keep.log")  # re-included by the deeper file
    _write(tmp_path, "sub/drop.log")
    _write(tmp_path, ".longctxignore", "docs/drafts/\n*.tmp\n")
    _write(tmp_path, "docs/drafts/wip.md")
    _write(tmp_path, "docs/final.md")
    _write(tmp_path, "notes.tmp")
    _write(tmp_path, "other/.longctxignore", "!special.tmp\n")
    _write(tmp_path, "other/special.tmp")
    _write(tmp_path, "src/main.py", "print('hi')\n")

    corpus = load_corpus([tmp_path])
    assert sorted(_statuses(corpus)) == sorted(
        [
            ".gitignore",
            ".longctxignore",
            "docs/final.md",
            "other/.longctxignore",
            "other/special.tmp",
            "src/main.py",
            "sub/.gitignore",
            "sub/keep.log",
            "sub/top-only.txt",
        ]
    )
    assert corpus.ordering == "path"
    assert corpus.head_sha is None


def test_a_dot_git_entry_is_never_content(tmp_path: Path) -> None:
    _write(tmp_path, ".git", "gitdir: ../elsewhere\n")  # a worktree's .git file
    _write(tmp_path, "vendor/.git/config", "[core]\n")
    _write(tmp_path, "vendor/lib.py")
    # Neither .git is a usable repository, so the top is read as a plain folder.
    statuses = _statuses(load_corpus([tmp_path]))
    assert statuses == {"vendor/lib.py": ("included", None)}


def test_invalid_ignore_patterns_are_skipped_like_git_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write(tmp_path, ".gitignore", "!\n*.log\n")
    _write(tmp_path, "a.log")
    _write(tmp_path, "a.txt")
    corpus = load_corpus([tmp_path])
    assert set(_statuses(corpus)) == {".gitignore", "a.txt"}
    assert "invalid pattern" in caplog.text


def test_links_inside_the_root_are_followed_and_loops_and_escapes_are_reported(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = _write(tmp_path, "outside/secret-plan.txt", "OUTSIDE-CONTENT\n")
    _write(root, "real/file.txt", "real content\n")
    os.symlink("real/file.txt", root / "file-link.txt")
    os.symlink("real", root / "dir-link")
    os.symlink("..", root / "real" / "up")  # a loop: real/up/real/up/...
    os.symlink(".", root / "here")  # a loop on the root itself
    os.symlink(outside, root / "escape.txt")
    os.symlink(outside.parent, root / "escape-dir")
    os.symlink("self", root / "self")
    os.symlink("missing.txt", root / "dangling.txt")

    corpus = load_corpus([root])
    statuses = _statuses(corpus)
    assert statuses == {
        "real/file.txt": ("included", None),
        "file-link.txt": ("included", None),
        "dir-link/file.txt": ("included", None),
        "dir-link/up": ("skipped", "symlink-loop"),
        "real/up": ("skipped", "symlink-loop"),
        "here": ("skipped", "symlink-loop"),
        "escape.txt": ("skipped", "symlink-outside-root"),
        "escape-dir": ("skipped", "symlink-outside-root"),
        "self": ("skipped", "symlink-loop"),
        "dangling.txt": ("skipped", "unreadable"),
    }
    link = corpus.manifest.get("file-link.txt")
    assert link is not None and link.notes == ("symbolic link to real/file.txt",)
    texts = {document.path: document.text for document in corpus.documents}
    assert texts["file-link.txt"] == texts["real/file.txt"] == "real content\n"
    manifest_json = corpus.manifest.to_json()
    assert "OUTSIDE-CONTENT" not in manifest_json
    assert all("OUTSIDE-CONTENT" not in document.text for document in corpus.documents)
    assert str(tmp_path) not in manifest_json


def test_a_fifo_is_listed_as_not_a_regular_file_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    _write(tmp_path, "a.txt")
    entry = load_corpus([tmp_path]).manifest.get("pipe")
    assert entry is not None
    assert (entry.status, entry.reason, entry.notes) == ("skipped", "not-a-regular-file", ("a FIFO",))


def test_an_unreadable_file_is_skipped_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Simulated: tests run as root, where chmod 000 does not stop reads, so opening this one file fails."""
    locked = _write(tmp_path, "locked.txt", "private\n")
    _write(tmp_path, "open.txt", "public\n")
    real_open = os.open

    def refusing_open(path: str, flags: int, *args: int, **kwargs: int) -> int:
        if os.fspath(path) == str(locked):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)
    corpus = load_corpus([tmp_path])
    entry = corpus.manifest.get("locked.txt")
    assert entry is not None
    assert (entry.status, entry.reason, entry.notes) == ("skipped", "unreadable", ("Permission denied",))
    assert [document.path for document in corpus.documents] == ["open.txt"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_a_file_without_read_permission_is_unreadable(tmp_path: Path) -> None:
    locked = _write(tmp_path, "locked.txt", "private\n")
    locked.chmod(0)
    try:
        entry = load_corpus([tmp_path]).manifest.get("locked.txt")
    finally:
        locked.chmod(0o644)
    assert entry is not None and entry.reason == "unreadable"


def test_a_folder_that_cannot_be_listed_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulated like the unreadable file: listing this one folder fails."""
    _write(tmp_path, "closed/inside.txt")
    _write(tmp_path, "a.txt")
    real_scandir = os.scandir

    def refusing_scandir(path: str) -> object:
        if os.fspath(path).endswith("closed"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", refusing_scandir)
    statuses = _statuses(load_corpus([tmp_path]))
    assert statuses == {"a.txt": ("included", None), "closed/": ("skipped", "unreadable")}


def test_the_root_that_cannot_be_listed_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_scandir = os.scandir

    def refusing_scandir(path: str) -> object:
        if os.fspath(path) == str(tmp_path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", refusing_scandir)
    with pytest.raises(SourceError, match="cannot list folder: Permission denied") as raised:
        load_corpus([tmp_path])
    assert raised.value.path == str(tmp_path)


def test_size_limit_per_file(tmp_path: Path) -> None:
    _write(tmp_path, "big.txt", "x" * 2000)
    _write(tmp_path, "small.txt", "x" * 10)
    corpus = load_corpus([tmp_path], CorpusOptions(limits=Limits(max_file_bytes=1000)))
    entry = corpus.manifest.get("big.txt")
    assert entry is not None
    assert (entry.reason, entry.size_bytes, entry.notes) == (
        "too-large",
        2000,
        ("2000 bytes; the limit is 1000",),
    )
    assert [document.path for document in corpus.documents] == ["small.txt"]


def test_the_default_file_limit_keeps_a_large_source_file(tmp_path: Path) -> None:
    _write(tmp_path, "generated_tables.py", "TABLE = [\n" + "    0x1234,\n" * 200_000 + "]\n")  # 2.4 MB
    corpus = load_corpus([tmp_path])
    assert [document.path for document in corpus.documents] == ["generated_tables.py"]


def test_binary_content_decides_not_the_extension(tmp_path: Path) -> None:
    _write(tmp_path, "picture.png", "this png is actually text\n")
    _write(tmp_path, "notes.txt", b"text with a \x00 NUL byte\n")
    _write(tmp_path, "real.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00")
    statuses = _statuses(load_corpus([tmp_path]))
    assert statuses == {
        "picture.png": ("included", None),
        "notes.txt": ("skipped", "binary"),
        "real.png": ("skipped", "binary"),
    }


def test_kinds(tmp_path: Path) -> None:
    for name in ("a.py", "b.md", "c.txt", "README", "Makefile", "d.rst", "e.yaml"):
        _write(tmp_path, name)
    kinds = {document.path: document.kind for document in load_corpus([tmp_path]).documents}
    assert kinds == {
        "a.py": "code",
        "b.md": "markdown",
        "c.txt": "text",
        "README": "text",
        "Makefile": "code",
        "d.rst": "text",
        "e.yaml": "code",
    }


def test_lfs_pointer_outside_a_repository_is_still_a_pointer(tmp_path: Path) -> None:
    _write(tmp_path, "model.bin", LFS_POINTER)
    _write(tmp_path, "README.md", "# Model\n")  # a corpus of skips alone is an error (EmptyCorpus)
    entry = load_corpus([tmp_path]).manifest.get("model.bin")
    assert entry is not None and entry.reason == "lfs-pointer"


def test_a_folder_on_the_way_that_leads_outside_the_root_is_not_followed(tmp_path: Path) -> None:
    """A candidate whose parent folder became a link out of the root (git lists a/b.txt, a is now a link)."""
    root = tmp_path / "root"
    root.mkdir()
    outside = _write(tmp_path, "outside/b.txt", "OUTSIDE-CONTENT\n")
    os.symlink(outside.parent, root / "a")
    reader = FileReader(max_file_bytes=1024, allow_secrets=False)
    result = reader.read(Candidate(path="a/b.txt", location=str(root / "a" / "b.txt"), root_real=str(root)))
    assert result == Skip(
        "a/b.txt", SkipReason.SYMLINK_OUTSIDE_ROOT, ("a folder on its path links outside the root",)
    )


def test_a_link_passed_directly_is_followed_and_named_by_the_link(tmp_path: Path) -> None:
    target = _write(tmp_path, "elsewhere/real-name.md", "# Real\n")
    link = tmp_path / "link.md"
    os.symlink(target, link)
    corpus = load_corpus([link])
    assert [(d.path, d.text) for d in corpus.documents] == [("link.md", "# Real\n")]
    secret_target = _write(tmp_path, "elsewhere/.env", "A=1\n")
    innocent = tmp_path / "settings.txt"
    os.symlink(secret_target, innocent)
    entry = load_corpus([innocent, link]).manifest.get("settings.txt")
    assert entry is not None and (entry.reason, entry.notes) == ("secret", ("file name matches dotenv-file",))


def test_outside_git_the_folders_tools_make_are_one_entry_each_unless_asked_for(tmp_path: Path) -> None:
    _write(tmp_path, "app.py", "print('app')\n")
    _write(tmp_path, ".venv/lib/site.py")
    _write(tmp_path, "env/pyvenv.cfg", "home = /usr/bin\n")  # a virtual environment by another name
    _write(tmp_path, "env/lib/os.py")
    _write(tmp_path, "web/node_modules/left-pad/index.js")
    _write(tmp_path, "pkg/__pycache__/mod.cpython-311.pyc", b"\x00\x01")
    _write(tmp_path, "pkg/mod.py")
    _write(tmp_path, ".tox/py311/log.txt")
    _write(tmp_path, "venv/__init__.py")  # a package named venv (the stdlib has one) is content
    corpus = load_corpus(tmp_path)
    default = "ignored-by-default"
    assert _statuses(corpus) == {
        ".tox/": ("skipped", default),
        ".venv/": ("skipped", default),
        "app.py": ("included", None),
        "env/": ("skipped", default),
        "pkg/__pycache__/": ("skipped", default),
        "pkg/mod.py": ("included", None),
        "venv/__init__.py": ("included", None),
        "web/node_modules/": ("skipped", default),
    }
    entry = corpus.manifest.get(".venv/")
    assert entry is not None and "--no-default-ignores" in entry.notes[0]
    everything = load_corpus(tmp_path, CorpusOptions(default_ignores=False))
    assert {entry.path for entry in everything.manifest.included} >= {
        ".venv/lib/site.py",
        "env/lib/os.py",
        "web/node_modules/left-pad/index.js",
        ".tox/py311/log.txt",
    }
    assert everything.manifest.get("pkg/__pycache__/mod.cpython-311.pyc") is not None


def test_a_gitignore_that_already_ignores_a_tool_folder_keeps_it_out_of_the_manifest(tmp_path: Path) -> None:
    _write(tmp_path, ".gitignore", "node_modules/\n")
    _write(tmp_path, "node_modules/x.js")
    _write(tmp_path, "a.py")
    assert _statuses(load_corpus(tmp_path)) == {".gitignore": ("included", None), "a.py": ("included", None)}
