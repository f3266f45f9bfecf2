"""What a lint found: per request the cached tokens on each engine, every finding, and the totals.

Renderings: :meth:`LintReport.to_text` (a table for a terminal),
:meth:`LintReport.to_html` (one page, no script, no external asset),
:meth:`LintReport.to_json` / :meth:`LintReport.to_dict` (for machines; the
shape is documented in ``docs/cli.md``). :meth:`LintReport.failing` is what
``--fail-on`` gates on.
"""

from __future__ import annotations

import dataclasses
import html
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from longctx.errors import ConfigError
from longctx.lint.causes import CAUSES
from longctx.recordtypes import record_type

__all__ = ["CacheModel", "Finding", "LintReport", "RequestLint", "fail_selection"]


@record_type
class CacheModel:
    """The cache one simulation stood for: the engine, block (page) size, KV budget."""

    engine: str
    kind: str
    block_tokens: int
    kv_tokens: int | None
    model: str


@record_type
class Finding:
    """One break or loss: in which request, against which earlier one, where, why, and the fix.

    ``engine`` is None when the finding holds on both engines (a change of the
    prompt), else the engine whose cache it concerns (``evicted``,
    ``block_straddle``: vLLM's blocks). ``token_offset`` is the first token the
    request does not share with ``ancestor``; ``before``/``after`` the
    request's text around it, ``ancestor_after`` the ancestor's text there.
    """

    request: str
    ancestor: str | None
    cause: str
    severity: str
    engine: str | None
    token_offset: int
    lost_tokens: int
    part: str
    before: str
    after: str
    ancestor_after: str
    fix: str | None


@record_type
class RequestLint:
    """One request: its prompt tokens, its ancestor and what they share, each engine's cached tokens.

    ``reported_cached`` is what the server reported, where the log kept the
    response. ``cause`` is why it parts from its ancestor (``first`` when
    nothing earlier shares a token; see :mod:`longctx.lint.causes`).
    """

    index: int
    label: str
    line: int
    prompt_tokens: int
    ancestor: str | None
    shared_tokens: int
    cached: Mapping[str, int]
    reported_cached: int | None
    cause: str
    findings: tuple[Finding, ...]


def fail_selection(spec: str) -> frozenset[str]:
    """The causes a ``--fail-on`` value names: causes, ``break``, ``loss`` or ``any``, comma-separated."""
    chosen: set[str] = set()
    for word in filter(None, (part.strip() for part in spec.split(","))):
        if word == "any":
            chosen |= {name for name, kind in CAUSES.items() if kind != "expected"}
        elif word in ("break", "loss"):
            chosen |= {name for name, kind in CAUSES.items() if kind == word}
        elif word in CAUSES and CAUSES[word] != "expected":
            chosen.add(word)
        else:
            known = ", ".join(name for name, kind in CAUSES.items() if kind != "expected")
            raise ConfigError(f"--fail-on: unknown cause {word!r} (any, break, loss, or one of: {known})")
    return frozenset(chosen)


