"""store.caches and store.blobs: each cached value reads back as saved, under its own key only, and the
limits on what is kept hold (longctx.store.caches, longctx.store.blobs)."""

from __future__ import annotations

import contextlib
import gc
import io
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from longctx.errors import StoreError
from longctx.store import Store, StoredPackIds, StoredText

# Each test on both stores: the SQLite file, and a PostgreSQL server (tests/store_backends.py).
pytestmark = pytest.mark.usefixtures("store_backend")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "home") as opened:
        yield opened


def test_token_counts_are_kept_per_tokenizer_and_found_past_the_parameter_limit(store: Store) -> None:
    counts = {f"{index:064x}": index + 1 for index in range(1203)}
    store.caches.save_token_counts("t1", counts)
    store.caches.save_token_counts("t2", {f"{5:064x}": 99})
    store.caches.save_token_counts("t2", {})
    wanted = [*counts, f"{5:064x}", "f" * 64]  # a repeat and an unknown one
    assert store.caches.token_counts("t1", wanted) == counts
    assert store.caches.token_counts("t2", wanted) == {f"{5:064x}": 99}
    assert store.caches.token_counts("t3", wanted) == {}
    store.caches.save_token_counts("t1", {f"{0:064x}": 42})  # a count saved again replaces the old
    assert store.caches.token_counts("t1", [f"{0:064x}"]) == {f"{0:064x}": 42}


def test_a_packs_ids_read_back_exactly_per_tokenizer_and_pack(store: Store) -> None:
    ids = StoredPackIds(head=(0, 1, 255, 256, 65535, 2**31 - 1, 151_643), after_user=(151_645, 198))
    assert store.caches.pack_ids("tok", "fp") is None
    store.caches.save_pack_ids("tok", "fp", ids)
    assert store.caches.pack_ids("tok", "fp") == ids
    assert store.caches.pack_ids("tok", "other") is None and store.caches.pack_ids("other", "fp") is None
    rows = store.database.query("SELECT head FROM prompt_ids")
    assert bytes(rows[0]["head"])[:12] == bytes([0, 0, 0, 0, 1, 0, 0, 0, 255, 0, 0, 0])  # int32 little-endian
    store.caches.save_pack_ids("tok", "fp", StoredPackIds((7,), ()))
    assert store.caches.pack_ids("tok", "fp") == StoredPackIds((7,), ())


def test_a_pdf_text_keeps_its_lone_surrogates_pages_and_notes(store: Store) -> None:
    record = {"text": "page one \ud800 caf\u00e9", "page_count": 3, "notes": ["page 2 has no text"]}
    assert store.caches.pdf_text("pypdf 5", "a" * 64) is None
    store.caches.save_pdf_text("pypdf 5", "a" * 64, record)
    # Read back whole, with the pages found unusable (none given: none).
    assert store.caches.pdf_text("pypdf 5", "a" * 64) == {**record, "unusable_pages": []}
    store.caches.save_pdf_text("pypdf 5", "c" * 64, {**record, "unusable_pages": [[2, "no text layer"]]})
    assert store.caches.pdf_text("pypdf 5", "c" * 64) == {**record, "unusable_pages": [[2, "no text layer"]]}
    assert (
        store.caches.pdf_text("pypdf 6", "a" * 64) is None
        and store.caches.pdf_text("pypdf 5", "b" * 64) is None
    )


def test_commit_times_keep_only_the_newest_sets(store: Store) -> None:
    for number in range(5):
        store.caches.save_commit_times(f"key-{number}", {"a.py": number, "b.py": number + 10}, keep=3)
        time.sleep(0.002)
    assert [store.caches.commit_times(f"key-{number}") for number in range(5)] == [
        None,
        None,
        {"a.py": 2, "b.py": 12},
        {"a.py": 3, "b.py": 13},
        {"a.py": 4, "b.py": 14},
    ]
    for number in range(70):
        store.caches.save_commit_times(f"more-{number:02}", {"a.py": number})
    kept = store.database.query("SELECT count(*) FROM commit_times")[0][0]
    assert kept == 64  # the default


def test_special_tokens_are_kept_per_tokenizer_in_order(store: Store) -> None:
    assert store.caches.special_tokens("server:vllm:m:abc") is None
    store.caches.save_special_tokens("server:vllm:m:abc", ["<|im_end|>", "<|im_start|>"])
    store.caches.save_special_tokens("server:vllm:m:def", [])
    assert store.caches.special_tokens("server:vllm:m:abc") == ("<|im_end|>", "<|im_start|>")
    assert store.caches.special_tokens("server:vllm:m:def") == ()


