"""Turn followup_probe.py's JSON into docs/benchmarks.md's "Cached follow-ups" section.

Usage: python benchmarks/gpu/followup_report.py PROBE.json [PROBE2.json ...] [--answers ANSWERS.json ...] [--write]
Several files (one per engine, or one per server launch option, ``--server-label``) make one
section, a table each; a probe of the id path alone (``--modes ids``) gets a row per pack against
the default server's. ``--answers`` adds answers_probe.py's tables (a streamed follow-up's first
piece against the question alone; typed batches against plain ones) as the ``gpu-answers`` section.
Without --write the sections are printed; with it, each replaces its section between its markers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SECTION = "followup-ids"
ANSWERS_SECTION = "gpu-answers"
SPLIT_HEADER = (
    "| pack tokens | question alone | cold | text: TTFT | of which client / transfer / rest "
    "| server /tokenize of it | ids: TTFT | of which client / transfer / rest | text / ids |"
)


def spread(values: list[float]) -> str:
    """``min-max s (median m)`` of ``values`` in seconds."""
    if not values:
        return "-"
    low, high, middle = min(values), max(values), statistics.median(values)
    return f"{low:.3f}-{high:.3f} s (median {middle:.3f})" if len(values) > 1 else f"{middle:.3f} s"


def phases(rows: list[dict[str, Any]]) -> str:
    """The medians of the client's work, the transfer and the rest."""
    return " / ".join(
        f"{statistics.median(r[name] for r in rows):.3f}" for name in ("client", "transfer", "rest")
    )


def ids_table(probe: dict[str, Any]) -> list[str]:
    """A probe of the id path alone: its follow-ups' TTFT per pack."""
    lines = ["| pack tokens | question alone | cold | ids: TTFT | of which client / transfer / rest |",
             "|---:|---:|---:|---:|---:|"]  # fmt: skip
    for tokens, rows in sorted(probe["packs"].items(), key=lambda item: int(item[0])):
        lines.append(
            f"| {int(tokens):,} | {spread([r['ttft'] for r in rows['question alone']])}"
            f" | {spread([rows['cold'][0]['ttft']])} | {spread([r['ttft'] for r in rows['ids']])}"
            f" | {phases(rows['ids'])} |"
        )
    return lines


def table(probe: dict[str, Any]) -> list[str]:
    if not all("text" in rows for rows in probe["packs"].values()):
        return ids_table(probe)
    lines = [SPLIT_HEADER, "|" + "---:|" * 9]
    api_rows: list[str] = []
    for tokens, rows in sorted(probe["packs"].items(), key=lambda item: int(item[0])):
        text = statistics.median(r["ttft"] for r in rows["text"])
        ids = statistics.median(r["ttft"] for r in rows["ids"])
        lines.append(
            f"| {int(tokens):,} | {spread([r['ttft'] for r in rows['question alone']])}"
            f" | {spread([rows['cold'][0]['ttft']])} | {spread([r['ttft'] for r in rows['text']])}"
            f" | {phases(rows['text'])} | {spread(rows['tokenize'])} | {spread([r['ttft'] for r in rows['ids']])}"
            f" | {phases(rows['ids'])} | {text / ids:.2f}x |"
        )
        for name, seconds in sorted((rows.get("api") or {}).items()):
            api_rows.append(f"| {int(tokens):,} | {name} | {seconds:.2f} s |")
    if api_rows:
        lines += ["", "| pack tokens | longctx call | wall |", "|---:|---|---:|", *api_rows]
    return lines


def section(probes: list[dict[str, Any]]) -> str:
    lines = [
        "## Cached follow-ups: text against token ids",
        "",
        "Written by `benchmarks/gpu/followup_report.py` from `benchmarks/gpu/followup_probe.py`'s JSON."
        " Streamed, time to the first content chunk; each mode under its own `cache_salt`. A follow-up's"
        " TTFT is split into the client's work (until the request's bytes are ready), the transfer and"
        " the rest (the server, until the first token); the server's `/tokenize` of the same prompt is"
        " timed beside it: what the text path pays inside the rest.",
    ]
    for probe in probes:
        lines += [
            "",
            f"### {probe['engine']} {probe.get('version') or ''}, `{probe['model']}`, window"
            f" {probe['window']:,}, server launched with: {probe.get('server_label', 'default')}",
            "",
            *table(probe),
        ]
    return "\n".join(lines) + "\n"


def answers_table(found: dict[str, Any]) -> list[str]:
    """answers_probe.py's rows: first streamed pieces against the question alone; typed batches against plain."""
    rows = found["rows"]
    floor = statistics.median(rows["stream question alone"])
    lines = [
        f"#### {found['engine']} {found.get('version') or ''}, a pack of {found['pack_target']:,} tokens",
        "",
        "| streamed question | time to its first piece | against the question alone |",
        "|---|---:|---:|",
    ]
    for name in ("stream follow-up ids", "stream follow-up text", "stream question alone"):
        lines.append(
            f"| {name[len('stream ') :]} | {spread(rows[name])} | {statistics.median(rows[name]) / floor:.2f}x |"
        )
    lines += ["", "| round | typed batch of 8 | plain batch of 8 (as long) | typed / plain | typed answers |",
              "|---:|---:|---:|---:|---:|"]  # fmt: skip
    for index, (typed, plain) in enumerate(zip(rows["batch schema"], rows["batch plain"], strict=True)):
        parsed = f"{typed['typed']}/8" if typed.get("typed") is not None else f"none: {typed.get('invalid')}"
        lines.append(
            f"| {index + 1} | {typed['seconds']:.2f} s | {plain['seconds']:.2f} s"
            f" | {typed['seconds'] / plain['seconds']:.3f} | {parsed} |"
        )
    typed_total = sum(r["seconds"] for r in rows["batch schema"])
    plain_total = sum(r["seconds"] for r in rows["batch plain"])
    lines.append(f"| all | {typed_total:.2f} s | {plain_total:.2f} s | {typed_total / plain_total:.3f} | |")
    return lines


def answers_section(found: list[dict[str, Any]]) -> str:
    lines = [
        "## Answers on the GPU: streamed first pieces and typed batches",
        "",
        "Written by `benchmarks/gpu/followup_report.py --answers` from `benchmarks/gpu/answers_probe.py`'s"
        " JSON. A session asks once over the pack (cold), then streams follow-ups; the seconds from"
        " `stream()` to its first piece, against the same questions in a session with no pack (the floor"
        " of a cached follow-up). Batches: `ask_many` of 8 over the pack, cold, typed by a schema under"
        " the engine's constraint, then plain with max_tokens set to the typed answers' mean length.",
    ]
    for one in found:
        lines += ["", *answers_table(one)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("probes", type=Path, nargs="*")
    parser.add_argument("--answers", type=Path, nargs="*", default=[], help="answers_probe.py's JSON files")
    parser.add_argument("--write", action="store_true", help="write the sections into docs/benchmarks.md")
    args = parser.parse_args()
    sections = []
    if args.probes:
        sections.append((SECTION, section([json.loads(path.read_text()) for path in args.probes])))
    if args.answers:
        sections.append((ANSWERS_SECTION, answers_section([json.loads(p.read_text()) for p in args.answers])))
    for name, body in sections:
        if args.write:
            from bench import write_section

            write_section(name, body)
        else:
            print(body)


if __name__ == "__main__":
    main()
