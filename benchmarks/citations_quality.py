"""Benchmark: how should longctx ask for citations so that a small real model's quotes verify?

Over the fact repository of :mod:`longctx.testing.answer_set` (ten fact questions with known
answers), a real instruct model answers every question once per way of asking for citations,
greedily (temperature 0), a way's questions all at once (the server batches them). Every way keeps the cached prefix (the system
prompt and the pack) byte for byte as a plain question has it: what differs is the text after the
question, and for the structured ways a request field (never in the prompt). Per way it records the
answers right (the answer_set rule, on the answer alone: a quote that holds the fact does not count
as the answer), the citations given, the citations verified against the pack
(:func:`longctx.citations.verify_claim`), the questions with at least one verified citation, the
share of the prompt read from the cache, the mean seconds per question and the seconds for all of
them.

The ways (``--variants``, comma-separated keys of :data:`VARIANTS`):

- ``first``: the instruction longctx shipped first: a ``Sources:`` block after the answer, one
  ``PATH:START-END "QUOTE"`` line per place;
- ``example``: the same block, reworded, with a one-line worked example (path, lines, quote);
- ``example-no-lines``: the same with no line numbers (the quote places the citation);
- ``quote-first``: the ``Sources:`` block first (a line copied from the document), then the answer;
- ``json``: structured outputs (``response_format`` json_schema): ``{"answer", "sources": [{"path":
  one of the pack's paths, "quote"}]}``, turned into the same citations;
- ``json-quote-first``: the same schema with the sources before the answer;
- ``json-lines``, ``json-lines-answer-first``: as ``json-quote-first`` and ``json``, but each quote
  one of its document's lines by the grammar (an ``enum`` per document);
  ``json-lines-answer-first-one``: the same with one source at most;
- ``shipped``: what ``cite=True`` asks (:data:`longctx.citations.CITE_INSTRUCTION`, the same
  words as ``json``, and :func:`longctx.citations.cite_schema`, the schema of
  ``json-lines-answer-first``), read as longctx reads it (:func:`longctx.citations.cited_text`,
  which also keeps the answer and the whole sources of an answer cut at ``max_tokens``).

With no ``--base-url`` it starts the harness's real-model vLLM (CPU, float32; ``--engine sglang``
for SGLang) and stops it at the end. ``--json FILE`` keeps the result; ``--section A.json B.json
...`` renders result files as the ``citations-quality`` section of docs/benchmarks.md (``--write``
replaces it there).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

SECTION = "citations-quality"
MAX_TOKENS = 128

FIRST_INSTRUCTION = (
    "\n\n"
    'End your answer with a line "Sources:" and below it one line for each place in the documents '
    "that your answer rests on, in this form:\n"
    '- PATH:START-END "QUOTE"\n'
    "PATH is the document's path as its fence shows it; START-END are the line numbers in that "
    "document (its first line after the fence is line 1); QUOTE is a short passage, a line or "
    "less, copied exactly from those lines. If you are not sure of the line numbers, write "
    '- PATH "QUOTE" instead. Cite only what the documents hold.'
)
EXAMPLE_INSTRUCTION = (
    "\n\n"
    'Answer briefly. Then write a line "Sources:" and under it one line for each document your answer '
    "rests on: the document's path as its fence shows it, the line numbers, and a short passage copied "
    "exactly from those lines, in double quotes. For example:\n"
    "Sources:\n"
    '- src/server.py:12-12 "TIMEOUT_SECONDS = 30"'
)
EXAMPLE_NO_LINES_INSTRUCTION = (
    "\n\n"
    'Answer briefly. Then write a line "Sources:" and under it one line for each document your answer '
    "rests on: the document's path as its fence shows it, then a short passage copied exactly from it, "
    "in double quotes. For example:\n"
    "Sources:\n"
    '- src/server.py "TIMEOUT_SECONDS = 30"'
)
QUOTE_FIRST_INSTRUCTION = (
    "\n\n"
    'First write a line "Sources:" and under it the line of the documents that answers the question, '
    "copied exactly, after its document's path as its fence shows it, like this:\n"
    "Sources:\n"
    '- src/server.py "TIMEOUT_SECONDS = 30"\n'
    "Then leave an empty line and write your answer."
)
JSON_QUOTE_FIRST_INSTRUCTION = (
    "\n\n"
    'Answer in JSON: first "sources", the places in the documents your answer rests on, each with its '
    '"path" (as its fence shows it) and a "quote": a line copied exactly from that document; then '
    '"answer", your answer.'
)
JSON_INSTRUCTION = (
    "\n\n"
    'Answer in JSON: "answer" is your answer; "sources" lists the places in the documents it rests on, '
    'each with its "path" (as its fence shows it) and a "quote": a short passage copied exactly from that '
    "document."
)


def _source_schema(paths: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"path": {"type": "string", "enum": paths}, "quote": {"type": "string"}},
        "required": ["path", "quote"],
        "additionalProperties": False,
    }


def _line_item(documents: Mapping[str, str]) -> dict[str, Any]:
    """A source whose quote is one of its document's lines (stripped, not blank), by the grammar.

    The item of :func:`longctx.citations.cite_schema`, so the variants measure what ``cite=True`` sends.
    """
    from longctx.citations import cite_schema

    item: dict[str, Any] = cite_schema(documents)["properties"]["sources"]["items"]
    return item


def _json_schema(
    paths: list[str], *, sources_first: bool, item: dict[str, Any] | None = None, most: int = 3
) -> dict[str, Any]:
    sources = {"type": "array", "items": item or _source_schema(paths), "minItems": 1, "maxItems": most}
    order = ["sources", "answer"] if sources_first else ["answer", "sources"]
    properties = {"answer": {"type": "string"}, "sources": sources}
    return {
        "type": "object",
        "properties": {name: properties[name] for name in order},
        "required": order,
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class Read:
    """One answer as a way reads it: the answer alone (for the rule) and its checked citations."""

    answer: str
    citations: tuple[Any, ...]


@dataclass(frozen=True)
class Variant:
    """A way of asking: the text after the question, the request fields, how its answer is read."""

    label: str
    instruction: str
    fields: Callable[[Mapping[str, str]], dict[str, Any]] = field(default=lambda documents: {})
    read: Callable[[str, Mapping[str, str]], Read] | None = None


def _read_prose(text: str, documents: Mapping[str, str]) -> Read:
    from longctx.citations import read_citations, strip_sources

    return Read(strip_sources(text), read_citations(text, documents))


def _read_json(text: str, documents: Mapping[str, str]) -> Read:
    from longctx.citations import CitationClaim, verify_claim

    try:
        data = json.loads(text)
    except ValueError:
        return Read(text, ())
    claims = [
        CitationClaim(str(source.get("path")), None, None, str(source.get("quote") or "").strip() or None)
        for source in data.get("sources", [])
        if isinstance(source, dict)
    ]
    return Read(str(data.get("answer", "")), tuple(verify_claim(claim, documents) for claim in claims))


def _response_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "cited", "schema": schema}}}


def _shipped() -> Variant:
    """What ``cite=True`` sends (the instruction and :func:`longctx.citations.cite_schema`), read as it reads."""
    from longctx.citations import CITE_INSTRUCTION, cite_schema, cited_text, strip_sources

    def read(text: str, documents: Mapping[str, str]) -> Read:
        cited = cited_text(text, documents)
        return Read(strip_sources(cited.text), cited.citations)

    return Variant(
        "shipped: cite=True",
        CITE_INSTRUCTION,
        lambda documents: _response_format(cite_schema(documents)),
        read,
    )


VARIANTS: dict[str, Callable[[], Variant]] = {
    "first": lambda: Variant("first instruction: Sources after", FIRST_INSTRUCTION),
    "example": lambda: Variant("worked example, with lines", EXAMPLE_INSTRUCTION),
    "example-no-lines": lambda: Variant("worked example, no lines", EXAMPLE_NO_LINES_INSTRUCTION),
    "quote-first": lambda: Variant("quote first, then the answer", QUOTE_FIRST_INSTRUCTION),
    "json": lambda: Variant(
        "json_schema: answer, sources (free quote)",
        JSON_INSTRUCTION,
        lambda documents: _response_format(_json_schema(list(documents), sources_first=False)),
        _read_json,
    ),
    "json-quote-first": lambda: Variant(
        "json_schema: sources (free quote), answer",
        JSON_QUOTE_FIRST_INSTRUCTION,
        lambda documents: _response_format(_json_schema(list(documents), sources_first=True)),
        _read_json,
    ),
    "json-lines": lambda: Variant(
        "json_schema: sources (a line of the file), answer",
        JSON_QUOTE_FIRST_INSTRUCTION,
        lambda documents: _response_format(
            _json_schema(list(documents), sources_first=True, item=_line_item(documents))
        ),
        _read_json,
    ),
    "json-lines-answer-first": lambda: Variant(
        "json_schema: answer, sources (a line of the file)",
        JSON_INSTRUCTION,
        lambda documents: _response_format(
            _json_schema(list(documents), sources_first=False, item=_line_item(documents))
        ),
        _read_json,
    ),
    "json-lines-answer-first-one": lambda: Variant(
        "json_schema: answer, one source (a line of the file)",
        JSON_INSTRUCTION,
        lambda documents: _response_format(
            _json_schema(list(documents), sources_first=False, item=_line_item(documents), most=1)
        ),
        _read_json,
    ),
    "shipped": _shipped,
}


def _chat(base_url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{base_url}/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=1800) as response:
        data: dict[str, Any] = json.load(response)
    return data


def measure(args: argparse.Namespace, base_url: str) -> dict[str, Any]:
    from longctx import pack
    from longctx.packing.rendering import read_documents
    from longctx.testing.answer_set import FACTS, write_fact_repository

    with urllib.request.urlopen(f"{base_url}/models", timeout=30) as response:
        model = json.load(response)["data"][0]["id"]
    repository = write_fact_repository(Path(tempfile.mkdtemp()) / "skyline-tools", planted=True)
    packed = pack(repository).pack
    documents = read_documents(packed.prefix)

    def body(question: str, variant: Variant) -> dict[str, Any]:
        messages = [
            {"role": "system", "content": packed.system},
            {"role": "user", "content": packed.prefix + question + variant.instruction},
        ]
        return {
            "model": model,
            "messages": messages,
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            **variant.fields(documents),
        }

    warm = _chat(base_url, {**body("Say OK.", Variant("", "")), "max_tokens": 2})  # the pack's prefill
    rows: list[dict[str, Any]] = []
    for key in args.variants:
        variant = VARIANTS[key]()
        right = given = verified = grounded = 0
        seconds: list[float] = []
        cached: list[float] = []
        answers: list[dict[str, Any]] = []
        facts = FACTS[: args.questions]

        def timed(question: str, variant: Variant = variant) -> tuple[dict[str, Any], float]:
            started = time.monotonic()
            return _chat(base_url, body(question, variant)), time.monotonic() - started

        # Every question of a way at once: the server batches them (one at a time, the loaded 2-core
        # machine decoded ~1 token/s and a way took 20 minutes).
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=len(facts)) as pool:
            replies = list(pool.map(lambda fact: timed(fact.question), facts))
        wall = time.monotonic() - started
        for fact, (reply, took) in zip(facts, replies, strict=True):
            seconds.append(took)
            text = str(reply["choices"][0]["message"]["content"])
            usage = reply.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            cached.append((details.get("cached_tokens") or 0) / max(usage.get("prompt_tokens") or 1, 1))
            read = (variant.read or _read_prose)(text, documents)
            print(f"{key}: {seconds[-1]:.0f} s {text!r}", file=sys.stderr, flush=True)
            right += fact.right(read.answer)
            given += len(read.citations)
            verified += sum(citation.verified for citation in read.citations)
            grounded += any(citation.verified for citation in read.citations)
            answers.append(
                {
                    "question": fact.question,
                    "text": text,
                    "right": fact.right(read.answer),
                    "citations": [citation.to_dict() for citation in read.citations],
                }
            )
        rows.append(
            {
                "variant": key,
                "label": variant.label,
                "asked": len(answers),
                "right": right,
                "citations": given,
                "verified": verified,
                "grounded": grounded,
                "cached_share": round(sum(cached) / len(cached), 3),
                "mean_seconds": round(sum(seconds) / len(seconds), 1),
                "batch_seconds": round(wall, 1),
                "answers": answers,
            }
        )
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "answers"}), file=sys.stderr, flush=True)
        result = _result(args.label, model, warm, rows)
        if args.json:  # after every way, so a run cut short keeps what it measured
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    return _result(args.label, model, warm, rows)


def _result(label: str, model: str, warm: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "label": label,
        "model": model,
        "pack_tokens": warm["usage"]["prompt_tokens"],
        "max_tokens": MAX_TOKENS,
        "rows": rows,
    }


def section(paths: list[Path]) -> str:
    from bench import machine

    lines = [
        "## Citations: how to ask a small real model for quotes that verify",
        "",
        "Written by `benchmarks/citations_quality.py` (see its docstring). The ten fact questions of "
        "longctx.testing.answer_set over its repository, a way's ten at once (batched), greedily, in each way of "
        "asking for citations; the pack (system prompt and documents) is the same bytes in every way, so "
        "every question reads it from the cache. `right`: the answer alone (without its sources) meets "
        "the fact's rule; `citations`: places cited; `verified`: citations whose quote occurs in the "
        "document named (longctx.citations.verify_claim); `grounded`: questions with at least one "
        "verified citation; `on the fact's file`: questions with a verified citation of the document that "
        "holds the fact (a verified quote is a real line, not yet the right one). "
        f"Machine: {machine()}.",
        "",
        "| run | model | pack tokens | way of asking | right | citations | verified | grounded | "
        "on the fact's file | prompt cached | mean s | the ten at once, s |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    from longctx.testing.answer_set import FACTS

    sources = {fact.question: fact.source for fact in FACTS}
    for path in paths:
        data = json.loads(path.read_text())
        for row in data["rows"]:
            # A verified citation of the document that holds the fact (answer_set's Fact.source).
            on_source = sum(
                any(c["verified"] and c["path"] == sources.get(a["question"]) for c in a["citations"])
                for a in row.get("answers", [])
            )
            on_source_cell = f"{on_source}/{row['asked']}" if "answers" in row else "-"
            lines.append(
                f"| {data['label']} | {data['model']} | {data['pack_tokens']:,} | {row['label']} | "
                f"{row['right']}/{row['asked']} | {row['citations']} | {row['verified']} | "
                f"{row['grounded']}/{row['asked']} | "
                f"{on_source_cell} | "
                f"{row['cached_share']:.0%} | {row['mean_seconds']} | {row.get('batch_seconds', '-')} |"
            )
    lines += [
        "",
        f"At most {MAX_TOKENS} tokens an answer. The json_schema ways other than `shipped` count only a whole "
        "JSON answer (one cut at max_tokens gives no citations there); `shipped` is longctx's own reading, "
        "which keeps the answer and every whole source of an answer cut among its sources. The prose ways "
        "lost their answers to loops (`Sources:` written again and again) or to a list of paths alone. "
        "Seconds were taken on the shared 2-core machine beside other sessions' builds and tests, whose "
        "load changed within a run: compare them loosely.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", help="a running server's /v1 URL; else the harness's real-model server")
    parser.add_argument("--engine", default="vllm", choices=("vllm", "sglang"))
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--questions", type=int, default=10, help="ask the first N fact questions")
    parser.add_argument("--label", default="CPU")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--section", type=Path, nargs="*")
    parser.add_argument("--write", action="store_true", help="with --section: rewrite docs/benchmarks.md")
    args = parser.parse_args()
    if args.section:
        text = section(args.section)
        if args.write:
            from bench import write_section

            write_section(SECTION, text)
        print(text)
        return 0
    args.variants = args.variants.split(",")
    from bench import real_model_server

    with real_model_server(args.base_url, args.engine) as base_url:
        result = measure(args, base_url)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