def save_snapshot(store: Store, slot: str, state: str, sections: list[bytes], *, keep: int = 8) -> Path:
    text_file = store.blobs.new_file(slot, state)
    text_file.write_bytes(b"".join(sections))
    store.caches.save_pack_snapshot(
        slot, state, fingerprint=f"fp-{slot}-{state}", summary={"slot": slot, "files": 2},
        manifest={"skipped": [slot]}, text_file=text_file, section_sizes=[len(s) for s in sections],
        keep=keep,
    )  # fmt: skip
    return text_file


def test_a_pack_snapshot_reads_back_for_its_slot_and_state_only(store: Store) -> None:
    sections = [b"header\n", "caf\u00e9\n".encode(), b"listing\n"]
    assert not store.caches.has_pack_snapshot("repo") and store.caches.pack_snapshot("repo", "s1") is None
    partial = save_snapshot(store, "repo", "s1", sections)
    assert not partial.exists()  # moved into place
    snapshot = store.caches.pack_snapshot("repo", "s1")
    assert snapshot is not None
    assert (snapshot.slot, snapshot.state, snapshot.fingerprint) == ("repo", "s1", "fp-repo-s1")
    assert (
        snapshot.summary == {"slot": "repo", "files": 2} and snapshot.manifest_json == '{"skipped": ["repo"]}'
    )
    assert snapshot.section_sizes == (7, 6, 8) and bytes(snapshot.text.view) == b"".join(sections)
    assert store.caches.has_pack_snapshot("repo") and not store.caches.has_pack_snapshot("other")
    assert store.caches.pack_snapshot("repo", "s2") is None
    # A new state replaces the slot's snapshot and its file.
    save_snapshot(store, "repo", "s2", [b"new text"])
    assert store.caches.pack_snapshot("repo", "s1") is None
    again = store.caches.pack_snapshot("repo", "s2")
    assert again is not None and bytes(again.text.view) == b"new text"
    assert sorted(path.name for path in store.blobs.folder.iterdir()) == ["repo-s2.txt"]


def test_a_snapshot_whose_text_is_gone_cut_or_empty_is_not_read_back(store: Store) -> None:
    save_snapshot(store, "gone", "s", [b"abc"])
    (store.blobs.folder / "gone-s.txt").unlink()
    assert store.caches.pack_snapshot("gone", "s") is None
    save_snapshot(store, "cut", "s", [b"abc", b"def"])
    (store.blobs.folder / "cut-s.txt").write_bytes(b"abcde")
    assert store.caches.pack_snapshot("cut", "s") is None
    save_snapshot(store, "empty", "s", [b"", b""])
    assert store.caches.pack_snapshot("empty", "s") is None
    save_snapshot(store, "none", "s", [])
    assert store.caches.pack_snapshot("none", "s") is None
    with pytest.raises(StoreError, match="does not hold the sections' 4 bytes"):
        text_file = store.blobs.new_file("short", "s")
        text_file.write_bytes(b"abc")
        store.caches.save_pack_snapshot(
            "short", "s", fingerprint="f", summary={}, manifest={}, text_file=text_file, section_sizes=[4]
        )
    assert not store.caches.has_pack_snapshot("short")


def test_only_the_newest_snapshots_and_their_files_are_kept(store: Store) -> None:
    for number in range(5):
        save_snapshot(store, f"slot{number}", "s", [f"text {number}".encode()], keep=3)
        time.sleep(0.002)
    kept = [number for number in range(5) if store.caches.has_pack_snapshot(f"slot{number}")]
    assert kept == [2, 3, 4]
    assert sorted(path.name for path in store.blobs.folder.iterdir()) == [
        "slot2-s.txt",
        "slot3-s.txt",
        "slot4-s.txt",
    ]
    for number in range(5, 14):
        save_snapshot(store, f"slot{number}", "s", [b"x"])
    assert sum(store.caches.has_pack_snapshot(f"slot{number}") for number in range(14)) == 8  # the default


