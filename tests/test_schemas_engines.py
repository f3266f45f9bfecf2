"""Typed answers against the real vLLM and SGLang servers: decoding constrained, the prefix untouched.

Even the tiny random-weight model answers JSON that validates when the
server constrains decoding. Left alone it fills the JSON with whitespace until
max_tokens (measured on the CPU servers, vLLM 0.32.0 and SGLang 0.5.23: both
let any whitespace run between tokens, and neither takes a per-request switch
against it: vLLM's ``disable_any_whitespace`` is read from its server config
only, SGLang's is ``--constrained-json-disable-any-whitespace``). So these
tests ban the model's whitespace-only tokens with ``logit_bias``, a standard
request field, and bound the schema's strings and numbers (maxLength, a
range, an enum); then both engines answered a complete object in under 40
tokens. Validation itself is tested in tests/test_schemas.py.
"""

from __future__ import annotations

import sysconfig
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from engine_helpers import whitespace_ban
from pydantic import BaseModel, ConfigDict, Field

from longctx.backends.base import Backend, connect
from longctx.options.groups import RequestOptions
from longctx.packing.rendering import DOCUMENTS_OPENING, render_document, render_listing
from longctx.schemas import answer_schema
from longctx.sessions import Session
from longctx.store import Store, StoredPack
from longctx.testing import EngineHarness, LocalServer

STDLIB = Path(sysconfig.get_paths()["stdlib"])

PET = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "kind": {"enum": ["cat", "dog"]},
    },
    "required": ["name", "age", "kind"],
    "additionalProperties": False,
}


class Pet(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)
    kind: Literal["cat", "dog"]


def small_pack() -> StoredPack:
    """Two documents in the pack's own format, about 2,500 tokens, new to the server (a nonce)."""
    nonce = uuid.uuid4().hex
    text = (STDLIB / "textwrap.py").read_text()[:8_000]
    prefix = (
        DOCUMENTS_OPENING
        + render_document("lib/textwrap.py", text)
        + render_document("README.md", f"# fixture {nonce}\n")
        + render_listing([])
        + "Question:\n"
    )
    return StoredPack(
        fingerprint=nonce + nonce,
        format_version="test/1",
        system="You answer questions about the documents.",
        prefix=prefix,
        summary={"title": "typed"},
    )


@pytest.fixture(scope="module")
def no_whitespace(longctx_harness: EngineHarness) -> dict[str, Any]:
    """The request field that bans the tiny model's whitespace-only tokens (see the module docstring)."""
    ban = whitespace_ban(longctx_harness.model())
    assert ban["logit_bias"], "the tiny model has whitespace tokens"
    return ban


@pytest.fixture
def backend(engine_server: LocalServer) -> Iterator[Backend]:
    backend = connect(engine_server.api_base)
    yield backend
    backend.close()


def test_a_typed_sibling_reads_the_plain_prefix_and_its_data_validates(
    backend: Backend, tmp_path: Path, no_whitespace: dict[str, Any]
) -> None:
    store = Store.open(tmp_path / "home")
    request = RequestOptions(max_tokens=64, temperature=0.0, extra_body=no_whitespace)
    session = Session(backend, small_pack(), store=store, request=request)
    session.ask_many(["Alpha: what does wrap do?"])  # cold: prefills the pack
    session.settle()  # the pack's ids, made beside that request, are ready for the next two
    plain = session.ask_many(["Beta: name a pet."])[0]
    typed = session.ask_many(["Gamma: name a pet."], schema=PET)[0]
    assert plain.usage.cached_tokens is not None and plain.usage.cached_tokens > 0
    assert typed.usage.cached_tokens == plain.usage.cached_tokens  # the schema is no prompt byte
    # Both went as token ids (/v1/completions), which take the schema's field as chat does.
    assert plain.usage.prompt_form == typed.usage.prompt_form == "ids", (plain.usage, typed.usage)
    assert typed.finish_reason == "stop", typed.text
    assert set(typed.data) == {"name", "age", "kind"} and typed.data["kind"] in ("cat", "dog")
    (turn,) = store.sessions.turns(typed.session_id)
    assert turn.schema == answer_schema(PET).to_dict()


def test_a_typed_turn_is_a_model_instance_and_the_next_turn_reads_it_from_the_cache(
    backend: Backend, tmp_path: Path, no_whitespace: dict[str, Any]
) -> None:
    store = Store.open(tmp_path / "home")
    request = RequestOptions(max_tokens=64, temperature=0.0, extra_body=no_whitespace)
    session = Session(backend, small_pack(), store=store, request=request)
    first = session.ask("Name a pet.", schema=Pet)
    assert isinstance(first.data, Pet), first.text
    second = session.ask("And another?")
    block = backend.info.cache_block_tokens or 1
    assert first.usage.prompt_tokens is not None and second.usage.cached_tokens is not None
    reachable = first.usage.prompt_tokens - first.usage.prompt_tokens % block
    assert second.usage.cached_tokens >= 0.99 * reachable, (second.usage, first.usage)
