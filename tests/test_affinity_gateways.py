"""Affinity through the distributed engines' gateways, against fake gateways that route by them.

- llm-d: the gateway sets ``x-session-token`` (the serving pod, base64) on a
  response; the client echoes it, and the gateway sends the request to
  that pod. Without the echo, requests scatter.
- NVIDIA Dynamo: ``X-Dynamo-Session-ID`` pins a session to a worker.
- OpenAI's ``prompt_cache_key``: accepted as the session's affinity key
  (API and CLI) and sent in the body to a server that is not an engine.
"""

from __future__ import annotations

import base64
import itertools
import zlib
from pathlib import Path

import httpx2
import pytest
from click.testing import CliRunner
from fake_engine import FakeEngine

from longctx.backends.base import connect
from longctx.cli.app import Runtime, main
from longctx.options.groups import RequestOptions, ServerOptions
from longctx.sessions import Session
from longctx.store import Store, StoredPack

GATEWAY = "http://gateway:8000/v1"
PACK = StoredPack(
    fingerprint="a" * 64,
    format_version="test/1",
    system="s",
    prefix="<doc>\n" + "text of the document\n" * 100 + "</doc>\n",
    summary={"title": "t"},
)


class Pods:
    """Two fake engines behind a gateway that routes by ``route_by`` (a function of the request)."""

    def __init__(self) -> None:
        self.pods = {name: FakeEngine(block=1) for name in ("pod-a", "pod-b")}
        self._turn = itertools.cycle(self.pods)

    def served(self) -> dict[str, int]:
        return {name: len(pod.chat_bodies) for name, pod in self.pods.items()}

    def llm_d(self, request: httpx2.Request) -> httpx2.Response:
        """llm-d's session affinity: a token names the pod; without one, the next pod, and a token set."""
        if request.url.path != "/v1/chat/completions":
            return self.pods["pod-a"].handle(request)
        token = request.headers.get("x-session-token")
        name = base64.b64decode(token).decode() if token else next(self._turn)
        response = self.pods[name].handle(request)
        response.headers["x-session-token"] = base64.b64encode(name.encode()).decode()
        return response

    def dynamo(self, request: httpx2.Request) -> httpx2.Response:
        """Dynamo's session affinity: one session id, one worker; none, the next worker."""
        if request.url.path != "/v1/chat/completions":
            return self.pods["pod-a"].handle(request)
        session = request.headers.get("x-dynamo-session-id")
        names = list(self.pods)
        name = names[zlib.crc32(session.encode()) % 2] if session else next(self._turn)
        return self.pods[name].handle(request)


def test_llm_d_session_token_is_echoed_and_keeps_the_session_on_its_pod(tmp_path: Path) -> None:
    pods = Pods()
    backend = connect(GATEWAY, transport=httpx2.MockTransport(pods.llm_d))
    with Store.open(tmp_path / "home") as store:
        session = Session(backend, PACK, store=store, request=RequestOptions(max_tokens=4))
        answers = [session.ask(f"question {n}?") for n in range(4)]
    served = pods.served()
    assert sorted(served.values()) == [0, 4], served  # every turn on the first turn's pod
    headers = [h for pod in pods.pods.values() for h in pod.chat_headers]
    assert "x-session-token" not in headers[0]  # the client does not invent a token
    first_pod = next(name for name, count in served.items() if count)
    assert {h["x-session-token"] for h in headers[1:]} == {base64.b64encode(first_pod.encode()).decode()}
    assert all(answer.usage.cached_tokens for answer in answers[1:])  # so the pod's cache serves them


def test_without_the_echo_an_llm_d_gateway_would_scatter_the_session(tmp_path: Path) -> None:
    # The control: the fake gateway really routes by the token (a request without one goes round).
    pods = Pods()
    with httpx2.Client(transport=httpx2.MockTransport(pods.llm_d)) as client:
        for _ in range(4):
            client.post(
                f"{GATEWAY}/chat/completions", json={"model": "fake-model", "messages": [], "stream": True}
            )
    assert pods.served() == {"pod-a": 2, "pod-b": 2}


def test_dynamo_session_header_pins_the_session_and_follows_prompt_cache_key(tmp_path: Path) -> None:
    pods = Pods()
    backend = connect(GATEWAY, transport=httpx2.MockTransport(pods.dynamo))
    with Store.open(tmp_path / "home") as store:
        session = Session(backend, PACK, store=store, request=RequestOptions(max_tokens=4))
        for n in range(3):
            session.ask(f"question {n}?")
        keyed = Session(
            backend, PACK, store=store, request=RequestOptions(max_tokens=4, prompt_cache_key="tenant-7-docs")
        )
        keyed.ask("keyed question?")
    assert sorted(pods.served().values()) in ([0, 4], [1, 3])
    headers = [h for pod in pods.pods.values() for h in pod.chat_headers]
    sessions = [h["x-dynamo-session-id"] for h in headers]
    assert sessions.count(session.affinity_key) == 3
    assert sessions.count("tenant-7-docs") == 1 and keyed.affinity_key == "tenant-7-docs"
    three = [pod for pod in pods.pods.values() if len(pod.chat_bodies) >= 3]
    assert three and all(h["x-dynamo-session-id"] == session.affinity_key for h in three[0].chat_headers[:3])


def _bodies(engine: str, **server: object) -> list[dict[str, object]]:
    fake = FakeEngine(engine=engine, block=1)
    backend = connect(ServerOptions(GATEWAY, **server), transport=fake.transport())  # type: ignore[arg-type]
    session = Session(backend, PACK, store=None, request=RequestOptions(max_tokens=4, prompt_cache_key="k1"))
    try:
        session.ask("question?")
    finally:
        session.close()
    return fake.chat_bodies


@pytest.mark.parametrize(
    ("engine", "server", "sent"),
    [
        ("generic", {}, True),  # a hosted API or gateway: prompt_cache_key in the body
        ("vllm", {}, False),  # the engines do not route on it
        ("vllm", {"affinity_body_fields": ("prompt_cache_key",)}, True),
        ("generic", {"affinity_body_fields": ()}, False),
    ],
)
def test_prompt_cache_key_goes_in_the_body_where_a_gateway_reads_it(
    engine: str, server: dict[str, object], sent: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LONGCTX_HOME", str(tmp_path / "home"))
    body = _bodies(engine, **server)[0]
    assert body["user"] == "k1"
    assert ("prompt_cache_key" in body) is sent
    if sent:
        assert body["prompt_cache_key"] == "k1"


def test_the_cli_takes_prompt_cache_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LONGCTX_HOME", str(tmp_path / "home"))
    (tmp_path / "doc.txt").write_text("a document\n" * 50)
    fake = FakeEngine(engine="generic", block=1)
    backend = connect(GATEWAY, transport=fake.transport())
    result = CliRunner().invoke(
        main,
        ["ask", str(tmp_path / "doc.txt"), "what?", "--prompt-cache-key", "cli-key", "--quiet"],
        obj=Runtime(backend=backend),
    )
    assert result.exit_code == 0, result.output
    assert fake.chat_bodies[-1]["prompt_cache_key"] == "cli-key"
    assert fake.chat_headers[-1]["x-session-id"] == "cli-key"
