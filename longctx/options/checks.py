"""The rules option fields name beyond their declared type and range, and the loaders of stored forms.

A field's type, range and choices are declared on the field itself
(:class:`longctx.options.OptionSpec`) and checked by one checker. What is
left here is a rule no declaration says: ``check(name, value)`` is given
the value once its type and range passed, and returns the value to keep or
raises :class:`~longctx.errors.ConfigError`. Each is the one rule for its
options, whichever way a value arrives
(:meth:`longctx.options.OptionFields.checked`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from longctx.errors import ConfigError

__all__ = [
    "cache_salt",
    "not_blank",
    "server_urls",
    "spellings",
    "stored_dict",
    "stored_optional_int",
    "stored_optional_tuple",
    "stored_tuple",
    "url_list",
]


def spellings(name: str, value: Any) -> tuple[str, ...]:
    if not all(value):
        raise ConfigError(f"{name} takes non-empty strings")
    # Sorted and unique: the same spellings given in another order are the same options.
    return tuple(sorted(set(value)))


def cache_salt(name: str, value: Any) -> Any:
    if value is not None and (not 1 <= len(value) <= 128 or any(c in value for c in "@/\\\0")):
        raise ConfigError("cache_salt must be 1 to 128 characters without @, /, \\ or NUL")
    return value


def url_list(value: str | Sequence[str]) -> tuple[str, ...]:
    """The URLs ``value`` names: one, several comma-separated, or a sequence; blank parts left out."""
    urls = [part.strip() for part in value.split(",")] if isinstance(value, str) else list(value)
    return tuple(url for url in urls if url)


def server_urls(name: str, value: Any) -> Any:
    """The one URL rule: one URL, several comma-separated, or a sequence of them, each ``http(s)://``.

    An argument, a flag, ``LONGCTX_BASE_URL`` and a config file's ``base_url``
    are all checked by it, with the same message.
    """
    if value is None:
        return None
    urls = url_list(value)
    if not urls:
        raise ConfigError(f"{name} names no server URL: {value!r}")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{name} must be http:// or https:// URLs, not {url!r}")
    return value


def not_blank(name: str, value: Any) -> Any:
    if value is not None and not value.strip():
        raise ConfigError(f"{name} is empty")
    return value


def stored_tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value or ())


def stored_optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def stored_optional_tuple(value: Any) -> tuple[Any, ...] | None:
    return None if value is None else tuple(value)


def stored_dict(value: Any) -> dict[str, Any]:
    return dict(value or {})
