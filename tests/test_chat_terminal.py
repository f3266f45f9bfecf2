"""``longctx chat`` and ``longctx ask`` in a real terminal (a pty, through pexpect), as a person uses them.

Against the fake engine over HTTP (tests/fake_http.py), which can hold an
answer after its first word: the first piece is seen on the screen while
the rest is not sent yet. One test drives the chat against the real vLLM.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from click.testing import CliRunner, Result
from corpus_fixtures import committed_repo
from fake_engine import FakeEngine
from fake_http import FakeHttpServer

from longctx import cli
from longctx.backends.base import Backend, connect
from longctx.cli import Runtime, main
from longctx.store import Store
from longctx.testing import LocalServer

ENTRY_POINT = Path(sys.executable).parent / "longctx"
ANSWER = "Streamed answers arrive word by word until the last"
UP_ARROW = "\x1b[A"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    files = {"main.py": "def main():\n    return 0\n", "NOTES.md": f"# notes {uuid.uuid4()}\n"}
    return committed_repo(tmp_path / "project", files)


@pytest.fixture
def server() -> Iterator[FakeHttpServer]:
    fake = FakeEngine(engine="generic", answer=ANSWER, block=1)
    served = FakeHttpServer(fake)
    yield served
    served.hold.set()
    served.close()


def spawn(*args: str, home: Path, base_url: str, timeout: float = 20) -> pexpect.spawn:
    """``longctx ARGS`` in a terminal of its own (stdin, stdout and stderr all the pty)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LONGCTX_")}
    environment.update(
        {"LONGCTX_HOME": str(home), "LONGCTX_INSTANT_RETRIES": "1", "LONGCTX_BASE_URL": base_url,
         "TERM": "xterm-256color", "COLUMNS": "160", "LINES": "40"}
    )  # fmt: skip
    return pexpect.spawn(
        str(ENTRY_POINT), list(args), env=environment, encoding="utf-8", timeout=timeout, dimensions=(40, 160)
    )


def ready(child: pexpect.spawn) -> None:
    """Until the chat's first prompt is shown (a key sent before could be lost as the terminal is set up)."""
    child.expect(r"empty line to end\r\n> ")


def ctrl_c_at_prompt(child: pexpect.spawn) -> None:
    """A Ctrl-C at the prompt, once the prompt is shown and a moment has passed, as a person's key comes.

    CPython's readline writes the prompt and then waits in select() for a key; a SIGINT that lands
    between the two is seen only at the next key. A key sent the instant "> " appears hits that window
    about once in 150 tries on a loaded machine (the chat then waits for ever); no hand is that quick.
    """
    child.expect("> ")
    time.sleep(0.3)
    child.sendcontrol("c")


def ended(child: pexpect.spawn) -> int:
    """The exit status once the process is gone (its remaining output read)."""
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus if child.exitstatus is not None else 128 + (child.signalstatus or 0)


def last_question(server: FakeHttpServer) -> str:
    content = server.chat_requests()[-1]["messages"][-1]["content"]
    return content if isinstance(content, str) else content[-1]["text"]


def test_the_chat_shows_a_spinner_then_the_answer_as_it_streams(
    repository: Path, home: Path, server: FakeHttpServer
) -> None:
    child = spawn("chat", str(repository), "--no-warm-start", home=home, base_url=server.base_url)
    ready(child)
    server.hold_after_first_piece()  # the server sends the first word, then waits
    child.sendline("What does main return?")
    child.expect("waiting for the first token")
    child.expect("Streamed")
    assert server.first_piece_sent.is_set() and "the last" not in child.before
    server.hold.set()
    child.expect("the last")
    child.expect(r"\[turn 1: ")  # numbered as the report numbers it
    child.sendline("/quit")
    assert ended(child) == cli.EXIT_OK


def test_chat_commands_are_answered_in_the_chat_and_never_reach_the_model(
    repository: Path, home: Path, server: FakeHttpServer
) -> None:
    child = spawn("chat", str(repository), "--no-warm-start", home=home, base_url=server.base_url)
    ready(child)
    child.sendline("What does main return?")
    child.expect(r"\[turn 1: ")
    asked = len(server.chat_requests())
    child.sendline("/help")
    child.expect("chat commands")
    child.expect("/report")
    child.sendline("/history")
    child.expect(re.escape("[turn 1] > What does main return?"))
    child.expect("Streamed answers")
    child.sendline("/tokens")
    child.expect("prompt tokens")
    child.sendline("/report")
    child.expect("cached tokens")
    child.sendline("/what")
    child.expect("unknown command /what")
    assert len(server.chat_requests()) == asked  # none of them went to the model
    child.sendline("//etc/hosts: what is it?")  # the escape: a question that starts with /
    child.expect(r"\[turn 2: ")
    assert last_question(server).endswith("/etc/hosts: what is it?")
    child.sendline("/exit")
    assert ended(child) == cli.EXIT_OK
    with Store.open(home) as store:
        session = store.sessions.sessions()[0]
        questions = [turn.question for turn in store.sessions.turns(session.id)]
    assert questions == ["What does main return?", "/etc/hosts: what is it?"]


