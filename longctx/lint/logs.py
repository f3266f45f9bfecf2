"""Request logs: the formats people have, read into one :class:`LoggedRequest` per request.

One JSON object per line (blank lines and lines starting with ``#`` are
skipped). Each line is recognised by its shape, so one file may mix them:

- an OpenAI-style request body: ``{"model", "messages", ...}`` (chat) or
  ``{"model", "prompt", ...}`` (completions; ``prompt`` a string or a list
  of token ids);
- the OpenAI batch-file form ``{"custom_id", "url", "body": {...}}``;
- what longctx records (:mod:`longctx.lint.recording`: ``longctx proxy`` and
  :class:`~longctx.lint.recording.RequestRecorder`): ``{"kind":
  "longctx.request", "path", "request": {...}, "response": {...}}``, with the
  server's answer (status, usage, time to the first byte) beside the body;
- any object with the body under ``"request"`` or ``"body"`` and the answer
  under ``"response"`` (a generic recording proxy's log).

Nothing here tokenizes: :mod:`longctx.lint.rendering` does that.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any, Final, Literal

from longctx.errors import InputError
from longctx.recordtypes import record_type

__all__ = [
    "RECORD_KIND",
    "LoggedRequest",
    "ReportedUsage",
    "message_text",
    "read_log",
    "requests_from_lines",
]

RECORD_KIND: Final = "longctx.request"
"""The ``kind`` of a line longctx's recorder writes."""

RequestKind = Literal["chat", "completions"]


@record_type
class ReportedUsage:
    """What the server answered to a logged request, where the log kept it; None: not kept."""

    status: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_seconds: float | None = None


@record_type
class LoggedRequest:
    """One request of a log: its body's prompt part, and what the server answered if the log says.

    ``index`` is its position among the log's requests (0-based), ``line``
    its line in the file. ``messages`` for chat requests, ``prompt`` (text or
    token ids) for completions. ``tools`` and ``cache_salt`` shape the prompt
    (and the cache's namespace) too; ``user`` is the body's ``user`` field.
    """

    index: int
    line: int
    kind: RequestKind
    model: str | None
    messages: tuple[Mapping[str, Any], ...] = ()
    prompt: str | tuple[int, ...] | None = None
    tools: tuple[Mapping[str, Any], ...] = ()
    cache_salt: str | None = None
    user: str | None = None
    request_id: str | None = None
    timestamp: float | None = None
    reported: ReportedUsage = field(default_factory=ReportedUsage)

    @property
    def label(self) -> str:
        """How reports name it: its id where the log gave one, else ``#index``."""
        return self.request_id or f"#{self.index}"


def read_log(path: str | Path) -> list[LoggedRequest]:
    """The requests of the JSONL log at ``path``, in file order; :class:`InputError` names a bad line."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read the request log: {error}", path=source) from error
    return requests_from_lines(text.splitlines(), source=str(source))


def requests_from_lines(lines: Iterable[str], *, source: str = "<log>") -> list[LoggedRequest]:
    """The requests of JSONL ``lines`` (see the module docstring for the shapes read)."""
    found: list[LoggedRequest] = []
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            entry = json.loads(stripped)
        except json.JSONDecodeError as error:
            raise InputError(f"{source}:{number}: not JSON ({error.msg})") from error
        request = _request(entry, len(found), number, source)
        if request is not None:
            found.append(request)
    if not found:
        raise InputError(
            f"{source}: no request in the log (chat bodies, completions bodies, or recorded lines)"
        )
    return found


def _request(entry: Any, index: int, line: int, source: str) -> LoggedRequest | None:
    if not isinstance(entry, dict):
        raise InputError(f"{source}:{line}: a line is one JSON object, not {type(entry).__name__}")
    body, response, meta = _parts(entry)
    if body is None:
        return None  # a line of another kind (a note, a response alone): not a request
    if "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise InputError(f"{source}:{line}: messages is not a list of objects")
        kind: RequestKind = "chat"
        prompt: str | tuple[int, ...] | None = None
    elif "prompt" in body:
        kind, messages, prompt = "completions", [], _prompt(body["prompt"], source, line)
    else:
        return None
    tools = body.get("tools") or ()
    return LoggedRequest(
        index=index,
        line=line,
        kind=kind,
        model=_text(body.get("model")),
        messages=tuple(messages),
        prompt=prompt,
        tools=tuple(tools) if isinstance(tools, list) else (),
        cache_salt=_text(body.get("cache_salt")),
        user=_text(body.get("user")),
        request_id=_text(meta.get("id") or meta.get("custom_id") or meta.get("request_id")),
        timestamp=_number(meta.get("started_at") or meta.get("timestamp") or meta.get("ts")),
        reported=_reported(response),
    )


def _parts(entry: dict[str, Any]) -> tuple[dict[str, Any] | None, Mapping[str, Any], Mapping[str, Any]]:
    """The body, the response and the line's own fields of one log line."""
    for key in ("request", "body"):
        inner = entry.get(key)
        if isinstance(inner, dict) and ("messages" in inner or "prompt" in inner):
            response = entry.get("response")
            return inner, response if isinstance(response, dict) else {}, entry
    if "messages" in entry or "prompt" in entry:
        return entry, {}, entry
    return None, {}, entry


def _prompt(value: Any, source: str, line: int) -> str | tuple[int, ...]:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        return _prompt(value[0], source, line)  # a batch of one
    if isinstance(value, list) and all(isinstance(token, int) for token in value):
        return tuple(value)
    raise InputError(f"{source}:{line}: prompt is neither text nor one list of token ids")


def _reported(response: Mapping[str, Any]) -> ReportedUsage:
    usage = response.get("usage")
    if not isinstance(usage, dict):
        body = response.get("body")
        usage = body.get("usage") if isinstance(body, dict) else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    return ReportedUsage(
        status=_integer(response.get("status") or response.get("status_code")),
        prompt_tokens=_integer(usage.get("prompt_tokens")) if isinstance(usage, dict) else None,
        cached_tokens=_integer(details.get("cached_tokens")) if isinstance(details, dict) else None,
        ttft_seconds=_number(response.get("ttft_seconds")),
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def message_text(message: Mapping[str, Any]) -> str:
    """A message's content as text: a string as it is, content parts' text joined, images as a marker."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(part) for part in content)
    return json.dumps(content, ensure_ascii=False)


def _part_text(part: Any) -> str:
    if isinstance(part, dict) and part.get("type") == "text":
        return str(part.get("text", ""))
    if isinstance(part, dict) and "image_url" in part:
        url = part["image_url"].get("url", "") if isinstance(part["image_url"], dict) else ""
        return f"<image {len(url)} chars>"
    return json.dumps(part, ensure_ascii=False, sort_keys=False)
