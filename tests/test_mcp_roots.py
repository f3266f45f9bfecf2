"""``longctx mcp`` reads only inside its roots, driven by the MCP SDK's own stdio client.

The roots: the client's declared ones (and their changes), else ``--root``
folders, else the folder the server was started in. A path outside, through
``..`` or a symbolic link, is a tool error naming the rule, and nothing is
read: the refused calls below never open the store. Without an engine, a
path that passes the check goes on to the server and fails there
(``ServerUnreachable``), which is how these tests see that it passed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.session import ClientRequestContext
from mcp.types import ErrorData, ListRootsResult, Root
from test_mcp import data_of, free_port, make_repository, mcp_client, text_of

from longctx.testing import LocalServer

OUTSIDE = "is outside the roots of this server"

# The SDK marks roots deprecated for a protocol revision (2026-07-28) that clients do not speak yet.
pytestmark = pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """A work folder with a repository in it, a repository beside it, and a link from inside to outside."""
    work = tmp_path / "work"
    inside = make_repository(work / "inside", ("colorsys.py",))
    outside = make_repository(tmp_path / "outside", ("colorsys.py",))
    (outside / "secret.txt").write_text("not for the agent\n")
    (work / "escape").symlink_to(outside, target_is_directory=True)
    return {"work": work, "inside": inside, "outside": outside, "home": tmp_path / "home"}


def unreachable_env(home: Path) -> dict[str, str]:
    return {"LONGCTX_HOME": str(home), "LONGCTX_BASE_URL": f"http://127.0.0.1:{free_port()}/v1"}


async def ask(client: ClientSession, path: str | list[str]) -> tuple[bool, str]:
    result = await client.call_tool("ask", {"path": path, "question": "What is here?"})
    return result.is_error, text_of(result)


async def assert_refused(client: ClientSession, path: str | list[str], origin: str) -> None:
    for tool, arguments in (
        ("ask", {"path": path, "question": "What is here?"}),
        ("ask_many", {"path": path, "questions": ["One?", "Two?"]}),
        ("show_pack", {"path": path}),
    ):
        result = await client.call_tool(tool, arguments)
        message = text_of(result)
        assert result.is_error, (tool, path, message)
        assert f"InputError: {path if isinstance(path, str) else path[-1]}" in message, message
        assert OUTSIDE in message and origin in message, message
        assert "symbolic links are resolved" in message and "--root" in message, message
        assert "Traceback" not in message


async def assert_passes(client: ClientSession, path: str) -> None:
    """The path passed the roots check: the call went on to the (unreachable) server."""
    failed, message = await ask(client, path)
    assert failed and "ServerUnreachable" in message, message


def roots_of(folders: list[list[Path]]) -> Callable[..., Any]:
    """A client's roots callback answering ``folders[0]`` (the test changes it in place)."""

    async def list_roots(context: ClientRequestContext) -> ListRootsResult:
        return ListRootsResult(roots=[Root(uri=folder.as_uri(), name=folder.name) for folder in folders[0]])

    return list_roots


def test_without_roots_it_reads_only_in_the_folder_it_was_started_in(layout: dict[str, Path]) -> None:
    work, outside, home = layout["work"], layout["outside"], layout["home"]

    async def scenario() -> None:
        async with mcp_client(unreachable_env(home), cwd=work) as client:
            origin = f"the folder the server was started in: {work}"
            await assert_refused(client, str(outside), origin)
            await assert_refused(client, str(outside / "secret.txt"), origin)
            await assert_refused(client, f"{work}/../outside", origin)
            await assert_refused(client, "../outside", origin)
            # A symbolic link inside the root that leads out of it, and a file through it.
            await assert_refused(client, str(work / "escape"), origin)
            await assert_refused(client, str(work / "escape" / "secret.txt"), origin)
            # One path outside refuses the call, whatever the others.
            await assert_refused(client, [str(layout["inside"]), str(work / "escape")], origin)
            await assert_refused(client, "~", origin)
            assert not home.exists(), "a refused call opened the store"
            shown = await client.call_tool("savings", {})
            assert data_of(shown) == {"sources": []}
            # Inside: the root itself, a repository in it, relative to where it was started.
            await assert_passes(client, str(layout["inside"]))
            await assert_passes(client, "inside")

    asyncio.run(scenario())


