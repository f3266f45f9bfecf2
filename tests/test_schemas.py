"""Typed answers: schemas read, sent as the engine takes them, answers validated, against the fake engine.

The real engines (constrained decoding from the tiny model, a schema'd
sibling's cached tokens): tests/test_schemas_engines.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
from click.testing import CliRunner, Result
from fake_engine import FakeEngine
from pydantic import BaseModel

from longctx import AnswerSchema, InvalidAnswer, Job, JobItem, answer_schema, read_job
from longctx.backends.base import Backend, ServerInfo
from longctx.backends.chat import ChatClient, ChatRequest
from longctx.backends.engines import GENERIC, SGLANG, VLLM
from longctx.backends.profiles import SchemaForm
from longctx.cli import Runtime, main
from longctx.cli.app import EXIT_INVALID_ANSWER, EXIT_USAGE
from longctx.errors import ConfigError
from longctx.schemas import concise_schema, schema_argument
from longctx.sessions import Session, ShardedSession
from longctx.store import Store, StoredPack

URL = "http://fake-engine:8000/v1"
PERSON = '{"name": "Ada", "age": 36}'
PACK = StoredPack(
    fingerprint="d" * 64,
    format_version="test/1",
    system="You answer questions about the documents.",
    prefix="<documents>\nAda Lovelace, born 1815.\n</documents>\n\n",
    summary={"title": "typed fixture"},
)


class Person(BaseModel):
    name: str
    age: int


# -- reading a schema ---------------------------------------------------------------


def test_the_concise_spec_is_simonw_llms() -> None:
    assert concise_schema("name, age int, bio: their biography") == {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "bio": {"type": "string", "description": "their biography"},
        },
        "required": ["name", "age", "bio"],
    }
    # Newlines separate fields when there are any, so a description may hold commas.
    spread = concise_schema("score float: from 0, to 1\nok bool\n")
    assert spread["properties"] == {
        "score": {"type": "number", "description": "from 0, to 1"},
        "ok": {"type": "boolean"},
    }


@pytest.mark.parametrize(
    ("spec", "message"),
    [("name, age integer", "unknown type 'integer'"), (" , ", "names no field"), ("a b c", "expected"),
     ("a, a int", "given twice")],
)  # fmt: skip
def test_a_bad_concise_spec_is_refused_naming_the_field(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        concise_schema(spec)


def test_answer_schema_takes_a_model_class_a_dict_and_a_spec() -> None:
    model = answer_schema(Person)
    assert model.name == "Person" and model.model is Person
    assert model.json_schema["required"] == ["name", "age"]
    given = answer_schema({"title": "a person!", "type": "object", "properties": {"x": {"type": "string"}}})
    assert given.name == "a_person" and given.model is None  # a name servers take
    assert answer_schema("name").json_schema["properties"] == {"name": {"type": "string"}}
    multi = answer_schema(Person, multi=True)
    assert multi.json_schema["properties"]["items"]["items"] == model.json_schema


@pytest.mark.parametrize(
    ("spec", "message"),
    [({"type": "object", "properties": 3}, "not a JSON Schema"), ({"type": "string"}, "a JSON object"),
     (42, "not int"), (int, "not type")],
)  # fmt: skip
def test_what_is_no_schema_is_refused(spec: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        answer_schema(spec)


def test_the_stored_form_round_trips_and_its_digest_follows_the_schema() -> None:
    schema = answer_schema(Person)
    again = AnswerSchema.from_dict(json.loads(json.dumps(schema.to_dict())))
    assert again == schema and again.digest == schema.digest and again.model is None
    assert answer_schema("name, age int").digest != answer_schema("name, age float").digest


def test_schema_argument_reads_a_file_or_a_spec(tmp_path: Path) -> None:
    path = tmp_path / "person.json"
    path.write_text(json.dumps(Person.model_json_schema()))
    assert schema_argument(str(path)).json_schema == Person.model_json_schema()
    assert schema_argument("name, age int").json_schema == concise_schema("name, age int")
    with pytest.raises(ConfigError, match="cannot read the schema file"):
        schema_argument(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="holds no JSON"):
        schema_argument(str(tmp_path / "bad.json"))


# -- validating an answer ----------------------------------------------------------------


def test_a_valid_answer_becomes_the_models_instance_or_the_parsed_json() -> None:
    assert answer_schema(Person).validated(PERSON, "stop") == Person(name="Ada", age=36)
    assert answer_schema("name, age int").validated(PERSON, "stop") == {"name": "Ada", "age": 36}
    people = answer_schema(Person, multi=True).validated(f'{{"items": [{PERSON}, {PERSON}]}}', "stop")
    assert people == [Person(name="Ada", age=36)] * 2


@pytest.mark.parametrize(
    ("text", "finish", "message"),
    [('{"name": "Ada", "ag', "length", "cut at max_tokens"), ("Ada, 36", "stop", "not JSON"),
     ('{"name": "Ada", "age": "old"}', "stop", "'old' is not of type 'integer' \\(at age\\)"),
     ('{"name": "Ada"}', "stop", "'age' is a required property")],
)  # fmt: skip
def test_a_cut_or_invalid_answer_is_an_error_that_keeps_the_text(
    text: str, finish: str, message: str
) -> None:
    with pytest.raises(InvalidAnswer, match=message) as caught:
        answer_schema(Person).validated(text, finish)
    assert caught.value.text == text and caught.value.finish_reason == finish


# -- the engines, as the registry knows them -----------------------------------------------


def _info(profile: object, version: str | None, settings: dict[str, object] | None = None) -> ServerInfo:
    return ServerInfo(
        api_url=URL, root_url=URL[:-3], profile=profile, version=version, model="m",  # type: ignore[arg-type]
        context_length=None, prefix_caching=None, cache_reporting=None, metrics=None,
        cache_block_tokens=None, settings=settings or {},
    )  # fmt: skip


@pytest.mark.parametrize("profile", [VLLM, SGLANG, GENERIC])
def test_every_engine_takes_the_schema_as_response_format(profile: object) -> None:
    schema = answer_schema(Person)
    fields = schema.request_fields(_info(profile, None))
    wrapped = {"name": "Person", "schema": schema.json_schema, "strict": True}
    assert fields == {"response_format": {"type": "json_schema", "json_schema": wrapped}}


def test_a_server_that_cannot_constrain_decoding_is_refused_before_sending() -> None:
    with pytest.raises(ConfigError, match=r"grammar_backend='none'.*--grammar-backend xgrammar"):
        answer_schema(Person).request_fields(_info(SGLANG, "0.5.23", {"grammar_backend": "none"}))
    with pytest.raises(ConfigError, match=r"vLLM 0\.5\.4 at .* cannot constrain an answer to a schema"):
        answer_schema(Person).request_fields(_info(VLLM, "0.5.4"))


def test_the_structured_outputs_form_puts_its_options_beside_the_schema() -> None:
    form = SchemaForm("0.10.2", "structured_outputs", {"disable_any_whitespace": True})
    assert form.body("n", {"type": "object"}) == {
        "structured_outputs": {"json": {"type": "object"}, "disable_any_whitespace": True}
    }


def test_the_constraint_wins_over_the_extra_body_and_leaves_the_messages(fake: FakeEngine) -> None:
    client = ChatClient(URL, "m", profile=GENERIC, transport=fake.transport())
    request = ChatRequest(
        messages=({"role": "user", "content": "q"},),
        extra_body={"response_format": {"type": "text"}, "top_k": 3},
        constraint={"response_format": {"type": "json_schema"}},
    )
    client.complete(request)
    body = fake.chat_bodies[-1]
    assert body["response_format"] == {"type": "json_schema"} and body["top_k"] == 3
    assert body["messages"] == [{"role": "user", "content": "q"}]


def test_a_schemad_request_sent_as_token_ids_carries_its_constraint_to_completions() -> None:
    """A prompt of token ids goes to ``/v1/completions``; the schema's field goes with it."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        seen.append((request.url.path, json.loads(request.content)))
        answered = {"index": 0, "text": PERSON, "finish_reason": "stop"}
        usage = {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}
        events = [{"id": "c", "choices": [answered]}, {"id": "c", "choices": [], "usage": usage}]
        stream = "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"
        return httpx2.Response(200, text=stream, headers={"content-type": "text/event-stream"})

    fields = answer_schema(Person).request_fields(_info(VLLM, "0.32.0"))
    client = ChatClient(URL, "m", profile=VLLM, transport=httpx2.MockTransport(handle))
    request = ChatRequest(
        messages=({"role": "user", "content": "q"},), prompt_ids=(1, 2, 3), constraint=fields
    )
    assert client.complete(request).text == PERSON
    ((path, body),) = seen
    assert path == "/v1/completions" and body["prompt"] == [1, 2, 3] and "messages" not in body
    assert body["response_format"] == fields["response_format"]


