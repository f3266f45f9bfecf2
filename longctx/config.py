"""Settings from arguments and ``LONGCTX_*`` environment variables.

An explicit argument wins over the environment, which wins over the default:

- ``LONGCTX_BASE_URL``: the server (default ``http://127.0.0.1:8000/v1``); a
  comma-separated list names several replicas of one model;
- ``LONGCTX_MODEL``: the served model name (default: the server's only model);
- ``LONGCTX_API_KEY``: sent as a bearer token, never printed;
- ``LONGCTX_HOME``: where the store lives (see :mod:`longctx.store`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from longctx.errors import ConfigError

__all__ = ["DEFAULT_BASE_URL", "resolve_api_key", "resolve_base_urls", "resolve_model"]

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


def resolve_base_urls(base_url: str | Sequence[str] | None) -> tuple[str, ...]:
    """The server URL(s) to use: the argument, else ``LONGCTX_BASE_URL``, else the default."""
    if base_url is None:
        base_url = os.environ.get("LONGCTX_BASE_URL") or DEFAULT_BASE_URL
    urls = [part.strip() for part in base_url.split(",")] if isinstance(base_url, str) else list(base_url)
    urls = [url for url in urls if url]
    if not urls:
        raise ConfigError("no server URL given (argument or LONGCTX_BASE_URL)")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"server URL must start with http:// or https://, got {url!r}")
    return tuple(urls)


def resolve_model(model: str | None) -> str | None:
    """The served model name: the argument, else ``LONGCTX_MODEL``, else None (ask the server)."""
    return model or os.environ.get("LONGCTX_MODEL") or None


def resolve_api_key(api_key: str | None) -> str | None:
    """The API key: the argument, else ``LONGCTX_API_KEY``, else None."""
    return api_key or os.environ.get("LONGCTX_API_KEY") or None
