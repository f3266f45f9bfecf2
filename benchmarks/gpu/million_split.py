"""The server-side pieces of a cached follow-up at ~1M token ids, each timed alone in the engine's Python.

Run with the engine's interpreter (vLLM's or SGLang's environment), no server, no GPU needed; on
the GPU machine it measures that machine's CPU, which is where these pieces run:

- ``body``: the request body (1M ids as JSON, compact) parsed by the standard library, by orjson
  (which both engines' HTTP layers may use), and validated into the engine's request model (vLLM's
  ``CompletionRequest``; SGLang's ``CompletionRequest`` and ``GenerateReqInput``);
- ``ipc``: the ids serialized as the API process sends them to the engine (msgpack of a list, as
  msgspec encodes it), and back;
- ``hash`` (vLLM): the prefix-cache block hashes of the prompt (``hash_block_tokens`` chained over
  blocks of 16, as the engine hashes a new request) for each ``--prefix-caching-hash-algo`` this
  vLLM takes;
- ``lookup``: a dictionary lookup per block (the shape of vLLM's cached-block map) and, for SGLang
  (page size 1 and 16), a token-by-token comparison of the prefix (the shape of its radix match).

Usage: ``ENGINE_PYTHON benchmarks/gpu/million_split.py --tokens 1000000 --out OUT/split-ENGINE.json``.
Each figure is the median of ``--repeats`` runs. Nothing here is longctx's: it names what the
engine's own code costs, so a change on either side can be chosen by its figure.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def timed(work: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def attempt(found: dict[str, Any], name: str, work: Callable[[], Any], repeats: int) -> None:
    """``found[name]`` = the median seconds of ``work``, or why it could not run."""
    try:
        found[name] = timed(work, repeats)
    except Exception as error:  # noqa: BLE001 - a piece this engine's version lacks is written down
        found[name] = f"failed: {type(error).__name__}: {str(error)[:200]}"


def body_pieces(ids: list[int], repeats: int, engine: str) -> dict[str, Any]:
    body = {"model": "m", "prompt": ids, "max_tokens": 8, "stream": True, "temperature": 0.0}
    raw = json.dumps(body, separators=(",", ":")).encode()
    found: dict[str, Any] = {"bytes": len(raw)}
    attempt(found, "json.loads", lambda: json.loads(raw), repeats)
    try:
        import orjson

        attempt(found, "orjson.loads", lambda: orjson.loads(raw), repeats)
    except ImportError:
        found["orjson.loads"] = "orjson not installed"
    parsed = json.loads(raw)
    if engine == "vllm":

        def vllm_model() -> Any:
            from vllm.entrypoints.openai.protocol import CompletionRequest

            return CompletionRequest

        try:
            model = vllm_model()
        except ImportError:
            try:
                from vllm.entrypoints.openai.completion.protocol import CompletionRequest as model
            except ImportError as error:
                model = None
                found["pydantic validate"] = f"failed: {error}"
        if model is not None:
            attempt(found, "pydantic validate", lambda: model.model_validate(parsed), repeats)
            attempt(found, "pydantic validate_json", lambda: model.model_validate_json(raw), repeats)
    else:
        try:
            from sglang.srt.entrypoints.openai.protocol import CompletionRequest as model

            attempt(found, "pydantic validate", lambda: model.model_validate(parsed), repeats)
            attempt(found, "pydantic validate_json", lambda: model.model_validate_json(raw), repeats)
        except ImportError as error:
            found["pydantic validate"] = f"failed: {error}"
        native = {"input_ids": ids, "sampling_params": {"max_new_tokens": 8}, "stream": True}
        try:
            from sglang.srt.managers.io_struct import GenerateReqInput

            attempt(found, "GenerateReqInput", lambda: GenerateReqInput(**native), repeats)
        except ImportError as error:
            found["GenerateReqInput"] = f"failed: {error}"
    return found


def ipc_pieces(ids: list[int], repeats: int) -> dict[str, Any]:
    found: dict[str, Any] = {}
    try:
        import msgspec

        packed = msgspec.msgpack.encode(ids)
        found["msgpack bytes"] = len(packed)
        attempt(found, "msgpack encode", lambda: msgspec.msgpack.encode(ids), repeats)
        attempt(found, "msgpack decode", lambda: msgspec.msgpack.decode(packed), repeats)
    except ImportError:
        found["msgpack"] = "msgspec not installed"
    from array import array

    attempt(found, "array('q') from the list", lambda: array("q", ids), repeats)
    attempt(found, "list copy", lambda: list(ids), repeats)
    return found


def vllm_hashes(ids: list[int], repeats: int, block: int = 16) -> dict[str, Any]:
    found: dict[str, Any] = {"block_size": block, "blocks": len(ids) // block}
    try:
        from vllm.v1.core import kv_cache_utils as utils
    except ImportError as error:
        return {"failed": str(error)}
    try:
        from vllm.utils.hashing import get_hash_fn_by_name
    except ImportError:
        try:
            from vllm.utils import get_hash_fn_by_name  # older layout
        except ImportError as error:
            return {"failed": f"no get_hash_fn_by_name: {error}"}
    for name in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor", "builtin"):
        try:
            function = get_hash_fn_by_name(name)
        except Exception as error:  # noqa: BLE001 - the engine's own refusal, written down
            found[name] = f"not taken by this vLLM: {str(error)[:120]}"
            continue
        try:
            utils.init_none_hash(function)
        except Exception as error:  # noqa: BLE001 - e.g. xxhash not installed, written down
            found[name] = f"init_none_hash failed: {str(error)[:120]}"
            continue

        def chain(function: Callable[[Any], bytes] = function) -> list[Any]:
            parent = None
            hashes = []
            for start in range(0, len(ids) - block + 1, block):
                parent = utils.hash_block_tokens(function, parent, ids[start : start + block], None)
                hashes.append(parent)
            return hashes

        attempt(found, name, chain, repeats)
        found[f"{name} lookup (dict, per block)"] = timed(_lookup(chain()), repeats)
    return found


def _lookup(hashes: list[Any]) -> Callable[[], list[Any]]:
    """One dictionary lookup per block hash: the shape of vLLM's map of cached blocks."""
    table = {key: index for index, key in enumerate(hashes)}
    return lambda: [table.get(key) for key in hashes]


