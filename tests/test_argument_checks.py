"""Arguments are checked where they enter: a mistake fails at the line that made it.

Every field of every option object declares its type and range once and is
refused at construction; calls check what they are given; a path is checked
before any network.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import importlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fake_engine import FakeEngine

from longctx.backends.base import Backend
from longctx.cli import main, streaming
from longctx.cli.app import EXIT_BAD_INPUT, EXIT_EMPTY_CORPUS, Runtime
from longctx.errors import ConfigError, EmptyCorpus, InputError, SessionClosed
from longctx.jobs.items import JobItem
from longctx.jobs.job import Job
from longctx.options.fields import VALUE_TYPES, OptionFields, OptionSpec
from longctx.options.groups import ServerOptions
from longctx.sessions import DocSession, RepoSession, Session, ShardedSession
from longctx.store import Store, StoredPack

PACKAGE = Path(__file__).resolve().parent.parent / "longctx"


def _option_classes() -> list[type[OptionFields]]:
    """Every record type of longctx named ``...Options``, found in the source (so a new one is found too)."""
    found: list[type[OptionFields]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            decorated = isinstance(node, ast.ClassDef) and any(
                ast.unparse(decorator).startswith(("record_type", "dataclass"))
                for decorator in node.decorator_list
            )
            if decorated and node.name.endswith("Options"):  # type: ignore[union-attr]
                module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
                found.append(getattr(importlib.import_module(module), node.name))  # type: ignore[union-attr]
    return found


OPTION_CLASSES = _option_classes()


def test_the_option_classes_found_are_the_known_ones_and_all_are_option_objects() -> None:
    names = {options.__name__ for options in OPTION_CLASSES}
    assert {"CorpusOptions", "RequestOptions", "ServerOptions", "JobOptions", "CanaryOptions"} <= names
    for options in OPTION_CLASSES:
        assert issubclass(options, OptionFields), f"{options.__name__} checks no field: make it OptionFields"


def _every_field() -> Iterator[tuple[type[OptionFields], dataclasses.Field[Any]]]:
    seen: set[type] = set()
    pending = list(OPTION_CLASSES)
    while pending:
        options = pending.pop()
        if options in seen:
            continue
        seen.add(options)
        for field in dataclasses.fields(options):  # type: ignore[arg-type]
            spec = field.metadata.get("option")
            if isinstance(spec, OptionSpec) and spec.nested is not None:
                pending.append(spec.nested)
            yield options, field


FIELDS = list(_every_field())

# Values of the wrong type for each declared type (None is tried where None is not the default).
WRONG: dict[str, list[Any]] = {
    "int": ["1", 1.5, True],
    "float": ["1.0", True, [1]],
    "bool": [1, "yes"],
    "str": [5, b"x", ["a"]],
    "strings": ["one string", 5, [1], ("a", None)],
    "mapping": [5, [("a", 1)], "a=1"],
    "urls": [8000, ["http://a/v1", 3]],
}


def _refused(options: type[OptionFields], name: str, value: Any) -> str:
    with pytest.raises(ConfigError) as raised:
        options(**{name: value})
    message = str(raised.value)
    assert name in message, message
    return message


@pytest.mark.parametrize(("options", "field"), FIELDS, ids=[f"{o.__name__}.{f.name}" for o, f in FIELDS])
def test_every_option_field_refuses_a_wrong_type_and_a_value_out_of_its_range(
    options: type[OptionFields], field: dataclasses.Field[Any]
) -> None:
    spec = field.metadata.get("option")
    assert isinstance(spec, OptionSpec), f"{options.__name__}.{field.name} is not made with option()"
    options()  # the defaults pass their own checks
    if spec.nested is not None:
        assert "must be a" in _refused(options, field.name, 5)
        return
    assert spec.value_type in VALUE_TYPES, f"{options.__name__}.{field.name} declares no type"
    wrong = list(WRONG[spec.value_type])
    if field.default is not None:
        wrong.append(None)
    for value in wrong:
        message = _refused(options, field.name, value)
        assert repr(value) in message, message
        assert "must be" in message, message
    step = 1 if spec.value_type == "int" else 0.5
    if spec.minimum is not None:
        below = spec.minimum if spec.minimum_open else spec.minimum - step
        assert repr(type_of(spec)(below)) in _refused(options, field.name, type_of(spec)(below))
    if spec.maximum is not None:
        above = spec.maximum if spec.maximum_open else spec.maximum + step
        assert repr(type_of(spec)(above)) in _refused(options, field.name, type_of(spec)(above))
    if spec.choices is not None:
        assert "use one of" in _refused(options, field.name, "no-such-choice")


def type_of(spec: OptionSpec) -> type:
    return int if spec.value_type == "int" else float


def test_an_option_declared_without_a_type_is_refused_when_its_class_is_defined() -> None:
    from longctx.options.fields import option

    with pytest.raises(TypeError, match="declares its value_type"):
        option(None, flag="--untyped")


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (dict(temperature="hot"), "temperature must be a number from 0 to 2 or None, not 'hot'"),
        (dict(temperature=5.0), "temperature must be from 0 to 2, not 5.0"),
        (dict(seed="7"), "seed must be an integer or None, not '7'"),
        (dict(extra_body=["top_p"]), "extra_body must be a mapping, not ['top_p']"),
    ],
)
def test_the_request_options_a_new_user_got_wrong_fail_at_construction(
    options: dict[str, Any], expected: str
) -> None:
    from longctx.options.groups import RequestOptions

    with pytest.raises(ConfigError) as raised:
        RequestOptions(**options)
    assert str(raised.value) == expected


def test_the_server_options_a_new_user_got_wrong_fail_at_construction() -> None:
    for given, expected in [
        (dict(base_url=8000), "base_url must be a URL string or a list of URL strings or None, not 8000"),
        (dict(base_url="localhost:8000"), "base_url must be http:// or https:// URLs, not 'localhost:8000'"),
        (dict(timeout="10"), "timeout must be a number above 0, not '10'"),
        (dict(timeout=0), "timeout must be above 0, not 0"),
        (dict(replica_retry_seconds=-1), "replica_retry_seconds must be at least 0, not -1"),
    ]:
        with pytest.raises(ConfigError) as raised:
            ServerOptions(**given)
        assert str(raised.value) == expected
    assert ServerOptions(base_url=["http://a:1/v1", "http://b:2/v1"]).base_url == (
        "http://a:1/v1",
        "http://b:2/v1",
    )


# -- calls check what they are given ----------------------------------------------

PACK = StoredPack(
    fingerprint="c" * 64, format_version="test/1", system="You answer.", prefix="<documents>x</documents>\n",
    summary={"title": "fixture"},
)  # fmt: skip


@pytest.fixture
def session(backend: Backend, tmp_path: Path) -> Session:
    return Session(backend, PACK, store=Store.open(tmp_path / "home"))


def test_one_string_given_to_ask_many_is_refused_not_asked_per_character(
    session: Session, fake: FakeEngine
) -> None:
    with pytest.raises(TypeError, match=r"ask_many takes a list of questions, not str \(ask\(question\)"):
        session.ask_many("abc")
    assert fake.chat_bodies == []


@pytest.mark.parametrize("question", [None, 123, b"bytes"])
def test_a_question_that_is_no_string_is_a_type_error_naming_it(
    question: object, session: Session, fake: FakeEngine
) -> None:
    with pytest.raises(TypeError, match=f"question must be a str, not {type(question).__name__}"):
        session.ask(question)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=f"questions\\[1\\] must be a str, not {type(question).__name__}"):
        session.ask_many(["x", question])  # type: ignore[list-item]
    assert fake.chat_bodies == []


def test_a_sharded_session_checks_its_questions_before_anything_is_read(tmp_path: Path) -> None:
    # The paths do not exist and no server is named: the question's error comes first.
    sharded = ShardedSession([str(tmp_path / "missing")], store=Store.open(tmp_path / "home"))
    with pytest.raises(TypeError, match="question must be a str, not NoneType"):
        sharded.ask(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"questions\[1\] must be a str, not int"):
        sharded.ask_many(["x", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="not str"):
        sharded.ask_many("abc")


# What each call is refused at its own line for: (question, keywords, error, message).
BAD_CALLS = {
    "blank question": ("", {}, ConfigError, "the question is empty"),
    "question no string": (42, {}, TypeError, "question must be a str, not int"),
    "negative max_tokens": ("q", {"max_tokens": -5}, ConfigError, "max_tokens"),
    "unknown keyword": ("q", {"colour": "red"}, TypeError, "unexpected keyword argument"),
    "cite with schema": ("q", {"cite": True, "schema": {"type": "object"}}, ConfigError, "cite and schema"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_stream_and_astream_refuse_their_arguments_at_the_call_like_ask(
    case: str, session: Session, fake: FakeEngine
) -> None:
    # A plan is a generator: checks inside it would run only when the stream is iterated.
    question, keywords, error, message = BAD_CALLS[case]
    with pytest.raises(error, match=message):
        session.ask(question, **keywords)
    with pytest.raises(error, match=message):
        session.stream(question, **keywords)
    with pytest.raises(error, match=message):
        session.astream(question, **keywords)
    with pytest.raises(error, match=message):
        session.plan_ask(question, **keywords)
    assert fake.chat_bodies == [] and session.turns == ()


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_ask_many_and_its_plan_refuse_their_arguments_at_the_call(
    case: str, session: Session, fake: FakeEngine
) -> None:
    question, keywords, error, message = BAD_CALLS[case]
    message = message.replace("question must", r"questions\[1\] must").replace(
        "the question is empty", r"questions\[1\] is empty"
    )
    with pytest.raises(error, match=message):
        session.ask_many(["first", question], **keywords)
    with pytest.raises(error, match=message):
        session.plan_ask_many(["first", question], **keywords)

    async def awaited() -> None:
        await session.aask_many(["first", question], **keywords)

    with pytest.raises(error, match=message):
        asyncio.run(awaited())
    assert fake.chat_bodies == []


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_a_sharded_session_refuses_a_streams_arguments_at_the_call(case: str, tmp_path: Path) -> None:
    # The paths do not exist and no server is named: the call's own error comes first.
    sharded = ShardedSession([str(tmp_path / "missing")], store=Store.open(tmp_path / "home"))
    question, keywords, error, message = BAD_CALLS[case]
    for call in (sharded.stream, sharded.astream, sharded.plan_ask):
        with pytest.raises(error, match=message):
            call(question, **keywords)
    with pytest.raises(error, match=r"questions\[1\]" if case.startswith(("blank", "question")) else message):
        sharded.plan_ask_many(["first", question], **keywords)


def test_a_stream_made_before_its_session_closed_still_refuses_to_run(session: Session) -> None:
    answer_stream = session.stream("q")
    session.close()
    with pytest.raises(SessionClosed):
        list(answer_stream)


def test_the_cli_refuses_a_blank_question_without_contacting_the_server(
    tmp_path: Path, listener: Listener
) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    questions = tmp_path / "questions.txt"
    questions.write_text("one\ntwo\n")
    for args, message in (
        (["ask", str(tmp_path), " "], "the question is empty"),
        (["ask", str(tmp_path), "--question", ""], "the question is empty"),
        (["ask", str(tmp_path), "q", "--cite", "--schema", "answer str"], "cite and schema"),
        (
            ["batch", str(tmp_path), "--questions", str(questions), "--cite", "--schema", "a str"],
            "cite and schema",
        ),
    ):
        result = CliRunner().invoke(
            main, [*args, "--base-url", listener.url], env={"LONGCTX_HOME": str(tmp_path / "h")}
        )
        assert result.exit_code != 0 and message in result.stderr, (args, result.output)
        assert "Traceback" not in result.output
    assert listener.connections == 0


def test_the_cli_streamed_answer_refuses_its_question_before_the_spinner_starts(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []
    monkeypatch.setattr(streaming.Spinner, "start", lambda spinner: started.append("spinner") or spinner)
    with pytest.raises(ConfigError, match="the question is empty"):
        streaming.print_answer(session, "", streaming.Printing(stream=True, spinner=True, echo=True))
    assert started == []  # a spinner started before the refusal would be left spinning


@pytest.mark.parametrize("kind", [RepoSession, DocSession, ShardedSession])
def test_a_path_that_is_no_path_is_a_type_error_at_construction(kind: type) -> None:
    with pytest.raises(TypeError, match=r"paths must be a path or a sequence of paths, not int \(42\)"):
        kind(42)
    with pytest.raises(TypeError, match=r"paths\[1\] must be a str or os.PathLike, not NoneType"):
        kind(["a", None])


def test_a_job_checks_its_arguments_at_construction(tmp_path: Path) -> None:
    item = JobItem((str(tmp_path),), "q")
    with pytest.raises(TypeError, match="Job\\(\\) takes an iterable of JobItem, not str"):
        Job("abc")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Job\\(\\) item 1 is a dict, not a JobItem"):
        Job([item, {"paths": "a", "question": "q"}])  # type: ignore[list-item]
    for keyword in ("backend", "server", "store", "corpus", "request", "options"):
        with pytest.raises(TypeError, match=f"Job\\({keyword}=...\\) takes a"):
            Job([item], **{keyword: {}})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Job\(on_result=\.\.\.\) takes a function"):
        Job([item], on_result="print")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="at least one item"):
        Job([])
    with pytest.raises(TypeError, match="paths must be a path"):
        JobItem(42, "q")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="question must be a str, not NoneType"):
        JobItem(("a",), None)  # type: ignore[arg-type]


# -- a path is checked before any network -------------------------------------------


class Listener:
    """A server socket that records every connection made to it and closes it at once (no HTTP)."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(8)
        self.socket.settimeout(0.05)
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.socket.getsockname()[1]}/v1"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                accepted, _ = self.socket.accept()
            except TimeoutError:
                continue
            self.connections += 1
            accepted.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.socket.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


