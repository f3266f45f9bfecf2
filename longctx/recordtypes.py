"""``@record_type``: longctx's value classes, dataclasses made without compiling code at import.

A dataclass writes its ``__init__``, ``__repr__``, ``__eq__``, ``__hash__`` and, when frozen,
``__setattr__`` and ``__delattr__`` as source text and compiles each (``exec``) as the class is made.
A new ``longctx batch`` process made 169 dataclasses and compiled 955 methods so, most of them for
classes it never instantiated: 36% of the whole process's instructions were spent parsing and
compiling them (callgrind, Python 3.11.7, 2026-12-06). A record is still a dataclass: the standard
library collects its fields, so ``dataclasses.fields``, ``replace``, ``asdict`` and ``is_dataclass``
work on it as before. What differs is how its methods are made:

- ``__repr__``, ``__eq__`` and ``__hash__`` are shared functions that read the class's field names;
- a frozen record's ``__setattr__`` and ``__delattr__`` are closures, made without compiling;
- ``__init__`` is compiled the first time the class is instantiated, from the same kind of source
  dataclasses writes, so an instance costs what a dataclass's does.

Their behaviour is the dataclass's: equality compares fields with ``compare=True`` between instances
of the same class, a frozen record hashes those fields (a mutable one is unhashable), ``repr`` shows
fields with ``repr=True`` and survives a cycle, assigning or deleting a field of a frozen record
raises :class:`dataclasses.FrozenInstanceError`, and methods a class defines itself are kept.
``InitVar`` pseudo-fields are refused (no record needs them). One thing shows the laziness: until a
class's first instance, ``inspect.signature`` of the class reads ``(*args, **kwargs)`` (type checkers
read the fields, through ``dataclass_transform``).
"""

from __future__ import annotations

import dataclasses
import operator
import reprlib
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

_T = TypeVar("_T")
_MISSING = dataclasses.MISSING


@overload
def record_type(cls: type[_T], /) -> type[_T]: ...


@overload
def record_type(*, frozen: bool = True, slots: bool = False) -> Callable[[type[_T]], type[_T]]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field))
def record_type(cls: type[_T] | None = None, /, *, frozen: bool = True, slots: bool = False) -> Any:
    """Make ``cls`` a dataclass (frozen unless ``frozen=False``; with ``__slots__`` if ``slots``).

    The class returned is the one to use: with ``slots=True`` it is a new class, as with dataclasses.
    Raises TypeError where dataclasses would (a field without a default after one with a default),
    and for an ``InitVar``.
    """

    def wrap(klass: type[_T]) -> type[_T]:
        return _make(klass, frozen=frozen, slots=slots)

    return wrap if cls is None else wrap(cls)


def _make(cls: type[_T], *, frozen: bool, slots: bool) -> type[_T]:
    own = cls.__dict__
    if frozen and ("__setattr__" in own or "__delattr__" in own):
        raise TypeError(f"{cls.__qualname__}: a frozen record cannot define __setattr__ or __delattr__")
    # Read before dataclasses touches the class: what it defines itself is kept.
    explicit_init = "__init__" in own
    explicit_eq = "__eq__" in own
    explicit_repr = "__repr__" in own
    explicit_hash = "__hash__" in own and not (own["__hash__"] is None and explicit_eq)
    # dataclasses refuses a frozen class over a non-frozen one and the reverse, reading its bases'
    # parameters: a record says what it is there (below), and one over a frozen base is made frozen
    # by dataclasses too (its compiled __setattr__ and __delattr__ are then replaced by the closures).
    frozen_base = any(_params(base, "frozen") for base in cls.__mro__[1:])
    documented = bool(cls.__doc__)
    if not documented:
        cls.__doc__ = "-"  # dataclasses would parse a signature to write one; named below instead
    made: Any = dataclasses.dataclass(
        cls, init=False, repr=False, eq=False, frozen=frozen and frozen_base, slots=slots
    )
    # What the record does, for dataclasses' checks of a subclass and for anyone who reads them.
    for parameter, value in (("init", True), ("repr", True), ("eq", True), ("frozen", frozen)):
        setattr(made.__dataclass_params__, parameter, value)
    fields = dataclasses.fields(made)
    # The pseudo-fields fields() leaves out are ClassVars and InitVars; dataclasses tells them apart
    # only by a private marker, whose name is read here.
    for pseudo in made.__dataclass_fields__.values():
        if repr(getattr(pseudo, "_field_type", None)) == "_FIELD_INITVAR":
            raise TypeError(f"{cls.__qualname__}.{pseudo.name}: a record takes no InitVar")
    _check_defaults(made, fields)
    methods: dict[str, Any] = {}
    if not documented:
        methods["__doc__"] = f"{cls.__name__}({', '.join(f.name for f in fields)})"
    if not explicit_init:
        methods["__init__"] = _first_init(made, frozen=frozen, slots=slots)
    if not explicit_repr:
        methods["__record_repr__"] = tuple(f.name for f in fields if f.repr)
        methods["__repr__"] = _repr
    if not explicit_eq:
        methods["__record_key__"] = staticmethod(_key(tuple(f.name for f in fields if f.compare)))
        methods["__eq__"] = _eq
    if not explicit_hash:
        if frozen:
            hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
            methods["__record_hash_key__"] = staticmethod(_key(hashed))
            methods["__hash__"] = _hash
        else:
            methods["__hash__"] = None  # mutable: unhashable, as a dataclass is
    if frozen:
        methods.update(_frozen_methods(made, frozenset(f.name for f in fields)))
        if slots:
            methods.update(__getstate__=_getstate, __setstate__=_setstate)
    for name, method in methods.items():
        setattr(made, name, method)
    result: type[_T] = made
    return result


