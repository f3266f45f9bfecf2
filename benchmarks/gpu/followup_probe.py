"""Where a cached follow-up's time goes: text against token ids, against the question alone.

Against one running server (vLLM or SGLang; a GPU machine's, or the test
suite's CPU servers with small sizes). For each pack size (``--packs
32000,122000,max``; ``max`` is the largest pack the window takes), a pack of
standard-library text in one user message (system, documents, a blank line,
the question), each mode under its own ``cache_salt``:

- ``cold``: the pack's first request (nothing cached);
- ``text``: ``--follow-ups`` cached follow-ups as chat messages (what longctx sent until now);
- ``ids``: the same follow-ups as token ids on ``/v1/completions``, the ids made as longctx makes
  them (:mod:`longctx.sessions.prompt_ids`: the pack's ids once, then each question's own tokens);
- ``question alone``: the question without the pack, cached, as the floor.

Each streamed request's time to first token is split into the client's work (until the request's
bytes are ready: the messages or ids encoded, and for ``ids`` the question tokenized), the transfer
(sending the bytes), and the rest (the server's work until the first token); beside it the server's
own ``/tokenize`` of the same prompt (messages, generation prompt), timed, which is the template and
tokenizing the text path pays inside "the rest". With ``--api-rows`` it also times longctx's
``ask_many`` of 8 and a job of 8 questions over the pack, with ``prompt_ids`` on and off.

``--server-label`` names the server's launch options in the output (run the same probe against a
server started with other options, e.g. vLLM's ``--prefix-caching-hash-algo xxhash``, or SGLang's
radix cache settings, and compare). Writes JSON (``--out``); ``followup_report.py`` turns it into
the docs/benchmarks.md section.

Checked against the test suite's CPU vLLM: ``python benchmarks/gpu/followup_probe.py --base-url
http://127.0.0.1:PORT/v1 --packs 2000,4000 --follow-ups 2 --out /tmp/probe.json``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import statistics
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from longctx.backends.base import connect  # the checkout's longctx, found through the path above
from longctx.sessions.prompt_ids import pack_ids

SYSTEM = "Answer questions about the documents."
FOLLOW_UPS = tuple(f"Question {n}: which function of these files would you test first?" for n in range(1, 9))
WINDOW_ROOM = 4096  # the template, the question and the answer


def pack_text(target_tokens: int, chars_per_token: float) -> str:
    """Standard-library text in a documents fence, about ``target_tokens`` tokens, ending in a blank line."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    budget, parts, total = int(target_tokens * chars_per_token), [], 0
    for path in sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if total + len(text) > budget:
            continue
        parts.append(f'<document path="{path.relative_to(stdlib)}">\n{text}\n</document>\n')
        total += len(text)
        if total > budget * 0.995:
            break
    return "<documents>\n" + "".join(parts) + "</documents>\n\n"


def fitted_pack(target_tokens: int, tokenizer: Any, chars_per_token: float = 3.6) -> str:
    """:func:`pack_text` of at most ``target_tokens`` tokens as the served tokenizer counts them.

    A characters-per-token guess alone overflowed the window (3.6 where the tokenizer gave about
    3.5: every request an HTTP 400), so the text is counted and, while over, made again smaller.
    """
    ratio = chars_per_token
    for _ in range(6):
        text = pack_text(target_tokens, ratio)
        counted = tokenizer.count(text)
        if counted <= target_tokens:
            return text
        ratio *= target_tokens / counted * 0.99
    raise SystemExit(f"no pack of at most {target_tokens} tokens: the last counted {counted}")


class ProbeFailure(SystemExit):
    """A request that did not succeed: never recorded as a time."""