def _bad_paths(tmp_path: Path) -> dict[str, tuple[Path, type[InputError], int]]:
    empty = tmp_path / "empty"
    (empty / "sub" / "deeper").mkdir(parents=True)
    return {
        "missing folder": (tmp_path / "nonexistent", InputError, EXIT_BAD_INPUT),
        "missing PDF": (tmp_path / "report.pdf", InputError, EXIT_BAD_INPUT),
        "empty folder": (empty, EmptyCorpus, EXIT_EMPTY_CORPUS),
    }


@pytest.mark.parametrize("case", ["missing folder", "missing PDF", "empty folder"])
def test_the_cli_refuses_a_bad_path_at_once_without_contacting_the_server(
    case: str, tmp_path: Path, listener: Listener
) -> None:
    path, _, code = _bad_paths(tmp_path)[case]
    runner = CliRunner()
    for args in (
        ["ask", str(path), "q"],
        ["ask", str(path), "q", "--shard"],
        ["chat", str(path)],
    ):
        started = time.monotonic()
        result = runner.invoke(main, [*args, "--base-url", listener.url], input="")
        assert result.exit_code == code, (args, result.output)
        assert str(path) in result.stderr and "Traceback" not in result.output
        assert time.monotonic() - started < 2
        assert listener.connections == 0, args
    questions = tmp_path / "questions.txt"
    questions.write_text("one\ntwo\n")
    result = runner.invoke(
        main, ["batch", str(path), "--questions", str(questions), "--base-url", listener.url]
    )
    assert result.exit_code == code, result.output
    assert listener.connections == 0


