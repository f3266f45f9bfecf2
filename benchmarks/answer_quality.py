"""Benchmark: are the answers right, and does longctx's cache-friendly layout cost any of them?

Over the fact repository of :mod:`longctx.testing.answer_set` (ten fact questions with known
answers, three sentences planted at the start, middle and end of the pack), padded with more
standard-library modules for larger packs, a real instruct model answers every question once per
layout, greedily (temperature 0), and each answer is checked by its rule:

- ``longctx``: the pack as longctx sends it: a fixed system prompt, the documents in stability
  order, the question last (the cached prefix is everything before the question);
- ``question first``: the question, then the same documents (nothing can be cached across questions);
- ``filesystem order``: the documents in the order the file system lists them, the question last;
- ``timestamp``: longctx's layout with the date and time in the system prompt, as some chat templates
  put it (one timestamp per run here, so the cost is one prefill; a timestamp per request would also
  cost every request its cache).

``--canary`` also runs :func:`longctx.canary` on the real pack with a fact question: cold, cold under
another salt, then from the cache, token for token.

Against a running server (any engine, any GPU)::

    python benchmarks/answer_quality.py --base-url http://127.0.0.1:8000/v1 --fillers 0,4,12 \\
        --label "vLLM, H100, bf16 KV" --json /tmp/quality-bf16.json

With no ``--base-url`` it starts the harness's real-model vLLM (CPU, float32; ``--engine sglang`` for
SGLang) and stops it at the end. ``--section A.json B.json ...`` renders result files as the
``answer-quality`` section of docs/benchmarks.md (``--write`` replaces it there); ``--drift A.json
B.json`` compares two runs answer by answer (fp8-KV against bf16-KV: start one server with
``--kv-cache-dtype fp8`` and one without, run this against each, then ``--drift``). The fp8-KV probe
and the 8k/16k/32k table need a GPU (the CPU builds have no fp8 KV cache); benchmarks/gpu/ carries
the scripts that start those servers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

SECTION = "answer-quality"
GPU_SECTION = "answer-quality-gpu"
MAX_TOKENS = 24


def _chat(base_url: str, model: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0.0}
    request = urllib.request.Request(
        f"{base_url}/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=1800) as response:
        data: dict[str, Any] = json.load(response)
    return data


def _ask_all(base_url: str, model: str, requests: list[list[dict[str, str]]]) -> list[str]:
    """Every request at once (the server batches them), each answer's text in order."""
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        answers = list(pool.map(lambda messages: _chat(base_url, model, messages), requests))
    return [str(answer["choices"][0]["message"]["content"]) for answer in answers]


def _layouts(repository: Path, stamp: str) -> dict[str, tuple[str, str, bool]]:
    """Each layout's system prompt, the documents' text, and whether the question goes first."""
    from longctx import pack
    from longctx.packing.rendering import DOCUMENTS_OPENING, render_document, render_listing

    packed = pack(repository).pack
    listed: list[str] = []
    for folder, folders, files in os.walk(repository):
        folders[:] = [name for name in folders if name != ".git"]  # os.walk lists in the file system's order
        listed.extend(os.path.relpath(os.path.join(folder, name), repository) for name in files)
    in_fs_order = (
        DOCUMENTS_OPENING
        + "".join(render_document(path, (repository / path).read_text()) for path in listed)
        + render_listing([])
        + "Question:\n"
    )
    return {
        "longctx": (packed.system, packed.prefix, False),
        "question first": (packed.system, packed.prefix, True),
        "filesystem order": (packed.system, in_fs_order, False),
        "timestamp": (f"{packed.system}\n\nCurrent date and time: {stamp}.", packed.prefix, False),
    }


def _messages(system: str, documents: str, question: str, first: bool) -> list[dict[str, str]]:
    if first:
        user = f"Question: {question}\n\n{documents.removesuffix('Question:' + chr(10))}"
    else:
        user = documents + question
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def measure(args: argparse.Namespace, base_url: str) -> dict[str, Any]:
    from longctx.testing.answer_set import FACTS, PLANTED, write_fact_repository

    with urllib.request.urlopen(f"{base_url}/models", timeout=30) as response:
        model = json.load(response)["data"][0]["id"]
    questions = [(fact.question, fact.expected, "fact") for fact in FACTS]
    questions += [(plant.question, plant.expected, "planted") for plant in PLANTED]
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    rows: list[dict[str, Any]] = []
    for filler in args.fillers:
        repository = write_fact_repository(
            Path(tempfile.mkdtemp()) / "skyline-tools", filler=filler, planted=True
        )
        for layout, (system, documents, first) in _layouts(repository, stamp).items():
            if layout not in args.layouts:
                continue
            asked = questions
            if first and args.question_first_limit:
                # Nothing is cached across questions in this layout: each is a whole cold prefill.
                asked = questions[: args.question_first_limit]
            started = time.monotonic()
            warm = _chat(base_url, model, _messages(system, documents, "Say OK.", first))  # the prefill
            prompt_tokens = warm["usage"]["prompt_tokens"]
            texts = _ask_all(base_url, model, [_messages(system, documents, q[0], first) for q in asked])
            checked = zip(asked, texts, strict=True)
            right = [
                re.search(expected, text, re.IGNORECASE) is not None for (_, expected, _), text in checked
            ]
            rows.append(
                {
                    "filler": filler,
                    "pack_tokens": prompt_tokens,
                    "layout": layout,
                    "facts_right": sum(r for r, q in zip(right, asked, strict=True) if q[2] == "fact"),
                    "facts_asked": sum(q[2] == "fact" for q in asked),
                    "planted_right": sum(r for r, q in zip(right, asked, strict=True) if q[2] == "planted"),
                    "planted_asked": sum(q[2] == "planted" for q in asked),
                    "seconds": round(time.monotonic() - started, 1),
                    "answers": texts,
                }
            )
            print(
                json.dumps({k: v for k, v in rows[-1].items() if k != "answers"}), file=sys.stderr, flush=True
            )
    result: dict[str, Any] = {"label": args.label, "model": args.model_name or model, "rows": rows}
    if args.canary:
        result["canary"] = _canary(base_url, args.fillers[0])
    return result