def test_a_partial_text_is_left_while_a_save_may_write_it_and_removed_after_an_hour(store: Store) -> None:
    writing = store.blobs.new_file("other", "s")
    abandoned = store.blobs.new_file("dead", "s")
    hour_ago = time.time() - 3601
    os.utime(abandoned, (hour_ago, hour_ago))
    (store.blobs.folder / "stray.txt").write_text("no row points here")
    save_snapshot(store, "repo", "s", [b"abc"])
    assert sorted(path.name for path in store.blobs.folder.iterdir()) == [writing.name, "repo-s.txt"]
    assert writing.name == f"other-s.txt.{os.getpid()}.partial"


def test_a_new_text_file_is_named_for_its_slot_and_state_cut_short_and_empty(store: Store) -> None:
    first = store.blobs.new_file("s" * 40, "t" * 40)
    assert first.name == f"{'s' * 32}-{'t' * 32}.txt.{os.getpid()}.partial"
    first.write_bytes(b"left from a failed save")
    assert store.blobs.new_file("s" * 40, "t" * 40).read_bytes() == b""
    assert store.blobs.keep(first, "s" * 40, "t" * 40, 0) == f"{'s' * 32}-{'t' * 32}.txt"
    assert store.blobs.open("missing.txt") is None
    assert store.blobs.open(f"{'s' * 32}-{'t' * 32}.txt") is None  # empty: nothing to map


def test_a_text_folder_that_cannot_be_made_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "pack-snapshots").write_text("a file where the folder goes")
    with Store.open(tmp_path / "home") as store:
        with pytest.raises(StoreError, match="cannot create"):
            store.blobs.new_file("repo", "s")
        with pytest.raises(StoreError, match="cannot keep a pack snapshot"):
            store.blobs.keep(tmp_path / "no such file", "repo", "s", 0)


def test_a_stored_text_is_read_in_chunks_and_copied_whole(tmp_path: Path) -> None:
    data = bytes(range(256)) * 41 + b"end"  # 10,499 bytes: not a multiple of the chunk
    path = tmp_path / "text.txt"
    path.write_bytes(data)
    text = StoredText(path)
    assert text.size == len(data) and bytes(text.view) == data
    pieces = [bytes(piece) for piece in text.read_chunks(4096)]
    assert [len(piece) for piece in pieces] == [4096, 4096, 2307] and b"".join(pieces) == data
    assert [bytes(piece) for piece in text.read_chunks(len(data))] == [data]
    # A file (sendfile), its buffered writer, and a stream with no file (written from the mapping).
    with (tmp_path / "raw.out").open("wb", buffering=0) as raw:
        raw.write(b">")
        assert text.copy_to(raw) == len(data)
    with (tmp_path / "buffered.out").open("wb") as buffered:
        buffered.write(b">")  # still in the buffer: flushed before the file's own bytes follow
        assert text.copy_to(buffered) == len(data)
    memory = io.BytesIO()
    assert text.copy_to(memory) == len(data)
    assert (tmp_path / "raw.out").read_bytes() == (tmp_path / "buffered.out").read_bytes() == b">" + data
    assert memory.getvalue() == data


def test_a_stored_text_cut_while_read_is_an_error_not_a_short_text(tmp_path: Path) -> None:
    path = tmp_path / "text.txt"
    path.write_bytes(b"x" * 10_000)
    text = StoredText(path)
    chunks = text.read_chunks(4096)
    next(chunks)
    os.truncate(path, 4096)
    with pytest.raises(OSError, match="ended at byte 4096 of 10000"):
        next(chunks)


