"""Real answers: a trained instruct model on both CPU engines, every answer checked by rule.

The model is :data:`longctx.testing.real_model.DEFAULT_MODEL` (Qwen2.5-Coder-0.5B-Instruct,
converted from the registry's GGUF parts; docs/testing.md says why), served in float32 by the
harness's real-model servers. One repository (:mod:`longctx.testing.answer_set`: two standard-library
modules and a small project with facts no model knows from training, three sentences planted at the
start, the middle and the end of its pack, about 3,500 tokens) is packed once and prefilled once per
engine; every test then reads that pack from the server's cache. Answers are greedy
(temperature 0) and short, since decoding is what a 2-core machine pays most for.

What is shown, on each engine of ``LONGCTX_REAL_ENGINES`` (default both, ``vllm,sglang``):
the fact questions (at least 8 of 10 right; 9 of 10 measured on both), the planted sentences at every
depth, typed answers with the right values on the plain request path (no logit bias, no whitespace ban),
a follow-up that needs the previous answer, questions over real PDFs, a cited answer with at least one
citation verified against the pack (a citation with no quote never is). On vLLM (time): a cached answer
equal to the cold one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from longctx import DocSession, RepoSession, RequestOptions
from longctx.citations import NO_QUOTE, read_citations
from longctx.sessions import Answer
from longctx.store import Store
from longctx.testing import LocalServer
from longctx.testing.answer_set import (
    FACTS,
    PLANTED,
    document_order,
    planted_positions,
    score,
    write_fact_repository,
)
from longctx.testing.pdfs import write_text_pdf

# All 13 siblings in flight at once: with the engines' default of 8 they decoded in two waves, each
# paying every decoding step's fixed cost again (SGLang's CPU build joined the last five one by one).
REQUEST = RequestOptions(max_tokens=24, temperature=0.0, concurrency=16)
RIGHT_AT_LEAST = 8
# The engines these tests run on: both CPU engines by default; LONGCTX_REAL_ENGINES=vllm (or sglang)
# narrows them. The harness keeps at most two extra servers up at once, so both real servers (5-7 GB
# each) never stand beside every other extra.
ENGINES = [name for name in os.environ.get("LONGCTX_REAL_ENGINES", "vllm,sglang").split(",") if name]
on_engines = pytest.mark.parametrize(
    "real_engine_server",
    [pytest.param(name, marks=getattr(pytest.mark, name)) for name in ENGINES],
    indirect=True,
)
# The costlier checks on vLLM alone, whatever LONGCTX_REAL_ENGINES says.
vllm_only = pytest.mark.parametrize(
    "real_engine_server", [pytest.param("vllm", marks=pytest.mark.vllm)], indirect=True
)


@dataclass
class Warm:
    """One engine's server with the fact repository's pack in its cache, and the first answers."""

    server: LocalServer
    repository: Path
    store: Store
    cold: Answer
    batch: tuple[Answer, ...]
    cold_seconds: float
    batch_seconds: float

    def session(self, **request: object) -> RepoSession:
        options = RequestOptions(**{"max_tokens": 24, "temperature": 0.0, **request})  # type: ignore[arg-type]
        return RepoSession(self.repository, server=self.server.api_base, store=self.store, request=options)


@pytest.fixture(scope="module")
def fact_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fact_repository(tmp_path_factory.mktemp("real") / "skyline-tools", planted=True)


@pytest.fixture(scope="module")
def warm(
    real_engine_server: LocalServer, fact_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Warm]:
    """The pack prefilled (the first fact, asked alone), then every fact and planted question as siblings."""
    store = Store.open(tmp_path_factory.mktemp("home"))
    session = RepoSession(fact_repository, server=real_engine_server.api_base, store=store, request=REQUEST)
    started = time.monotonic()
    cold = session.ask_many([FACTS[0].question])[0]
    cold_seconds = time.monotonic() - started
    started = time.monotonic()
    batch = session.ask_many([fact.question for fact in FACTS] + [plant.question for plant in PLANTED])
    batch_seconds = time.monotonic() - started
    session.close()
    yield Warm(real_engine_server, fact_repository, store, cold, tuple(batch), cold_seconds, batch_seconds)
    store.close()


def _shown(questions: object, answers: tuple[Answer, ...]) -> str:
    return "\n".join(f"{answer.question!r} -> {answer.text!r}" for answer in answers)


@on_engines
def test_the_fact_questions_are_answered_right(warm: Warm) -> None:
    answers = warm.batch[: len(FACTS)]
    right = score(FACTS, [answer.text for answer in answers])
    assert right >= RIGHT_AT_LEAST, f"{right} of {len(FACTS)} right:\n{_shown(FACTS, answers)}"
    # The pack was new to the server (SGLang caches single tokens: the chat template's first few, from
    # its ready check, come back cached).
    assert (warm.cold.usage.cached_tokens or 0) < 64, warm.cold.usage
    # The siblings read the pack from the cache (vLLM's CPU build caches whole 128-token blocks).
    for answer in answers:
        assert (answer.usage.cached_tokens or 0) > 0.9 * (answer.usage.prompt_tokens or 1), answer.usage


@on_engines
def test_a_planted_sentence_is_found_at_the_start_middle_and_end(warm: Warm) -> None:
    order = document_order(warm.repository)
    start, middle, end = planted_positions(order)
    assert (order.index(start), order.index(middle), order.index(end)) == (0, len(order) // 2, len(order) - 1)
    for plant, path in zip(PLANTED, (start, middle, end), strict=True):
        assert plant.sentence in (warm.repository / path).read_text()
    answers = warm.batch[len(FACTS) :]
    assert score(PLANTED, [answer.text for answer in answers]) == len(PLANTED), _shown(PLANTED, answers)


@vllm_only
def test_a_cached_answer_is_the_cold_answer_token_for_token(warm: Warm) -> None:
    session = warm.session()
    again = session.ask_many([FACTS[0].question])[0]
    session.close()
    assert (again.usage.cached_tokens or 0) > 0
    assert again.text == warm.cold.text
    assert FACTS[0].right(again.text)


@on_engines
def test_typed_answers_carry_the_right_values_on_the_plain_request_path(warm: Warm) -> None:
    session = warm.session(max_tokens=40)
    (answer,) = session.ask_many(
        ["What are the exposure server's port and the upload retry count?"], schema="port int, retries int"
    )
    session.close()
    assert answer.data == {"port": 8417, "retries": 6}, answer.text
    assert answer.finish_reason == "stop"


@on_engines
def test_a_cited_answer_quotes_the_pack_and_a_bare_path_never_verifies(warm: Warm) -> None:
    # Room for the sources (each a whole line of its file, by the grammar of longctx.citations.cite_schema)
    # and the answer: measured 60-120 tokens of JSON on the 0.5B (benchmarks/citations_quality.py).
    session = warm.session(max_tokens=192)
    (answer,) = session.ask_many(["Which port does the exposure server listen on?"], cite=True)
    session.close()
    assert answer.citations, answer.text
    documents = {path: (warm.repository / path).read_text() for path in document_order(warm.repository)}
    assert any(citation.verified for citation in answer.citations), answer.text
    for citation in answer.citations:
        if citation.verified:
            assert citation.quote is not None
            assert " ".join(citation.quote.split()) in " ".join(documents[citation.path].split())
    # The prefix is the pack's, byte for byte: the cited question read it from the cache.
    assert (answer.usage.cached_tokens or 0) > 0.9 * (warm.cold.usage.prompt_tokens or 1), answer.usage
    # What the 0.5B wrote when asked in prose (a path alone) is never verified, on this pack.
    (bare,) = read_citations("Port 8417.\n\nSources:\n- settings.py\n", documents)
    assert not bare.verified and bare.reason == NO_QUOTE


@on_engines
def test_a_follow_up_needs_the_previous_answer(warm: Warm) -> None:
    session = warm.session(max_tokens=12)
    first = session.ask("Which function of colorsys.py converts RGB to HLS? Give its name only.")
    second = session.ask(
        "Which function in the same file does the reverse of the function you just named? Give its name only."
    )
    session.close()
    assert "rgb_to_hls" in first.text
    assert "hls_to_rgb" in second.text, second.text
    # The follow-up's prompt holds the first turn, read back from the cache.
    assert (second.usage.cached_tokens or 0) >= (warm.cold.usage.cached_tokens or 0)
    assert (second.usage.prompt_tokens or 0) > (first.usage.prompt_tokens or 0)


REPORT = (
    "Skyline observatory: maintenance report for March\n"
    "\n"
    "The main mirror was recoated on 14 March by Nordic Optics.\n"
    "The cooling pump of the camera was replaced; its serial number is KP-5521.\n"
)
BUDGET = (
    "Skyline observatory: budget for the coming year\n"
    "\n"
    "Travel: 42,000 kronor.\n"
    "The largest item is the new spectrograph, at 1.9 million kronor.\n"
)


@on_engines
def test_document_questions_over_real_pdfs(real_engine_server: LocalServer, tmp_path: Path) -> None:
    folder = tmp_path / "papers"
    folder.mkdir()
    write_text_pdf(folder / "maintenance.pdf", [REPORT, "Next inspection: September."])
    write_text_pdf(folder / "budget.pdf", [BUDGET])
    session = DocSession(
        folder, server=real_engine_server.api_base, store=Store.open(tmp_path / "home"), request=REQUEST
    )
    answers = session.ask_many(
        [
            "Who recoated the main mirror?",
            "What is the serial number of the new cooling pump?",
            "What is the largest item of the budget?",
        ]
    )
    session.close()
    rules = ("Nordic Optics", "KP-5521", "spectrograph")
    right = [rule.lower() in answer.text.lower() for rule, answer in zip(rules, answers, strict=True)]
    assert all(right), _shown(rules, tuple(answers))
