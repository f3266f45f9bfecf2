"""``@record_type`` behaves as the dataclass it replaces, and compiles nothing until an instance is made."""

from __future__ import annotations

import builtins
import copy
import dataclasses
import pickle
from dataclasses import FrozenInstanceError, field
from typing import Any, ClassVar

import pytest

from longctx.recordtypes import record_type


@record_type
class Point:
    """A frozen record with defaults, a factory and a field left out of comparison and repr."""

    x: int
    y: int = 0
    tags: list[str] = field(default_factory=list)
    note: str = field(default="", compare=False, repr=False)
    KIND: ClassVar[str] = "point"


@dataclasses.dataclass(frozen=True)
class PointDataclass:
    """The same fields as a standard dataclass: the behaviour to match."""

    x: int
    y: int = 0
    tags: list[str] = field(default_factory=list)
    note: str = field(default="", compare=False, repr=False)
    KIND: ClassVar[str] = "point"


@record_type(slots=True)
class Pair:
    """A frozen record with slots."""

    left: str
    right: tuple[int, ...] = ()


@record_type(frozen=False)
class Counter:
    """A mutable record with a __post_init__ and a field set there."""

    start: int
    seen: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.seen = self.start * 2


def test_a_record_compares_hashes_and_prints_as_the_dataclass_does() -> None:
    for kind in (Point, PointDataclass):
        first, same, other_note = kind(1, 2), kind(1, 2), kind(1, 2, note="x")  # type: ignore[operator]
        assert first == same == other_note and first != kind(1, 3)  # type: ignore[operator]
        assert first != (1, 2, [], "")  # another class never compares equal
    assert repr(Point(1, 2, ["a"], "hidden")) == "Point(x=1, y=2, tags=['a'])"
    assert repr(Point(1, 2, ["a"])) == repr(PointDataclass(1, 2, ["a"])).replace("PointDataclass", "Point")
    assert hash(Pair("a", (1,))) == hash(Pair("a", (1,)))
    assert {Pair("a"), Pair("a"), Pair("b")} == {Pair("a"), Pair("b")}
    assert Counter.__hash__ is None  # mutable: unhashable, as a dataclass is
    assert Point(1).tags is not Point(1).tags  # the factory runs per instance


def test_a_frozen_record_refuses_assignment_and_deletion() -> None:
    point, pair = Point(1), Pair("a")
    for instance, name in ((point, "x"), (pair, "left")):
        with pytest.raises(FrozenInstanceError, match=f"cannot assign to field '{name}'"):
            setattr(instance, name, 5)
        with pytest.raises(FrozenInstanceError, match=f"cannot delete field '{name}'"):
            delattr(instance, name)
    with pytest.raises(FrozenInstanceError):
        point.extra = 1  # type: ignore[attr-defined]


def test_dataclasses_functions_work_on_records() -> None:
    point = Point(1, 2, ["a"], "n")
    assert dataclasses.is_dataclass(point)
    assert [f.name for f in dataclasses.fields(point)] == ["x", "y", "tags", "note"]
    assert dataclasses.asdict(point) == {"x": 1, "y": 2, "tags": ["a"], "note": "n"}
    assert dataclasses.replace(point, y=5) == Point(1, 5, ["a"], "n")
    assert Point.__match_args__ == ("x", "y", "tags", "note")
    assert Point.__dataclass_params__.frozen and not Counter.__dataclass_params__.frozen  # type: ignore[attr-defined]
    counter = Counter(3)
    assert counter.seen == 6
    counter.start = 4  # a mutable record takes assignment
    assert counter != Counter(4) and repr(counter) == "Counter(start=4, seen=6)"
    counter.seen = 8
    assert counter == Counter(4)


def test_a_record_copies_and_pickles() -> None:
    for value in (Point(1, 2, ["a"]), Pair("a", (1, 2))):
        assert copy.copy(value) == value
        assert copy.deepcopy(value) == value
        assert pickle.loads(pickle.dumps(value)) == value


def test_arguments_and_their_errors_are_the_dataclass_ones() -> None:
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'x'"):
        Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        Point(1, z=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):

        @record_type
        class Wrong:
            a: int = 0
            b: int  # type: ignore[misc]

    @record_type
    class KeywordOnly:
        a: int
        b: int = field(kw_only=True, default=0)
        c: str = "c"

    assert KeywordOnly(1, "x", b=2) == KeywordOnly(a=1, c="x", b=2)
    with pytest.raises(TypeError):
        KeywordOnly(1, "x", 2)  # type: ignore[misc]


def test_subclasses_of_records_and_of_dataclasses_mix_as_dataclasses_allow() -> None:
    @record_type
    class Child(Point):
        z: int = 9

    @dataclasses.dataclass(frozen=True)
    class StandardChild(Point):
        z: int = 8

    assert Child(1).z == 9 and Child(1) != Point(1)
    assert StandardChild(1, 2) == StandardChild(1, 2) and StandardChild(1).z == 8
    with pytest.raises(FrozenInstanceError):
        Child(1).z = 3  # type: ignore[misc]
    with pytest.raises(TypeError, match="cannot inherit non-frozen dataclass from a frozen one"):

        @record_type(frozen=False)
        class Thawed(Point):
            pass


def test_a_class_s_own_methods_are_kept() -> None:
    @record_type
    class Shown:  # noqa: PLW1641 - the record makes a frozen class's __hash__ from its fields
        a: int

        def __repr__(self) -> str:
            return "shown"

        def __eq__(self, other: object) -> bool:
            return True

    assert repr(Shown(1)) == "shown" and Shown(1) == 5
    assert hash(Shown(1)) == hash(Shown(1))  # frozen, with its own __eq__: hashed by its fields
    with pytest.raises(TypeError, match="InitVar"):

        @record_type
        class Initvar:
            a: dataclasses.InitVar[int]


def test_no_code_is_compiled_until_the_first_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of records: making the class compiles nothing; its first instance compiles __init__ once."""
    compiled: list[str] = []
    real_compile = builtins.compile
    real_exec = builtins.exec

    def counting_compile(source: Any, filename: Any, *args: Any, **kwargs: Any) -> Any:
        compiled.append(str(filename))
        return real_compile(source, filename, *args, **kwargs)

    def counting_exec(source: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(source, str):
            compiled.append("exec of source")
        return real_exec(source, *args, **kwargs)

    monkeypatch.setattr(builtins, "compile", counting_compile)
    monkeypatch.setattr(builtins, "exec", counting_exec)

    @record_type
    class Lazy:
        a: int
        b: str = "b"

    assert compiled == []
    assert Lazy(1) == Lazy(1, "b")
    assert compiled == ["<record test_no_code_is_compiled_until_the_first_instance.<locals>.Lazy.__init__>"]
    compiled.clear()

    @dataclasses.dataclass(frozen=True)
    class Standard:
        a: int
        b: str = "b"

    assert len(compiled) >= 5  # what the standard dataclass compiles as the class is made