def test_a_stored_text_copied_to_a_file_that_refuses_sendfile_is_written_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = b"0123456789" * 1000
    path = tmp_path / "text.txt"
    path.write_bytes(data)
    text = StoredText(path)

    def half_then_refuse(out: int, source: int, offset: int, count: int) -> int:
        if offset:
            raise OSError("sendfile refused")
        return os.write(out, data[: count // 2])  # half the text, then a refusal

    monkeypatch.setattr(os, "sendfile", half_then_refuse)
    with (tmp_path / "out").open("wb") as out:
        assert text.copy_to(out) == len(data)
    assert (tmp_path / "out").read_bytes() == data
    # A sendfile that sends nothing (a file it cannot send from): the rest is written.
    monkeypatch.setattr(os, "sendfile", lambda out, source, offset, count: 0)
    with (tmp_path / "out2").open("wb") as out:
        assert text.copy_to(out) == len(data)
    assert (tmp_path / "out2").read_bytes() == data


def test_without_preadv_or_sendfile_the_text_is_read_and_copied_from_the_mapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = b"abcdefghij" * 1000
    path = tmp_path / "text.txt"
    path.write_bytes(data)
    text = StoredText(path)
    monkeypatch.delattr(os, "preadv")
    monkeypatch.delattr(os, "sendfile")
    pieces = [bytes(piece) for piece in text.read_chunks(4096)]
    assert [len(piece) for piece in pieces] == [4096, 4096, 1808] and b"".join(pieces) == data
    with (tmp_path / "out").open("wb") as out:
        assert text.copy_to(out) == len(data)
    assert (tmp_path / "out").read_bytes() == data


def test_a_file_gets_the_text_by_sendfile_and_any_other_stream_from_the_mapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = b"0123456789" * 500
    path = tmp_path / "text.txt"
    path.write_bytes(data)
    text = StoredText(path)
    sent: list[int] = []
    real_sendfile = os.sendfile

    def counting(out: int, source: int, offset: int, count: int) -> int:
        sent.append(count)
        return real_sendfile(out, source, offset, count)

    monkeypatch.setattr(os, "sendfile", counting)
    with (tmp_path / "buffered").open("wb") as buffered:
        text.copy_to(buffered)
    assert sent == [len(data)]
    with (tmp_path / "raw").open("wb", buffering=0) as raw:
        text.copy_to(raw)
    assert sent == [len(data)] * 2
    with (tmp_path / "random").open("w+b") as both:  # a BufferedRandom
        text.copy_to(both)
    assert sent == [len(data)] * 3
    text.copy_to(io.BytesIO())
    closed = (tmp_path / "closed").open("wb", buffering=0)
    closed.close()
    with pytest.raises(ValueError):
        text.copy_to(closed)  # a closed file is written to, and refuses, as any stream would
    assert sent == [len(data)] * 3


def test_a_text_one_byte_past_a_chunk_reads_whole(tmp_path: Path) -> None:
    path = tmp_path / "text.txt"
    path.write_bytes(b"y" * 4097)
    pieces = [bytes(piece) for piece in StoredText(path).read_chunks(4096)]
    assert [len(piece) for piece in pieces] == [4096, 1]


def test_a_sendfile_that_sends_in_pieces_gives_the_whole_text_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = bytes(range(256)) * 20
    path = tmp_path / "text.txt"
    path.write_bytes(data)
    text = StoredText(path)
    real_sendfile = os.sendfile
    monkeypatch.setattr(
        os, "sendfile", lambda out, source, offset, count: real_sendfile(out, source, offset, 1000)
    )
    with (tmp_path / "out").open("wb") as out:
        assert text.copy_to(out) == len(data)
    assert (tmp_path / "out").read_bytes() == data


def test_an_entry_that_cannot_be_removed_is_left_and_a_partial_text_goes_past_an_hour(store: Store) -> None:
    save_snapshot(store, "first", "s", [b"abc"])
    (store.blobs.folder / "a-folder").mkdir()  # unlink refuses it: left for a later save, the save goes on
    old = store.blobs.new_file("dead", "s")
    just_past = time.time() - 3600.5
    os.utime(old, (just_past, just_past))
    save_snapshot(store, "repo", "s", [b"abc"])
    assert sorted(path.name for path in store.blobs.folder.iterdir()) == [
        "a-folder",
        "first-s.txt",
        "repo-s.txt",
    ]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts this process's descriptors in /proc")
def _open_on(path: Path) -> list[str]:
    """This process's descriptors on ``path`` as it was opened (since replaced: Linux adds " (deleted)")."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # a descriptor closed while listed
            if os.readlink(f"/proc/self/fd/{fd}") == f"{path} (deleted)":
                found.append(fd)
    return found


def test_a_stored_text_reads_its_file_as_opened_and_closes_it_when_dropped(tmp_path: Path) -> None:
    path = tmp_path / "text.txt"
    path.write_bytes(b"as it was")
    text = StoredText(path)
    path.unlink()  # removed by another process's save: what is open still reads
    path.write_bytes(b"a new text")
    assert (
        bytes(text.view) == b"as it was" and b"".join(bytes(p) for p in text.read_chunks(4)) == b"as it was"
    )
    assert _open_on(path), "the stored text keeps its file open while it lives"
    del text
    gc.collect()
    # The descriptors on the replaced file, not the process's count: other threads open and close theirs.
    assert not _open_on(path)
