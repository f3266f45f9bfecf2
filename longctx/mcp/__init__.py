"""The MCP server for coding agents (``longctx mcp``), through the ``mcp`` library.

- :mod:`~longctx.mcp.server`: the tools an agent calls (ask, ask many,
  pack, savings) and their results;
- :mod:`~longctx.mcp.roots`: the folders a client lets the server read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from longctx.exports import lazy_exports

# The package's names (its ``__all__``), each with the module it comes from, imported on first use
# (PEP 562) like the names of longctx itself.
_EXPORTS: dict[str, str] = {
    "AskManyResult": "longctx.mcp.server",
    "AskResult": "longctx.mcp.server",
    "ClientRoots": "longctx.mcp.server",
    "DocumentTokens": "longctx.mcp.server",
    "PackInfo": "longctx.mcp.server",
    "SavingsResult": "longctx.mcp.server",
    "SiblingAnswer": "longctx.mcp.server",
    "SkippedPath": "longctx.mcp.server",
    "SourceSavings": "longctx.mcp.server",
    "Toolbox": "longctx.mcp.server",
    "build_server": "longctx.mcp.server",
    "serve": "longctx.mcp.server",
    "AllowedRoots": "longctx.mcp.roots",
    "RootsInForce": "longctx.mcp.roots",
    "resolved_path": "longctx.mcp.roots",
}

if TYPE_CHECKING:
    from longctx.mcp.roots import AllowedRoots as AllowedRoots
    from longctx.mcp.roots import RootsInForce as RootsInForce
    from longctx.mcp.roots import resolved_path as resolved_path
    from longctx.mcp.server import AskManyResult as AskManyResult
    from longctx.mcp.server import AskResult as AskResult
    from longctx.mcp.server import ClientRoots as ClientRoots
    from longctx.mcp.server import DocumentTokens as DocumentTokens
    from longctx.mcp.server import PackInfo as PackInfo
    from longctx.mcp.server import SavingsResult as SavingsResult
    from longctx.mcp.server import SiblingAnswer as SiblingAnswer
    from longctx.mcp.server import SkippedPath as SkippedPath
    from longctx.mcp.server import SourceSavings as SourceSavings
    from longctx.mcp.server import Toolbox as Toolbox
    from longctx.mcp.server import build_server as build_server
    from longctx.mcp.server import serve as serve


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = list(_EXPORTS)