@pytest.mark.parametrize("case", ["missing folder", "missing PDF", "empty folder"])
def test_a_session_refuses_a_bad_path_before_it_connects(
    case: str, tmp_path: Path, listener: Listener
) -> None:
    path, error, _ = _bad_paths(tmp_path)[case]
    store = Store.open(tmp_path / "home")
    for kind in (RepoSession, DocSession, ShardedSession):
        session = kind(str(path), base_url=listener.url, store=store)
        started = time.monotonic()
        with pytest.raises(error) as raised:
            session.ask("q")
        assert isinstance(raised.value, InputError)
        assert time.monotonic() - started < 2
        assert listener.connections == 0, kind.__name__


def test_an_unreadable_file_is_refused_before_any_network(
    tmp_path: Path, listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    locked = tmp_path / "locked.md"
    locked.write_text("text\n")
    locked.chmod(0)
    if os.access(locked, os.R_OK):  # root reads any file: say this one cannot be read
        real_access = os.access
        monkeypatch.setattr(
            os, "access", lambda path, mode, **kw: os.fspath(path) != str(locked) and real_access(path, mode)
        )
    result = CliRunner().invoke(main, ["ask", str(locked), "q", "--base-url", listener.url])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.stderr == f"longctx: error: {locked}: cannot read file: permission denied\n"
    with pytest.raises(InputError, match="cannot read file"):
        DocSession(locked, base_url=listener.url, store=Store.open(tmp_path / "home")).ask("q")
    assert listener.connections == 0


def test_a_good_path_still_reaches_the_server(backend: Backend, fake: FakeEngine, tmp_path: Path) -> None:
    (tmp_path / "doc.md").write_text("a document\n")
    result = CliRunner().invoke(main, ["ask", str(tmp_path / "doc.md"), "hi"], obj=Runtime(backend=backend))
    assert result.exit_code == 0, result.output
    assert len(fake.chat_bodies) == 1