def radix_compare(ids: list[int], repeats: int) -> dict[str, Any]:
    """A Python token-by-token prefix compare (page size 1) and page-by-page (16): the radix match's shape."""
    other = list(ids)

    def per_token() -> int:
        count = 0
        for left, right in zip(ids, other, strict=False):
            if left != right:
                break
            count += 1
        return count

    def per_page(page: int = 16) -> int:
        count = 0
        for start in range(0, len(ids), page):
            if ids[start : start + page] != other[start : start + page]:
                break
            count += page
        return count

    return {"page 1 (per token)": timed(per_token, repeats), "page 16 (per page)": timed(per_page, repeats)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engine", choices=("vllm", "sglang"), help="default: whichever imports")
    parser.add_argument("--out", type=Path, required=True)
    options = parser.parse_args(argv)
    engine = options.engine
    version = None
    for name in (engine,) if engine else ("vllm", "sglang"):
        try:
            version = __import__(name).__version__
            engine = name
            break
        except ImportError:
            continue
    if engine is None:
        raise SystemExit("neither vllm nor sglang imports in this interpreter")
    generator = random.Random(0)
    ids = [generator.randrange(4, 32000) for _ in range(options.tokens)]
    found: dict[str, Any] = {
        "engine": engine, "version": version, "tokens": options.tokens, "host": platform.node(),
        "processor": platform.processor() or platform.machine(), "repeats": options.repeats,
    }  # fmt: skip
    found["body"] = body_pieces(ids, options.repeats, engine)
    found["ipc"] = ipc_pieces(ids, options.repeats)
    if engine == "vllm":
        found["hash"] = vllm_hashes(ids, options.repeats)
    found["lookup"] = radix_compare(ids, options.repeats)
    options.out.write_text(json.dumps(found, indent=2))
    print(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
