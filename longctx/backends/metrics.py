"""Reading Prometheus text exposition, as served on ``/metrics`` by both engines."""

from __future__ import annotations

import re
from collections.abc import Mapping

from longctx.recordtypes import record_type

__all__ = ["Sample", "parse_metrics", "total"]

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@record_type
class Sample:
    """One sample: metric name, labels and value."""

    name: str
    labels: dict[str, str]
    value: float

    def serves(self, model: str | None) -> bool:
        """Whether the sample counts for ``model``: any sample when None, else one of it or of no model."""
        return model is None or self.labels.get("model_name") in (None, model)


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


def total(
    samples: list[Sample], name: str, *, model: str | None = None, labels: Mapping[str, str] | None = None
) -> float | None:
    """Sum of ``name`` over the samples whose labels include ``labels`` (of ``model``); None if absent."""
    wanted = (labels or {}).items()
    values = [
        s.value
        for s in samples
        if s.name == name and s.serves(model) and all(s.labels.get(key) == value for key, value in wanted)
    ]
    return sum(values) if values else None