def test_root_flags_replace_the_starting_folder(layout: dict[str, Path], tmp_path: Path) -> None:
    second = make_repository(tmp_path / "second", ("colorsys.py",))

    async def scenario() -> None:
        env = unreachable_env(layout["home"])
        flags = ("--root", str(layout["inside"]), "--root", str(second))
        async with mcp_client(env, *flags, cwd=layout["work"]) as client:
            origin = f"the --root folders: {layout['inside']}, {second}"
            await assert_refused(client, str(layout["work"]), origin)
            await assert_refused(client, str(layout["outside"]), origin)
            await assert_passes(client, str(layout["inside"]))
            await assert_passes(client, str(second))

    asyncio.run(scenario())


def test_a_missing_root_flag_is_a_usage_error(layout: dict[str, Path]) -> None:
    import subprocess

    from test_mcp import ENTRY_POINT

    result = subprocess.run(
        [str(ENTRY_POINT), "mcp", "--root", str(layout["work"] / "nope")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 2 and "--root" in result.stderr, result.stderr


def test_the_clients_roots_and_their_changes_take_precedence(layout: dict[str, Path], tmp_path: Path) -> None:
    spaced = make_repository(tmp_path / "a folder with spaces", ("colorsys.py",))
    declared: list[list[Path]] = [[spaced]]

    async def scenario() -> None:
        env = unreachable_env(layout["home"])
        # The server is given --root work; the client's roots win over it.
        async with mcp_client(
            env, "--root", str(layout["work"]), cwd=layout["work"], roots=roots_of(declared)
        ) as client:
            await assert_refused(client, str(layout["inside"]), f"the client's roots: {spaced}")
            await assert_passes(client, str(spaced))  # a file:// URI, percent-encoded, read back
            # The client changes its roots and says so: the server follows.
            declared[0] = [layout["outside"], layout["inside"]]
            await client.send_roots_list_changed()
            await asyncio.sleep(0.2)
            origin = f"the client's roots: {layout['outside']}, {layout['inside']}"
            await assert_refused(client, str(spaced), origin)
            await assert_passes(client, str(layout["outside"]))
            await assert_passes(client, str(layout["inside"]))
            # An empty list leaves the server's own: its --root folder.
            declared[0] = []
            await client.send_roots_list_changed()
            await asyncio.sleep(0.2)
            await assert_refused(client, str(layout["outside"]), f"the --root folders: {layout['work']}")
            await assert_passes(client, str(layout["inside"]))

    asyncio.run(scenario())


def test_a_client_whose_roots_cannot_be_listed_gets_nothing(layout: dict[str, Path]) -> None:
    async def failing(context: ClientRequestContext) -> ErrorData:
        return ErrorData(code=-32603, message="roots are unavailable")

    async def scenario() -> None:
        async with mcp_client(unreachable_env(layout["home"]), cwd=layout["work"], roots=failing) as client:
            failed, message = await ask(client, str(layout["inside"]))
            assert failed and OUTSIDE in message and "could not be listed" in message, message
            assert "roots are unavailable" in message, message
        assert not layout["home"].exists()

    asyncio.run(scenario())


def test_a_root_declaring_client_against_vllm(
    vllm_server: LocalServer, layout: dict[str, Path], tmp_path: Path
) -> None:
    declared: list[list[Path]] = [[layout["work"]]]
    env = {"LONGCTX_HOME": str(layout["home"]), "LONGCTX_BASE_URL": vllm_server.api_base}

    async def scenario() -> None:
        async with mcp_client(env, "--max-tokens", "4", cwd=tmp_path, roots=roots_of(declared)) as client:
            answered = data_of(
                await client.call_tool(
                    "ask", {"path": str(layout["inside"]), "question": "Which module is this?"}
                )
            )
            assert answered["turn"] == 1 and answered["prompt_tokens"] > 0, answered
            shown = data_of(await client.call_tool("show_pack", {"path": str(layout["inside"])}))
            assert {doc["path"] for doc in shown["documents"]} == {"colorsys.py", "NOTES.md"}
            # The link inside the client's root leads out of it: refused, before any request.
            await assert_refused(
                client, str(layout["work"] / "escape"), f"the client's roots: {layout['work']}"
            )
            savings = data_of(await client.call_tool("savings", {}))
            (source,) = savings["sources"]
            assert source["paths"] == [str(layout["inside"])] and source["requests"] == 1, savings

    asyncio.run(scenario())
