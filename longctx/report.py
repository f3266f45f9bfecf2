"""The savings report over many requests.

:class:`SavingsReport` sums the requests of a session or a batch: hit rate,
prefill tokens saved, and prefill seconds saved, *estimated* from the cold
prefill rate measured on the same requests. It carries the cross-check
against the server's own prefix-cache counters and renders as text, JSON,
Markdown and HTML (shown by notebooks).

The HTML holds text nobody vetted (a server's model name, a path, and in
time questions, answers and citations an agent was told to write): every
text goes through :func:`html_text` on its way in, the page's JSON through
:func:`json_in_script`, and the page carries a Content-Security-Policy
that runs no script at all and loads nothing from elsewhere.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, field
from typing import Any

from longctx.citations import CitedAnswer
from longctx.errors import ConfigError
from longctx.recordtypes import record_type
from longctx.store import RequestRecord
from longctx.usage import Usage

__all__ = [
    "CachedByTier",
    "CounterCheck",
    "Prices",
    "RequestLine",
    "SavingsReport",
    "build_report",
    "cold_prefill_rate",
    "content_security_policy",
    "html_text",
    "json_in_script",
]


def html_text(value: object) -> str:
    """``value`` as text in HTML, an element's or an attribute's: the one way text enters the report's HTML.

    ``&``, ``<``, ``>`` and both quotes become references, so no text can
    open a tag, close one or leave an attribute's value.
    """
    return html.escape(str(value), quote=True)


def json_in_script(text: str) -> str:
    """JSON ``text`` made safe inside ``<script type="application/json">``, and still the same JSON.

    A script element's text is not unescaped by the browser, so ``<``,
    ``>`` and ``&`` are written as JSON escapes: no ``</script>`` or
    ``<!--`` can appear, and ``JSON.parse`` reads the original.
    """
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def content_security_policy(*, styles: Sequence[str] = (), scripts: Sequence[str] = ()) -> str:
    """A policy allowing only the page's own inline ``styles`` and ``scripts`` (by hash) and data: images.

    No script runs unless it is one of ``scripts`` byte for byte, nothing
    is fetched from anywhere, no form posts and no ``<base>`` redirects.
    """

    def hashes(texts: Sequence[str]) -> str:
        found = [
            f"'sha256-{base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()}'" for text in texts
        ]
        return " ".join(found) or "'none'"

    return (
        f"default-src 'none'; script-src {hashes(scripts)}; style-src {hashes(styles)}; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )


@record_type
class Prices:
    """Prices per million tokens, for a cost line in the report."""

    input_per_million: float
    cached_input_per_million: float
    output_per_million: float = 0.0
    currency: str = "USD"


@record_type
class CounterCheck:
    """The report's cached tokens against the server's own counter.

    ``counter`` names the metric, ``server_delta`` is how much it grew over
    the report's requests, ``reported`` the sum of the responses' cached
    tokens. The counter is the server's: calls of this process that
    overlapped the report's are counted in it too, and ``others_reported``
    is what their responses reported. ``matches`` is exact equality of the
    growth with both together; ``note`` explains a mismatch, the others'
    share, or why no check was possible.

    Where the server keeps a tier below the GPU, ``host_tokens`` and
    ``external_tokens`` are the cached tokens of the window it loaded from
    host memory and from storage, ``loaded_bytes`` the bytes that came back
    from the host, and ``tier_source`` how they were counted (``by_source``,
    ``cache_source``; ``transfers``: the server counts bytes only, and the
    host tokens are the reported ones its GPU counter lacks). None: not counted.
    """

    counter: str
    server_delta: int | None
    reported: int | None
    matches: bool | None
    note: str = ""
    others_reported: int = 0
    host_tokens: int | None = None
    external_tokens: int | None = None
    loaded_bytes: int | None = None
    tier_source: str | None = None


@record_type
class CachedByTier:
    """A report's cached tokens split by where the server found them.

    ``device`` is GPU memory, ``host`` host memory, ``external`` storage below
    it (disk, a cache server, another instance). ``source`` is ``responses``
    (every response said) or ``counters (...)``, the server's counters over
    the window, with how they were counted.
    """

    device: int
    host: int
    external: int
    source: str

    def describe(self) -> str:
        text = f"device {self.device:,}, host {self.host:,}"
        if self.external:
            text += f", storage {self.external:,}"
        return f"{text} (from the {self.source})"


@record_type
class RequestLine:
    """One request in a report: its id, what it was for, its :class:`~longctx.usage.Usage`, its attempts.

    ``base_url`` is the replica that answered it; ``question`` the question
    it answered, where the report knows it (a batch's siblings, a job's items).
    """

    id: str
    purpose: str
    usage: Usage
    attempts: int
    base_url: str = ""
    question: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The request's JSON form: its id and purpose, each usage field, its attempts, its question."""
        return {
            "id": self.id,
            "purpose": self.purpose,
            **self.usage.to_dict(),
            "attempts": self.attempts,
            "base_url": self.base_url,
            "question": self.question,
        }


