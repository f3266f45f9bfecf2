"""The one git runner: output byte for byte, failures as SourceError naming the command."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import pytest
from corpus_fixtures import commit, git, init_repo, isolated_git

from longctx.errors import SourceError
from longctx.sources.git import GitResult, GitRunner, decode_path, probe, probe_together, split_records

__all__ = ["isolated_git"]  # imported so that it is autouse here

# Not UTF-8, a NUL, and trailing blank lines: nothing may be decoded, stripped or translated.
_AWKWARD = b"\xff\xfe not utf-8\0\r\nline\n\n\n"


def _repository(path: Path) -> tuple[Path, str]:
    repo = init_repo(path)
    (repo / "awkward.bin").write_bytes(_AWKWARD)
    git(repo, "add", "awkward.bin")
    commit(repo, "c", when=1_500_000_000)
    return repo, git(repo, "rev-parse", "HEAD:awkward.bin").strip()


def test_output_is_bytes_exact(tmp_path: Path) -> None:
    repo, blob = _repository(tmp_path / "repo")
    runner = GitRunner(str(repo), "shown/path")

    result = runner.run("cat-file", "blob", blob)
    assert result == GitResult(0, _AWKWARD, b"")
    with closing(runner.stream("cat-file", "blob", blob)) as chunks:
        assert b"".join(chunks) == _AWKWARD
    batch = runner.run("cat-file", "--batch", input=f"{blob}\n".encode()).stdout
    assert batch == f"{blob} blob {len(_AWKWARD)}\n".encode() + _AWKWARD + b"\n"
    assert probe(str(repo), "cat-file", "blob", blob) == GitResult(0, _AWKWARD, b"")


def test_a_failing_command_raises_source_error_naming_it(tmp_path: Path) -> None:
    repo, _ = _repository(tmp_path / "repo")
    runner = GitRunner(str(repo), "shown/path")

    failed = r"^shown/path: git rev-parse failed \(exit 128\): fatal: .*"
    with pytest.raises(SourceError, match=failed) as raised:
        runner.run("rev-parse", "--verify", "no-such-branch^{commit}")
    assert raised.value.path == "shown/path"
    with (
        pytest.raises(SourceError, match=r"^shown/path: git log failed \(exit 128\): fatal: "),
        closing(runner.stream("log", "no-such-branch")) as chunks,
    ):
        list(chunks)
    # An exit status the caller allows is a result, not an error.
    allowed = runner.run("rev-parse", "-q", "--verify", "no-such-branch^{commit}", allowed_exit_codes=(0, 1))
    assert (allowed.returncode, allowed.stdout) == (1, b"")


def test_a_stream_closed_early_stops_git_without_error(tmp_path: Path) -> None:
    repo, _ = _repository(tmp_path / "repo")
    runner = GitRunner(str(repo), "shown/path")
    for number in range(20):
        (repo / f"file_{number}.txt").write_text("x\n" * 10_000 + str(number))
        git(repo, "add", "-A")
        commit(repo, f"c{number}", when=1_500_000_000 + number)
    with closing(runner.stream("log", "-p", "-z")) as chunks:
        assert next(chunks)  # the rest is never read


def test_probes_answer_failure_with_a_result_and_no_git_with_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, _ = _repository(tmp_path / "repo")
    top, missing = probe_together(
        str(repo), [("rev-parse", "--show-toplevel"), ("rev-parse", "--verify", "nope")]
    )
    assert top is not None and top.returncode == 0 and top.stdout.endswith(b"\n")
    assert missing is not None and missing.returncode == 128 and missing.stderr
    assert probe(str(tmp_path / "no-such-folder"), "status") is None
    GitRunner(str(repo), "shown/path").run("status")  # GitPython imported before git goes missing
    monkeypatch.setenv("GIT_PYTHON_GIT_EXECUTABLE", str(tmp_path / "no-such-git"))
    assert probe(str(repo), "status") is None
    with pytest.raises(SourceError, match=r"^shown/path: git is not installed or not on PATH$"):
        GitRunner(str(repo), "shown/path").run("status")


def test_records_and_paths_keep_every_byte() -> None:
    assert split_records(b"a\0b c\0\0d\0") == [b"a", b"b c", b"", b"d"]
    assert split_records(b"") == []
    name = b"caf\xc3\xa9 \xff.txt"
    assert decode_path(name) == "café \udcff.txt"
    assert decode_path(name).encode("utf-8", "surrogateescape") == name
