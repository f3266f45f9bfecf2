"""Where the store is: the embedded SQLite file (the default), or a PostgreSQL database named by a URL.

``LONGCTX_STORE`` (or ``store`` in ``.longctx.toml``, or
:attr:`longctx.options.ServerOptions.store`) set to
``postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE`` puts every part of the
store on that server, shared by every client that names it; unset (or
``sqlite``), the store is ``longctx.db`` in the longctx home folder, as it
always was. The URL may hold a password: it is shown only through
:func:`redacted_url`, never stored in a session's settings, never logged.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from longctx.errors import ConfigError

__all__ = ["SCHEMES", "checked_store", "is_database_url", "redacted_url", "url_secrets"]

SCHEMES: Final = ("postgresql://", "postgres://")
"""The URL schemes that name a PostgreSQL store."""

_REDACTED: Final = "[redacted]"
_SECRET_PARAMETERS: Final = frozenset({"password", "sslpassword", "passfile", "sslkey"})


def is_database_url(value: str | None) -> bool:
    """Whether ``value`` names a PostgreSQL store (rather than the embedded default)."""
    return bool(value) and str(value).strip().lower().startswith(SCHEMES)


def checked_store(value: str | None) -> str | None:
    """The ``store`` setting as given, checked: a PostgreSQL URL, or None / ``sqlite`` for the file."""
    if value is None:
        return None
    text = str(value).strip()
    if not text or text.lower() == "sqlite":
        return None
    if not is_database_url(text):
        raise ConfigError(
            f"store must be a postgresql:// URL (or 'sqlite' for the embedded file), "
            f"not {redacted_url(text)!r}"
        )
    parts = urlsplit(text)
    if not parts.path.strip("/") and not any(key == "dbname" for key, _ in parse_qsl(parts.query)):
        raise ConfigError(
            f"the store URL {redacted_url(text)} names no database (postgresql://HOST/DATABASE)"
        )
    return text


def redacted_url(url: str) -> str:
    """``url`` with its password (and any secret query parameter) replaced by ``[redacted]``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return _REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        credentials, host = netloc.rsplit("@", 1)
        user = credentials.split(":", 1)[0]
        netloc = f"{user}:{_REDACTED}@{host}" if ":" in credentials else f"{user}@{host}"
    query = urlencode(
        [(key, _REDACTED if key in _SECRET_PARAMETERS else value) for key, value in parse_qsl(parts.query)],
        safe="[]",
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def url_secrets(url: str) -> tuple[str, ...]:
    """The secrets ``url`` holds (its password, secret parameters), to be redacted from any message."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return (url,)
    found = [parts.password] if parts.password else []
    found += [value for key, value in parse_qsl(parts.query) if key in _SECRET_PARAMETERS and value]
    # The raw (percent-encoded) form too: a message may quote the URL as given.
    credentials = parts.netloc.rsplit("@", 1)[0] if "@" in parts.netloc else ""
    raw = credentials.split(":", 1)[1] if ":" in credentials else ""
    return tuple(dict.fromkeys(secret for secret in [*found, raw] if secret))
