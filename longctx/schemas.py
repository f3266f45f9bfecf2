"""Typed answers: the schema an answer is decoded under, and the validated value it becomes.

``ask(..., schema=...)`` takes what :func:`answer_schema` takes: a pydantic
model class (anything with ``model_json_schema`` and ``model_validate``;
pydantic is never imported here), a JSON Schema dict, the concise spec of
simonw/llm (``"name, age int, bio: their biography"``), or an
:class:`AnswerSchema` made by it (``multi=True``: a list of such objects).

The schema travels as a request field (the engine profile says which:
:attr:`longctx.backends.profiles.EngineProfile.schema_forms`), never in the
prompt, so a schema'd question reads as much of the cached prefix as a plain
one. The server constrains decoding to it; longctx then validates the answer
again (:meth:`AnswerSchema.validated`, with ``jsonschema``, the one module that
imports it), since a server may ignore the field: an answer cut at
``max_tokens``, one that is no JSON, or one the schema refuses is an
:class:`~longctx.errors.InvalidAnswer` that keeps the raw text.

Stored form (:meth:`AnswerSchema.to_dict`): ``{"name", "schema", "multi"}``,
kept with each answer's turn; :attr:`AnswerSchema.digest` is part of a job
item's answer key, so a changed schema asks again.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from longctx.errors import ConfigError, InvalidAnswer
from longctx.recordtypes import record_type

if TYPE_CHECKING:
    from longctx.backends.base import ServerInfo

__all__ = [
    "CONCISE_TYPES",
    "AnswerSchema",
    "SchemaSpec",
    "answer_schema",
    "concise_schema",
    "json_value",
    "schema_argument",
]

CONCISE_TYPES: Final[Mapping[str, str]] = {
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
}
"""The types a concise spec's field may name, and their JSON Schema types (no type: ``str``)."""

SchemaSpec = Any
"""What ``schema=`` takes: an :class:`AnswerSchema`, a pydantic model class, a JSON Schema dict or a spec."""

_NAME_CHARACTERS = re.compile(r"[^A-Za-z0-9_-]+")


