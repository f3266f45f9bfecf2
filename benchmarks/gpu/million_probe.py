"""Where a cached follow-up's last second goes at ~1M tokens, and what cuts it; the cold prefill beside it.

Against one running server (vLLM or SGLang; on a GPU machine, or the test suite's CPU servers at
small sizes). One pack of ``--tokens`` token ids (standard-library text through the server's chat
template, cut to size), under one ``cache_salt``:

- ``cold``: the pack's first request (ids, nothing cached): its time to first token is the cold
  prefill, beside ``longctx plan``'s figures when ``--plan`` names its JSON; every mode's
  follow-ups then use the cache it filled (one salt: one cold prefill per run);
- ``ids``: ``--follow-ups`` cached follow-ups as token ids on ``/v1/completions``, the body encoded
  as longctx encodes it (compact JSON);
- ``spaced``: the same with the standard library's default JSON separators (a larger body: what
  the body's size costs the server);
- ``session`` (SGLang only): the follow-ups through SGLang's session API on its native
  ``/generate``: a session opened, the pack's request made in it, then each follow-up names that
  request (``session_params``: ``rid``, ``offset`` = the pack's length, ``drop_previous_output``)
  and sends only its own tokens; the server rebuilds the prompt from the stored one;
- ``bare``: the question alone (cached), the floor.

Each follow-up's time to first token is split into the client's encoding of the body, the
transfer, and the rest (the server until its first token); beside it the server's own histograms
(``/metrics``: every ``*_sum`` that moved during the request, e.g. vLLM's
``vllm:time_to_first_token_seconds`` from the request's arrival in the engine,
``vllm:request_queue_time_seconds``, ``vllm:request_prefill_time_seconds``), and the client-side
costs of encoding the ids (json default, json compact, orjson when installed). A request that
fails (an HTTP status other than 200, an error event, no usage, or a prompt of another length than
sent) stops the probe: nothing of it is recorded.

Usage: ``python benchmarks/gpu/million_probe.py --base-url URL/v1 --tokens 1000000 --follow-ups 5
--server-label "default" --out OUT/million-ENGINE-LABEL.json``. Checked on the test suite's CPU
vLLM and SGLang with ``--tokens 8000 --follow-ups 2``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import statistics
import sys
import sysconfig
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from longctx.backends.base import connect  # the checkout's longctx, found through the path above
from longctx.sessions.prompt_ids import pack_ids

SYSTEM = "Answer questions about the documents."
QUESTIONS = tuple(f"Question {n}: which function of these files would you test first?" for n in range(1, 9))


class Refused(RuntimeError):
    """A request that failed: the probe stops rather than record it."""


def pack_text(chars: int) -> str:
    """Standard-library text in a documents fence, about ``chars`` characters, ending in a blank line."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts, total = [], 0
    paths = sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py")) + sorted(stdlib.glob("*/*/*.py"))
    while total < chars:
        for path in paths:
            text = path.read_text(encoding="utf-8", errors="replace")
            parts.append(f'<document path="{path.relative_to(stdlib)}">\n{text}\n</document>\n')
            total += len(text)
            if total >= chars:
                break
    return "<documents>\n" + "".join(parts) + "</documents>\n\n"


def metric_sums(text: str) -> dict[str, float]:
    """Every histogram's ``_sum`` and ``_count`` (labels summed over) in Prometheus text."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if not (name.endswith("_sum") or name.endswith("_count")):
            continue
        try:
            found[name] = found.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        except ValueError:
            continue
    return found


class Server:
    """A plain HTTP client (standard library only), streaming, timing each phase, refusing failures."""

    def __init__(self, base_url: str, model: str, engine: str) -> None:
        self.base_url, self.model, self.engine = base_url.rstrip("/"), model, engine
        parts = urlsplit(self.base_url)
        self.host, self.port, self.path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path

    def _connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=3600)

    def get(self, path: str) -> str:
        connection = self._connection()
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.read().decode() if response.status == 200 else ""
        finally:
            connection.close()

    def post_json(self, path: str, body: dict[str, Any]) -> Any:
        connection = self._connection()
        try:
            connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            response = connection.getresponse()
            raw = response.read()
            if response.status != 200:
                raise Refused(f"POST {path} answered HTTP {response.status}: {raw[:300]!r}")
            return json.loads(raw)
        finally:
            connection.close()

    def sums(self) -> dict[str, float]:
        return metric_sums(self.get("/metrics"))

    def stream(self, path: str, payload: bytes, started: float, expect_prompt: int | None) -> dict[str, Any]:
        """Send ``payload`` (encoded since ``started``) and read the stream to its end; refuse a failure.

        The metrics read and the connection made before sending are left out of the times.
        """
        encoded = time.perf_counter()
        before = self.sums()
        connection = self._connection()
        connection.connect()
        ready = time.perf_counter()
        connection.request("POST", path, payload, {"Content-Type": "application/json"})
        sent = time.perf_counter()
        response = connection.getresponse()
        if response.status != 200:
            raise Refused(f"POST {path} answered HTTP {response.status}: {response.read()[:300]!r}")
        first, usage, meta = None, None, None
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if "error" in chunk and "choices" not in chunk and "text" not in chunk:
                raise Refused(f"POST {path} failed in its stream: {str(chunk['error'])[:300]}")
            usage = chunk.get("usage") or usage
            meta = chunk.get("meta_info") or meta
            # A chunk with a choice (or /generate's text so far) follows a generated token, even one
            # that decodes to nothing (random weights).
            if first is None and (chunk.get("choices") or "text" in chunk):
                first = time.perf_counter()
        connection.close()
        ended = time.perf_counter()
        if meta is not None:  # /generate: its meta_info carries the counts
            finish = meta.get("finish_reason") or {}
            if isinstance(finish, dict) and finish.get("type") == "abort":
                raise Refused(f"POST {path} was aborted: {finish.get('message')}")
            usage = {"prompt_tokens": meta.get("prompt_tokens"), "cached": meta.get("cached_tokens")}
        if not usage or usage.get("prompt_tokens") is None:
            raise Refused(f"POST {path} sent no usage: nothing to check it by")
        prompt = usage["prompt_tokens"]
        if expect_prompt is not None and prompt != expect_prompt:
            raise Refused(
                f"POST {path}: the server counted {prompt} prompt tokens, {expect_prompt} were meant"
            )
        after = self.sums()
        cached = usage.get("cached")
        if cached is None:
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        first = first or ended
        return {
            "ttft": first - started - (ready - encoded), "encode": encoded - started, "transfer": sent - ready, "rest": first - sent,
            "total": ended - started - (ready - encoded), "prompt_tokens": prompt, "cached": cached, "bytes": len(payload),
            "server": {name: after[name] - before.get(name, 0.0) for name in after
                       if name.endswith("_sum") and after[name] != before.get(name, 0.0)},
        }  # fmt: skip


def sampling(server: Server, salt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": server.model, "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": max_tokens, "temperature": 0.0, "cache_salt": salt,
    }  # fmt: skip


def encode(body: dict[str, Any], compact: bool = True) -> bytes:
    if compact:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    return json.dumps(body).encode()


def encoding_costs(ids: list[int]) -> dict[str, Any]:
    """The client's cost of a million-id body, three ways (seconds, bytes), median of 3."""
    costs: dict[str, Any] = {}
    ways: dict[str, Any] = {
        "json default": lambda: json.dumps({"prompt": ids}).encode(),
        "json compact": lambda: encode({"prompt": ids}),
    }
    try:
        import orjson

        ways["orjson"] = lambda: orjson.dumps({"prompt": ids})
    except ImportError:
        costs["orjson"] = "not installed"
    for name, way in ways.items():
        times = []
        for _ in range(3):
            started = time.perf_counter()
            made = way()
            times.append(time.perf_counter() - started)
        parsed_started = time.perf_counter()
        json.loads(made)
        costs[name] = {"seconds": statistics.median(times), "bytes": len(made),
                       "json.loads seconds": time.perf_counter() - parsed_started}  # fmt: skip
    return costs


def cold_row(server: Server, ids: list[int], tail: list[int], salt: str) -> dict[str, Any]:
    """The pack's first request under ``salt`` (ids, one answer token): the cold prefill."""
    started = time.perf_counter()
    payload = encode({**sampling(server, salt, 1), "prompt": ids + tail})
    return server.stream(f"{server.path}/completions", payload, started, len(ids) + len(tail))


def completions_mode(
    server: Server, ids: list[int], tails: list[list[int]], compact: bool, salt: str
) -> dict[str, Any]:
    """The follow-ups as ids on /v1/completions, under the salt the cold request filled."""
    rows: dict[str, Any] = {}
    rows["follow-ups"] = []
    for tail in tails[1:]:
        started = time.perf_counter()
        payload = encode({**sampling(server, salt, 8), "prompt": ids + tail}, compact)
        rows["follow-ups"].append(
            server.stream(f"{server.path}/completions", payload, started, len(ids) + len(tail))
        )
    return rows


def session_mode(server: Server, ids: list[int], tails: list[list[int]], salt: str) -> dict[str, Any]:
    """SGLang's session API: the pack's request in a session, then follow-ups that send only their tokens.

    The pack's request in the session finds the pack cached (the cold request filled it under the
    same salt): its own time is the session's lead, not a prefill.
    """
    session = server.post_json("/open_session", {"capacity_of_str_len": 1 << 30})
    if not isinstance(session, str):
        raise Refused(f"open_session answered {session!r}")
    lead = uuid.uuid4().hex
    params = {"temperature": 0.0, "max_new_tokens": 1}
    rows: dict[str, Any] = {"session": session}
    try:
        started = time.perf_counter()
        body = {"input_ids": ids, "sampling_params": params, "stream": True, "rid": lead, "cache_salt": salt,
                "session_params": {"id": session}}  # fmt: skip
        rows["lead"] = server.stream("/generate", encode(body), started, len(ids))
        rows["follow-ups"] = []
        for tail in tails[1:]:
            started = time.perf_counter()
            body = {
                "input_ids": tail, "sampling_params": {**params, "max_new_tokens": 8}, "stream": True,
                "cache_salt": salt, "rid": uuid.uuid4().hex,
                "session_params": {"id": session, "rid": lead, "offset": len(ids), "drop_previous_output": True},
            }  # fmt: skip
            rows["follow-ups"].append(server.stream("/generate", encode(body), started, len(ids) + len(tail)))
    finally:
        _close(server, session)
    return rows


def _close(server: Server, session: str) -> None:
    connection = server._connection()
    try:
        connection.request("POST", "/close_session", json.dumps({"session_id": session}),
                           {"Content-Type": "application/json"})  # fmt: skip
        connection.getresponse().read()
    finally:
        connection.close()


def bare_mode(server: Server, tails: list[list[int]], head: list[int]) -> dict[str, Any]:
    salt = uuid.uuid4().hex
    rows: dict[str, Any] = {"follow-ups": []}
    started = time.perf_counter()
    server.stream(f"{server.path}/completions", encode({**sampling(server, salt, 1), "prompt": head + tails[0]}),
                  started, len(head) + len(tails[0]))  # fmt: skip
    for tail in tails[1:]:
        started = time.perf_counter()
        payload = encode({**sampling(server, salt, 8), "prompt": head + tail})
        rows["follow-ups"].append(
            server.stream(f"{server.path}/completions", payload, started, len(head) + len(tail))
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8765/v1")
    parser.add_argument("--tokens", type=int, default=1_000_000, help="the pack's ids (cut to this many)")
    parser.add_argument("--follow-ups", type=int, default=5)
    parser.add_argument("--modes", default="ids,spaced,session,bare")
    parser.add_argument("--server-label", default="default", help="the server's launch options, as named")
    parser.add_argument(
        "--plan", type=Path, help="longctx plan's JSON for the served shape, kept beside the cold row"
    )
    parser.add_argument(
        "--salt", help="the cache salt (default: a new one); with --no-cold, one filled before"
    )
    parser.add_argument(
        "--no-cold",
        action="store_true",
        help="skip the cold request: an earlier run filled the cache (--salt)",
    )
    parser.add_argument("--out", type=Path, required=True)
    options = parser.parse_args(argv)
    backend = connect(options.base_url)
    info, tokenizer = backend.info, backend.tokenizer()
    server = Server(options.base_url, info.model, info.engine)
    started = time.perf_counter()
    made = pack_ids(tokenizer, SYSTEM, pack_text(int(options.tokens * 4.3)))
    if isinstance(made, str):
        raise SystemExit(f"no ids for this server's template: {made}")
    ids = list(made.head[: options.tokens])
    pack_seconds = time.perf_counter() - started
    tails = [[*tokenizer.encode(q), *made.after_user] for q in QUESTIONS[: options.follow_ups + 1]]
    bare_head = list(made.head[:16])
    results: dict[str, Any] = {
        "engine": info.engine, "version": info.version, "model": info.model, "window": info.context_length,
        "kv_cache_tokens": info.kv_cache_tokens, "server_label": options.server_label, "host": platform.node(),
        "pack_tokens": len(ids), "pack_ids_seconds": pack_seconds, "client encoding": encoding_costs(ids),
        "modes": {}, "refused": None,
    }  # fmt: skip
    if options.plan and options.plan.exists():
        results["plan"] = json.loads(options.plan.read_text())
    modes = [mode for mode in options.modes.split(",") if mode]
    salt = uuid.uuid4().hex
    try:
        results["cold"] = cold_row(server, ids, tails[0], salt)
        print(
            f"[million] {info.engine} {len(ids):,} tokens cold: {results['cold']['ttft']:.2f} s",
            file=sys.stderr,
        )
        options.out.write_text(json.dumps(results, indent=2))
        for mode in modes:
            if mode == "session" and info.engine != "sglang":
                results["modes"][mode] = {
                    "skipped": f"{info.engine} has no session API that continues a prefix"
                }
                continue
            if mode == "session":
                rows = session_mode(server, ids, tails, salt)
            elif mode == "bare":
                rows = bare_mode(server, tails, bare_head)
            else:
                rows = completions_mode(server, ids, tails, compact=mode != "spaced", salt=salt)
            results["modes"][mode] = rows
            ttfts = [row["ttft"] for row in rows["follow-ups"]]
            print(f"[million] {info.engine} {len(ids):,} tokens {mode}: follow-ups median "
                  f"{statistics.median(ttfts):.3f} s ({min(ttfts):.3f}-{max(ttfts):.3f})", file=sys.stderr, flush=True)  # fmt: skip
            options.out.write_text(json.dumps(results, indent=2))
    except Refused as error:
        results["refused"] = str(error)
        options.out.write_text(json.dumps(results, indent=2))
        print(f"[million] refused: {error}", file=sys.stderr)
        return 3
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
