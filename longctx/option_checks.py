"""The checks option fields name (``option(check=...)``) and the loaders of their stored forms.

A check is ``check(name, value)``: it returns the value to keep or raises
:class:`~longctx.errors.ConfigError` (see :class:`longctx.options.OptionSpec`).
Each is the one rule for its options, whichever way a value arrives
(:meth:`longctx.options.OptionFields.checked`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from longctx.errors import ConfigError

__all__ = [
    "as_dict",
    "at_least_one",
    "cache_salt",
    "none_or_at_least_one",
    "not_negative",
    "one_of",
    "optional_tuple",
    "patterns",
    "positive_limit",
    "retry_seconds",
    "share",
    "spellings",
    "stored_dict",
    "stored_optional_int",
    "stored_optional_tuple",
    "stored_tuple",
    "urls",
]


def positive_limit(name: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"Limits.{name} must be a positive integer, not {value!r}")
    return value


def at_least_one(name: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be at least 1, not {value!r}")
    return value


def none_or_at_least_one(name: str, value: Any) -> Any:
    return None if value is None else at_least_one(name, value)


def not_negative(name: str, value: Any) -> Any:
    if value < 0:
        raise ConfigError(f"{name} must not be negative")
    return value


def one_of(choices: tuple[str, ...], what: str) -> Callable[[str, Any], Any]:
    def check(name: str, value: Any) -> Any:
        if value is not None and value not in choices:
            raise ConfigError(f"unknown {what} {value!r}; use one of {', '.join(choices)}")
        return value

    return check


def share(name: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value < 1):
        raise ConfigError(f"{name} must be a number from 0 up to (not including) 1, not {value!r}")
    return value


def patterns(name: str, value: Any) -> tuple[str, ...]:
    # A list given by the caller becomes a tuple, so the options stay hashable and frozen.
    if isinstance(value, str):
        raise ConfigError(f"CorpusOptions.{name} takes a sequence of patterns, not one string")
    return tuple(value)


def spellings(name: str, value: Any) -> tuple[str, ...]:
    spellings = patterns(name, value)
    if not all(isinstance(spelling, str) and spelling for spelling in spellings):
        raise ConfigError(f"CorpusOptions.{name} takes non-empty strings")
    # Sorted and unique: the same spellings given in another order are the same options.
    return tuple(sorted(set(spellings)))


def cache_salt(name: str, value: Any) -> Any:
    if value is not None and (not 1 <= len(value) <= 128 or any(c in value for c in "@/\\\0")):
        raise ConfigError("cache_salt must be 1 to 128 characters without @, /, \\ or NUL")
    return value


def as_dict(name: str, value: Any) -> dict[str, Any]:
    return dict(value)


def urls(name: str, value: Any) -> Any:
    return value if isinstance(value, (str, type(None))) else tuple(value)


def optional_tuple(name: str, value: Any) -> Any:
    return None if value is None else tuple(value)


def retry_seconds(name: str, value: Any) -> Any:
    if value < 0:
        raise ConfigError(f"{name} cannot be negative")
    return value


def stored_tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value or ())


def stored_optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def stored_optional_tuple(value: Any) -> tuple[Any, ...] | None:
    return None if value is None else tuple(value)


def stored_dict(value: Any) -> dict[str, Any]:
    return dict(value or {})