def _canary(base_url: str, filler: int) -> dict[str, Any]:
    from longctx import CanaryOptions, canary, connect, pack
    from longctx.testing.answer_set import FACTS, write_fact_repository

    repository = write_fact_repository(
        Path(tempfile.mkdtemp()) / "skyline-canary", filler=filler, planted=True
    )
    packed = pack(repository).pack
    messages = [
        {"role": "system", "content": packed.system},
        {"role": "user", "content": packed.prefix + FACTS[2].question},
    ]
    with connect(base_url) as backend:
        result = canary(backend, messages, CanaryOptions(max_tokens=16, compare_tokens=16))
    texts = {run.label: run.text for run in result.runs}
    return {
        "verdict": result.verdict,
        "texts_equal": len(set(texts.values())) == 1,
        "texts": texts,
        "largest_difference": max((c.largest_difference or 0.0 for c in result.comparisons), default=None),
        "cached_tokens": {run.label: run.cached_tokens for run in result.runs},
    }


def section(paths: list[Path]) -> str:
    from bench import machine

    lines = [
        "## Answer quality: right answers, and what the layout costs in them",
        "",
        "Written by `benchmarks/answer_quality.py` (see its docstring). Ten fact questions about a small "
        "repository with known answers and three sentences planted at its start, middle and end "
        "(longctx.testing.answer_set), padded with standard-library modules for larger packs; greedy "
        f"answers of at most {MAX_TOKENS} tokens, each checked by a rule (a regular expression). "
        f"Machine: {machine()}.",
        "",
        "| run | model | pack tokens | layout | facts right | planted right | seconds |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    canaries = []
    for path in paths:
        data = json.loads(path.read_text())
        for row in data["rows"]:
            lines.append(
                f"| {data['label']} | {data['model']} | {row['pack_tokens']:,} | {row['layout']} | "
                f"{row['facts_right']}/{row['facts_asked']} | {row['planted_right']}/{row['planted_asked']} | "
                f"{row['seconds']} |"
            )
        if "canary" in data:
            canaries.append((data["label"], data["canary"]))
    lines += [
        "",
        "`question first` caches nothing across questions (each is a cold prefill of the whole pack), so "
        "on a CPU it asks the first few questions only (`--question-first-limit`); `timestamp` puts one "
        "date and time, taken at the start of the run, in the system prompt. fp8 against bf16 KV (the CPU "
        "builds have no fp8 KV cache) and packs of 8k to 28k tokens on vLLM and SGLang were measured on a "
        "GPU: `answer-quality-gpu` below (`benchmarks/gpu/quality.sh`).",
    ]
    for label, found in canaries:
        lines += [
            "",
            f"Canary ({label}): verdict {found['verdict']}; the cold, second cold and cached answers are "
            f"{'the same text' if found['texts_equal'] else 'NOT the same text'} "
            f"(largest logprob difference {found['largest_difference']}; cached tokens {found['cached_tokens']}).",
        ]
    return "\n".join(lines) + "\n"


def gpu_section(paths: list[Path]) -> str:
    """The GPU runs: per engine, every pack size and layout with the bf16-KV and fp8-KV answers side by side.

    ``paths`` are result files of ``benchmarks/gpu/quality.sh``, named ``quality-ENGINE-KV.json``;
    the engines' bf16 and fp8 files are paired by name.
    """
    runs: dict[str, dict[str, dict[str, Any]]] = {}
    for path in paths:
        _, engine, kv = path.stem.split("-")
        runs.setdefault(engine, {})[kv] = json.loads(path.read_text())
    lines = [
        "## Answer quality on a GPU: pack sizes to the window, and fp8 against bf16 KV",
        "",
        "Written by `benchmarks/answer_quality.py --gpu-section` from the files `benchmarks/gpu/quality.sh` "
        "wrote (kept in benchmarks/gpu/results/quality/). The same ten facts and three planted sentences as "
        "above, padded with standard-library modules (Python 3.12's) to about 8k, 17k and 28k tokens of the "
        f"model's 32k window; greedy answers of at most {MAX_TOKENS} tokens. Each engine served the model "
        "twice on one GPU at once, the weights in bf16, the KV cache in bf16 (`auto`) on one and fp8 on the "
        "other (vLLM `--kv-cache-dtype fp8`, SGLang `fp8_e4m3`; neither with calibrated scales: the "
        "checkpoint carries none). *same text*: answers identical to the bf16-KV answer, of 13.",
        "",
    ]
    for _engine, pair in sorted(runs.items()):
        bf16, fp8 = pair["bf16"], pair["fp8"]
        lines += [
            f"### {bf16['label'].removesuffix(', bf16 KV')}: {bf16['model']}",
            "",
            "| pack tokens | layout | bf16 KV: facts | planted | fp8 KV: facts | planted | same text | seconds (bf16) |",
            "|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for row, other in zip(bf16["rows"], fp8["rows"], strict=True):
            same = sum(x == y for x, y in zip(row["answers"], other["answers"], strict=True))
            lines.append(
                f"| {row['pack_tokens']:,} | {row['layout']} | {row['facts_right']}/{row['facts_asked']} | "
                f"{row['planted_right']}/{row['planted_asked']} | {other['facts_right']}/{other['facts_asked']} | "
                f"{other['planted_right']}/{other['planted_asked']} | {same}/{len(row['answers'])} | "
                f"{row['seconds']} |"
            )
        for kv, data in (("bf16", bf16), ("fp8", fp8)):
            totals: dict[str, list[int]] = {}
            for row in data["rows"]:
                total = totals.setdefault(row["layout"], [0, 0])
                total[0] += row["facts_right"] + row["planted_right"]
                total[1] += row["facts_asked"] + row["planted_asked"]
            shown = ", ".join(f"{layout} {right}/{asked}" for layout, (right, asked) in totals.items())
            lines += ["", f"Right over the three sizes, {kv} KV: {shown}."]
        for kv, data in (("bf16", bf16), ("fp8", fp8)):
            found = data.get("canary")
            if found:
                lines += [
                    "",
                    f"Canary, {kv} KV ({found['cached_tokens'].get('cached')} tokens cached): verdict "
                    f"{found['verdict']} (under the floor of 0.05 nats of this run; 0.2 since), cold, "
                    "cold again and cached answers "
                    f"{'the same text' if found['texts_equal'] else 'NOT the same text'}, largest log "
                    f"probability difference {found['largest_difference']:.3f} nats.",
                ]
        lines.append("")
    return "\n".join(lines) + "\n"


def drift(first: Path, second: Path) -> str:
    """How many answers two runs (fp8-KV and bf16-KV, say) gave token for token alike, by layout."""
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    lines = [
        f"| layout | pack tokens | same text ({a['label']} vs {b['label']}) | right: {a['label']} | right: {b['label']} |"
    ]
    lines.append("|---|---:|---:|---:|---:|")
    for row_a, row_b in zip(a["rows"], b["rows"], strict=True):
        same = sum(x == y for x, y in zip(row_a["answers"], row_b["answers"], strict=True))
        asked = len(row_a["answers"])
        right_a = row_a["facts_right"] + row_a["planted_right"]
        right_b = row_b["facts_right"] + row_b["planted_right"]
        lines.append(
            f"| {row_a['layout']} | {row_a['pack_tokens']:,} | {same}/{asked} | {right_a}/{asked} | {right_b}/{asked} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", help="a running server's /v1 URL; else the harness's real-model server")
    parser.add_argument("--engine", default="vllm", choices=("vllm", "sglang"))
    parser.add_argument("--fillers", default="0", help="filler module counts, one pack size each: 0,4,12")
    parser.add_argument(
        "--layouts", default="longctx,question first,filesystem order,timestamp", help="comma-separated"
    )
    parser.add_argument("--label", default="CPU")
    parser.add_argument("--model-name", help="the model's name in the results (default: the server's)")
    parser.add_argument("--canary", action="store_true")
    parser.add_argument(
        "--question-first-limit", type=int, default=0, help="ask only the first N questions question-first"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--section", type=Path, nargs="*")
    parser.add_argument("--drift", type=Path, nargs=2)
    parser.add_argument("--gpu-section", type=Path, nargs="*", help="quality.sh's result files")
    parser.add_argument(
        "--write", action="store_true", help="with --section or --gpu-section: rewrite docs/benchmarks.md"
    )
    args = parser.parse_args()
    if args.section:
        body = section(args.section)
        if args.write:
            from bench import write_section

            write_section(SECTION, body)
        print(body)
        return 0
    if args.drift:
        print(drift(*args.drift))
        return 0
    if args.gpu_section:
        body = gpu_section(args.gpu_section)
        if args.write:
            from bench import write_section

            write_section(GPU_SECTION, body)
        print(body)
        return 0
    args.fillers = [int(n) for n in args.fillers.split(",")]
    args.layouts = args.layouts.split(",")
    from bench import real_model_server

    with real_model_server(args.base_url, args.engine) as base_url:
        result = measure(args, base_url)
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
