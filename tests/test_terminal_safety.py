"""A model cannot write to the user's terminal: hostile answers shown inert, pipes and --json byte for byte.

The fake engine over HTTP answers with colours (CSI), an OSC 8 link to a
URL of its choosing, an OSC 0 window title, a bell, a one-byte CSI (C1)
and a carriage return; ``ask``, ``chat``, ``batch`` and the citations block
run in a real terminal (pexpect) and their whole output is read: none of
the model's sequences reach it, each is shown as a visible escape, and the
only hyperlink is the one longctx made for a citation it verified.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from corpus_fixtures import committed_repo
from fake_engine import FakeEngine
from fake_http import FakeHttpServer

from longctx.cli.terminal import inert, shown

ENTRY_POINT = Path(sys.executable).parent / "longctx"

# Each a sequence a terminal acts on; the model's words around them are plain.
RED = "\x1b[38;5;196m"
LINK = "\x1b]8;;https://evil.example/\x1b\\click me\x1b]8;;\x1b\\"
TITLE = "\x1b]0;pwned title\x07"
C1_CSI = "\x9b2J"
HOSTILE = f"Plain start {RED}RED\x1b[0m {LINK} {TITLE} bell\x07 {C1_CSI} over\rwrite end"
NEVER_SHOWN = ("\x1b[38;5;196m", "\x1b]8;;https://evil", "\x1b]0;", "\x07", "\x9b", "over\rwrite")
CITED = f'{HOSTILE}\n\nSources:\n- main.py:1 "def main():"\n- evil{RED}.py:1 "x\x1b]0;t\x07"\n'


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    files = {"main.py": "def main():\n    return 0\n", "NOTES.md": "# notes\n"}
    return committed_repo(tmp_path / "project", files)


@pytest.fixture
def server() -> Iterator[FakeHttpServer]:
    served = FakeHttpServer(FakeEngine(engine="generic", answer=HOSTILE, block=1))
    yield served
    served.close()


def environment(home: Path, base_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LONGCTX_")}
    env.update({"LONGCTX_HOME": str(home), "LONGCTX_INSTANT_RETRIES": "1", "LONGCTX_BASE_URL": base_url,
                "TERM": "xterm-256color", "COLUMNS": "160", "LINES": "40"})  # fmt: skip
    return env


def in_terminal(args: list[str], home: Path, base_url: str, send: str | None = None) -> tuple[str, int]:
    """``longctx ARGS`` in a pty (stdin, stdout, stderr): all it wrote, and its exit status."""
    child = pexpect.spawn(
        str(ENTRY_POINT), args, env=environment(home, base_url), encoding="utf-8", timeout=30,
        dimensions=(40, 160),
    )  # fmt: skip
    seen = io.StringIO()
    child.logfile_read = seen
    if send is not None:
        child.expect(r"empty line to end\r\n> ")
        child.sendline(send)
        child.expect(r"\[turn 1: ")
        child.sendline("/history")
        child.expect(r"\[turn 1\] > ")
        child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    return seen.getvalue(), child.exitstatus if child.exitstatus is not None else -1


def assert_inert(output: str) -> None:
    for sequence in NEVER_SHOWN:
        assert sequence not in output, (sequence, output)
    assert "\\x1b[38;5;196m" in output and "\\x1b]0;pwned title\\x07" in output and "\\x9b2J" in output
    assert "https://evil.example" in output  # shown as text, inert: no link
    assert "overwrite end" in output  # the carriage return dropped


def test_inert_makes_every_control_visible_and_keeps_newlines_and_tabs() -> None:
    assert inert("a\tb\nc") == "a\tb\nc"
    assert inert("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m"
    assert inert("\x00\x07\x7f\x9b\u202e") == "\\x00\\x07\\x7f\\x9b\\u202e"
    assert inert("line\r\nnext") == "line\nnext"
    # Made inert piece by piece, a sequence cut anywhere is inert in each piece.
    assert "".join(inert(HOSTILE[i : i + 3]) for i in range(0, len(HOSTILE), 3)) == inert(HOSTILE)
    assert shown(HOSTILE, io.StringIO()) == HOSTILE  # not a terminal: as it came


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
def test_ask_in_a_terminal_shows_the_model_inert(
    repository: Path, tmp_path: Path, server: FakeHttpServer, streamed: bool
) -> None:
    args = ["ask", str(repository), "What does main return?"] + ([] if streamed else ["--no-stream"])
    output, status = in_terminal(args, tmp_path / "home", server.base_url)
    assert status == 0, output
    assert_inert(output)


def test_chat_in_a_terminal_shows_the_model_inert_in_answers_and_history(
    repository: Path, tmp_path: Path, server: FakeHttpServer
) -> None:
    args = ["chat", str(repository), "--no-warm-start"]
    output, status = in_terminal(args, tmp_path / "home", server.base_url, send="What does main return?")
    assert status == 0, output
    assert_inert(output)
    assert output.count("\\x1b]0;pwned title\\x07") >= 2  # the answer, then /history


def test_batch_in_a_terminal_shows_the_model_inert(
    repository: Path, tmp_path: Path, server: FakeHttpServer
) -> None:
    questions = tmp_path / "questions.txt"
    questions.write_text("First?\nSecond?\n")
    args = ["batch", str(repository), "--questions", str(questions)]
    output, status = in_terminal(args, tmp_path / "home", server.base_url)
    assert status == 0, output
    assert_inert(output)


def test_the_citations_block_links_only_what_longctx_verified(
    repository: Path, tmp_path: Path, server: FakeHttpServer
) -> None:
    server.fake.answer = CITED
    args = ["ask", str(repository), "What does main return?", "--cite"]
    output, status = in_terminal(args, tmp_path / "home", server.base_url)
    assert status == 0, output
    assert_inert(output)
    # One hyperlink: longctx's, to the file it found, around the location it verified.
    assert output.count("\x1b]8;;") == 2  # its opening and its closing
    assert f"\x1b]8;;file://{repository.resolve()}/main.py\x1b\\main.py:1\x1b]8;;\x1b\\" in output
    assert "evil\\x1b[38;5;196m.py:1" in output  # the model's path, inert and unlinked


def test_a_pipe_and_json_carry_the_answer_byte_for_byte(
    repository: Path, tmp_path: Path, server: FakeHttpServer
) -> None:
    env = environment(tmp_path / "home", server.base_url)
    command = [str(ENTRY_POINT), "ask", str(repository), "What does main return?", "-q"]
    piped = subprocess.run(command, env=env, capture_output=True, timeout=60, check=True)
    assert piped.stdout == (HOSTILE + "\n").encode()
    as_json = subprocess.run([*command, "--json"], env=env, capture_output=True, timeout=60, check=True)
    assert json.loads(as_json.stdout)["answer"] == HOSTILE


def test_a_stored_answer_shown_again_is_inert_too(
    repository: Path, tmp_path: Path, server: FakeHttpServer
) -> None:
    """``sessions show`` and a resumed chat's earlier turns repeat what the model wrote."""
    home = tmp_path / "home"
    env = environment(home, server.base_url)
    asked = subprocess.run(
        [str(ENTRY_POINT), "ask", str(repository), "What does main return?", "--json", "-q"],
        env=env, capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    session_id = json.loads(asked.stdout)["session_id"]
    shown_again, status = in_terminal(["sessions", "show", session_id], home, server.base_url)
    assert status == 0, shown_again
    assert_inert(shown_again)
    piped = subprocess.run([str(ENTRY_POINT), "sessions", "show", session_id], env=env, capture_output=True,
                           timeout=60, check=True)  # fmt: skip
    assert HOSTILE.encode() in piped.stdout  # a pipe: byte for byte
