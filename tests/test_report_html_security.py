"""The HTML report shows hostile text as text and runs no script, checked in headless Chromium.

A report's texts come from places nobody vetted: the server (its model
name, its notes), the paths packed, the questions an agent was told to ask,
the answers and citations the model wrote. Every text of a report here is a
payload that runs a script if it reaches the page as markup; the page
Chromium renders must show each one literally, and no script may have run.
The page's Content-Security-Policy is checked on its own too: markup slipped
into the page past the escaping still runs nothing.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import html
import html.parser
import itertools
import json
import re
import shutil
import subprocess
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from corpus_fixtures import committed_repo
from fake_engine import FakeEngine

from longctx.backends.base import connect
from longctx.report import Prices, SavingsReport
from longctx.sessions import RepoSession
from longctx.store import Store

# Each sets data-pwned on the root element if it runs; the number tells which one did.
PAYLOADS = (
    "<script>document.documentElement.dataset.pwned='{n}'</script>",
    "<img src=x onerror=\"document.documentElement.dataset.pwned='{n}'\">",
    '"><svg onload="document.documentElement.dataset.pwned=\'{n}\'"></svg>',
    "'></td></tr></table><iframe srcdoc=\"<script>parent.document.documentElement.dataset.pwned='{n}'"
    '</script>"></iframe>',
    "</script><script>document.documentElement.dataset.pwned='{n}'</script><!--",
    "<a href=\"javascript:document.documentElement.dataset.pwned='{n}'\">link</a> &amp; &lt;b&gt; ]]>",
)


class Hostile:
    """Numbered payloads, each one distinct text."""

    def __init__(self) -> None:
        self.counter = itertools.count(1)
        self.made: list[str] = []

    def __call__(self) -> str:
        number = next(self.counter)
        text = f"[{number}]" + PAYLOADS[number % len(PAYLOADS)].format(n=number)
        self.made.append(text)
        return text


def hostile_instance(cls: type[Any], hostile: Hostile) -> Any:
    """An instance of dataclass ``cls`` whose every text (nested ones too) is a payload, numbers plausible.

    Written over the fields, so a text field added to the report later is hostile here without an edit.
    """
    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        values[field.name] = hostile_value(hints[field.name], field, hostile)
    return cls(**values)


def hostile_value(kind: Any, field: dataclasses.Field[Any], hostile: Hostile) -> Any:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        real = [arm for arm in typing.get_args(kind) if arm is not type(None)]
        return hostile_value(real[0], field, hostile)
    if kind is str:
        return hostile()
    if kind is bool:
        return False
    if kind is int:
        return 1000
    if kind is float:
        return 0.25
    if origin is tuple:
        item = typing.get_args(kind)[0]
        return tuple(hostile_value(item, field, hostile) for _ in range(2))
    if origin is list:
        item = typing.get_args(kind)[0]
        return [hostile_value(item, field, hostile) for _ in range(2)]
    if dataclasses.is_dataclass(kind):
        return hostile_instance(kind, hostile)  # type: ignore[arg-type]
    if field.default is not dataclasses.MISSING:
        return field.default
    raise AssertionError(f"no hostile value for {field.name}: {kind}")


class PageText(html.parser.HTMLParser):
    """What a reader sees: the text of the rendered page outside scripts and styles, references decoded."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.data_blocks: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self._in = tag

    def handle_endtag(self, tag: str) -> None:
        if tag == self._in:
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "script":
            self.data_blocks.append(data)
        elif self._in is None:
            self.parts.append(data)

    @property
    def text(self) -> str:
        return "".join(self.parts)


@pytest.fixture
def chromium() -> str:
    path = shutil.which("chromium")
    assert path is not None, "chromium is installed by scripts/setup (Debian's package)"
    return path


