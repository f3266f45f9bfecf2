"""Command-line flags made from an option object's fields: one field, one flag, one place.

Each field of an option object (:mod:`longctx.options`) that names a flag
becomes a click option here: its name, help text, type, default and
whether it repeats all come from the field's :class:`~longctx.options.OptionSpec`.
A command decorated with :func:`options_from_flags` gets the flags and is
passed one option object built from them, so adding an option to
:mod:`longctx.options.groups` adds its flag to every command that takes that object.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import click
from click.core import ParameterSource

from longctx.errors import ConfigError
from longctx.options import ALWAYS, DEFAULT, OptionFields, OptionSpec, option_spec, setting
from longctx.recordtypes import record_type

__all__ = ["Flag", "flags_of", "options_from_flags"]


@record_type
class Flag:
    """One flag of an option class: the field it sets (``path``: through nested options) and its spec."""

    path: tuple[str, ...]
    field: dataclasses.Field[Any]
    spec: OptionSpec
    owner: type[OptionFields]

    @property
    def parameter(self) -> str:
        """The name click passes the value under: the field's name (a nested field's own name)."""
        return self.path[-1]

    @property
    def field_default(self) -> Any:
        """The field's own default (what ``{default}`` in the help text names)."""
        if self.field.default is not dataclasses.MISSING:
            return self.field.default
        return self.field.default_factory()  # type: ignore[operator]

    @property
    def default(self) -> Any:
        """The command line's default: the spec's ``cli_default``, else the field's default."""
        return self.field_default if self.spec.cli_default is DEFAULT else self.spec.cli_default

    def checked(self, value: Any) -> Any:
        """``value`` as the field's own rule keeps it; its ConfigError names the flag (``--max-tokens:``)."""
        try:
            return self.owner.checked(self.parameter, value)
        except ConfigError as error:
            raise ConfigError(
                f"{self.spec.flag.split('/')[0] if self.spec.flag else self.parameter}: {error}"
            ) from None

    def click_option(self) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """The click option this flag is."""
        spec = self.spec
        assert spec.flag is not None
        keywords: dict[str, Any] = {"help": spec.help.format(default=self.field_default) + _range_text(spec)}
        if spec.multiple:
            keywords["multiple"] = True
        elif self.field.type in ("bool", bool) and "/" not in spec.flag:
            keywords["is_flag"] = True
        else:
            keywords["default"] = self.default
        if spec.metavar:
            keywords["metavar"] = spec.metavar
        if spec.show_default:
            keywords["show_default"] = True
        value_type = _click_type(spec)
        if value_type is not None:
            keywords["type"] = value_type
        return click.option(spec.flag, self.parameter, **keywords)


def _click_type(spec: OptionSpec) -> Any:
    # No click range: the field's own check refuses a value out of range, with
    # the ConfigError the API and the environment give for it (one rule).
    if spec.choices is not None:
        return click.Choice(spec.choices)
    if spec.value_type == "mapping":
        return _JSON_OBJECT
    return {"int": int, "float": float}.get(spec.value_type or "")


class _JsonObject(click.ParamType[Any]):
    """A JSON object on the command line (``--extra-body '{"top_k": 20}'``)."""

    name = "json"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Mapping):
            return value
        import json  # here: `longctx --help` parses no JSON

        try:
            loaded = json.loads(value)
        except json.JSONDecodeError as error:
            self.fail(f"not JSON: {error.msg} at column {error.colno}", param, ctx)
        if not isinstance(loaded, dict):
            self.fail("a JSON object is needed ({...})", param, ctx)
        return loaded


_JSON_OBJECT = _JsonObject()


def _range_text(spec: OptionSpec) -> str:
    """The range the help shows, as click writes one (``[x>=1]``, ``[0<=x<1]``)."""
    if spec.minimum is None and spec.maximum is None:
        return ""
    number = _as_int if spec.value_type == "int" else (lambda bound: bound)
    low = f"{number(spec.minimum)}{'<' if spec.minimum_open else '<='}" if spec.minimum is not None else ""
    high = f"{'<' if spec.maximum_open else '<='}{number(spec.maximum)}" if spec.maximum is not None else ""
    above = f"x{'>' if spec.minimum_open else '>='}{number(spec.minimum)}"
    return f"  [{low}x{high}]" if low and high else f"  [{above}]" if low else f"  [x{high}]"


def _as_int(bound: float | None) -> int | None:
    return None if bound is None else int(bound)


def flags_of(options: type[OptionFields], groups: Collection[str] = ()) -> list[Flag]:
    """The flags of ``options`` (those of :data:`~longctx.options.ALWAYS` and of ``groups``), in field order.

    A nested option object's flags stand in its field's place. Raises
    TypeError for a group no flag of ``options`` has.
    """
    every = list(_walk(options, ()))
    unknown = set(groups) - {flag.spec.group for flag in every}
    if unknown:
        raise TypeError(f"{options.__name__} has no flags of group {', '.join(sorted(unknown))}")
    return [flag for flag in every if flag.spec.group in (ALWAYS, *groups)]


def _walk(options: type[OptionFields], path: tuple[str, ...]) -> Iterator[Flag]:
    for field in dataclasses.fields(options):  # type: ignore[arg-type]
        spec = option_spec(field)
        if spec.nested is not None:
            yield from _walk(spec.nested, (*path, field.name))
        elif spec.flag is not None:
            yield Flag((*path, field.name), field, spec, options)


def options_from_flags(
    options: type[OptionFields], keyword: str, groups: Collection[str] = ()
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator giving a command the flags of ``options`` and passing them on as one object, ``keyword=``.

    A flag left out takes the value :func:`longctx.options.settings.setting` finds
    (``LONGCTX_<NAME>``, then the config files), checked by the field's own
    rule; a flag left at a ``cli_default`` of None with nothing configured is
    not passed, so the field's own default holds (the limits' flags). Fields without a flag (or of
    another group) keep their defaults.
    """
    flags = flags_of(options, groups)

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            context = click.get_current_context()
            given = {}
            for flag in flags:
                value = kwargs.pop(flag.parameter)
                if context.get_parameter_source(flag.parameter) is ParameterSource.COMMANDLINE:
                    value = flag.checked(value)
                else:
                    # A flag left out: the environment or a config file, else the default.
                    configured = setting(flag.owner, flag.parameter)
                    value = value if configured is None else configured.value
                given[flag.path] = value
            return function(*args, **{keyword: _build(options, (), given)}, **kwargs)

        command: Callable[..., Any] = wrapper
        for flag in reversed(flags):  # click lists the last applied first
            command = flag.click_option()(command)
        return command

    return decorate


def _build(options: type[OptionFields], path: tuple[str, ...], given: dict[tuple[str, ...], Any]) -> Any:
    values: dict[str, Any] = {}
    for field in dataclasses.fields(options):  # type: ignore[arg-type]
        spec = option_spec(field)
        here = (*path, field.name)
        if spec.nested is not None:
            values[field.name] = _build(spec.nested, here, given)
        elif here in given and not (given[here] is None and spec.cli_default is None):
            values[field.name] = given[here]
    return options(**values)