def _params(cls: type, name: str) -> bool:
    """One of the dataclass parameters ``cls`` was made with (False for a class that is no dataclass)."""
    return bool(getattr(getattr(cls, "__dataclass_params__", None), name, False))


def _check_defaults(cls: type, fields: tuple[dataclasses.Field[Any], ...]) -> None:
    """Refuse a positional field without a default after one with a default, as dataclasses does."""
    seen_default = False
    for f in fields:
        if not f.init or f.kw_only:
            continue
        if f.default is _MISSING and f.default_factory is _MISSING:
            if seen_default:
                message = f"non-default argument {f.name!r} follows default argument"
                raise TypeError(f"{cls.__qualname__}: {message}")
        else:
            seen_default = True


def _key(names: tuple[str, ...]) -> Callable[[Any], Any]:
    """The values of ``names`` as a tuple, as dataclasses compares and hashes them."""
    if not names:
        return lambda _: ()
    if len(names) == 1:
        one = operator.attrgetter(names[0])
        return lambda instance: (one(instance),)
    return operator.attrgetter(*names)


@reprlib.recursive_repr()
def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__record_repr__)
    return f"{self.__class__.__qualname__}({shown})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is self.__class__:
        key = self.__record_key__
        return key(self) == key(other)
    return NotImplemented


def _hash(self: Any) -> int:
    return hash(self.__record_hash_key__(self))


def _getstate(self: Any) -> list[Any]:
    return [getattr(self, f.name) for f in dataclasses.fields(self)]


def _setstate(self: Any, state: list[Any]) -> None:
    for f, value in zip(dataclasses.fields(self), state, strict=True):
        object.__setattr__(self, f.name, value)


def _frozen_methods(cls: type, names: frozenset[str]) -> dict[str, Callable[..., None]]:
    """A frozen dataclass's ``__setattr__`` and ``__delattr__``, as closures over ``cls``."""
    base: Any = cls  # super() of a class known only at run time

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(base, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(base, self).__delattr__(name)

    __setattr__.__qualname__ = f"{cls.__qualname__}.__setattr__"
    __delattr__.__qualname__ = f"{cls.__qualname__}.__delattr__"
    return {"__setattr__": __setattr__, "__delattr__": __delattr__}


def _first_init(cls: type, *, frozen: bool, slots: bool) -> Callable[..., None]:
    """An ``__init__`` that compiles the class's own at its first call, puts it in place and runs it."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init = _compile_init(cls, frozen=frozen, slots=slots)
        setattr(cls, "__init__", init)  # noqa: B010 - a method put in place at run time
        init(self, *args, **kwargs)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


_HAS_FACTORY = object()  # a parameter's default that says "call the field's default_factory"


def _compile_init(cls: type, *, frozen: bool, slots: bool) -> Callable[..., None]:
    """The ``__init__`` dataclasses would write for ``cls``: the same parameters, defaults and order."""
    namespace: dict[str, Any] = {"_HAS_FACTORY": _HAS_FACTORY, "_setattr": object.__setattr__}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for f in dataclasses.fields(cls):
        name = f.name
        if f.default_factory is not _MISSING:
            namespace[f"_factory_{name}"] = f.default_factory
            made = f"_factory_{name}()"
            value = f"{made} if {name} is _HAS_FACTORY else {name}" if f.init else made
            default = "=_HAS_FACTORY"
        elif f.default is not _MISSING:
            namespace[f"_default_{name}"] = f.default
            value = name if f.init else f"_default_{name}"
            default = f"=_default_{name}"
            if not f.init and not slots:
                continue  # the class attribute holds the default, as with dataclasses
        else:
            if not f.init:
                continue
            value, default = name, ""
        if f.init:
            (keyword if f.kw_only else positional).append(f"{name}{default}")
        body.append(f"_setattr(self, {name!r}, {value})" if frozen else f"self.{name} = {value}")
    if hasattr(cls, "__post_init__"):
        body.append("self.__post_init__()")
    parameters = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    source = f"def __init__({parameters}):\n" + "".join(f"    {line}\n" for line in body or ["pass"])
    exec(compile(source, f"<record {cls.__qualname__}.__init__>", "exec"), namespace)
    init: Callable[..., None] = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init