@record_type
class LintReport:
    """The lint of one log (see the module docstring); ``tokenizer`` names what rendered it."""

    requests: tuple[RequestLint, ...]
    models: tuple[CacheModel, ...]
    tokenizer: str

    @property
    def engines(self) -> tuple[str, ...]:
        """The engines simulated, by name (the block cache's first)."""
        return tuple(model.engine for model in self.models)

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(finding for row in self.requests for finding in row.findings)

    @property
    def prompt_tokens(self) -> int:
        return sum(row.prompt_tokens for row in self.requests)

    def cached_tokens(self, engine: str) -> int:
        """The tokens ``engine``'s simulated cache served over the log."""
        return sum(row.cached[engine] for row in self.requests)

    def hit_rate(self, engine: str) -> float:
        """Cached over prompt tokens on ``engine``, 0 to 1."""
        total = self.prompt_tokens
        return self.cached_tokens(engine) / total if total else 0.0

    @property
    def reusable_tokens(self) -> int:
        """What an unbounded token-level cache would serve: each prefix shared with an earlier request."""
        return sum(min(row.shared_tokens, max(row.prompt_tokens - 1, 0)) for row in self.requests)

    @property
    def reported_cached_tokens(self) -> int | None:
        """The server's reported cached tokens over the log, where every response in it said; else None."""
        values = [row.reported_cached for row in self.requests]
        return None if any(value is None for value in values) else sum(v for v in values if v is not None)

    def causes(self) -> Counter[str]:
        """How many findings of each cause."""
        return Counter(finding.cause for finding in self.findings)

    def failing(self, causes: Iterable[str]) -> tuple[Finding, ...]:
        """The findings whose cause is one of ``causes`` (``--fail-on``)."""
        chosen = set(causes)
        return tuple(finding for finding in self.findings if finding.cause in chosen)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokenizer": self.tokenizer,
            "models": [dataclasses.asdict(model) for model in self.models],
            "summary": {
                "requests": len(self.requests),
                "prompt_tokens": self.prompt_tokens,
                "reusable_tokens": self.reusable_tokens,
                "reported_cached_tokens": self.reported_cached_tokens,
                **{
                    engine: {
                        "cached_tokens": self.cached_tokens(engine),
                        "hit_rate": round(self.hit_rate(engine), 4),
                    }
                    for engine in self.engines
                },
                "causes": dict(sorted(self.causes().items())),
            },
            "requests": [{**dataclasses.asdict(row), "cached": dict(row.cached)} for row in self.requests],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)

    def summary_lines(self) -> list[str]:
        total = self.prompt_tokens
        lines = [f"{len(self.requests)} requests, {total:,} prompt tokens ({self.tokenizer})"]
        for model in self.models:
            budget = "unbounded KV" if model.kv_tokens is None else f"KV {model.kv_tokens:,} tokens"
            unit = "block" if model.kind == "blocks" else "page"
            lines.append(
                f"  {model.engine:<6} ({unit} {model.block_tokens}, {budget}): "
                f"{self.cached_tokens(model.engine):,} cached, {self.hit_rate(model.engine):.1%}"
            )
        reusable = self.reusable_tokens
        lines.append(
            f"  shared with an earlier request: {reusable:,} ({reusable / total if total else 0:.1%})"
        )
        reported = self.reported_cached_tokens
        if reported is not None:
            lines.append(
                f"  reported by the server in the log: {reported:,} ({reported / total if total else 0:.1%})"
            )
        return lines

    def to_text(self) -> str:
        """The table (one row per request), the findings with their fixes, the totals."""
        header = ("request", "prompt", "shared", "ancestor", *self.engines, "reported", "cause")
        rows = [
            (
                row.label,
                f"{row.prompt_tokens:,}",
                f"{row.shared_tokens:,}",
                row.ancestor or "-",
                *(f"{row.cached[engine]:,}" for engine in self.engines),
                "-" if row.reported_cached is None else f"{row.reported_cached:,}",
                row.cause,
            )
            for row in self.requests
        ]
        widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
        lines = [
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
            for line in (header, *rows)
        ]
        findings = self.findings
        if findings:
            lines.append("")
            lines.append("findings:")
            for finding in findings:
                lines.extend(_finding_lines(finding))
        lines.append("")
        lines.extend(self.summary_lines())
        return "\n".join(lines) + "\n"

    def to_html(self) -> str:
        """One self-contained page: the totals, the table, each finding with its text around the break."""
        escape = html.escape
        rows = "".join(
            "<tr>"
            + "".join(
                f"<td>{escape(str(cell))}</td>"
                for cell in (
                    row.label,
                    row.prompt_tokens,
                    row.shared_tokens,
                    row.ancestor or "-",
                    *(row.cached[engine] for engine in self.engines),
                    "-" if row.reported_cached is None else row.reported_cached,
                    row.cause,
                )
            )
            + "</tr>"
            for row in self.requests
        )
        items = "".join(
            f"<li class='{escape(f.severity)}'><b>{escape(f.cause)}</b> in {escape(f.request)} "
            f"(against {escape(f.ancestor or '-')}, {escape(f.part)}) at token {f.token_offset:,}"
            f"{'' if f.engine is None else ' on ' + escape(f.engine)}: {f.lost_tokens:,} tokens"
            f"<pre>{escape(f.before)}<mark>{escape(f.after)}</mark>\n"
            f"{' ' * 0}earlier: <mark>{escape(f.ancestor_after)}</mark></pre>"
            f"{'' if f.fix is None else '<p>fix: ' + escape(f.fix) + '</p>'}</li>"
            for f in self.findings
        )
        summary = "".join(f"<li>{escape(line.strip())}</li>" for line in self.summary_lines())
        head = "".join(
            f"<th>{name}</th>"
            for name in ("request", "prompt", "shared", "ancestor", *self.engines, "reported", "cause")
        )
        return (
            "<!doctype html><html><head><meta charset='utf-8'><title>longctx lint</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
            "pre{background:#f6f6f6;padding:4px;white-space:pre-wrap}mark{background:#fdd}"
            "li.break b{color:#b00}li.loss b{color:#a60}</style></head><body>"
            f"<h1>Prefix-cache lint</h1><ul>{summary}</ul>"
            f"<table><tr>{head}</tr>{rows}</table>"
            f"<h2>Findings ({len(self.findings)})</h2><ol>{items}</ol></body></html>\n"
        )


def _finding_lines(finding: Finding) -> list[str]:
    where = f"{finding.request} vs {finding.ancestor or '-'}, {finding.part}, token {finding.token_offset:,}"
    engine = "" if finding.engine is None else f" [{finding.engine}]"
    lines = [f"- {finding.cause}{engine} ({finding.severity}): {where}, {finding.lost_tokens:,} tokens"]
    if finding.cause not in ("block_straddle", "short_prefix", "evicted"):
        lines.append(f"    here:    ...{_flat(finding.before[-30:])}|{_flat(finding.after[:40])}")
        lines.append(f"    earlier: ...{_flat(finding.before[-30:])}|{_flat(finding.ancestor_after[:40])}")
    if finding.fix:
        lines.append(f"    fix: {finding.fix}")
    return lines


def _flat(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]
