"""Turn followup_probe.py's JSON into docs/benchmarks.md's "Cached follow-ups" section.

Usage: python benchmarks/gpu/followup_report.py PROBE.json [PROBE2.json ...] [--write]
Several files (one per engine, or one per server launch option, ``--server-label``) make one
section, a table each. Without --write the section is printed; with it, it replaces the section
between its markers (``followup-ids``).
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


def table(probe: dict[str, Any]) -> list[str]:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("probes", type=Path, nargs="+")
    parser.add_argument("--write", action="store_true", help="write the section into docs/benchmarks.md")
    args = parser.parse_args()
    body = section([json.loads(path.read_text()) for path in args.probes])
    if args.write:
        from bench import write_section

        write_section(SECTION, body)
    else:
        print(body)


if __name__ == "__main__":
    main()