@record_type
class SavingsReport:
    """What the prefix cache saved over a set of requests.

    ``cached_tokens`` is ``None`` when no response reported it; then
    ``missing_reason`` says what to change on the server. ``dispatch`` (a
    batch's report only) says how its siblings went out and why.
    ``prefill_seconds_saved`` is an estimate: cached tokens divided by the
    cold prefill rate (tokens per second) measured on this report's requests
    that prefilled most of their prompt. ``citations``: the answers asked
    with ``cite=True`` and where each says it rests (see :mod:`longctx.citations`).
    """

    title: str
    engine: str
    model: str
    requests: tuple[RequestLine, ...]
    prompt_tokens: int
    cached_tokens: int | None
    completion_tokens: int
    missing_reason: str | None
    cold_prefill_tokens_per_second: float | None
    counter_check: CounterCheck | None = None
    prices: Prices | None = None
    notes: tuple[str, ...] = field(default=())
    dispatch: str | None = None
    citations: tuple[CitedAnswer, ...] = ()

    @property
    def hit_rate(self) -> float | None:
        if self.cached_tokens is None or self.prompt_tokens == 0:
            return None
        return self.cached_tokens / self.prompt_tokens

    @property
    def cached_by_tier(self) -> CachedByTier | None:
        """Where the cached tokens came from: per request where every response said, else the counters.

        None when neither the responses nor the server's counters split them
        (no tier below the GPU seen, or an engine that does not count it).
        """
        if self.cached_tokens is None:
            return None
        lines = [line for line in self.requests if line.usage.cached_tokens is not None]
        if lines and all(line.usage.host_cached_tokens is not None for line in lines):
            host = sum(line.usage.host_cached_tokens or 0 for line in lines)
            external = sum(line.usage.external_cached_tokens or 0 for line in lines)
            return CachedByTier(self.cached_tokens - host - external, host, external, "responses")
        check = self.counter_check
        if check is None or check.tier_source is None or check.host_tokens is None:
            return None
        external = check.external_tokens or 0
        # The window's split, applied to this report's cached tokens (other calls may share the window).
        host = min(check.host_tokens, self.cached_tokens)
        external = min(external, self.cached_tokens - host)
        return CachedByTier(
            self.cached_tokens - host - external, host, external, f"counters ({check.tier_source})"
        )

    @property
    def prefill_tokens(self) -> int | None:
        """Prompt tokens the server actually prefilled."""
        if self.cached_tokens is None:
            return None
        return self.prompt_tokens - self.cached_tokens

    @property
    def prefill_seconds_saved(self) -> float | None:
        if self.cached_tokens is None or not self.cold_prefill_tokens_per_second:
            return None
        return self.cached_tokens / self.cold_prefill_tokens_per_second

    @property
    def cost(self) -> float | None:
        """Input plus output cost at ``prices`` (cached tokens at the cached price)."""
        if self.prices is None or self.cached_tokens is None:
            return None
        uncached = self.prompt_tokens - self.cached_tokens
        return (
            uncached * self.prices.input_per_million
            + self.cached_tokens * self.prices.cached_input_per_million
            + self.completion_tokens * self.prices.output_per_million
        ) / 1e6

    @property
    def cost_without_cache(self) -> float | None:
        if self.prices is None:
            return None
        return (
            self.prompt_tokens * self.prices.input_per_million
            + self.completion_tokens * self.prices.output_per_million
        ) / 1e6

    # -- renderings ---------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (the ``--json`` output)."""
        return {
            "title": self.title,
            "engine": self.engine,
            "model": self.model,
            "requests": [line.to_dict() for line in self.requests],
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefill_tokens": self.prefill_tokens,
            "completion_tokens": self.completion_tokens,
            "hit_rate": self.hit_rate,
            "missing_reason": self.missing_reason,
            "cold_prefill_tokens_per_second": self.cold_prefill_tokens_per_second,
            "prefill_seconds_saved_estimate": self.prefill_seconds_saved,
            "counter_check": asdict(self.counter_check) if self.counter_check else None,
            "cost": self.cost,
            "cost_without_cache": self.cost_without_cache,
            "currency": self.prices.currency if self.prices else None,
            "cached_by_tier": asdict(tiers) if (tiers := self.cached_by_tier) else None,
            "replicas": dict(self._per_replica()),
            "notes": list(self.notes),
            "dispatch": self.dispatch,
            "citations": [
                {"question": c.question, "turn": c.turn, "citations": [x.to_dict() for x in c.citations]}
                for c in self.citations
            ],
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    def summary_line(self) -> str:
        """One line for a terminal's stderr."""
        if self.cached_tokens is None:
            return (
                f"{_requests(len(self.requests))}, {self.prompt_tokens:,} prompt tokens; "
                f"cached tokens unknown: {self.missing_reason}"
            )
        saved = self.prefill_seconds_saved
        saved_text = f", ~{saved:.1f} s prefill saved (estimate)" if saved is not None else ""
        return (
            f"{_requests(len(self.requests))}, {self.cached_tokens:,} of {self.prompt_tokens:,}"
            f" prompt tokens cached ({self.hit_rate or 0:.1%}){saved_text}"
        )

    def _facts(self) -> list[tuple[str, str]]:
        facts = [("server", f"{self.engine}, model {self.model}"), ("requests", str(len(self.requests)))]
        if self.dispatch:
            facts.append(("dispatch", self.dispatch))
        facts.append(("prompt tokens", f"{self.prompt_tokens:,}"))
        if self.cached_tokens is None:
            facts.append(("cached tokens", f"unknown: {self.missing_reason}"))
        else:
            facts.append(("cached tokens", f"{self.cached_tokens:,} ({self.hit_rate or 0:.1%} hit rate)"))
            facts.append(("prefilled tokens", f"{self.prefill_tokens:,}"))
            tiers = self.cached_by_tier
            # Engines that count by tier also count a server without a host tier (all on the GPU).
            if tiers is not None and (tiers.host or tiers.external):
                facts.append(("cached by tier", tiers.describe()))
        facts.append(("completion tokens", f"{self.completion_tokens:,}"))
        facts += [(f"replica {url}", text) for url, text in self._per_replica()]
        if self.cold_prefill_tokens_per_second:
            facts.append(
                ("cold prefill rate", f"{self.cold_prefill_tokens_per_second:,.0f} tokens/s (measured)")
            )
        if self.prefill_seconds_saved is not None:
            facts.append(("prefill time saved", f"~{self.prefill_seconds_saved:.2f} s (estimate)"))
        if self.cost is not None and self.cost_without_cache is not None and self.prices:
            facts.append(
                (
                    "cost",
                    f"{self.cost:.4f} {self.prices.currency} (without cache {self.cost_without_cache:.4f})",
                )
            )
        check = self.counter_check
        if check is not None:
            if check.matches is None:
                facts.append(("server counter", f"{check.counter}: not checked ({check.note})"))
            else:
                verdict = "matches" if check.matches else f"MISMATCH ({check.note})"
                if check.matches and check.others_reported:
                    verdict += f" ({check.note})"
                facts.append(("server counter", f"{check.counter} grew by {check.server_delta:,}: {verdict}"))
        return facts

    def _per_replica(self) -> list[tuple[str, str]]:
        """Each replica's requests and cached share, when more than one answered."""
        urls = sorted({line.base_url for line in self.requests if line.base_url})
        if len(urls) < 2:
            return []
        shown = []
        for url in urls:
            mine = [line for line in self.requests if line.base_url == url]
            prompt = sum(line.usage.prompt_tokens or 0 for line in mine)
            cached = sum(line.usage.cached_tokens or 0 for line in mine)
            share = f", {cached:,} of {prompt:,} prompt tokens cached" if prompt else ""
            shown.append((url, f"{len(mine)} requests{share}"))
        return shown

    def _rows(self) -> list[list[str]]:
        def number(value: int | None) -> str:
            return "n/a" if value is None else f"{value:,}"

        def seconds(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.2f}"

        asked = self._shows_questions()
        return [
            [
                str(index),
                line.purpose,
                number(line.usage.prompt_tokens),
                number(line.usage.cached_tokens),
                number(line.usage.completion_tokens),
                seconds(line.usage.ttft_seconds),
                seconds(line.usage.total_seconds),
                *([_one_line(line.question or "", 60)] if asked else []),
            ]
            for index, line in enumerate(self.requests, start=1)
        ]

    _HEADINGS = ("#", "purpose", "prompt", "cached", "completion", "ttft s", "total s")

    def _shows_questions(self) -> bool:
        return any(line.question for line in self.requests)

    def _headings(self) -> tuple[str, ...]:
        """The table's columns: a question column where the report knows the requests' questions."""
        return (*self._HEADINGS, "question") if self._shows_questions() else self._HEADINGS

    def to_text(self) -> str:
        lines = [self.title, "=" * len(self.title)]
        width = max(len(name) for name, _ in self._facts())
        lines += [f"{name:<{width}}  {value}" for name, value in self._facts()]
        headings = self._headings()
        rows = [list(headings), *self._rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(headings))]
        lines.append("")
        for row in rows:
            lines.append(
                "  ".join(
                    cell.ljust(widths[i]) if i in (1, 7) else cell.rjust(widths[i])
                    for i, cell in enumerate(row)
                ).rstrip()
            )
        lines += [f"note: {note}" for note in self.notes]
        for cited in self.citations:
            lines += ["", f"sources of turn {cited.turn}: {cited.question}"]
            lines += [f"  {citation.describe()}" for citation in cited.citations] or ["  (none given)"]
        return "\n".join(lines)

    def to_markdown(self) -> str:
        lines = [f"### {self.title}", ""]
        lines += [f"- **{name}**: {value}" for name, value in self._facts()]
        headings = self._headings()
        lines += ["", "| " + " | ".join(headings) + " |", "|" + "---|" * len(headings)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in self._rows()]
        lines += [f"\n_{note}_" for note in self.notes]
        return "\n".join(lines)

    def to_html(self) -> str:
        """An HTML fragment: facts, a bar per request (cached vs prefilled), the table."""
        escape = html_text
        facts = "".join(f"<tr><th>{escape(n)}</th><td>{escape(v)}</td></tr>" for n, v in self._facts())
        head = "".join(f"<th>{escape(h)}</th>" for h in self._headings())
        body = "".join(
            "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in self._rows()
        )
        notes = "".join(f"<p><em>{escape(note)}</em></p>" for note in self.notes)
        notes += self._citations_html()
        return (
            f'<div class="longctx-report"><h3>{escape(self.title)}</h3>'
            f'<table class="longctx-facts">{facts}</table>'
            f"{self.chart_svg()}"
            f'<table class="longctx-requests"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
            f"{notes}</div>"
        )

    def _citations_html(self) -> str:
        """Each cited answer's sources, a link to the file where it is on this machine; every text escaped."""
        escape = html.escape
        parts = []
        for cited in self.citations:
            items = []
            for citation, link in zip(
                cited.citations, cited.links or [None] * len(cited.citations), strict=True
            ):
                where = escape(citation.location)
                if link is not None:
                    where = f'<a href="{escape(link, quote=True)}">{where}</a>'
                quote = f" <q>{escape(citation.quote)}</q>" if citation.quote else ""
                status = "" if citation.verified else f" <em>unverified: {escape(citation.reason or '')}</em>"
                items.append(f"<li>{where}{quote}{status}</li>")
            parts.append(
                f"<h4>Sources of turn {cited.turn}: {escape(cited.question)}</h4>"
                f'<ul class="longctx-citations">{"".join(items) or "<li>none given</li>"}</ul>'
            )
        return "".join(parts)

    def _repr_html_(self) -> str:
        return self.to_html()

    def to_page(self) -> str:
        """A self-contained HTML page (no scripts, no external files) with the figures and the chart.

        Its Content-Security-Policy runs no script and loads nothing; the
        report's JSON is in it as a data block (``id="longctx-report"``).
        """
        style = (
            "body{font-family:system-ui,sans-serif;margin:2em;color:#222}"
            "table{border-collapse:collapse;margin:1em 0}"
            "th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}"
            ".longctx-facts th{text-align:left;background:#f4f4f4}"
            ".longctx-facts td{text-align:left}"
        )
        policy = content_security_policy(styles=[style])
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{html_text(policy)}">'
            f"<title>{html_text(self.title)}</title><style>{style}</style></head>"
            f'<body>{self.to_html()}<script type="application/json" id="longctx-report">'
            f"{json_in_script(self.to_json(indent=None))}</script></body></html>\n"
        )

    def plot(self, ax: Any = None) -> Any:
        """A matplotlib bar chart of cached versus prefilled prompt tokens per request.

        Needs the ``notebook`` extra (``pip install 'longctx-sdk[notebook]'``).
        """
        try:
            import matplotlib.pyplot as plt
        except ImportError as error:
            raise ConfigError("plotting needs matplotlib: pip install 'longctx-sdk[notebook]'") from error
        if ax is None:
            _, ax = plt.subplots(figsize=(7, 0.4 * max(3, len(self.requests)) + 1))
        labels = [f"#{i} {line.purpose}" for i, line in enumerate(self.requests, start=1)]
        cached = [line.usage.cached_tokens or 0 for line in self.requests]
        prefilled = [
            (line.usage.prompt_tokens or 0) - c for line, c in zip(self.requests, cached, strict=True)
        ]
        ax.barh(labels, cached, color="#2e8b57", label="cached")
        ax.barh(labels, prefilled, left=cached, color="#b0b0b0", label="prefilled")
        ax.invert_yaxis()
        ax.set_xlabel("prompt tokens")
        ax.set_title(self.title)
        ax.legend()
        return ax

    def chart_svg(self, width: int = 560, bar_height: int = 16) -> str:
        """Cached (green) versus prefilled (grey) prompt tokens per request, as inline SVG."""
        lines = [line for line in self.requests if line.usage.prompt_tokens]
        if not lines:
            return ""
        largest = max(line.usage.prompt_tokens or 0 for line in lines)
        label_width, gap = 40, 4
        height = len(lines) * (bar_height + gap) + 24
        parts = [
            '<svg class="longctx-chart" xmlns="http://www.w3.org/2000/svg" '
            f'width="{width}" height="{height}" '
            'role="img" aria-label="cached versus prefilled prompt tokens per request">'
        ]
        scale = (width - label_width - 10) / largest
        for index, line in enumerate(lines):
            y = index * (bar_height + gap)
            cached = line.usage.cached_tokens or 0
            prefilled = (line.usage.prompt_tokens or 0) - cached
            parts.append(f'<text x="0" y="{y + bar_height - 4}" font-size="11">#{index + 1}</text>')
            parts.append(
                f'<rect x="{label_width}" y="{y}" width="{cached * scale:.1f}" '
                f'height="{bar_height}" fill="#2e8b57">'
                f"<title>cached {cached:,}</title></rect>"
            )
            parts.append(
                f'<rect x="{label_width + cached * scale:.1f}" y="{y}" width="{prefilled * scale:.1f}" '
                f'height="{bar_height}" fill="#b0b0b0"><title>prefilled {prefilled:,}</title></rect>'
            )
        legend_y = len(lines) * (bar_height + gap) + 14
        parts.append(
            f'<text x="{label_width}" y="{legend_y}" font-size="11" fill="#2e8b57">cached</text>'
            f'<text x="{label_width + 60}" y="{legend_y}" font-size="11" fill="#707070">'
            "prefilled</text></svg>"
        )
        return "".join(parts)


