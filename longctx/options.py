"""Option fields: each option of an option object written once, with everything that follows from it.

An option object (:class:`~longctx.config.CorpusOptions`,
:class:`~longctx.config.RequestOptions`, ...) is a frozen dataclass of
:class:`OptionFields` whose fields are made by :func:`option`. A field's
metadata (:class:`OptionSpec`) says how it is checked, how it is kept
with a stored session and read back, whether a resumed session applies it,
and how the command line spells it (its flag, help text, value type). So
adding an option is one field: :meth:`OptionFields.to_dict`,
:meth:`OptionFields.from_dict` and the validation follow from the fields,
and ``longctx.cli`` builds each command's flags from them (click is not
imported here: the CLI's flags are data until the CLI reads them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from typing import Any, Final

__all__ = ["ALWAYS", "DEFAULT", "OptionFields", "OptionSpec", "option", "option_spec"]


class _Default:
    """The marker of a flag whose default is its field's."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Final = _Default()
"""A flag's ``cli_default`` when it is the field's own default (the usual case)."""

ALWAYS: Final = ""
"""The ``group`` of a flag every command with these options has."""


@dataclass(frozen=True)
class OptionSpec:
    """What a field of an option object is beyond its type and default.

    ``check(name, value)`` (``name``: the field's) returns the value to keep
    (converted, such as a list to a tuple) or raises
    :class:`~longctx.errors.ConfigError`. ``load``
    converts the stored form back (identity when None; it is given None too); ``stored`` is
    whether :meth:`OptionFields.to_dict` writes it; ``on_resume`` whether a
    resumed session applies it when given again. ``nested`` is the option
    class a field holds (its own fields give its flags and its stored form).

    The command line: ``flag`` (``"--max-tokens"``, or
    ``"--follow-changes/--no-follow-changes"`` for a switch; None: no flag)
    with ``help`` (``{default}`` in it is the default); ``value_type``
    (``"int"``, ``"float"``, ``"str"``; a bool field is a switch),
    ``choices``, ``minimum`` / ``maximum`` (``maximum_open``: excluded),
    ``multiple`` (repeatable, into a tuple), ``metavar``, ``show_default``;
    ``cli_default`` when the command line's default is not the field's (a
    flag left out then means "not given"); ``group`` names the commands'
    choice (:data:`ALWAYS`: every command with these options has it).
    """

    help: str = ""
    flag: str | None = None
    check: Callable[[str, Any], Any] | None = None
    load: Callable[[Any], Any] | None = None
    stored: bool = True
    on_resume: bool = False
    nested: type[OptionFields] | None = None
    value_type: str | None = None
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    maximum_open: bool = False
    multiple: bool = False
    metavar: str | None = None
    show_default: bool = False
    cli_default: Any = DEFAULT
    group: str = ALWAYS


def option(
    default: Any = MISSING,
    *,
    default_factory: Callable[[], Any] | Any = MISSING,
    repr: bool = True,
    **spec: Any,
) -> Any:
    """A dataclass field with its :class:`OptionSpec` (the keywords of ``spec``) in its metadata."""
    metadata = {"option": OptionSpec(**spec)}
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, repr=repr, metadata=metadata)
    return dataclasses.field(default=default, repr=repr, metadata=metadata)


def option_spec(field: dataclasses.Field[Any]) -> OptionSpec:
    """The spec of ``field`` (an empty one for a field made without :func:`option`)."""
    spec = field.metadata.get("option")
    return spec if isinstance(spec, OptionSpec) else OptionSpec()


class OptionFields:
    """What an option object gets from its fields: validation, :meth:`to_dict`, :meth:`from_dict`.

    A subclass is a frozen dataclass calling :meth:`_check_fields` from its
    ``__post_init__`` (before any check across fields).
    """

    __slots__ = ()

    def _check_fields(self) -> None:
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            spec = option_spec(field)
            if spec.check is not None:
                object.__setattr__(self, field.name, spec.check(field.name, getattr(self, field.name)))

    @classmethod
    def checked(cls, name: str, value: Any) -> Any:
        """``value`` for the field ``name`` as that field's own check keeps it (what construction does).

        The one rule for a value however it arrives: a per-call keyword
        (``ask(max_tokens=)``), a flag, the environment or a config file all
        pass through the check the field names, so each raises the same
        :class:`~longctx.errors.ConfigError`. A field without a check keeps
        ``value``; a name that is no field is a TypeError (a bug).
        """
        for field in dataclasses.fields(cls):  # type: ignore[arg-type]
            if field.name == name:
                check = option_spec(field).check
                return value if check is None else check(name, value)
        raise TypeError(f"{cls.__name__} has no option {name!r}")

    def to_dict(self) -> dict[str, Any]:
        """The stored form: every stored field, as plain JSON data (a nested option as its own dict)."""
        return {
            field.name: _plain(getattr(self, field.name))
            for field in dataclasses.fields(self)  # type: ignore[arg-type]
            if option_spec(field).stored
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        """The options :meth:`to_dict` wrote; keys it did not write (an older release's) take their defaults.

        Keys that are no field are ignored: a session's settings hold the
        options among other things.
        """
        given: dict[str, Any] = {}
        for field in dataclasses.fields(cls):  # type: ignore[arg-type]
            spec = option_spec(field)
            if not spec.stored or field.name not in data:
                continue
            value = data[field.name]
            if spec.nested is not None:
                value = spec.nested.from_dict(value or {})
            elif spec.load is not None:
                value = spec.load(value)
            given[field.name] = value
        return cls(**given)


def _plain(value: Any) -> Any:
    if isinstance(value, OptionFields):
        return value.to_dict()
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return list(value)
    return value