# -- sessions, against the fake engine -----------------------------------------------------


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(engine="generic", block=1, answer=PERSON)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "home")


def test_ask_with_a_schema_sends_it_as_a_field_and_the_prompt_unchanged(
    backend: Backend, fake: FakeEngine, store: Store
) -> None:
    session = Session(backend, PACK, store=store)
    typed = session.fork(at=0).ask("Who?", schema=Person)
    plain = session.fork(at=0).ask("Who?")
    typed_body, plain_body = fake.chat_bodies
    assert typed_body["messages"] == plain_body["messages"]  # the schema costs no prompt byte
    assert typed_body["response_format"]["json_schema"]["schema"] == Person.model_json_schema()
    assert "response_format" not in plain_body
    assert typed.data == Person(name="Ada", age=36) and plain.data is None
    assert typed.to_dict()["data"] == {"name": "Ada", "age": 36}
    assert typed.to_dict()["schema"] == answer_schema(Person).to_dict()
    assert "data" not in plain.to_dict()


def test_the_schema_is_stored_with_the_turn_and_later_turns_carry_none(
    backend: Backend, fake: FakeEngine, store: Store
) -> None:
    session = Session(backend, PACK, store=store)
    session.ask("Who?", schema="name, age int")
    session.ask("And then?")
    assert "response_format" not in fake.chat_bodies[-1]
    first, second = Session.resume(session.id, backend, store=store).turns
    assert first.schema == answer_schema("name, age int").to_dict() and second.schema is None