class Server:
    """A plain HTTP client (the standard library only), streaming, timing each phase."""

    def __init__(self, base_url: str, model: str, engine: str) -> None:
        self.base_url, self.model, self.engine = base_url.rstrip("/"), model, engine
        parts = urlsplit(self.base_url)
        self.host, self.port, self.path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path
        self.tokenize_path = "/tokenize" if engine == "vllm" else "/v1/tokenize"

    def post(self, path: str, body: dict[str, Any]) -> Any:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=3600)
        try:
            connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            response = connection.getresponse()
            raw = response.read()
            if response.status != 200:
                raise ProbeFailure(f"{path} answered HTTP {response.status}: {raw[:300]!r}")
            return json.loads(raw)
        finally:
            connection.close()

    def tokenize_timed(self, messages: list[dict[str, str]]) -> tuple[list[int], float]:
        """The server's tokens of ``messages`` (generation prompt on) and how long the call took."""
        started = time.perf_counter()
        body = {"model": self.model, "messages": messages, "add_generation_prompt": True}
        tokens = self.post(self.tokenize_path, body)["tokens"]
        return tokens, time.perf_counter() - started

    def stream(self, route: str, body: dict[str, Any], started: float) -> dict[str, Any]:
        """Send ``body`` (made since ``started``) and read the stream to its end: the phases' times."""
        payload = json.dumps(body).encode()
        ready = time.perf_counter()
        connection = http.client.HTTPConnection(self.host, self.port, timeout=3600)
        connection.request("POST", f"{self.path}/{route}", payload, {"Content-Type": "application/json"})
        sent = time.perf_counter()
        response = connection.getresponse()
        if response.status != 200:  # a refused request (the pack over the window...) is no timing
            failed = response.read()[:300]
            connection.close()
            raise ProbeFailure(f"{route} answered HTTP {response.status}: {failed!r}")
        first, usage = None, None
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or ():
                text = (choice.get("delta") or {}).get("content") if "delta" in choice else choice.get("text")
                if text and first is None:
                    first = time.perf_counter()
        connection.close()
        if not usage or not usage.get("prompt_tokens"):
            # No usage: the stream broke or the server refused inside it; not a time.
            raise ProbeFailure(f"{route}: the stream ended without its usage ({usage!r})")
        first = first or time.perf_counter()  # one empty token (max_tokens 1): the end is the first
        details = (usage or {}).get("prompt_tokens_details") or {}
        return {
            "ttft": first - started, "client": ready - started, "transfer": sent - ready,
            "rest": first - sent, "prompt_tokens": (usage or {}).get("prompt_tokens"),
            "cached": details.get("cached_tokens"), "bytes": len(payload),
        }  # fmt: skip


def body(server: Server, salt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": server.model, "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": max_tokens, "temperature": 0.0, "cache_salt": salt,
    }  # fmt: skip