def _one_line(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters (a table cell)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def cold_prefill_rate(records: Iterable[RequestRecord]) -> float | None:
    """Tokens per second of prefill, from requests that prefilled most of their prompt.

    Time to first token of a request that found little in the cache is
    dominated by prefill, so uncached tokens over that time is the rate a
    cache hit saves. None when no such request was seen.
    """
    tokens = 0
    seconds = 0.0
    for record in records:
        usage = record.usage
        if usage.prompt_tokens is None or usage.cached_tokens is None or usage.ttft_seconds is None:
            continue
        uncached = usage.prompt_tokens - usage.cached_tokens
        if uncached >= 0.5 * usage.prompt_tokens and uncached >= 256 and usage.ttft_seconds > 0:
            tokens += uncached
            seconds += usage.ttft_seconds
    return tokens / seconds if seconds > 0 else None


def _text_prompt_notes(records: Sequence[RequestRecord]) -> list[str]:
    """Why requests went as chat text where token ids were wanted (``prompt_form``), once per reason."""
    reasons: dict[str, int] = {}
    for record in records:
        form = record.usage.prompt_form or ""
        if form.startswith("text: "):
            reasons[form[len("text: ") :]] = reasons.get(form[len("text: ") :], 0) + 1
    return [f"{count} request(s) sent as chat text, not token ids: {why}" for why, count in reasons.items()]


def build_report(
    records: Sequence[RequestRecord],
    *,
    title: str,
    counter_check: CounterCheck | None = None,
    prices: Prices | None = None,
    notes: Sequence[str] = (),
    cold_rate: float | None = None,
    dispatch: str | None = None,
    citations: Sequence[CitedAnswer] = (),
    questions: Mapping[str, str] | None = None,
) -> SavingsReport:
    """Sum ``records`` into a :class:`SavingsReport`.

    ``cold_rate`` (tokens per second) is used when none of ``records`` was
    a cold request to measure it on; ``dispatch`` describes how a batch's
    siblings went out; ``questions`` maps a request's id to the question it
    answered (the table shows them).
    """
    asked = questions or {}
    reported = [r.usage.cached_tokens for r in records if r.usage.cached_tokens is not None]
    missing = next(
        (r.usage.cached_reason for r in records if r.usage.cached_tokens is None and r.usage.cached_reason),
        None,
    )
    if reported and len(reported) < len(records):
        missing_notes = [f"{len(records) - len(reported)} request(s) did not report cached tokens: {missing}"]
    else:
        missing_notes = []
    missing_notes += _text_prompt_notes(records)
    engines = sorted({r.engine for r in records}) or ["unknown"]
    models = sorted({r.model for r in records}) or ["unknown"]
    return SavingsReport(
        title=title,
        engine=", ".join(engines),
        model=", ".join(models),
        requests=tuple(
            RequestLine(
                id=r.id,
                purpose=r.purpose,
                usage=r.usage,
                attempts=r.attempts,
                base_url=r.base_url,
                question=asked.get(r.id),
            )
            for r in records
        ),
        prompt_tokens=sum(r.usage.prompt_tokens or 0 for r in records),
        cached_tokens=sum(reported) if reported else None,
        completion_tokens=sum(r.usage.completion_tokens or 0 for r in records),
        missing_reason=None if reported else (missing or ("no requests" if not records else "not reported")),
        cold_prefill_tokens_per_second=cold_prefill_rate(records) or cold_rate,
        counter_check=counter_check,
        prices=prices,
        notes=tuple([*missing_notes, *notes]),
        dispatch=dispatch,
        citations=tuple(citations),
    )


def _requests(count: int) -> str:
    """``1 request``, ``2 requests``."""
    return f"{count} request{'' if count == 1 else 's'}"
