"""A job's items: :class:`JobItem` (one question about one pack), and :func:`read_job` for JSONL.

An item names the paths of its pack, its question, the caller's ``id``
(echoed in its result) and, optionally, the schema its answer is typed by
(:mod:`longctx.schemas`). :class:`~longctx.jobs.job.Job` runs them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from longctx.errors import ConfigError
from longctx.recordtypes import record_type
from longctx.schemas import AnswerSchema, SchemaSpec, answer_schema
from longctx.sessions.corpus_sessions import as_paths

__all__ = ["JobItem", "read_job"]

_ITEM_KEYS = frozenset({"paths", "question", "id", "schema"})


@record_type
class JobItem:
    """One question about the pack of ``paths``; ``id`` is the caller's, echoed in the result.

    ``schema``: the answer is typed (:mod:`longctx.schemas`: a JSON Schema
    dict or a concise spec in a JSONL line; in Python also a pydantic model
    class); it is part of the answer's key, so a changed schema asks again.
    """

    paths: tuple[str, ...]
    question: str
    id: str | None = None
    schema: SchemaSpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "paths", tuple(os.fspath(path) for path in as_paths(self.paths)))
        if not self.paths or any(not path for path in self.paths):
            raise ConfigError("a job item needs at least one path, and no empty one")
        if not isinstance(self.question, str):
            raise TypeError(f"a job item's question must be a str, not {type(self.question).__name__}")
        if not self.question.strip():
            raise ConfigError("a job item's question is empty")
        if self.schema is not None:
            answer_schema(self.schema)  # refused here, before any pack is read

    @property
    def answer_schema(self) -> AnswerSchema | None:
        """The item's :class:`~longctx.schemas.AnswerSchema` (None: a plain answer)."""
        return None if self.schema is None else answer_schema(self.schema)

    @property
    def pack_key(self) -> tuple[str, ...]:
        """The absolute paths: items with the same key share one pack."""
        return tuple(os.path.abspath(path) for path in self.paths)

    @classmethod
    def from_dict(cls, data: Any, *, where: str = "a job item") -> JobItem:
        """An item from ``{"paths": str | [str, ...], "question": str, "id"?: str, "schema"?: dict | str}``.

        Raises :class:`~longctx.errors.ConfigError` naming ``where`` and the
        problem: not an object, a missing or unknown key, a wrong type.
        """
        if not isinstance(data, dict):
            kind = type(data).__name__
            raise ConfigError(f"{where}: expected an object with paths and question, got {kind}")
        unknown = sorted(set(data) - _ITEM_KEYS)
        if unknown:
            names = ", ".join(map(repr, unknown))
            raise ConfigError(f"{where}: unknown key {names} (known: id, paths, question, schema)")
        for key in ("paths", "question"):
            if key not in data:
                raise ConfigError(f"{where}: missing {key!r}")
        paths = data["paths"]
        if isinstance(paths, str):
            paths = [paths]
        if not isinstance(paths, list) or not all(isinstance(path, str) for path in paths):
            raise ConfigError(f"{where}: 'paths' must be a string or a list of strings")
        question, item_id = data["question"], data.get("id")
        if not isinstance(question, str):
            raise ConfigError(f"{where}: 'question' must be a string")
        if item_id is not None and not isinstance(item_id, (str, int)):
            raise ConfigError(f"{where}: 'id' must be a string or a number")
        schema = data.get("schema")
        if schema is not None and not isinstance(schema, (dict, str)):
            raise ConfigError(f"{where}: 'schema' must be a JSON Schema object or a concise spec string")
        try:
            return cls(tuple(paths), question, None if item_id is None else str(item_id), schema)
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}") from error

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"paths": list(self.paths), "question": self.question}
        if self.id is not None:
            data["id"] = self.id
        shape = self.answer_schema
        if shape is not None:
            data["schema"] = shape.json_schema
        return data


def read_job(source: str | os.PathLike[str] | IO[str]) -> tuple[JobItem, ...]:
    """The items of a JSONL file (a path, or an open text file such as stdin), in order.

    Each non-blank line is one :meth:`JobItem.from_dict` object. Raises
    :class:`~longctx.errors.ConfigError` naming the file and line of the
    first bad one, or when the file holds no item.
    """
    if isinstance(source, (str, os.PathLike)):
        name = os.fspath(source)
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as error:
            raise ConfigError(f"cannot read the job file {name}: {error.strerror or error}") from error
        except UnicodeDecodeError as error:
            raise ConfigError(f"the job file {name} is not UTF-8 text: {error}") from error
    else:
        name = getattr(source, "name", "<job>")
        text = source.read()
    items: list[JobItem] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name} line {number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{where}: not JSON ({error.msg} at column {error.colno})") from error
        items.append(JobItem.from_dict(data, where=where))
    if not items:
        raise ConfigError(f"the job file {name} holds no items")
    return tuple(items)
