"""``longctx mcp`` driven by the MCP SDK's own stdio client, against the real vLLM server of the harness.

The client starts the installed ``longctx mcp`` command as a subprocess,
lists its tools and calls them the way an agent does; what comes back is
read from the tool results (structured content, or the error text).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import subprocess
import sys
import sysconfig
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from corpus_fixtures import committed_repo
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.session import ListRootsFnT
from mcp.types import CallToolResult, TextContent

from longctx.backends.base import connect
from longctx.testing import LocalServer

STDLIB = Path(sysconfig.get_paths()["stdlib"])
ENTRY_POINT = Path(sys.executable).parent / "longctx"
TOOLS = {"ask", "ask_many", "show_pack", "savings"}


def make_repository(root: Path, names: tuple[str, ...] = ("textwrap.py", "bisect.py")) -> Path:
    """A git repository of standard-library files, with a nonce so its pack is new to the server."""
    files: dict[str, str | bytes] = {name: (STDLIB / name).read_text() for name in names}
    files |= {"NOTES.md": f"# notes {uuid.uuid4()}\n", "logo.bin": bytes(range(256)) * 4}
    return committed_repo(root, files)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


Call = Callable[[str, dict[str, Any]], Awaitable[CallToolResult]]


@asynccontextmanager
async def mcp_client(
    env: dict[str, str], *args: str, cwd: Path, roots: ListRootsFnT | None = None
) -> AsyncIterator[ClientSession]:
    """An initialised MCP client session with ``longctx mcp ARGS``, started in ``cwd``, as its server.

    With ``roots`` the client declares roots (and that it announces their changes), answered by it.
    """
    # The SDK starts the server with a few safe variables only: PYTHONPATH is passed on so that the
    # server runs the longctx under test, not only the installed one.
    python_path = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    parameters = StdioServerParameters(
        command=str(ENTRY_POINT),
        args=["mcp", *args],
        env={"LONGCTX_INSTANT_RETRIES": "1", **python_path, **env},
        cwd=cwd,
    )
    async with (
        stdio_client(parameters) as (read, write),
        ClientSession(read, write, list_roots_callback=roots) as session,
    ):
        await session.initialize()
        yield session


def text_of(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


def data_of(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    return result.structured_content


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def test_help_lists_the_mcp_command() -> None:
    result = subprocess.run([str(ENTRY_POINT), "mcp", "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "Model Context Protocol" in result.stdout


def run_without_the_sdk(*args: str) -> subprocess.CompletedProcess[str]:
    """``longctx ARGS`` in a Python where importing the mcp SDK fails, as without the extra."""
    code = f"import sys; sys.modules['mcp'] = None; from longctx.cli import main; main({list(args)!r})"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )


def test_without_the_extra_help_works_and_the_command_names_the_extra() -> None:
    helped = run_without_the_sdk("--help")
    assert helped.returncode == 0, helped.stderr
    assert "mcp" in helped.stdout
    served = run_without_the_sdk("mcp")
    assert served.returncode == 2, served.stderr
    assert (
        served.stderr.strip()
        == "longctx: error: the MCP server needs the mcp extra: pip install 'longctx-sdk[mcp]'"
    )


def test_an_unreachable_server_is_a_tool_error_with_the_message(tmp_path: Path, home: Path) -> None:
    repository = make_repository(tmp_path / "repo")
    url = f"http://127.0.0.1:{free_port()}/v1"

    async def scenario() -> None:
        async with mcp_client({"LONGCTX_HOME": str(home)}, "--base-url", url, cwd=tmp_path) as client:
            result = await client.call_tool("ask", {"path": str(repository), "question": "What is here?"})
            assert result.is_error
            message = text_of(result)
            # The SDK puts "Error executing tool ask: " before the message.
            assert "ServerUnreachable: cannot reach " in message, message
            assert url.removesuffix("/v1") in message, message
            assert "Traceback" not in message
            # The failed source is not kept: savings knows nothing of it, and the server still answers.
            savings = await client.call_tool("savings", {})
            assert data_of(savings) == {"sources": []}

    asyncio.run(scenario())


def test_ask_streams_the_answer_as_progress_and_returns_the_same_result(
    vllm_server: LocalServer, tmp_path: Path, home: Path
) -> None:
    """A client with a progress token hears the text so far; one without gets the result alone."""
    repository = make_repository(tmp_path / "repo", ("bisect.py",))
    env = {"LONGCTX_HOME": str(home), "LONGCTX_BASE_URL": vllm_server.api_base}
    heard: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        heard.append((progress, message))

    async def scenario() -> None:
        async with mcp_client(env, "--max-tokens", "48", cwd=tmp_path) as client:
            arguments = {"path": str(repository), "question": "What does insort do?"}
            streamed = data_of(await client.call_tool("ask", arguments, progress_callback=on_progress))
            assert heard, "no progress notification"
            answer = streamed["answer"]
            for progress, message in heard:
                assert message is not None and answer.startswith(message), (message, answer)
                assert progress == len(message)
            assert [progress for progress, _ in heard] == sorted({progress for progress, _ in heard})
            plain = data_of(await client.call_tool("ask", {**arguments, "new_conversation": True}))
            assert set(plain) == set(streamed) and plain["turn"] == streamed["turn"] == 1

    asyncio.run(scenario())


def test_the_agent_flow_against_vllm(vllm_server: LocalServer, tmp_path: Path, home: Path) -> None:
    repository = make_repository(tmp_path / "repo")
    other = make_repository(tmp_path / "other", ("colorsys.py",))
    with connect(vllm_server.api_base) as backend:
        block = backend.info.cache_block_tokens or 16
    env = {"LONGCTX_HOME": str(home), "LONGCTX_BASE_URL": vllm_server.api_base}

    async def scenario() -> None:
        async with mcp_client(env, "--max-tokens", "16", cwd=tmp_path) as client:
            listed = await client.list_tools()
            assert {tool.name for tool in listed.tools} == TOOLS
            assert all(tool.description and tool.input_schema for tool in listed.tools)

            asked: list[dict[str, Any]] = []
            for question in ("What does textwrap.dedent do?", "And fill?", "Which file defines insort?"):
                result = await client.call_tool("ask", {"path": str(repository), "question": question})
                asked.append(data_of(result))
            pack_tokens = asked[0]["pack_tokens"]
            print(f"mcp turns (prompt, cached), pack {pack_tokens} tokens, {block}-token blocks:")
            print([(answer["prompt_tokens"], answer["cached_tokens"]) for answer in asked])
            assert pack_tokens > 4000, asked[0]
            # One session for the source, reused: the questions are its turns 0, 1, 2.
            assert {answer["session_id"] for answer in asked} == {asked[0]["session_id"]}
            assert [answer["turn"] for answer in asked] == [1, 2, 3]
            assert asked[0]["cached_tokens"] < pack_tokens // 2, asked[0]
            for previous, answer in itertools.pairwise(asked):
                # Everything the previous request sent is read from the cache, up to the last full block.
                assert answer["cached_tokens"] >= pack_tokens - block, answer
                assert answer["cached_tokens"] >= previous["prompt_tokens"] - block, (previous, answer)

            siblings = data_of(
                await client.call_tool(
                    "ask_many",
                    {"path": str(repository), "questions": ["Name one function.", "Name one module."]},
                )
            )
            assert [answer["question"] for answer in siblings["answers"]] == [
                "Name one function.",
                "Name one module.",
            ]
            print(
                "siblings:",
                [(answer["prompt_tokens"], answer["cached_tokens"]) for answer in siblings["answers"]],
            )
            for answer in siblings["answers"]:
                assert answer["cached_tokens"] >= asked[-1]["prompt_tokens"] - block, siblings

            # Calls at once, on the same source and another: all answered, each source its own session.
            results = await asyncio.gather(
                client.call_tool("ask", {"path": str(repository), "question": "One more?"}),
                client.call_tool("ask", {"path": str(other), "question": "What is colorsys?"}),
                client.call_tool("ask", {"path": [str(other)], "question": "What converts RGB to HSV?"}),
            )
            same, first_other, second_other = (data_of(result) for result in results)
            assert same["session_id"] == asked[0]["session_id"] and same["turn"] == 4
            assert first_other["session_id"] == second_other["session_id"] != same["session_id"]
            assert sorted([first_other["turn"], second_other["turn"]]) == [1, 2]

            shown = data_of(await client.call_tool("show_pack", {"path": str(repository)}))
            assert {doc["path"] for doc in shown["documents"]} == {"textwrap.py", "bisect.py", "NOTES.md"}
            assert shown["skipped"] == [{"path": "logo.bin", "reason": "binary"}]
            assert shown["skipped_by_reason"] == {"binary": 1}
            assert shown["pack_tokens"] == pack_tokens and not shown["estimated"]
            assert shown["context_length"] == 32768 and shown["fits"] is True
            assert shown["prompt_budget"] < shown["context_length"]

            fresh = data_of(
                await client.call_tool(
                    "ask",
                    {
                        "path": str(repository),
                        "question": "Start over: what is bisect?",
                        "new_conversation": True,
                    },
                )
            )
            assert fresh["turn"] == 1 and fresh["session_id"] != asked[0]["session_id"]
            assert fresh["cached_tokens"] >= pack_tokens - block, fresh

            savings = data_of(await client.call_tool("savings", {"path": str(repository)}))
            (source,) = savings["sources"]
            assert source["requests"] == 3 + 2 + 1 + 1
            assert source["cached_tokens"] >= 6 * (pack_tokens - block)
            # The calls made at once shared counter windows: each source's check is still exact.
            assert source["server_counters_match"] is True, source
            everything = data_of(await client.call_tool("savings", {}))
            assert len(everything["sources"]) == 2
            assert all(each["server_counters_match"] is True for each in everything["sources"]), everything

            missing = tmp_path / "no-such-folder"
            result = await client.call_tool("ask", {"path": str(missing), "question": "Anything?"})
            assert result.is_error
            message = text_of(result)
            assert f"InputError: {missing}: no such file or folder" in message, message
            assert "Traceback" not in message
            empty = await client.call_tool("ask_many", {"path": str(repository), "questions": []})
            assert empty.is_error and "ConfigError: ask_many needs at least one question" in text_of(empty), (
                text_of(empty)
            )

            # A typed question: the schema reaches the session, and an answer cut at max_tokens is a
            # tool error with the reason (the tiny model's typed answers: tests/test_schemas_engines.py).
            (ask_tool,) = [tool for tool in listed.tools if tool.name == "ask"]
            assert "schema" in ask_tool.input_schema["properties"]
            typed = {"path": str(repository), "question": "Name one.", "schema": "name", "max_tokens": 2}
            cut = text_of(await client.call_tool("ask", typed))
            assert "InvalidAnswer: the answer was cut at max_tokens" in cut and "as it came: '{" in cut, cut

    asyncio.run(scenario())
    assert os.path.isdir(home)
