"""How fast the store grows: bytes per turn, per sibling answer and per pack, at typical sizes.

Usage: store_growth.py [--turns N] [--answer-chars C] [--pack-chars P]. Writes
into a fresh store in a temporary folder, through the store's own API, as
the sessions write: a pack (``--pack-chars`` of text, about a quarter as
many tokens), a chat of N turns (a 120-character question and an answer of
C characters, with its request), then a batch of N sibling answers (each a
session row, a turn, a request, an answer key) over the same pack. The file
is checkpointed and measured after each step; prints the bytes each step
added, per item. The figure is the file's growth, the page overhead
included: what ``du`` sees, and what ``sessions prune --max-size`` is
about.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

from longctx.store import DATABASE_NAME, Opening, RequestRecord, SessionRecord, Store, StoredPack, TurnRecord
from longctx.usage import Usage


def _size(home: Path) -> int:
    connection = sqlite3.connect(home / DATABASE_NAME)
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.close()
    return sum(path.stat().st_size for path in home.glob(DATABASE_NAME + "*"))


def _request(session_id: str, position: int, prompt_tokens: int) -> RequestRecord:
    usage = Usage(prompt_tokens, prompt_tokens - 20, None, 500, 0.4, 3.2)
    return RequestRecord(
        f"{session_id}-{position}-0123456789abcdef", session_id, None, "turn", time.time(),
        "http://127.0.0.1:8000/v1", "vllm", "moonshotai/Kimi-Linear-48B-A3B-Instruct", usage, 1,
    )  # fmt: skip


def _turn(session_id: str, position: int, answer_chars: int) -> TurnRecord:
    question = f"Question {position}: " + "what does this part of the code do, and why? " * 2
    answer = ("The function reads the configuration, checks each field and returns it. " * 40)[:answer_chars]
    return TurnRecord(session_id, position, question[:120], answer, answer, None, None, time.time())


def measure(turns: int, answer_chars: int, pack_chars: int) -> dict[str, float]:
    """Bytes added to the file per pack, per chat turn and per sibling answer."""
    with tempfile.TemporaryDirectory() as folder, Store.open(Path(folder)) as store:
        home = Path(folder)
        empty = _size(home)
        pack = StoredPack("f" * 64, "7", "You answer questions about the documents.",
                          ("def handler(event):\n    return event\n" * pack_chars)[:pack_chars], {"files": 40})  # fmt: skip
        settings = {"model": "m", "base_urls": ["http://127.0.0.1:8000/v1"], "max_tokens": 512}
        chat = SessionRecord("chat-session-0001", time.time(), "session", "repo", pack.fingerprint, None, None,
                             settings)  # fmt: skip
        store.sessions.record_opening(Opening(pack, chat))
        with_pack = _size(home)
        prompt = pack_chars // 4
        for position in range(turns):
            store.sessions.commit_turn(
                _turn(chat.id, position, answer_chars), _request(chat.id, position, prompt)
            )
        with_chat = _size(home)
        for index in range(turns):
            sibling = SessionRecord(f"sibling-{index:06d}", time.time(), "sibling", "repo", pack.fingerprint,
                                    chat.id, turns, settings)  # fmt: skip
            store.sessions.commit_turn(
                _turn(sibling.id, 0, answer_chars), _request(sibling.id, 0, prompt), new_session=sibling,
                key=f"job:0123456789abcdef:{index}:0123456789abcdef:01234567",
            )  # fmt: skip
        with_siblings = _size(home)
    return {
        "empty store": empty,
        "per pack": with_pack - empty,
        "per chat turn": (with_chat - with_pack) / turns,
        "per sibling answer": (with_siblings - with_chat) / turns,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--answer-chars", type=int, default=2000)
    parser.add_argument("--pack-chars", type=int, default=400_000)
    arguments = parser.parse_args()
    figures = measure(arguments.turns, arguments.answer_chars, arguments.pack_chars)
    print(f"turns {arguments.turns}, answers of {arguments.answer_chars} chars, "
          f"a pack of {arguments.pack_chars} chars")  # fmt: skip
    for name, value in figures.items():
        print(f"{name:>20}: {value:>12,.0f} bytes")


if __name__ == "__main__":
    main()
