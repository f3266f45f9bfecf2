"""What longctx records of an application's requests: one JSON line per request, no credentials.

A line (``kind`` :data:`~longctx.lint.logs.RECORD_KIND`)::

    {"kind": "longctx.request", "id": "...", "started_at": 1765000000.0,
     "path": "/v1/chat/completions",
     "request": {...the JSON body as sent...},
     "response": {"status": 200, "usage": {...}, "ttft_seconds": 0.41, "total_seconds": 0.9}}

Headers are never written (an ``Authorization`` or ``api-key`` header is
the application's secret), and body fields that carry a key by their name
(:data:`SECRET_FIELDS`) are replaced by ``"[redacted]"``. :mod:`longctx.lint.logs`
reads these lines back, so a recording can be linted as it is.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, TextIO

from longctx.lint.logs import RECORD_KIND

__all__ = ["SECRET_FIELDS", "RequestRecorder", "usage_of_events", "without_secrets"]

SECRET_FIELDS: Final = frozenset(
    {"api_key", "apikey", "api-key", "authorization", "password", "secret", "token"}
)
"""Body keys (any depth, any case) whose values are never written."""


def without_secrets(value: Any) -> Any:
    """``value`` with every :data:`SECRET_FIELDS` key's value replaced."""
    if isinstance(value, dict):
        return {
            key: "[redacted]" if str(key).lower() in SECRET_FIELDS else without_secrets(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [without_secrets(item) for item in value]
    return value


def usage_of_events(lines: list[bytes]) -> Mapping[str, Any] | None:
    """The last ``usage`` of a server-sent event stream's ``data:`` lines (None: no chunk carried one)."""
    usage: Mapping[str, Any] | None = None
    for line in lines:
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            continue
        try:
            event = json.loads(payload)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("usage"), dict):
            usage = event["usage"]
    return usage


class RequestRecorder:
    """Appends recorded requests to a JSONL file (thread-safe; each line flushed as written)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        self.count = 0

    def record(
        self,
        path: str,
        body: Mapping[str, Any],
        *,
        started_at: float,
        status: int | None,
        usage: Mapping[str, Any] | None,
        ttft_seconds: float | None,
        total_seconds: float | None,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        """Write one request's line; returns it."""
        line = {
            "kind": RECORD_KIND,
            "id": request_id or uuid.uuid4().hex[:16],
            "started_at": round(started_at, 6),
            "path": path,
            "request": without_secrets(dict(body)),
            "response": {
                "status": status,
                "usage": dict(usage) if usage is not None else None,
                "ttft_seconds": None if ttft_seconds is None else round(ttft_seconds, 6),
                "total_seconds": None if total_seconds is None else round(total_seconds, 6),
            },
        }
        text = json.dumps(line, ensure_ascii=False)
        with self._lock:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", encoding="utf-8")
            self._file.write(text + "\n")
            self._file.flush()
            self.count += 1
        return line

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