@record_type
class AnswerSchema:
    """A JSON Schema an answer must satisfy, its name, and the model class its value becomes (if any).

    ``json_schema`` is what the server is sent: with ``multi``, an object
    whose ``items`` is a list of ``item_schema`` (simonw/llm's
    ``--schema-multi``), and :attr:`Answer.data <longctx.sessions.answers.Answer.data>`
    is then the list. ``model`` is the pydantic(-like) class the value is
    made into (None: the parsed JSON).
    """

    name: str
    item_schema: Mapping[str, Any]
    multi: bool = False
    model: Any = field(default=None, compare=False, repr=False)

    @property
    def json_schema(self) -> dict[str, Any]:
        """The JSON Schema the whole answer satisfies (the request's, and the validator's)."""
        if not self.multi:
            return dict(self.item_schema)
        return {
            "type": "object",
            "properties": {"items": {"type": "array", "items": dict(self.item_schema)}},
            "required": ["items"],
        }

    @property
    def digest(self) -> str:
        """16 hex digits over the stored form: what a job's answer key holds of the schema."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """The stored form: ``{"name", "schema", "multi"}`` (a model class is kept as its JSON Schema)."""
        return {"name": self.name, "schema": dict(self.item_schema), "multi": self.multi}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AnswerSchema:
        """The schema :meth:`to_dict` wrote (its value is then parsed JSON, not a model instance)."""
        return cls(str(data["name"]), dict(data["schema"]), bool(data.get("multi", False)))

    def request_fields(self, server: ServerInfo) -> dict[str, Any]:
        """The body fields that constrain an answer from ``server`` to this schema, as its engine takes them.

        Raises :class:`~longctx.errors.ConfigError` before anything is sent
        when the engine (at its version) has no way to, or the server's
        settings turned it off (the message names the flag that turns it on).
        """
        engine = f"{server.profile.label} {server.version or '(version unknown)'} at {server.api_url}"
        form = server.profile.schema_form_for(server.version)
        if form is None:
            raise ConfigError(f"{engine} cannot constrain an answer to a schema: ask without one")
        refusal = form.refusal(server.settings)
        if refusal is not None:
            raise ConfigError(f"{engine}: {refusal}")
        return form.body(self.name, self.json_schema)

    def validated(self, text: str, finish_reason: str | None) -> Any:
        """The value of the answer ``text``: parsed, checked against the schema, made into the model.

        Raises :class:`~longctx.errors.InvalidAnswer` (with ``text``) when the
        answer was cut at ``max_tokens`` (``finish_reason`` ``"length"``), is
        no JSON, or the schema or the model refuses it.
        """
        if finish_reason == "length":
            raise InvalidAnswer(
                "the answer was cut at max_tokens before its JSON was complete; raise max_tokens"
                " (the CLI's --max-tokens)",
                text=text,
                finish_reason=finish_reason,
            )
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise InvalidAnswer(
                f"the answer is not JSON ({error.msg} at line {error.lineno} column {error.colno}); "
                "does the server constrain answers to a schema?",
                text=text,
                finish_reason=finish_reason,
            ) from error
        problem = _schema_problem(self.json_schema, value)
        if problem is not None:
            raise InvalidAnswer(
                f"the answer does not satisfy the schema: {problem}", text=text, finish_reason=finish_reason
            )
        items = value["items"] if self.multi else None
        if self.model is None:
            # A list with multi, as a model's answer is: the CLI's --json and the API give one shape.
            return items if items is not None else value
        try:
            if items is not None:
                return [self.model.model_validate(item) for item in items]
            return self.model.model_validate(value)
        except ValueError as error:  # pydantic's ValidationError is a ValueError
            raise InvalidAnswer(
                f"{self.name} refused the answer: {error}", text=text, finish_reason=finish_reason
            ) from error


def answer_schema(spec: SchemaSpec, *, multi: bool = False) -> AnswerSchema:
    """The :class:`AnswerSchema` of ``spec`` (see the module docstring); ``multi``: a list of them.

    Raises :class:`~longctx.errors.ConfigError` for a spec that is none of
    these, a concise spec with an unknown type, or a JSON Schema that is not
    one (checked against its metaschema).
    """
    if isinstance(spec, AnswerSchema):
        return (
            spec if not multi or spec.multi else AnswerSchema(spec.name, spec.item_schema, True, spec.model)
        )
    make_schema = getattr(spec, "model_json_schema", None)
    if isinstance(spec, type) and callable(make_schema):
        if not callable(getattr(spec, "model_validate", None)):
            raise ConfigError(f"schema class {spec.__name__} has no model_validate")
        schema = make_schema()
        return AnswerSchema(_name(spec.__name__), _checked(schema), multi, spec)
    if isinstance(spec, Mapping):
        schema = _checked(dict(spec))
        return AnswerSchema(_name(str(schema.get("title") or "answer")), schema, multi)
    if isinstance(spec, str):
        return AnswerSchema("answer", concise_schema(spec), multi)
    raise ConfigError(
        "schema must be a pydantic model class, a JSON Schema dict or a concise spec string"
        f" ('name, age int, bio: their biography'), not {type(spec).__name__}"
    )


def schema_argument(text: str, *, multi: bool = False) -> AnswerSchema:
    """The schema a command line gives (``--schema FILE|SPEC``): a JSON Schema file if ``text`` names one,
    else the concise spec.

    Raises :class:`~longctx.errors.ConfigError` for a file that cannot be
    read or holds no JSON (naming it), or a spec :func:`answer_schema` refuses.
    """
    path = Path(text)
    if text.endswith(".json") or path.is_file():
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except OSError as error:
            raise ConfigError(f"cannot read the schema file {text}: {error.strerror or error}") from error
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ConfigError(f"the schema file {text} holds no JSON: {error}") from error
        return answer_schema(loaded, multi=multi)
    return answer_schema(text, multi=multi)


def concise_schema(spec: str) -> dict[str, Any]:
    """The JSON Schema of a concise spec: simonw/llm's ``"name, age int, bio: their biography"``.

    Fields are separated by newlines when the spec has any, else by commas
    (so a description on its own line may hold commas). Each is a name, an
    optional type (:data:`CONCISE_TYPES`; default ``str``) and an optional
    description after a colon. Every field is required.
    """
    lines = spec.splitlines() if "\n" in spec.strip() else spec.split(",")
    properties: dict[str, Any] = {}
    for line in (part.strip() for part in lines):
        if not line:
            continue
        head, colon, description = line.partition(":")
        words = head.split()
        if not words or len(words) > 2:
            raise ConfigError(f"schema field {line!r}: expected 'name [type][: description]'")
        kind = words[1] if len(words) == 2 else "str"
        if kind not in CONCISE_TYPES:
            known = ", ".join(CONCISE_TYPES)
            raise ConfigError(f"schema field {words[0]!r}: unknown type {kind!r} (known: {known})")
        if words[0] in properties:
            raise ConfigError(f"schema field {words[0]!r} is given twice")
        properties[words[0]] = {"type": CONCISE_TYPES[kind]}
        if colon and description.strip():
            properties[words[0]]["description"] = description.strip()
    if not properties:
        raise ConfigError("the schema spec names no field")
    return {"type": "object", "properties": properties, "required": list(properties)}


def json_value(data: Any) -> Any:
    """``data`` (an :attr:`Answer.data`) as JSON values: a model instance (or a list of them) dumped."""
    if isinstance(data, list):
        return [json_value(item) for item in data]
    dump = getattr(data, "model_dump", None)
    return dump(mode="json") if callable(dump) else data


def _name(name: str) -> str:
    """A schema name as OpenAI-compatible servers take it: letters, digits, _ and -, at most 64."""
    return _NAME_CHARACTERS.sub("_", name).strip("_")[:64] or "answer"


def _checked(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` if it is a JSON Schema (by its metaschema), else a ConfigError naming the problem."""
    import jsonschema  # here: importing longctx imports no validator

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as error:
        raise ConfigError(f"not a JSON Schema: {error.message}") from error
    if schema.get("type") not in (None, "object") or not schema:
        raise ConfigError('an answer\'s schema must describe a JSON object ("type": "object")')
    return schema


def _schema_problem(schema: Mapping[str, Any], value: Any) -> str | None:
    """The first thing ``schema`` refuses in ``value`` (with where), or None."""
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path)
    return f"{error.message} (at {where})" if where else error.message
