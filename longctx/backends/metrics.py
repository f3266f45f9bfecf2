"""Reading Prometheus text exposition, as served on ``/metrics`` by both engines."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Sample", "parse_metrics", "total"]

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    """One sample: metric name, labels and value."""

    name: str
    labels: dict[str, str]
    value: float


def parse_metrics(text: str) -> list[Sample]:
    """Every sample in ``text``; comments and malformed lines are passed over."""
    samples: list[Sample] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if not match:
            continue
        try:
            value = float(match.group(4))
        except ValueError:
            continue
        labels = {
            key: raw.replace('\\"', '"').replace("\\\\", "\\")
            for key, raw in _LABEL.findall(match.group(3) or "")
        }
        samples.append(Sample(match.group(1), labels, value))
    return samples


def total(samples: list[Sample], name: str, *, model: str | None = None) -> float | None:
    """Sum of ``name`` over all label sets (one model's, when given); None if absent."""
    values = [
        s.value
        for s in samples
        if s.name == name and (model is None or s.labels.get("model_name") in (None, model))
    ]
    return sum(values) if values else None
