"""ServerTokenizer against mock vLLM and SGLang tokenize routes, and the count cache."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx2
import pytest
from pack_fixtures import corpus_of, document

from longctx.backends.http import HttpEndpoint
from longctx.backends.tokenizer import CHUNK_CHARS, ServerTokenizer
from longctx.errors import TokenizerError
from longctx.packing import build_pack
from longctx.store import Store
from longctx.tokens.tokenizers import EstimateTokenizer, cached_counts, text_sha256


def _fake_ids(text: str) -> list[int]:
    """A stand-in tokenizer: one token per whitespace-separated word, plus one per line break."""
    return [len(word) for word in text.split()] + [0] * text.count("\n")


class FakeServer:
    """Answers an engine's tokenize route with :func:`_fake_ids` and records every request."""

    def __init__(self, engine: str, template_tokens: int = 7) -> None:
        self.engine = engine
        self.template_tokens = template_tokens
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        with self.lock:
            self.requests.append((request.url.path, body))
        expected = "/tokenize" if self.engine == "vllm" else "/v1/tokenize"
        if request.url.path != expected:
            return httpx2.Response(404, json={"detail": "Not Found"})
        if "messages" in body:
            ids = [9] * self.template_tokens
            for message in body["messages"]:
                ids += _fake_ids(message["content"])
            return httpx2.Response(200, json={"tokens": ids, "count": len(ids), "max_model_len": 32768})
        prompt = body["prompt"]
        if isinstance(prompt, list):
            if self.engine == "vllm":
                return httpx2.Response(400, json={"error": {"message": "prompt must be a string"}})
            tokens = [_fake_ids(text) for text in prompt]
            return httpx2.Response(200, json={"tokens": tokens, "count": [len(ids) for ids in tokens]})
        ids = _fake_ids(prompt)
        return httpx2.Response(200, json={"tokens": ids, "count": len(ids), "max_model_len": 32768})

    def tokenizer(self) -> ServerTokenizer:
        endpoint = HttpEndpoint(
            "http://server.test:8000/v1", timeout=5.0, transport=httpx2.MockTransport(self.handler)
        )
        return ServerTokenizer(endpoint, self.engine, "tiny")  # type: ignore[arg-type]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_server_tokenizer_uses_the_engine_route_without_special_tokens(engine: str) -> None:
    server = FakeServer(engine)
    tokenizer = server.tokenizer()
    assert tokenizer.encode("a bb\nccc") == [1, 2, 3, 0]
    assert tokenizer.count("a bb") == 2
    path, body = server.requests[0]
    assert path == ("/tokenize" if engine == "vllm" else "/v1/tokenize")
    assert body == {"model": "tiny", "prompt": "a bb\nccc", "add_special_tokens": False}
    assert not tokenizer.estimated


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_count_many_matches_count(engine: str) -> None:
    server = FakeServer(engine)
    tokenizer = server.tokenizer()
    texts = [f"word {index} " * index for index in range(40)]
    assert tokenizer.count_many(texts) == [len(_fake_ids(text)) for text in texts]
    assert tokenizer.count_many([]) == []
    if engine == "sglang":
        # SGLang's route takes a list: a few requests, not one per text.
        assert len(server.requests) == 1
        assert server.requests[0][1]["prompt"] == texts
    else:
        assert len(server.requests) == len(texts)


def test_sglang_batches_stay_below_a_size_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("longctx.backends.tokenizer._BATCH_CHARS", 100)
    server = FakeServer("sglang")
    texts = ["x " * 30] * 7
    assert server.tokenizer().count_many(texts) == [30] * 7
    assert [len(body["prompt"]) for _, body in server.requests] == [1, 1, 1, 1, 1, 1, 1]


def test_identity_names_engine_model_and_tokenizer_behaviour() -> None:
    vllm = FakeServer("vllm").tokenizer()
    identity = vllm.identity
    assert identity.startswith("server:vllm:tiny:")
    assert vllm.identity == identity  # asked once
    other = FakeServer("sglang").tokenizer()
    assert other.identity.startswith("server:sglang:tiny:")


