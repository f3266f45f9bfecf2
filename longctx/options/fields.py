"""Option fields: each option of an option object written once, with everything that follows from it.

An option object (:class:`~longctx.options.groups.CorpusOptions`,
:class:`~longctx.options.groups.RequestOptions`, ...) is a frozen dataclass of
:class:`OptionFields` whose fields are made by :func:`option`. A field's
metadata (:class:`OptionSpec`) says what it accepts (its type and range,
declared once and checked by :meth:`OptionSpec.checked` however the value
arrives), how it is kept with a stored session and read back, whether a
resumed session applies it, and how the command line spells it (its flag,
help text). So adding an option is one field: :meth:`OptionFields.to_dict`,
:meth:`OptionFields.from_dict` and the validation follow from the fields,
and ``longctx.cli`` builds each command's flags from them (click is not
imported here: the CLI's flags are data until the CLI reads them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING
from typing import Any, Final

from longctx.errors import ConfigError
from longctx.recordtypes import record_type

__all__ = ["ALWAYS", "DEFAULT", "VALUE_TYPES", "OptionFields", "OptionSpec", "option", "option_spec"]


class _Default:
    """The marker of a flag whose default is its field's."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Final = _Default()
"""A flag's ``cli_default`` when it is the field's own default (the usual case)."""

ALWAYS: Final = ""
"""The ``group`` of a flag every command with these options has."""


def _strings(value: Any) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes))
        and all(isinstance(item, str) for item in value)
    )


@record_type
class _ValueType:
    """One declared type: what a message calls it, which values it accepts, the form kept."""

    expected: str
    accepts: Callable[[Any], bool]
    keep: Callable[[Any], Any] = lambda value: value