def messages_for(pack: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": pack + question}]


def probe_pack(
    server: Server, tokenizer: Any, pack: str, follow_ups: int, modes: tuple[str, ...] = ("text", "ids")
) -> dict[str, Any]:
    """One pack's rows: cold, text, ids, question alone; and the server's /tokenize of each follow-up."""
    questions = FOLLOW_UPS[:follow_ups]
    started = time.perf_counter()
    made = pack_ids(tokenizer, SYSTEM, pack)
    pack_seconds = time.perf_counter() - started
    if isinstance(made, str):
        raise SystemExit(f"no ids for this server's template: {made}")
    rows: dict[str, Any] = {"pack_ids_seconds": pack_seconds}
    for mode in modes:
        salt = uuid.uuid4().hex
        cold_started = time.perf_counter()
        rows.setdefault("cold", []).append(
            server.stream("chat/completions", {**body(server, salt, 1), "messages": messages_for(pack, "Hi.")},
                          cold_started)
        )  # fmt: skip
        rows[mode] = []
        for question in questions:
            began = time.perf_counter()
            if mode == "text":
                request = {**body(server, salt, 8), "messages": messages_for(pack, question)}
                rows[mode].append(server.stream("chat/completions", request, began))
            else:
                ids = [*made.head, *tokenizer.encode(question), *made.after_user]
                rows[mode].append(
                    server.stream("completions", {**body(server, salt, 8), "prompt": ids}, began)
                )
    rows["tokenize"] = [server.tokenize_timed(messages_for(pack, q))[1] for q in questions]
    rows["prompt_tokens"] = len(server.tokenize_timed(messages_for(pack, questions[0]))[0])
    alone = uuid.uuid4().hex
    server.stream("chat/completions", {**body(server, alone, 1), "messages": messages_for("", "Hi.")},
                  time.perf_counter())  # fmt: skip
    rows["question alone"] = [
        server.stream("chat/completions", {**body(server, alone, 8), "messages": messages_for("", q)},
                      time.perf_counter())
        for q in questions
    ]  # fmt: skip
    return rows


def api_rows(base_url: str, pack: str) -> dict[str, Any]:
    """longctx's ask_many of 8 and a job of 8 over the pack, ``prompt_ids`` on and off (wall seconds)."""
    from longctx.jobs import Job, JobItem, JobOptions
    from longctx.options.groups import RequestOptions
    from longctx.sessions import Session
    from longctx.store import Store, StoredPack

    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as home, connect(base_url) as backend:
        folder = Path(home) / "pack"
        folder.mkdir()
        (folder / "documents.txt").write_text(pack)
        for ids in (False, True):
            mode = "ids" if ids else "text"
            # A store per mode: a job finds the answers its store holds and would not ask again.
            with Store.open(Path(home) / mode) as store:
                request = RequestOptions(
                    max_tokens=8, temperature=0.0, cache_salt=uuid.uuid4().hex, prompt_ids=ids
                )
                stored = StoredPack(uuid.uuid4().hex * 2, "probe/1", SYSTEM, pack, {})
                started = time.perf_counter()
                Session(backend, stored, store=store, request=request).ask_many(list(FOLLOW_UPS))
                found[f"ask_many 8 {mode}"] = time.perf_counter() - started
                items = [JobItem((str(folder),), question) for question in FOLLOW_UPS]
                request = RequestOptions(
                    max_tokens=8, temperature=0.0, cache_salt=uuid.uuid4().hex, prompt_ids=ids
                )
                started = time.perf_counter()
                Job(items, backend=backend, store=store, request=request, options=JobOptions()).run()
                found[f"job 8 {mode}"] = time.perf_counter() - started
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8765/v1")
    parser.add_argument("--packs", default="32000,122000,max")
    parser.add_argument("--follow-ups", type=int, default=4)
    parser.add_argument("--chars-per-token", type=float, default=3.6)
    parser.add_argument(
        "--modes",
        default="text,ids",
        help="which follow-ups to time (a server option's run may need ids only)",
    )
    parser.add_argument(
        "--server-label", default="default", help="the server's launch options, as named in the output"
    )
    parser.add_argument(
        "--api-rows", action="store_true", help="also longctx's ask_many and a job, text vs ids"
    )
    parser.add_argument("--out", type=Path, required=True)
    options = parser.parse_args(argv)
    backend = connect(options.base_url)
    info, tokenizer = backend.info, backend.tokenizer()
    server = Server(options.base_url, info.model, info.engine)
    window = info.context_length or 32768
    results: dict[str, Any] = {
        "engine": info.engine, "version": info.version, "model": info.model, "window": window,
        "server_label": options.server_label, "host": platform.node(), "packs": {},
    }  # fmt: skip
    for size in options.packs.split(","):
        target = window - WINDOW_ROOM if size == "max" else int(size)
        pack = fitted_pack(target, tokenizer, options.chars_per_token)
        modes = tuple(options.modes.split(","))
        rows = probe_pack(server, tokenizer, pack, options.follow_ups, modes)
        if options.api_rows:
            rows["api"] = api_rows(options.base_url, pack)
        results["packs"][str(rows["prompt_tokens"])] = rows
        summary = {mode: statistics.median(r["ttft"] for r in rows[mode]) for mode in modes}
        print(f"[probe] {rows['prompt_tokens']:,} tokens: median TTFT {summary}", file=sys.stderr, flush=True)
        options.out.write_text(json.dumps(results, indent=2))
    backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
