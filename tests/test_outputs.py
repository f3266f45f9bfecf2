"""Pack.save (longctx.outputs): a pack is saved whole or not at all; a file that holds it is left alone."""

from __future__ import annotations

import errno
import io
import os
import stat
import threading
from pathlib import Path
from typing import BinaryIO

import pytest
from corpus_fixtures import commit, git, init_repo, isolated_git

from longctx import outputs
from longctx.errors import OutputError
from longctx.packing import Pack, build_pack, pack
from longctx.sources.corpus import load_corpus
from longctx.store import Store
from longctx.tokens.tokenizers import EstimateTokenizer

__all__ = ["isolated_git"]  # imported so that it is autouse here


def a_pack(folder: Path, text: str = "print('hello')\n") -> Pack:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "app.py").write_text(text)
    (folder / "notes.md").write_text("# Notes\n\nÜber alles: ünïcödé.\n")
    return build_pack(load_corpus(folder), tokenizer=EstimateTokenizer())


def pack_bytes(built: Pack) -> bytes:
    stream = io.BytesIO()
    built.write_to(stream)
    return stream.getvalue()


def leftovers(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.endswith(".tmp"))


def test_a_new_file_gets_exactly_the_pack_and_no_temporary_file_stays(tmp_path: Path) -> None:
    built = a_pack(tmp_path / "corpus")
    target = tmp_path / "out" / "pack.txt"
    target.parent.mkdir()

    saved = built.save(target)

    assert target.read_bytes() == pack_bytes(built)
    assert saved.size == built.size_bytes == len(pack_bytes(built))
    assert saved.unchanged is False
    assert saved.path == str(target)
    assert leftovers(target.parent) == []
    # A new file gets open()'s mode: 0o666 less the umask.
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask


def test_a_file_that_already_holds_the_pack_is_left_untouched(tmp_path: Path) -> None:
    built = a_pack(tmp_path / "corpus")
    target = tmp_path / "pack.txt"
    built.save(target)
    os.utime(target, ns=(1_000_000_000, 1_000_000_000))
    before = target.stat()

    saved = built.save(target)

    after = target.stat()
    assert saved.unchanged is True
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert target.read_bytes() == pack_bytes(built)


def test_a_file_of_the_same_size_but_other_bytes_is_replaced(tmp_path: Path) -> None:
    built = a_pack(tmp_path / "corpus")
    expected = pack_bytes(built)
    target = tmp_path / "pack.txt"
    # Same length, one byte different, near the end: every chunk is compared.
    target.write_bytes(expected[:-2] + b"#" + expected[-1:])

    saved = built.save(target)

    assert saved.unchanged is False
    assert target.read_bytes() == expected


def test_a_larger_pack_than_one_compare_read_is_compared_whole(tmp_path: Path) -> None:
    body = "".join(f"line_{number} = {number}\n" for number in range(40_000))  # > COMPARE_BYTES
    built = a_pack(tmp_path / "corpus", body)
    expected = pack_bytes(built)
    assert len(expected) > 2 * outputs.COMPARE_BYTES
    target = tmp_path / "pack.txt"
    middle = outputs.COMPARE_BYTES + 17
    target.write_bytes(expected[:middle] + b"X" + expected[middle + 1 :])

    assert built.save(target).unchanged is False
    assert target.read_bytes() == expected
    assert built.save(target).unchanged is True


def test_the_permission_bits_of_a_replaced_file_are_kept(tmp_path: Path) -> None:
    built = a_pack(tmp_path / "corpus")
    target = tmp_path / "pack.txt"
    target.write_text("an older, shorter pack\n")
    target.chmod(0o640)

    built.save(target)

    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert target.read_bytes() == pack_bytes(built)


def test_a_symbolic_link_is_written_through(tmp_path: Path) -> None:
    built = a_pack(tmp_path / "corpus")
    real = tmp_path / "real" / "pack.txt"
    real.parent.mkdir()
    real.write_text("old\n")
    link = tmp_path / "pack-link.txt"
    link.symlink_to(real)

    built.save(link)

    assert link.is_symlink()
    assert real.read_bytes() == pack_bytes(built)
    assert leftovers(real.parent) == [] and leftovers(tmp_path) == []


def test_a_fifo_is_written_as_it_is(tmp_path: Path) -> None:
    built = a_pack(tmp_path / "corpus")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()

    saved = built.save(fifo)
    reader.join(timeout=10)

    assert received == [pack_bytes(built)]
    assert saved.unchanged is False
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "pack.txt"
    target.write_bytes(b"the pack of yesterday\n")

    def half_then_full_disk(stream: BinaryIO) -> int:
        stream.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OutputError) as raised:
        outputs.save(target, 2000, lambda: [b"y" * 2000], half_then_full_disk)

    assert "No space left on device" in str(raised.value)
    assert raised.value.path == str(target)
    assert target.read_bytes() == b"the pack of yesterday\n"
    assert leftovers(tmp_path) == []


def test_a_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    built = a_pack(tmp_path / "corpus")
    target = tmp_path / "no-such-folder" / "pack.txt"

    with pytest.raises(OutputError, match="cannot write the output: No such file or directory") as raised:
        built.save(target)

    assert raised.value.path == str(target)


def test_a_folder_that_refuses_new_files_gets_the_file_written_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A writable file in a folder the user may not create files in (a shared
    # output). Root ignores folder permissions, so the refusal is injected.
    built = a_pack(tmp_path / "corpus")
    target = tmp_path / "pack.txt"
    target.write_text("old\n")
    real_open = os.open

    def refuse_temporary_files(path: str, flags: int, mode: int = 0o777) -> int:
        if str(path).endswith(".tmp"):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", refuse_temporary_files)
    inode = target.stat().st_ino

    saved = built.save(target)

    assert saved.unchanged is False
    assert target.read_bytes() == pack_bytes(built)
    assert target.stat().st_ino == inode


def test_a_writer_that_writes_the_wrong_count_is_caught_before_the_file_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.write_bytes(b"old")
    with pytest.raises(OutputError, match="wrote 3 bytes where 5 were expected"):
        outputs.save(target, 5, lambda: [b"abcde"], lambda stream: stream.write(b"abc"))
    assert target.read_bytes() == b"old"
    assert leftovers(tmp_path) == []


def test_a_pack_read_back_from_the_store_is_compared_from_the_stored_file(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo")
    (repo / "app.py").write_text("def main():\n    return 42\n" * 20_000)  # > COMPARE_BYTES
    git(repo, "add", "-A")
    commit(repo, "first", when=1_700_000_000)
    target = tmp_path / "pack.txt"
    with Store.open(tmp_path / "home") as store:
        first = pack(repo, tokenizer=EstimateTokenizer(), store=store)
        assert first.pack.save(target).unchanged is False
        again = pack(repo, tokenizer=EstimateTokenizer(), store=store)
        assert again.reused

        assert again.pack.size_bytes == first.pack.size_bytes
        assert again.pack.save(target).unchanged is True
        expected = target.read_bytes()
        target.write_bytes(expected[:-1] + b"!")
        assert again.pack.save(target).unchanged is False
        assert target.read_bytes() == expected == pack_bytes(first.pack)