def test_an_invalid_answer_raises_with_its_text_and_stores_no_turn(
    backend: Backend, fake: FakeEngine, store: Store
) -> None:
    fake.answer = "Ada, aged 36"
    session = Session(backend, PACK, store=store)
    with pytest.raises(InvalidAnswer, match="not JSON") as caught:
        session.ask("Who?", schema=Person)
    assert caught.value.text == "Ada, aged 36"
    assert session.turns == ()  # the history holds only answers that are what they were asked to be
    fake.answer = PERSON
    assert session.ask("Who?", schema=Person).data == Person(name="Ada", age=36)


def test_siblings_each_carry_the_schema_and_a_stored_batch_gives_its_values_back(
    backend: Backend, fake: FakeEngine, store: Store
) -> None:
    session = Session(backend, PACK, store=store)
    batch = session.ask_many(["Who?", "Who else?"], schema=Person, reuse_answered=True)
    assert [answer.data for answer in batch] == [Person(name="Ada", age=36)] * 2
    assert all("response_format" in body for body in fake.chat_bodies)
    again = session.ask_many(["Who?", "Who else?"], schema=Person, reuse_answered=True)
    assert again.reused == 2 and again[0].data == Person(name="Ada", age=36)
    assert len(fake.chat_bodies) == 2


def test_aask_types_its_answer_too(backend: Backend, store: Store) -> None:
    async def asked() -> object:
        async with Session(backend, PACK, store=store) as session:
            return (await session.aask("Who?", schema=Person)).data

    assert asyncio.run(asked()) == Person(name="Ada", age=36)