def test_tokenize_messages_renders_like_a_chat_request() -> None:
    vllm_server, sglang_server = FakeServer("vllm"), FakeServer("sglang")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u v"}]
    assert len(vllm_server.tokenizer().tokenize_messages(messages)) == 7 + 3
    assert vllm_server.requests[-1][1] == {
        "model": "tiny",
        "messages": messages,
        "add_generation_prompt": True,
    }
    sglang_server.tokenizer().tokenize_messages(messages)
    assert "add_generation_prompt" not in sglang_server.requests[-1][1]


def test_server_errors_become_tokenizer_errors() -> None:
    def broken(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(500, json={"error": {"message": "boom"}})

    tokenizer = ServerTokenizer(
        HttpEndpoint("http://x.test", timeout=5.0, transport=httpx2.MockTransport(broken)), "vllm", "m"
    )
    with pytest.raises(TokenizerError, match="boom"):
        tokenizer.count("a")

    def no_tokens(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, json={"count": 1})

    tokenizer = ServerTokenizer(
        HttpEndpoint("http://x.test", timeout=5.0, transport=httpx2.MockTransport(no_tokens)), "vllm", "m"
    )
    with pytest.raises(TokenizerError, match="without tokens"):
        tokenizer.count("a")

    # A tokens field that is no list (null, a count) is the server's fault, said as such.
    for engine, tokens in (("vllm", None), ("sglang", 3)):
        answer = httpx2.Response(200, json={"tokens": tokens})
        endpoint = HttpEndpoint(
            "http://x.test", timeout=5.0, transport=httpx2.MockTransport(lambda _, a=answer: a)
        )
        with pytest.raises(TokenizerError, match=f"answered tokens that are no list: {tokens}"):
            ServerTokenizer(endpoint, engine, "m").count_many(["a", "b"])  # type: ignore[arg-type]
    with pytest.raises(TokenizerError):
        ServerTokenizer(HttpEndpoint("http://x.test", timeout=5.0), "tgi", "m")  # type: ignore[arg-type]


class CountingTokenizer:
    """The estimate, recording every text it is asked to count."""

    def __init__(self) -> None:
        self.inner = EstimateTokenizer()
        self.asked: list[str] = []

    @property
    def identity(self) -> str:
        return "counting"

    @property
    def estimated(self) -> bool:
        return True

    def count(self, text: str) -> int:
        self.asked.append(text)
        return self.inner.count(text)

    def count_many(self, texts: Sequence[str]) -> list[int]:
        self.asked.extend(texts)
        return self.inner.count_many(texts)


def test_cached_counts_asks_only_for_unseen_texts() -> None:
    tokenizer = CountingTokenizer()
    with Store.open() as store:
        assert cached_counts(tokenizer, ["aaaa", "bbbbbbbb", "aaaa"], store) == [1, 2, 1]
        assert tokenizer.asked == ["aaaa", "bbbbbbbb"]
        assert cached_counts(tokenizer, ["bbbbbbbb", "cccc"], store) == [2, 1]
        assert tokenizer.asked == ["aaaa", "bbbbbbbb", "cccc"]
        assert store.caches.token_counts("counting", [text_sha256("cccc")]) == {text_sha256("cccc"): 1}
    assert cached_counts(tokenizer, ["dd"]) == [1]


def test_repacking_an_unchanged_corpus_never_calls_the_tokenizer() -> None:
    corpus = corpus_of([document(f"src/{index}.py", f"VALUE = {index}\n" * index) for index in range(50)])
    tokenizer = CountingTokenizer()
    with Store.open() as store:
        first = build_pack(corpus, tokenizer=tokenizer, store=store)
        assert len(tokenizer.asked) == len(first.sections)
        tokenizer.asked.clear()
        second = build_pack(corpus, tokenizer=tokenizer, store=store)
        assert tokenizer.asked == []
        assert second == first
        # One edited file: only its section is counted again.
        edited = corpus_of(
            [
                document(d.path, d.text + ("# edit\n" if d.path == "src/7.py" else ""))
                for d in corpus.documents
            ]
        )
        build_pack(edited, tokenizer=tokenizer, store=store)
        assert tokenizer.asked == [build_pack(edited).section("document:src/7.py").text]


def test_server_pack_counts_prefix_whole_and_template_overhead_once() -> None:
    server = FakeServer("vllm", template_tokens=5)
    tokenizer = server.tokenizer()
    corpus = corpus_of([document("a.py", "x = 1\n"), document("b.py", "y = 2\n")])
    with Store.open() as store:
        pack = build_pack(corpus, tokenizer=tokenizer, store=store)
        assert pack.template_overhead_tokens == 5
        assert pack.prefix_tokens == len(_fake_ids(pack.system)) + len(_fake_ids(pack.prefix))
        assert pack.sections_additive is True
        asked = len(server.requests)
        again = build_pack(corpus, tokenizer=tokenizer, store=store)
        assert again == pack
        assert len(server.requests) == asked  # counts, whole prefix and template all cached
    count = pack.prompt_count("why is x one?", tokenizer)
    assert count.total == pack.prefix_tokens + 5 + 4
    assert not count.estimated


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_long_text_is_counted_in_bounded_pieces_that_add_up(engine: str) -> None:
    text = "word another line\n" * (3 * CHUNK_CHARS // 18)

    def pieces_sent(engine: str) -> list[str]:
        server = FakeServer(engine)
        assert server.tokenizer().count_many([text, "short"]) == [len(_fake_ids(text)), 1]
        prompts = [body["prompt"] for _, body in server.requests]
        return [piece for prompt in prompts for piece in (prompt if isinstance(prompt, list) else [prompt])]

    # SGLang's route takes the pieces as one list, in order; vLLM's are sent side by side, so the
    # order its fake server records them in is the threads', not the text's.
    in_order = pieces_sent("sglang")
    assert len(in_order) >= 4 and max(len(piece) for piece in in_order) <= CHUNK_CHARS
    assert "".join(in_order[:-1]) == text and in_order[-1] == "short"
    assert sorted(pieces_sent(engine)) == sorted(in_order)


def test_no_piece_is_sent_once_one_failed() -> None:
    server = FakeServer("vllm")
    answer = server.handler

    def failing(request: httpx2.Request) -> httpx2.Response:
        answer(request)
        return httpx2.Response(500, json={"error": {"message": "boom"}})

    _count_failing(failing, PIECES)
    assert len(server.requests) < PIECES  # the pool's queue was cancelled


PIECES = 200


def _count_failing(handler: Callable[[httpx2.Request], httpx2.Response], pieces: int) -> None:
    """A count of ``pieces`` pieces against ``handler``, which fails it: the error the caller meets."""
    endpoint = HttpEndpoint(
        "http://server.test:8000/v1", timeout=15.0, transport=httpx2.MockTransport(handler)
    )
    with pytest.raises(TokenizerError, match="could not tokenize"):
        ServerTokenizer(endpoint, "vllm", "tiny").count("x\n" * (pieces * CHUNK_CHARS // 2))


def test_the_workers_stop_sending_after_a_failed_piece_even_while_the_caller_is_held() -> None:
    """The pieces after one that failed are not sent, however late the calling thread reads it.

    The first piece's answer is held until half a second after the fifth has failed: the caller is
    still waiting on the first, so only the workers can stop the queue (27 pieces were sent when only
    the caller did). Every piece before the failure is sent, and the caller meets the real error.
    """
    server = FakeServer("vllm")
    answer = server.handler
    seen: list[int] = []
    fifth_failed = threading.Event()
    lock = threading.Lock()

    def handler(request: httpx2.Request) -> httpx2.Response:
        with lock:
            number = len(seen)
            seen.append(number)
        if number == 0:
            fifth_failed.wait(10)  # the caller reads this piece first: it waits here,
            time.sleep(0.5)  # and long after the failure, while the other workers are free
        if number == 4:
            fifth_failed.set()
            return httpx2.Response(500, json={"error": {"message": "boom"}})
        return answer(request)

    _count_failing(handler, PIECES)
    # The failing piece and those in flight beside it: at most the pool's 8 workers' worth after it.
    assert 5 <= len(seen) <= 5 + 8, len(seen)