def test_ctrl_d_ends_the_chat(repository: Path, home: Path, server: FakeHttpServer) -> None:
    child = spawn("chat", str(repository), "--no-warm-start", home=home, base_url=server.base_url)
    ready(child)
    child.sendeof()
    child.expect("no question asked")
    assert ended(child) == cli.EXIT_OK


def test_a_question_the_server_died_on_is_kept_and_offered_again_in_the_resumed_chat(
    repository: Path, home: Path, server: FakeHttpServer
) -> None:
    child = spawn("chat", str(repository), "--no-warm-start", home=home, base_url=server.base_url)
    ready(child)
    child.sendline("First question?")
    child.expect(r"\[turn 1: ")
    server.stop()
    child.sendline("Which file holds main?")
    child.expect("the server went away")
    child.sendcontrol("c")  # stops the waiting: back to the prompt, the question kept
    child.expect(re.escape("stopped; the question is kept (Up arrow)"))
    ctrl_c_at_prompt(child)  # a second Ctrl-C in a row ends the chat
    child.expect(r"resume with: longctx chat --session (\w+)")
    session_id = child.match.group(1)
    assert ended(child) == cli.EXIT_OK
    assert (home / "chat_history").stat().st_mode & 0o777 == 0o600  # questions are private
    server.start()
    resumed = spawn("chat", "--session", session_id, "--no-warm-start", home=home, base_url=server.base_url)
    # The earlier turns first, then the prompt; Up offers the question that was not answered.
    resumed.expect(re.escape("[turn 1] > First question?"))
    resumed.expect("Streamed answers")
    ready(resumed)
    resumed.send(UP_ARROW)
    resumed.expect("Which file holds main")
    resumed.send("\r")
    resumed.expect(r"\[turn 2: ")
    assert last_question(server).endswith("Which file holds main?")
    resumed.sendline("/quit")
    assert ended(resumed) == cli.EXIT_OK


def test_ctrl_c_in_a_streamed_answer_returns_to_the_prompt_and_a_second_one_ends_the_chat(
    repository: Path, home: Path, server: FakeHttpServer
) -> None:
    child = spawn("chat", str(repository), "--no-warm-start", home=home, base_url=server.base_url)
    ready(child)
    child.sendline("First question?")
    child.expect(r"\[turn 1: ")
    server.hold_after_first_piece()
    child.sendline("Second question?")
    child.expect("Streamed")
    child.sendcontrol("c")
    child.expect("stopped before its end and is not stored")
    child.expect(re.escape("stopped; the question is kept (Up arrow)"))
    child.expect("> ")
    server.hold.set()
    # The chat goes on: the Up arrow offers the stopped question, and it is asked again.
    child.send(UP_ARROW)
    child.expect("Second question")
    child.send("\r")
    child.expect(r"\[turn 2: ")
    server.hold_after_first_piece()
    child.sendline("Third question?")
    child.expect("Streamed")
    child.sendcontrol("c")
    child.expect("stopped before its end")
    server.hold.set()
    ctrl_c_at_prompt(child)  # a second Ctrl-C in a row, at the prompt: the chat ends
    child.expect(r"session (\w+): ")
    session_id = child.match.group(1)
    child.expect(f"resume with: longctx chat --session {session_id}")
    assert ended(child) == cli.EXIT_OK
    with Store.open(home) as store:
        assert [turn.question for turn in store.sessions.turns(session_id)] == [
            "First question?",
            "Second question?",
        ]


def test_ctrl_c_at_the_prompt_says_how_to_end_and_ctrl_d_ends(
    repository: Path, home: Path, server: FakeHttpServer
) -> None:
    child = spawn("chat", str(repository), "--no-warm-start", home=home, base_url=server.base_url)
    ready(child)
    child.sendline("First question?")
    child.expect(r"\[turn 1: ")
    ctrl_c_at_prompt(child)
    child.expect(re.escape("(Ctrl-C again, Ctrl-D or an empty line ends the chat)"))
    child.sendline("Still here?")  # a line between: the next Ctrl-C is a first one again
    child.expect(r"\[turn 2: ")
    ctrl_c_at_prompt(child)
    child.expect("Ctrl-C again")
    child.sendeof()
    child.expect("resume with: longctx chat --session")
    assert ended(child) == cli.EXIT_OK


def test_ask_streams_on_a_terminal_and_not_with_no_stream(
    repository: Path, home: Path, server: FakeHttpServer
) -> None:
    server.hold_after_first_piece()
    child = spawn("ask", str(repository), "What does main return?", home=home, base_url=server.base_url)
    child.expect("waiting for the first token")
    child.expect("Streamed")
    assert "the last" not in child.before
    server.hold.set()
    child.expect("the last")
    child.expect("prompt tokens")
    assert ended(child) == cli.EXIT_OK
    server.hold_after_first_piece()
    whole = spawn(
        "ask", str(repository), "And now?", "--no-stream", home=home, base_url=server.base_url, timeout=3
    )
    with pytest.raises(pexpect.TIMEOUT):
        whole.expect("Streamed")  # nothing is shown before the whole answer is in
    server.hold.set()
    whole.expect(ANSWER)
    assert ended(whole) == cli.EXIT_OK