VALUE_TYPES: Final[dict[str, _ValueType]] = {
    "int": _ValueType("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "float": _ValueType("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    "bool": _ValueType("true or false", lambda v: isinstance(v, bool)),
    "str": _ValueType("a string", lambda v: isinstance(v, str)),
    # A list given by the caller becomes a tuple, so the options stay hashable and frozen.
    "strings": _ValueType("a list or tuple of strings (not one string)", _strings, tuple),
    "mapping": _ValueType("a mapping", lambda v: isinstance(v, Mapping), dict),
    "urls": _ValueType(
        "a URL string or a list of URL strings",
        lambda v: isinstance(v, str) or _strings(v),
        lambda v: v if isinstance(v, str) else tuple(v),
    ),
}
"""The types a field may declare (``value_type``), besides ``"options"`` (a field holding ``nested``)."""


@record_type
class OptionSpec:
    """What a field of an option object is beyond its default: what it accepts, where it goes.

    What it accepts is declared here once: ``value_type`` (a key of
    :data:`VALUE_TYPES`: ``"int"``, ``"float"``, ``"bool"``, ``"str"``,
    ``"strings"``, ``"mapping"``, ``"urls"``; ``"options"`` for a
    ``nested`` option object, implied), ``minimum`` / ``maximum`` (with
    ``minimum_open`` / ``maximum_open``: excluded), ``choices``, and None
    where the field's default is None. :meth:`checked` applies them, then
    ``check(name, value)`` (``name``: the field's), a rule beyond type and
    range (the characters of a cache salt), which returns the value to keep
    or raises :class:`~longctx.errors.ConfigError`. ``load``
    converts the stored form back (identity when None; it is given None too); ``stored`` is
    whether :meth:`OptionFields.to_dict` writes it; ``on_resume`` whether a
    resumed session applies it when given again. ``nested`` is the option
    class a field holds (its own fields give its flags and its stored form).

    The command line: ``flag`` (``"--max-tokens"``, or
    ``"--follow-changes/--no-follow-changes"`` for a switch; None: no flag)
    with ``help`` (``{default}`` in it is the default); its value's type,
    choices and range are the field's (a bool field is a switch);
    ``multiple`` (repeatable, into a tuple), ``metavar``, ``show_default``;
    ``cli_default`` when the command line's default is not the field's (a
    flag left out then means "not given"); ``group`` names the commands'
    choice (:data:`ALWAYS`: every command with these options has it).
    A field with a flag can be set by ``LONGCTX_<NAME>`` and the config
    files (:mod:`longctx.options.settings`); ``settable`` lets one without a
    flag be set so too.
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
    minimum_open: bool = False
    maximum_open: bool = False
    multiple: bool = False
    metavar: str | None = None
    show_default: bool = False
    cli_default: Any = DEFAULT
    group: str = ALWAYS
    settable: bool = False

    def expected(self, none_allowed: bool = False) -> str:
        """What the field accepts, in words: ``an integer at least 1``, ``a number from 0 to 2``."""
        if self.nested is not None:
            kind = f"a {self.nested.__name__}"
        else:
            kind = VALUE_TYPES[self.value_type or ""].expected
        bounds = self.range_text()
        return f"{kind}{' ' + bounds if bounds else ''}{' or None' if none_allowed else ''}"

    def range_text(self) -> str:
        """The declared range in words (``at least 1``, ``above 0``, ``from 0 to 2``); empty when none."""
        low, high = self.minimum, self.maximum
        low_text = None if low is None else f"above {low:g}" if self.minimum_open else f"at least {low:g}"
        high_text = None if high is None else f"below {high:g}" if self.maximum_open else f"at most {high:g}"
        if low_text is None or high_text is None:
            return low_text or high_text or ""
        if self.minimum_open:
            return f"{low_text} and {high_text}"
        if self.maximum_open:
            return f"from {low:g} up to (not including) {high:g}"
        return f"from {low:g} to {high:g}"

    def in_range(self, value: Any) -> bool:
        low, high = self.minimum, self.maximum
        if low is not None and (value <= low if self.minimum_open else value < low):
            return False
        return high is None or (value < high if self.maximum_open else value <= high)

    def checked(self, name: str, value: Any, *, none_allowed: bool) -> Any:
        """``value`` as the field ``name`` keeps it, by the declared type, range and choices, then ``check``.

        Raises :class:`~longctx.errors.ConfigError` naming the field, the
        value and what is expected. ``none_allowed``: None is the field's
        default, so None is accepted (and kept) as "not set".
        """
        if value is None and none_allowed:
            return None if self.check is None else self.check(name, None)
        if self.nested is not None:
            if not isinstance(value, self.nested):
                raise ConfigError(f"{name} must be {self.expected(none_allowed)}, not {value!r}")
        else:
            value_type = VALUE_TYPES[self.value_type or ""]
            if not value_type.accepts(value):
                raise ConfigError(f"{name} must be {self.expected(none_allowed)}, not {value!r}")
            value = value_type.keep(value)
            if self.range_text() and not self.in_range(value):
                raise ConfigError(f"{name} must be {self.range_text()}, not {value!r}")
            if self.choices is not None and value not in self.choices:
                raise ConfigError(f"unknown {name} {value!r}; use one of {', '.join(self.choices)}")
        return value if self.check is None else self.check(name, value)


def option(
    default: Any = MISSING,
    *,
    default_factory: Callable[[], Any] | Any = MISSING,
    repr: bool = True,
    **spec: Any,
) -> Any:
    """A dataclass field with its :class:`OptionSpec` (the keywords of ``spec``) in its metadata.

    ``value_type`` must be among ``spec`` (unless ``nested`` is): a field that
    declares no type is a TypeError when its class is defined.
    """
    if spec.get("nested") is None and spec.get("value_type") not in VALUE_TYPES:
        raise TypeError(
            f"an option declares its value_type, one of {', '.join(VALUE_TYPES)};"
            f" not {spec.get('value_type')!r}"
        )
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
    ``__post_init__`` (before any check across fields), so a wrong type or a
    value out of range fails where the object is built.
    """

    __slots__ = ()

    def _check_fields(self) -> None:
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            object.__setattr__(self, field.name, _checked(field, getattr(self, field.name)))

    @classmethod
    def checked(cls, name: str, value: Any) -> Any:
        """``value`` for the field ``name`` as that field's own check keeps it (what construction does).

        The one rule for a value however it arrives: a per-call keyword
        (``ask(max_tokens=)``), a flag, the environment or a config file all
        pass through the field's declared type and range and its check, so
        each raises the same :class:`~longctx.errors.ConfigError`. A name that
        is no field is a TypeError (a bug).
        """
        for field in dataclasses.fields(cls):  # type: ignore[arg-type]
            if field.name == name:
                return _checked(field, value)
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


def _checked(field: dataclasses.Field[Any], value: Any) -> Any:
    if "option" not in field.metadata:
        return value  # a plain dataclass field of a subclass: not an option
    return option_spec(field).checked(field.name, value, none_allowed=field.default is None)


def _plain(value: Any) -> Any:
    if isinstance(value, OptionFields):
        return value.to_dict()
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return list(value)
    return value
