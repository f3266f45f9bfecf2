"""Where an option's value comes from when no argument or flag gives it.

An explicit value (an argument, a flag) wins over the environment
(``LONGCTX_<NAME>``), which wins over the project file (``.longctx.toml``,
:func:`project_config_file`), which wins over the user file
(:func:`user_config_file`), which wins over the field's default. The option
classes whose flagged fields may be set so register with :func:`settable`
(:mod:`longctx.options.groups`'s do); :func:`setting` finds a field's value, checked by
the field's own rule.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Final, TypeVar

from longctx.errors import ConfigError
from longctx.options.fields import OptionFields, OptionSpec, option_spec
from longctx.process_state import PROCESS
from longctx.recordtypes import record_type

__all__ = [
    "PROJECT_CONFIG_NAME",
    "Setting",
    "environment_variable",
    "project_config_file",
    "settable",
    "settable_keys",
    "setting",
    "user_config_file",
]


@record_type
class Setting:
    """A value configured for an option outside the call, and where it was found.

    ``source`` names it as a user would look for it: ``LONGCTX_MAX_TOKENS``.
    """

    value: Any
    source: str


def environment_variable(name: str) -> str:
    """The variable that sets the option ``name``: ``LONGCTX_`` and its name in capitals."""
    return f"LONGCTX_{name.upper()}"


_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


def setting(options: type[OptionFields], name: str) -> Setting | None:
    """The value configured for the field ``name`` of ``options``; None when nothing sets it.

    In this order, the first that sets it wins: ``LONGCTX_<NAME>``, the
    project file (:func:`project_config_file`), the user file
    (:func:`user_config_file`); a flag or an argument, where there is one,
    wins over all three. A variable's text is converted by the field's type
    (a number, a switch as ``1/0``, ``true/false``, ``yes/no``, ``on/off``,
    a repeatable flag as a comma-separated list); a file's value must
    already have the type (a TOML integer, string, boolean, list of strings).
    Either is checked by the field's own rule
    (:meth:`~longctx.options.OptionFields.checked`), so a bad value raises the
    :class:`~longctx.errors.ConfigError` the API and the flag raise, prefixed
    with where it was found (``LONGCTX_MAX_TOKENS: ...``, ``/path/.longctx.toml:
    max_tokens: ...``).
    """
    field = _field(options, name)
    variable = environment_variable(name)
    text = os.environ.get(variable, "").strip()
    if text:
        return Setting(_checked(options, field, _from_text(field, text, variable), variable), variable)
    for path in (project_config_file(), user_config_file()):
        if path is None:
            continue
        values = _file_values(path)
        if name in values:
            source = f"{path}: {name}"
            value = _checked(options, field, _from_toml(field, values[name], source), source)
            return Setting(value, source)
    return None


PROJECT_CONFIG_NAME: Final = ".longctx.toml"
"""The project file's name, looked for from the current folder up (:func:`project_config_file`)."""


def user_config_file() -> Path | None:
    """The user's config file: ``$LONGCTX_CONFIG`` if set, else ``config.toml`` in the user config folder.

    The folder is the platform's (``platformdirs.user_config_dir("longctx")``:
    ``~/.config/longctx`` on Linux, ``~/Library/Application Support/longctx``
    on macOS, ``%LOCALAPPDATA%\\longctx`` on Windows). None when the file does
    not exist.
    """
    configured = os.environ.get("LONGCTX_CONFIG")
    if configured is not None:
        path = Path(configured).expanduser() if configured.strip() else None
    else:
        import platformdirs  # imported here: only a command that reads settings needs it

        path = Path(platformdirs.user_config_dir("longctx", appauthor=False)) / "config.toml"
    return path if path is not None and path.is_file() else None


def project_config_file(start: Path | None = None) -> Path | None:
    """The nearest ``.longctx.toml`` from ``start`` (the current folder) up; None if there is none.

    The search stops after the first folder that holds ``.git`` (the
    repository's root) or is the home folder, so a file above the project
    or outside the user's home is never read.
    """
    folder = (start or Path.cwd()).resolve()
    home = Path.home().resolve()
    while True:
        candidate = folder / PROJECT_CONFIG_NAME
        if candidate.is_file():
            return candidate
        if folder == home or (folder / ".git").exists() or folder.parent == folder:
            return None
        folder = folder.parent