# -- against the real vLLM server ----------------------------------------------------


def _queried(backend: Backend, url: str) -> int:
    """Prompt tokens the server has looked up in its cache, once the count has settled."""
    previous = -1
    while True:
        reading = backend.counters([url]).get(url)
        assert reading is not None and reading.queries is not None
        if reading.queries == previous:
            return previous
        previous = reading.queries
        time.sleep(0.5)


@pytest.mark.vllm
def test_the_chat_in_a_terminal_against_vllm(repository: Path, home: Path, vllm_server: LocalServer) -> None:
    base_url = vllm_server.api_base
    with connect(base_url) as backend:
        url = backend.servers[0].api_url
        child = spawn(
            "chat", str(repository), "--max-tokens", "12", "--no-warm-start", home=home, base_url=base_url,
            timeout=120,
        )  # fmt: skip
        ready(child)
        child.sendline("What does main return?")
        child.expect("waiting for the first token")
        child.expect(r"\[turn 1: .* cached")
        before = _queried(backend, url)
        child.sendline("/help")
        child.expect("chat commands")
        child.sendline("/history")
        child.expect(re.escape("[turn 1] > What does main return?"))
        child.sendline("/tokens")
        child.expect("prompt tokens")
        time.sleep(1)
        assert _queried(backend, url) == before  # the commands sent the server nothing
        child.sendline("/quit")
        assert ended(child) == cli.EXIT_OK
    with Store.open(home) as store:
        session_id = store.sessions.sessions()[0].id
    # A long answer stopped by Ctrl-C while it streams: exit 130, the session as it was.
    long = spawn(
        "chat", "--session", session_id, "--max-tokens", "4000", home=home, base_url=base_url, timeout=120
    )
    ready(long)
    long.sendline("Explain every line, at length.")
    long.expect("waiting for the first token")
    time.sleep(1.5)
    long.sendcontrol("c")
    long.expect("stopped before its end and is not stored")
    long.expect("stopped; the question is kept")  # back at the prompt
    ctrl_c_at_prompt(long)  # the second ends the chat
    long.expect(f"resume with: longctx chat --session {session_id}")
    assert ended(long) == cli.EXIT_OK
    # The next turn reads the earlier prefix from the cache.
    again = spawn(
        "chat", "--session", session_id, "--max-tokens", "4", home=home, base_url=base_url, timeout=120
    )
    again.expect(re.escape("[turn 1] > What does main return? -> "))  # one line a turn
    ready(again)
    again.sendline("And the notes?")
    again.expect(r"\[turn 2: ")
    again.sendline("/quit")
    assert ended(again) == cli.EXIT_OK
    with Store.open(home) as store:
        first, second = [r for r in store.sessions.requests(session_ids=[session_id]) if r.purpose == "turn"]
        assert [turn.question for turn in store.sessions.turns(session_id)] == [
            "What does main return?",
            "And the notes?",
        ]
    assert first.usage.prompt_tokens is not None and second.usage.cached_tokens is not None
    block = 128  # vLLM's CPU build caches whole blocks of 128 tokens
    assert second.usage.cached_tokens >= first.usage.prompt_tokens - first.usage.prompt_tokens % block


# -- from a script (CliRunner, the fake engine in process) ----------------------------


def test_a_resumed_chat_shows_each_earlier_turn_in_a_line_and_history_in_full(repository: Path) -> None:
    fake = FakeEngine(engine="generic", block=1, answer="line one\nline two")
    backend = connect("http://fake-engine:8000/v1", transport=fake.transport())

    def invoke(*args: str, stdin: str) -> Result:
        return CliRunner().invoke(main, list(args), obj=Runtime(backend=backend), input=stdin)

    first = invoke("chat", str(repository), "--json", "--no-warm-start", stdin="q1?\nq2?\nq3?\nq4?\n\n")
    assert first.exit_code == cli.EXIT_OK, first.output
    session_id = json.loads(first.stdout.splitlines()[0])["session_id"]
    asked = len(fake.chat_bodies)
    resumed = invoke("chat", "--session", session_id, "--no-warm-start", stdin="/history\n/nope\n\n")
    assert resumed.exit_code == cli.EXIT_OK, resumed.output
    assert len(fake.chat_bodies) == asked  # the commands sent nothing
    shown, later = resumed.stderr.split("4 earlier turns")
    for number in (1, 2, 3, 4):  # one line each
        assert f"[turn {number}] > q{number}? -> line one line two\n" in shown
    assert "/history shows them in full" in shown
    for number in (1, 2, 3, 4):  # /history: in full
        assert f"[turn {number}] > q{number}?\nline one\nline two\n" in later
    assert "unknown command /nope" in resumed.stderr
