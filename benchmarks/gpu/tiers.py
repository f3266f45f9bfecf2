"""SGLang's cache-tier counters over a run, from /metrics read before and after it.

Usage: python tiers.py BEFORE_1 AFTER_1 [BEFORE_2 AFTER_2 ...] > metrics.json

For each replica (a before/after pair) and in total: the change of
``sglang:cached_tokens_total`` by ``cache_source`` (device, host, storage_*, total),
of ``sglang:prompt_tokens_total`` and ``sglang:generation_tokens_total``, and the
host tier's size and use at the end (``sglang:hicache_host_{used,total}_tokens``).
Counters SGLang did not export (HiCache off, an older release) are left out.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
COUNTERS = ("sglang:prompt_tokens_total", "sglang:generation_tokens_total")
GAUGES = ("sglang:hicache_host_used_tokens", "sglang:hicache_host_total_tokens")


def read(path: Path) -> dict[str, float]:
    """``name`` or ``name[cache_source]`` -> value, summed over the other labels."""
    values: dict[str, float] = {}
    for line in path.read_text().splitlines():
        match = SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        name, labels = match["name"], dict(LABEL.findall(match["labels"] or ""))
        if name == "sglang:cached_tokens_total":
            key = f"{name}[{labels.get('cache_source', '')}]"
        elif name in COUNTERS or name in GAUGES:
            key = name
        else:
            continue
        values[key] = values.get(key, 0.0) + float(match["value"])
    return values


def change(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    out = {}
    for key, value in after.items():
        if any(key == gauge for gauge in GAUGES):
            out[key] = value
        else:
            out[key] = value - before.get(key, 0.0)
    return out


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]]
    if not paths or len(paths) % 2:
        sys.exit(__doc__)
    replicas = [change(read(paths[i]), read(paths[i + 1])) for i in range(0, len(paths), 2)]
    total: dict[str, float] = {}
    for replica in replicas:
        for key, value in replica.items():
            total[key] = total.get(key, 0.0) + value
    json.dump({"replicas": replicas, "total": total}, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
