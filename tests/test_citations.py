"""Grounded answers: the Sources block read and checked against the pack, with crafted answers.

The reading and checking (longctx.citations) are pure functions, tested on
their own; the plumbing (the instruction after the pack, the citations kept
with the turn, resumed, reported) against the fake engine answering a
crafted text. tests/test_citations_engines.py covers the real engines.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from fake_engine import FakeEngine

from longctx.backends.base import Backend, connect
from longctx.citations import (
    CITE_INSTRUCTION,
    NO_QUOTE,
    Citation,
    CitationClaim,
    Grounding,
    cite_schema,
    cited_text,
    file_link,
    parse_claims,
    read_citations,
)
from longctx.cli import Runtime, main, questions
from longctx.errors import ConfigError
from longctx.packing.rendering import DOCUMENTS_OPENING, read_documents, render_document, render_listing
from longctx.sessions import Session
from longctx.sessions.records import stored_citations
from longctx.store import Store, StoredPack

URL = "http://fake-engine:8000/v1"
MAIN = "import os\n\n\ndef main() -> str:\n    return  os.getcwd()\n"
NOTES = "first line\nsecond line\nthird line"  # no final newline
DOCUMENTS = {"src/main.py": MAIN, "docs/notes.txt": NOTES}
PREFIX = (
    DOCUMENTS_OPENING
    + render_document("src/main.py", MAIN)
    + render_document("docs/notes.txt", NOTES)
    + render_listing([])
)
PACK = StoredPack(
    fingerprint="c" * 64,
    format_version="test/1",
    system="You answer questions about the documents.",
    prefix=PREFIX,
    summary={"title": "cited fixture"},
)
CRAFTED = (
    "main returns the working directory.\n"
    "\n"
    "Sources:\n"
    '- src/main.py:4-5 "def main() -> str: return os.getcwd()"\n'  # valid, whitespace differs
    "- src/other.py:1-2\n"  # wrong path
    "- src/main.py:40-45\n"  # past the end
    '- docs/notes.txt:1-2 "third line"\n'  # quote elsewhere in the document
    '- docs/notes.txt:1 "not there at all"\n'  # quote nowhere
    "- docs/notes.txt:3\n"  # one line, no range
    '- src/main.py:4-5 "def main() -> str: return os.getcwd()"\n'  # duplicate
)


# -- the pack read back ---------------------------------------------------


@pytest.mark.parametrize("text", ["", "a", "a\n", "\n", "x\n\ny", "```inner```\n", "line\n``` not a fence\n"])
def test_read_documents_is_the_inverse_of_render_document(text: str) -> None:
    path = 'a "quoted" path\t.txt'  # a path rendered as a JSON string
    rendered = DOCUMENTS_OPENING + render_document("first.py", "x = 1\n") + render_document(path, text)
    assert read_documents(rendered + render_listing([])) == {"first.py": "x = 1\n", path: text}


def test_read_documents_keeps_the_later_copy_of_a_path() -> None:
    text = render_document("a.py", "old\n") + "<changed-since>\n" + render_document("a.py", "new\n")
    assert read_documents(text) == {"a.py": "new\n"}


# -- reading the Sources block ------------------------------------------------


@pytest.mark.parametrize(
    ("line", "claim"),
    [
        ("- src/a.py:12-20", CitationClaim("src/a.py", 12, 20, None)),
        ("- src/a.py:12", CitationClaim("src/a.py", 12, 12, None)),
        ("* `src/a.py:3-4`", CitationClaim("src/a.py", 3, 4, None)),
        ("1. src/a.py#L7-L9", CitationClaim("src/a.py", 7, 9, None)),
        ("[2] src/a.py (lines 5\u20136)", CitationClaim("src/a.py", 5, 6, None)),
        ('- ./src/a.py:2: "return x"', CitationClaim("src/a.py", 2, 2, "return x")),
        ('- src/a.py "line 9 of it"', CitationClaim("src/a.py", None, None, "line 9 of it")),
        ("- src/a.py \u2014 \u201ca quote\u201d", CitationClaim("src/a.py", None, None, "a quote")),
        ("- src/a.py", CitationClaim("src/a.py", None, None, None)),
    ],
)
def test_each_form_of_a_sources_line_is_read(line: str, claim: CitationClaim) -> None:
    assert parse_claims(f"The answer.\n\nSources:\n{line}\n") == (claim,)


@pytest.mark.parametrize("heading", ["Sources:", "**Sources:**", "## Sources", "sources :", "References:"])
def test_the_heading_may_be_written_several_ways(heading: str) -> None:
    assert parse_claims(f"Answer.\n{heading}\n- a.py:1\n") == (CitationClaim("a.py", 1, 1, None),)


def test_only_the_last_block_counts_and_it_ends_at_a_blank_line() -> None:
    answer = "Sources:\n- early.py:1\n\nThe sources of truth are two.\nSources:\n- late.py:2\n\nThanks!\n"
    assert parse_claims(answer) == (CitationClaim("late.py", 2, 2, None),)


def test_an_answer_without_a_sources_block_has_no_claims() -> None:
    assert parse_claims("The sources of this are unclear.") == ()
    assert read_citations("Plain answer.", DOCUMENTS) == ()


# -- checking against the pack -------------------------------------------------


def test_crafted_citations_are_checked_against_the_exact_pack_text() -> None:
    citations = read_citations(CRAFTED, read_documents(PREFIX))
    assert citations == (
        Citation("src/main.py", 4, 5, "def main() -> str: return os.getcwd()", verified=True),
        Citation("src/other.py", 1, 2, None, False, "no document 'src/other.py' in the pack"),
        Citation("src/main.py", 40, 45, None, False, "lines 40-45 are past the end of src/main.py (5 lines)"),
        Citation(
            "docs/notes.txt", 1, 2, "third line", False, "the quote is not in lines 1-2: it is at line 3"
        ),
        Citation("docs/notes.txt", 1, 1, "not there at all", False, "the quote is not in docs/notes.txt"),
        Citation("docs/notes.txt", 3, 3, None, False, NO_QUOTE),
    )


@pytest.mark.parametrize("line", ["secrets.py", "- src/main.py", "- src/main.py:1-5", "src/main.py#L4"])
def test_a_citation_without_a_quote_is_never_verified(line: str) -> None:
    """A real model answered "Sources: secrets.py" (no quote), and that was marked verified."""
    documents = {**DOCUMENTS, "secrets.py": "TOKEN = 'x'\n"}
    (citation,) = read_citations(f"The answer.\n\nSources: {line}\n", documents)
    assert not citation.verified
    assert citation.reason == NO_QUOTE


def test_a_quote_without_lines_is_placed_where_it_is() -> None:
    (citation,) = read_citations('Sources:\n- src/main.py "import  os"\n', DOCUMENTS)
    assert (citation.start_line, citation.end_line, citation.verified) == (1, 1, True)
    (spanning,) = read_citations('Sources:\n- src/main.py "str: return"\n', DOCUMENTS)
    assert (spanning.start_line, spanning.end_line, spanning.verified) == (4, 5, True)


def test_a_range_that_is_no_range_is_unverified() -> None:
    (citation,) = read_citations("Sources:\n- src/main.py:5-2\n", DOCUMENTS)
    assert not citation.verified
    assert citation.reason == "lines 5-2 are not a range"


def test_the_checking_is_deterministic() -> None:
    documents = read_documents(PREFIX)
    assert len({read_citations(CRAFTED, documents) for _ in range(5)}) == 1


def test_a_citation_round_trips_through_its_dict() -> None:
    for citation in read_citations(CRAFTED, DOCUMENTS):
        assert Citation.from_dict(json.loads(json.dumps(citation.to_dict()))) == citation


def test_describe_names_the_location_and_why_it_failed() -> None:
    assert Citation("a.py", 3, 3, None, True).describe() == "a.py:3"
    unverified = Citation("a.py", 1, 2, "x", False, "the quote is not in a.py")
    assert unverified.describe() == 'a.py:1-2 "x"  [unverified: the quote is not in a.py]'


def test_file_link_finds_the_document_under_a_packed_folder(tmp_path: Path) -> None:
    (tmp_path / "repo" / "src").mkdir(parents=True)
    (tmp_path / "repo" / "src" / "a b.py").write_text("x\n")
    root = str(tmp_path / "repo")
    assert file_link("src/a b.py", [root]) == "file://" + str(tmp_path / "repo" / "src" / "a%20b.py")
    assert file_link("repo/src/a b.py", [root]) is not None  # several paths: named under the base name
    assert file_link("src/missing.py", [root]) is None


# -- the plumbing, against the fake engine --------------------------------------


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(engine="generic", block=1, answer=CRAFTED)  # no tokenize route: the estimate counts


@pytest.fixture
def backend(fake: FakeEngine) -> Backend:
    return connect(URL, transport=fake.transport(), async_transport=fake.transport())


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "home")


def test_ask_with_cite_sends_the_instruction_after_the_pack_and_checks_the_answer(
    backend: Backend, fake: FakeEngine, store: Store
) -> None:
    session = Session(backend, PACK, store=store)
    answer = session.ask("What does main return?", cite=True)
    user = fake.chat_bodies[-1]["messages"][1]["content"]
    assert user == PACK.prefix + "What does main return?" + CITE_INSTRUCTION
    assert answer.citations == read_citations(CRAFTED, read_documents(PREFIX))
    assert answer.to_dict()["citations"][0]["verified"] is True
    assert answer.text == CRAFTED  # the answer is kept whole, its block included


def test_without_cite_nothing_is_added_or_read(backend: Backend, fake: FakeEngine, store: Store) -> None:
    session = Session(backend, PACK, store=store)
    answer = session.ask("What does main return?")
    assert fake.chat_bodies[-1]["messages"][1]["content"] == PACK.prefix + "What does main return?"
    assert answer.citations is None
    assert "citations" not in answer.to_dict()


def test_a_cited_turn_is_sent_again_byte_for_byte_and_resumes_with_its_citations(
    backend: Backend, fake: FakeEngine, store: Store
) -> None:
    session = Session(backend, PACK, store=store)
    first = session.ask("first?", cite=True)
    session.ask("second?")
    earlier, later = (body["messages"] for body in fake.chat_bodies)
    assert later[: len(earlier)] == earlier  # the instruction stays in the history: the prefix holds
    resumed = Session.resume(session.id, backend, store=store)
    assert stored_citations(resumed.turns[0]) == first.citations
    assert resumed.turns[0].instruction == CITE_INSTRUCTION
    assert resumed.turns[1].citations is None
    resumed.ask("third?")
    assert fake.chat_bodies[-1]["messages"][: len(later)] == later


def test_cited_siblings_share_the_plain_prefix(backend: Backend, fake: FakeEngine, store: Store) -> None:
    session = Session(backend, PACK, store=store)
    plain = session.ask_many(["one?", "two?"])
    cited = session.ask_many(["one?", "two?"], cite=True)
    assert all(answer.citations is None for answer in plain)
    assert [len(answer.citations or ()) for answer in cited] == [6, 6]
    bodies = [body["messages"][1]["content"] for body in fake.chat_bodies]
    assert all(body.startswith(PACK.prefix) for body in bodies)
    assert bodies[2:] == [body + CITE_INSTRUCTION for body in bodies[:2]]
    shared = plain.answers[1].usage.cached_tokens  # the system header and the pack: what siblings share
    assert shared is not None and all((answer.usage.cached_tokens or 0) >= shared for answer in cited)


def test_aask_cites_too(backend: Backend, store: Store) -> None:
    async def asked() -> int:
        async with Session(backend, PACK, store=store) as session:
            answer = await session.aask("q?", cite=True)
            return len(answer.citations or ())

    assert asyncio.run(asked()) == 6


# -- the cited answer's schema: the answer, then sources, each quote a line of its document ----


JSON_ANSWER = json.dumps(
    {
        "answer": " main returns the working directory. ",
        "sources": [
            {"path": "src/main.py", "quote": "return  os.getcwd()"},
            {"path": "docs/notes.txt", "quote": "not a line"},  # a server that ignored the schema
        ],
    },
    indent=2,
)


def test_the_cite_schema_offers_each_document_and_its_lines_after_the_answer() -> None:
    schema = cite_schema(DOCUMENTS)
    assert list(schema["properties"]) == ["answer", "sources"]  # measured: sources first cost answers
    options = schema["properties"]["sources"]["items"]["anyOf"]
    by_path = {
        option["properties"]["path"]["const"]: option["properties"]["quote"]["enum"] for option in options
    }
    assert by_path == {
        "src/main.py": sorted({"import os", "def main() -> str:", "return  os.getcwd()"}),
        "docs/notes.txt": ["first line", "second line", "third line"],
    }
    assert (
        cite_schema({"empty.txt": "\n\n", **DOCUMENTS})["properties"]["sources"]["items"]["anyOf"] == options
    )


def test_a_json_cited_answer_becomes_its_answer_and_a_sources_block() -> None:
    cited = cited_text(JSON_ANSWER, DOCUMENTS)
    assert [(c.location, c.verified) for c in cited.citations] == [
        ("src/main.py:5", True),  # the quote placed it
        ("docs/notes.txt", False),
    ]
    assert cited.citations[1].reason == "the quote is not in docs/notes.txt"
    assert cited.text == (
        "main returns the working directory.\n\n"
        'Sources:\n- src/main.py:5 "return  os.getcwd()"\n- docs/notes.txt "not a line"'
    )
    assert read_citations(cited.text, DOCUMENTS) == cited.citations  # the text reads back the same


@pytest.mark.parametrize(
    "answer", [CRAFTED, '{"sources": [{"path": "src/main.py"', "[1, 2]", '{"answer": 1}']
)
def test_an_answer_not_in_the_schema_is_read_as_prose(answer: str) -> None:
    assert cited_text(answer, DOCUMENTS) == type(cited_text(answer, DOCUMENTS))(
        answer, read_citations(answer, DOCUMENTS)
    )


def test_an_answer_cut_among_its_sources_keeps_the_answer_and_every_whole_source() -> None:
    cut = JSON_ANSWER[: JSON_ANSWER.index('"not a line"')]
    cited = cited_text(cut, DOCUMENTS)
    assert (
        cited.text == 'main returns the working directory.\n\nSources:\n- src/main.py:5 "return  os.getcwd()"'
    )
    assert [c.verified for c in cited.citations] == [True]
    assert cited_text('{"answer": "main ret', DOCUMENTS).citations == ()  # cut in the answer: nothing to keep


def test_a_json_source_without_a_quote_is_never_verified() -> None:
    cited = cited_text(
        json.dumps({"sources": [{"path": "src/main.py", "quote": " "}], "answer": "x"}), DOCUMENTS
    )
    (citation,) = cited.citations
    assert not citation.verified and citation.reason == NO_QUOTE


def test_a_cited_request_carries_the_schema_as_a_body_field_not_in_the_prompt(store: Store) -> None:
    fake = FakeEngine(engine="vllm", block=1, answer=JSON_ANSWER)
    backend = connect(URL, transport=fake.transport(), async_transport=fake.transport())
    session = Session(backend, PACK, store=store)
    plain = session.ask("What does main return?")
    answer = session.ask("What does main return?", cite=True)
    plain_body, cited_body = fake.chat_bodies[-2:]
    assert "response_format" not in plain_body and "structured_outputs" not in plain_body
    constraint = (
        cited_body.get("structured_outputs", {}).get("json")
        or (cited_body["response_format"]["json_schema"]["schema"])
    )
    assert constraint == cite_schema(DOCUMENTS)
    assert cited_body["messages"][:2] == plain_body["messages"]  # the cached prefix, byte for byte
    assert cited_body["messages"][-1]["content"] == "What does main return?" + CITE_INSTRUCTION
    assert plain.citations is None and [c.verified for c in answer.citations or ()] == [True, False]
    assert answer.text == cited_text(JSON_ANSWER, DOCUMENTS).text
    # The next turn's history holds what the model wrote (the tokens the engine cached), the turn the text.
    session.ask("And then?")
    assert fake.chat_bodies[-1]["messages"][4] == {"role": "assistant", "content": JSON_ANSWER}
    assert session.turns[1].answer == answer.text


def test_a_server_that_cannot_constrain_is_asked_with_the_instruction_alone(store: Store) -> None:
    fake = FakeEngine(engine="sglang", block=1, answer=CRAFTED)
    backend = connect(URL, transport=fake.transport(), async_transport=fake.transport())
    backend.info.settings["grammar_backend"] = "none"
    session = Session(backend, PACK, store=store)
    answer = session.ask("What does main return?", cite=True)
    body = fake.chat_bodies[-1]
    assert "response_format" not in body and body["messages"][1]["content"].endswith(CITE_INSTRUCTION)
    assert answer.citations == read_citations(CRAFTED, read_documents(PREFIX))


def test_citations_are_checked_against_files_a_living_session_appended() -> None:
    changed = "<files-changed>\n" + render_document("src/main.py", "def main():\n    return 1\n")
    grounding = Grounding(CITE_INSTRUCTION, (PREFIX, changed))
    (citation,) = grounding.citations('Sources:\n- src/main.py:2 "return 1"\n')
    assert citation.verified  # the current copy, not the pack's


def test_the_report_lists_and_links_the_citations(backend: Backend, store: Store) -> None:
    session = Session(backend, PACK, store=store)
    session.ask("What <does> main return?", cite=True)
    report = session.report()
    (cited,) = report.citations
    assert cited.question == "What <does> main return?"
    assert report.to_dict()["citations"][0]["citations"][0]["path"] == "src/main.py"
    page = report.to_html()
    assert "What &lt;does&gt; main return?" in page  # escaped
    assert "unverified: no document &#x27;src/other.py&#x27; in the pack" in page
    assert "sources of turn 1: What <does> main return?" in report.to_text()


def test_the_report_links_a_document_found_on_this_machine(tmp_path: Path) -> None:
    from longctx.citations import CitedAnswer
    from longctx.report import build_report

    citation = Citation("src/a.py", 1, 1, None, True)
    link = "file:///repo/src/a.py?x=<1>"
    report = build_report([], title="t", citations=[CitedAnswer("q", 0, (citation,), (link,))])
    assert '<a href="file:///repo/src/a.py?x=&lt;1&gt;">src/a.py:1</a>' in report.to_html()


def test_a_sharded_session_refuses_cite(tmp_path: Path) -> None:
    from longctx.sessions import ShardedSession

    session = ShardedSession([str(tmp_path)])
    with pytest.raises(ConfigError, match="cite is not available over shards"):
        session.ask("q?", cite=True)
    with pytest.raises(ConfigError, match="cite is not available over shards"):
        session.ask_many(["q?"], cite=True)


# -- the command line -----------------------------------------------------------


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text(MAIN)
    (root / "docs").mkdir()
    (root / "docs" / "notes.txt").write_text(NOTES)
    return root


def _cli(backend: Backend, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), obj=Runtime(backend=backend), input=stdin)


def test_ask_cite_prints_the_citations_after_the_answer(
    backend: Backend, fake: FakeEngine, repository: Path
) -> None:
    result = _cli(backend, "ask", str(repository), "What does main return?", "--cite", "-q")
    assert result.exit_code == 0, result.output
    assert fake.chat_bodies[-1]["messages"][1]["content"].endswith(
        "What does main return?" + CITE_INSTRUCTION
    )
    lines = result.stdout.splitlines()
    at = lines.index("[citations: 1 of 6 verified against the pack]")
    assert "\n".join(lines[:at]).strip() == CRAFTED.strip()  # the answer, then its citations
    assert lines[at + 1] == '  src/main.py:4-5 "def main() -> str: return os.getcwd()"  [ok]'
    assert lines[at + 2] == "  src/other.py:1-2  [UNVERIFIED: no document 'src/other.py' in the pack]"
    assert "\x1b]8;;" not in result.stdout  # not a terminal: plain text


def test_ask_cite_links_each_file_on_a_terminal(
    backend: Backend, repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(questions, "_hyperlinks", lambda: True)
    result = _cli(backend, "ask", str(repository), "What does main return?", "--cite", "-q")
    url = (repository / "src" / "main.py").as_uri()
    assert f"  \x1b]8;;{url}\x1b\\src/main.py:4-5\x1b]8;;\x1b\\ " in result.stdout
    assert "  src/other.py:1-2  [UNVERIFIED" in result.stdout  # no file, no link


@pytest.mark.parametrize(
    ("tty", "term", "expected"), [(True, "xterm", True), (True, "dumb", False), (False, "xterm", False)]
)
def test_hyperlinks_need_a_terminal_that_is_not_dumb(
    tty: bool, term: str, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Stdout:
        def isatty(self) -> bool:
            return tty

    monkeypatch.setattr(sys, "stdout", Stdout())
    monkeypatch.setenv("TERM", term)
    assert questions._hyperlinks() is expected


def test_ask_cite_json_holds_the_citations(backend: Backend, repository: Path) -> None:
    result = _cli(backend, "ask", str(repository), "q?", "--cite", "--json")
    data = json.loads(result.stdout)
    assert [c["verified"] for c in data["citations"]] == [True, False, False, False, False, False]
    plain = json.loads(_cli(backend, "ask", str(repository), "q?", "--json").stdout)
    assert "citations" not in plain


def test_batch_cite_prints_each_answers_citations(
    backend: Backend, fake: FakeEngine, repository: Path
) -> None:
    result = _cli(backend, "batch", str(repository), "--questions", "-", "--cite", "-q", stdin="one?\ntwo?\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("[citations: 1 of 6 verified against the pack]") == 2
    assert all(body["messages"][1]["content"].endswith(CITE_INSTRUCTION) for body in fake.chat_bodies)


def test_report_of_a_cited_session_shows_its_citations(
    backend: Backend, repository: Path, tmp_path: Path
) -> None:
    asked = json.loads(_cli(backend, "ask", str(repository), "q?", "--cite", "--json").stdout)
    page = tmp_path / "report.html"
    result = _cli(backend, "report", asked["session_id"], "--html", str(page))
    assert result.exit_code == 0, result.output
    html = page.read_text()
    url = (repository / "src" / "main.py").as_uri()
    assert f'<a href="{url}">src/main.py:4-5</a>' in html
    assert "unverified: lines 40-45 are past the end of src/main.py (5 lines)" in html