def test_a_streamed_answer_is_typed_too_and_an_invalid_one_raises_from_the_stream(
    backend: Backend, fake: FakeEngine, store: Store
) -> None:
    session = Session(backend, PACK, store=store)
    with session.stream("Who?", schema=Person) as answer_stream:
        assert "".join(answer_stream) == PERSON
    assert "response_format" in fake.chat_bodies[-1]
    assert answer_stream.answer.data == Person(name="Ada", age=36)
    fake.answer = '{"name": "Ada"}'
    cut = session.stream("Who else?", schema=Person)
    with pytest.raises(InvalidAnswer, match="'age' is a required property"), cut:
        list(cut)
    assert len(session.turns) == 1  # the invalid answer is not stored


def test_cite_with_a_schema_an_unknown_keyword_and_shards_are_refused(
    backend: Backend, store: Store, tmp_path: Path
) -> None:
    session = Session(backend, PACK, store=store)
    with pytest.raises(ConfigError, match="cite and schema cannot be asked together"):
        session.ask("Who?", schema=Person, cite=True)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        session.ask("Who?", shema=Person)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="schema is not available over shards"):
        ShardedSession([str(tmp_path)]).ask("q?", schema=Person)


# -- the command line and jobs -----------------------------------------------------------------


def _cli(backend: Backend, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), obj=Runtime(backend=backend), input=stdin)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    root.mkdir()
    (root / "ada.txt").write_text("Ada Lovelace, born 1815.\n")
    return root


def test_ask_schema_json_holds_the_data_and_an_invalid_answer_exits_12(
    backend: Backend, fake: FakeEngine, folder: Path, tmp_path: Path
) -> None:
    result = _cli(backend, "ask", str(folder), "Who?", "--schema", "name, age int", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["data"] == {"name": "Ada", "age": 36}
    schema_file = tmp_path / "person.json"
    schema_file.write_text(json.dumps(Person.model_json_schema()))
    result = _cli(backend, "batch", str(folder), "--questions", "-", "--schema", str(schema_file), "-q",
                  stdin="Who?\nWho else?\n")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout.count(PERSON) == 2
    fake.answer = '{"name": "Ada"}'
    result = _cli(backend, "ask", str(folder), "Who?", "--schema", "name, age int", "-q")
    assert result.exit_code == EXIT_INVALID_ANSWER
    assert "'age' is a required property" in result.stderr and '{"name": "Ada"}' in result.stderr
    assert _cli(backend, "ask", str(folder), "Who?", "--schema-multi").exit_code == EXIT_USAGE


def test_a_job_items_schema_types_its_answer_and_a_changed_schema_asks_again(
    backend: Backend, fake: FakeEngine, store: Store, folder: Path, tmp_path: Path
) -> None:
    job_file = tmp_path / "job.jsonl"
    line = {"paths": str(folder), "question": "Who?", "schema": "name, age int"}
    job_file.write_text(
        json.dumps(line) + "\n" + json.dumps({"paths": str(folder), "question": "Why?"}) + "\n"
    )
    items = read_job(job_file)
    first = Job(items, backend=backend, store=store).run()
    typed, plain = first.results
    assert typed.data == {"name": "Ada", "age": 36} and typed.to_dict()["data"] == typed.data
    assert "data" not in plain.to_dict()
    assert sum("response_format" in body for body in fake.chat_bodies) == 1
    again = Job(items, backend=backend, store=store).run()
    assert again.resumed == 2 and again.results[0].data == {"name": "Ada", "age": 36}
    changed = (JobItem((str(folder),), "Who?", schema="name, age float"), items[1])
    third = Job(changed, backend=backend, store=store).run()
    assert third.results[0].asked_because == "the schema changed" and third.results[1].resumed
    with pytest.raises(ConfigError, match="'schema' must be"):
        JobItem.from_dict({"paths": "a", "question": "q", "schema": 3})