class _ParsedFiles:
    """The config files parsed so far, each with the (mtime, size) it was parsed at (in ``PROCESS``)."""

    def __init__(self) -> None:
        self.files: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}


def _file_values(path: Path) -> dict[str, Any]:
    """The keys of the config file ``path`` (parsed once per version of the file); unknown keys refused."""
    stat = path.stat()
    version = (stat.st_mtime_ns, stat.st_size)
    parsed = PROCESS.get(_ParsedFiles).files
    cached = parsed.get(path)
    if cached is not None and cached[0] == version:
        return cached[1]
    import tomllib  # imported here: most runs have no config file

    try:
        values = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: not a valid TOML file: {error}") from None
    known = settable_keys()
    for key in values:
        if key not in known:
            raise ConfigError(f"{path}: unknown key {key!r}; the keys are {', '.join(sorted(known))}")
    parsed[path] = (version, values)
    return values


_SETTABLE: list[type[OptionFields]] = []
_O = TypeVar("_O", bound=type[OptionFields])


def settable(options: _O) -> _O:
    """Register ``options``: a class whose flagged fields a config file or variable may set (a decorator)."""
    _SETTABLE.append(options)
    return options


def settable_keys() -> dict[str, type[OptionFields]]:
    """Every option a config file or ``LONGCTX_<NAME>`` may set (flagged or ``settable``), and its class."""
    keys: dict[str, type[OptionFields]] = {}

    def walk(options: type[OptionFields]) -> None:
        for field in dataclasses.fields(options):  # type: ignore[arg-type]
            spec = option_spec(field)
            if spec.nested is not None:
                walk(spec.nested)
            elif spec.flag is not None or spec.settable:
                keys[field.name] = options

    for options in _SETTABLE:
        walk(options)
    return keys


def _listed(spec: OptionSpec) -> bool:
    """Whether a value of the field is a list of strings: a repeatable flag's, or a ``strings`` field's."""
    return spec.multiple or spec.value_type == "strings"


def _from_toml(field: dataclasses.Field[Any], value: Any, source: str) -> Any:
    spec = option_spec(field)
    if _listed(spec):
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ConfigError(f"{source}: must be a list of strings, not {value!r}")
        return tuple(value)
    if field.name == "base_url" and isinstance(value, list):
        return tuple(value)  # several replicas
    expected: tuple[type, ...]
    if _is_switch(field):
        expected, kind = (bool,), "true or false"
    elif spec.value_type == "int":
        expected, kind = (int,), "an integer"
    elif spec.value_type == "float":
        expected, kind = (int, float), "a number"
    else:
        expected, kind = (str,), "a string"
    if not isinstance(value, expected) or (bool not in expected and isinstance(value, bool)):
        raise ConfigError(f"{source}: must be {kind}, not {value!r}")
    return value


def _field(options: type[OptionFields], name: str) -> dataclasses.Field[Any]:
    for field in dataclasses.fields(options):  # type: ignore[arg-type]
        if field.name == name:
            return field
    raise TypeError(f"{options.__name__} has no option {name!r}")


def _is_switch(field: dataclasses.Field[Any]) -> bool:
    return field.type in ("bool", bool)


def _from_text(field: dataclasses.Field[Any], text: str, source: str) -> Any:
    spec = option_spec(field)
    if _listed(spec):
        return tuple(part.strip() for part in text.split(",") if part.strip())
    if _is_switch(field):
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ConfigError(
            f"{source}: {field.name} is a switch: 1 or 0 (true/false, yes/no, on/off), not {text!r}"
        )
    if spec.value_type == "mapping":  # a JSON object, as the flag takes it (LONGCTX_EXTRA_BODY)
        import json

        try:
            loaded = json.loads(text)
        except json.JSONDecodeError:
            loaded = None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{source}: {field.name} must be a JSON object, not {text!r}")
        return loaded
    convert = {"int": int, "float": float}.get(spec.value_type or "")
    if convert is None:
        return text
    try:
        return convert(text)
    except ValueError:
        kind = "an integer" if convert is int else "a number"
        raise ConfigError(f"{source}: {field.name} must be {kind}, not {text!r}") from None


def _checked(options: type[OptionFields], field: dataclasses.Field[Any], value: Any, source: str) -> Any:
    try:
        return options.checked(field.name, value)
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None