def rendered_dom(chromium: str, page: Path, profile: Path) -> str:
    """The page's DOM after Chromium loaded it (and ran whatever it let run)."""
    result = subprocess.run(  # noqa: PLW1510 - the return code is asserted below
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=2000",  # onerror and onload handlers get their turn before the dump
            f"--user-data-dir={profile}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def root_tag(dom: str) -> str:
    found = re.search(r"<html[^>]*>", dom)
    assert found is not None, dom[:500]
    return found.group(0)


def assert_safe_and_literal(report: SavingsReport, dom: str, hostile: Hostile) -> PageText:
    """No payload ran, every text the report shows is on the page as written, the JSON reads back."""
    assert "pwned" not in root_tag(dom), root_tag(dom)
    page = PageText()
    page.feed(dom)
    shown = [text for text in hostile.made if text in report.to_text()]
    assert shown, "the report shows none of its texts"
    for text in shown:
        assert text in page.text, text
    # The only script element is the JSON data block, and it reads back as the report's JSON.
    assert dom.count("<script") == 1, dom
    (block,) = page.data_blocks
    assert json.loads(block) == json.loads(report.to_json())
    return page


def test_every_text_of_a_report_is_shown_literally_and_runs_nothing(tmp_path: Path, chromium: str) -> None:
    hostile = Hostile()
    report = hostile_instance(SavingsReport, hostile)
    report = dataclasses.replace(
        report,
        prices=Prices(1.0, 0.1, currency=hostile()),
        requests=tuple(
            dataclasses.replace(line, base_url=f"http://replica-{index}/{hostile()}")
            for index, line in enumerate(report.requests)
        ),
    )
    page = tmp_path / "report.html"
    page.write_text(report.to_page())
    dom = rendered_dom(chromium, page, tmp_path / "profile")
    shown = assert_safe_and_literal(report, dom, hostile)
    # The texts of every kind of field: title, server, requests, replicas, counter note, notes, dispatch.
    for text in (report.title, report.model, report.requests[0].purpose, report.notes[0], report.dispatch):
        assert text in shown.text, text
    assert report.counter_check is not None and report.counter_check.note in shown.text
    assert report.requests[1].base_url in shown.text


def test_a_session_over_a_hostile_path_question_and_answer(tmp_path: Path, chromium: str) -> None:
    hostile = Hostile()
    folder_name = hostile().replace("/", "|")
    hostile.made[-1] = folder_name
    repository = committed_repo(tmp_path / folder_name, {"README.md": f"# {hostile()}\n"})
    fake = FakeEngine(engine="generic", block=1, model=hostile(), answer=hostile())
    question = hostile()
    backend = connect(
        "http://fake-engine:8000/v1", transport=fake.transport(), async_transport=fake.transport()
    )
    with (
        Store.open(tmp_path / "home") as store,
        RepoSession(str(repository), backend=backend, store=store) as session,
    ):
        answer = session.ask(question, max_tokens=8)
        assert answer.text == fake.answer
        report = session.report()
    assert folder_name in report.title and fake.model in report.model
    page = tmp_path / "report.html"
    page.write_text(report.to_page())
    dom = rendered_dom(chromium, page, tmp_path / "profile")
    assert_safe_and_literal(report, dom, hostile)


def test_the_policy_alone_stops_markup_that_slipped_past_the_escaping(tmp_path: Path, chromium: str) -> None:
    report = hostile_instance(SavingsReport, Hostile())
    slipped = (
        "<script>document.documentElement.dataset.pwned='inline'</script>"
        "<img src=x onerror=\"document.documentElement.dataset.pwned='handler'\">"
        "<script src=\"data:text/javascript,document.documentElement.dataset.pwned='data'\"></script>"
    )
    with_policy = report.to_page().replace("<body>", f"<body>{slipped}", 1)
    assert 'http-equiv="Content-Security-Policy"' in with_policy
    page = tmp_path / "with-policy.html"
    page.write_text(with_policy)
    assert "pwned" not in root_tag(rendered_dom(chromium, page, tmp_path / "profile-1"))
    # The same markup without the policy runs: the check above can fail.
    without = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", with_policy)
    page = tmp_path / "without-policy.html"
    page.write_text(without)
    assert "pwned" in root_tag(rendered_dom(chromium, page, tmp_path / "profile-2"))


def test_the_policy_runs_no_script_loads_nothing_and_allows_the_pages_own_style() -> None:
    page = hostile_instance(SavingsReport, Hostile()).to_page()
    found = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', page)
    assert found is not None
    policy = dict(part.strip().split(" ", 1) for part in html.unescape(found.group(1)).split(";"))
    assert policy["default-src"] == "'none'" and policy["script-src"] == "'none'"
    assert policy["base-uri"] == "'none'" and policy["form-action"] == "'none'"
    assert policy["img-src"] == "data:"
    # The page's one style element, allowed by its hash (a changed style without its hash is unstyled).
    (style,) = re.findall(r"<style>(.*?)</style>", page)
    digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
    assert policy["style-src"] == f"'sha256-{digest}'"
