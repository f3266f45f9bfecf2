"""What a newcomer met on second contact: each rough edge, now as the docs say.

Against the fake engine in process (CliRunner): a cut answer said on
stderr and in --json; typed answers of one shape in the CLI and the API;
engine fields from the command line; --require-citations; turns numbered
from 1; "1 request"; the job's help naming only flags that exist.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx2
import pytest
from click.testing import CliRunner, Result
from fake_engine import FakeEngine

from longctx import cli
from longctx.backends.base import Backend, connect
from longctx.cli import Runtime, main
from longctx.cli.app import EXIT_UNVERIFIED_CITATIONS
from longctx.errors import ConfigError
from longctx.sessions import RepoSession
from longctx.store import Store


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "main.py").write_text("def main():\n    return 0\n")
    return root


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine(engine="generic", block=1, answer="It returns 0.")


@pytest.fixture
def backend(fake: FakeEngine) -> Backend:
    return connect("http://fake-engine:8000/v1", transport=fake.transport())


def run(backend: Backend, tmp_path: Path, *args: str, stdin: str | None = None) -> Result:
    runtime = Runtime(backend=backend, open_store=lambda: Store.open(tmp_path / "home"))
    return CliRunner().invoke(main, list(args), obj=runtime, input=stdin)


def test_a_cut_answer_is_said_on_stderr_and_in_json(
    backend: Backend, fake: FakeEngine, folder: Path, tmp_path: Path
) -> None:
    fake.finish_reason = "length"
    plain = run(backend, tmp_path, "ask", str(folder), "What?", "--no-stream")
    assert plain.exit_code == 0, plain.output
    assert "the answer was cut at the token limit (finish_reason length): give a larger --max-tokens" in (
        plain.stderr
    )
    as_json = run(backend, tmp_path, "ask", str(folder), "What?", "--json")
    assert json.loads(as_json.stdout)["finish_reason"] == "length"
    questions = tmp_path / "questions.txt"
    questions.write_text("One?\nTwo?\n")
    batch = run(backend, tmp_path, "batch", str(folder), "--questions", str(questions))
    assert "answers 1, 2 of 2 were cut at the token limit" in batch.stderr
    fake.finish_reason = "stop"
    whole = run(backend, tmp_path, "ask", str(folder), "What?", "--json")
    assert json.loads(whole.stdout)["finish_reason"] == "stop" and "cut" not in whole.stderr


def test_schema_multi_gives_a_list_in_the_cli_as_in_the_api(
    backend: Backend, fake: FakeEngine, folder: Path, tmp_path: Path
) -> None:
    fake.answer = '{"items": [{"name": "Ada", "age": 36}]}'
    result = run(backend, tmp_path, "ask", str(folder), "Who?", "--schema", "name, age int", "--schema-multi",
                 "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    in_cli = json.loads(result.stdout)["data"]
    with (
        Store.open(tmp_path / "api") as store,
        RepoSession(str(folder), backend=backend, store=store) as session,
    ):
        from longctx.schemas import answer_schema

        in_api = session.ask("Who?", schema=answer_schema("name, age int", multi=True)).data
    assert in_cli == in_api == [{"name": "Ada", "age": 36}]


def test_a_cut_typed_answer_names_the_flag(
    backend: Backend, fake: FakeEngine, folder: Path, tmp_path: Path
) -> None:
    fake.answer, fake.finish_reason = '{"name": "Ad', "length"
    result = run(backend, tmp_path, "ask", str(folder), "Who?", "--schema", "name")
    assert result.exit_code == cli.app.EXIT_INVALID_ANSWER
    assert "--max-tokens" in result.stderr


def test_the_cli_sends_engine_fields_as_the_api_does(
    backend: Backend, fake: FakeEngine, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(backend, tmp_path, "ask", str(folder), "What?", "--extra-body", '{"top_k": 20}')
    assert result.exit_code == 0, result.output
    assert fake.chat_bodies[-1]["top_k"] == 20
    monkeypatch.setenv("LONGCTX_EXTRA_BODY", '{"min_p": 0.1}')
    assert run(backend, tmp_path, "ask", str(folder), "Again?").exit_code == 0
    assert fake.chat_bodies[-1]["min_p"] == 0.1
    refused = run(backend, tmp_path, "ask", str(folder), "What?", "--extra-body", "[1]")
    assert refused.exit_code == cli.EXIT_USAGE and "a JSON object is needed" in refused.stderr
    monkeypatch.setenv("LONGCTX_EXTRA_BODY", "top_k=20")
    wrong = run(backend, tmp_path, "ask", str(folder), "What?")
    assert wrong.exit_code == cli.EXIT_USAGE and "must be a JSON object" in wrong.stderr


def test_require_citations_fails_an_unsupported_answer_and_no_sources_is_said_so(
    backend: Backend, fake: FakeEngine, folder: Path, tmp_path: Path
) -> None:
    fake.answer = "It returns 0."  # no sources block
    cited = run(backend, tmp_path, "ask", str(folder), "What?", "--cite")
    assert cited.exit_code == 0
    assert "[citations: the answer gave no sources]" in cited.stdout and "0 of 0" not in cited.stdout
    required = run(backend, tmp_path, "ask", str(folder), "What?", "--require-citations")
    assert required.exit_code == EXIT_UNVERIFIED_CITATIONS, required.output
    assert "It returns 0." in required.stdout  # printed first
    fake.answer = 'It returns 0.\n\nSources:\n- main.py:2 "return 0"\n- other.py:1 "nothing"\n'
    unverified = run(backend, tmp_path, "ask", str(folder), "What?", "--require-citations", "--json")
    assert unverified.exit_code == EXIT_UNVERIFIED_CITATIONS
    assert json.loads(unverified.stdout)["citations"][1]["verified"] is False
    fake.answer = 'It returns 0.\n\nSources:\n- main.py:2 "return 0"\n'
    verified = run(backend, tmp_path, "ask", str(folder), "What?", "--require-citations")
    assert verified.exit_code == 0, verified.output
    assert "[citations: 1 of 1 verified against the pack]" in verified.stdout
    questions = tmp_path / "questions.txt"
    questions.write_text("One?\nTwo?\n")
    fake.answer = "No sources here."
    batch = run(backend, tmp_path, "batch", str(folder), "--questions", str(questions), "--require-citations")
    assert batch.exit_code == EXIT_UNVERIFIED_CITATIONS and "answers 1, 2 gave no sources" in batch.stderr


def test_ask_refuses_a_cite_that_is_not_a_bool(backend: Backend, folder: Path, tmp_path: Path) -> None:
    with (
        Store.open(tmp_path / "home") as store,
        RepoSession(str(folder), backend=backend, store=store) as session,
        pytest.raises(ConfigError, match="cite"),
    ):
        session.ask("What?", cite="yes")  # type: ignore[typeddict-item]


def test_turns_are_numbered_from_1_in_json_the_chat_and_sessions_show(
    backend: Backend, folder: Path, tmp_path: Path
) -> None:
    chat = run(backend, tmp_path, "chat", str(folder), "--json", "--no-warm-start", stdin="q1?\nq2?\n\n")
    lines = [json.loads(line) for line in chat.stdout.splitlines()]
    assert [line["turn"] for line in lines] == [1, 2]
    assert "[turn 1: " in chat.stderr and "[turn 2: " in chat.stderr
    shown = run(backend, tmp_path, "sessions", "show", lines[0]["session_id"])
    assert "[turn 1] > q1?" in shown.stdout and "[turn 2] > q2?" in shown.stdout
    one = run(backend, tmp_path, "ask", str(folder), "Just one?", "--no-stream")
    assert ": 1 request, " in one.stderr and "1 requests" not in one.stderr


def test_job_help_names_only_flags_that_exist() -> None:
    import re

    help_text = CliRunner().invoke(main, ["job", "--help"]).output
    options = set(re.findall(r"(--[a-z][a-z-]+)", help_text.split("Options:")[1]))
    mentioned = set(re.findall(r"(--[a-z][a-z-]+)", help_text.split("Options:")[0]))
    assert mentioned <= options, mentioned - options


def test_sessions_show_lists_a_batch_in_question_order_and_list_shows_job_ids(
    fake: FakeEngine, folder: Path, tmp_path: Path
) -> None:
    import threading

    import httpx2

    # Answers come back in reverse: the first question's waits until the last one's is served.
    order: list[str] = []
    last_served = threading.Event()

    def handler(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/chat/completions"):
            question = json.loads(request.content)["messages"][-1]["content"]
            if "Third?" not in str(question):
                last_served.wait(10)
            response = fake.handle(request)
            order.append(str(question))
            if "Third?" in str(question):
                last_served.set()
            return response
        return fake.handle(request)

    backend = connect("http://fake-engine:8000/v1", transport=httpx2.MockTransport(handler))
    questions = tmp_path / "questions.txt"
    questions.write_text("First?\nSecond?\nThird?\n")
    batch = run(backend, tmp_path, "batch", str(folder), "--questions", str(questions), "--json",
                "--concurrency", "3", "--dispatch", "together")  # fmt: skip
    assert batch.exit_code == 0, batch.output
    assert "Third?" in order[0]  # answered first
    session_id = json.loads(batch.stdout)["session_id"]
    shown = run(backend, tmp_path, "sessions", "show", session_id).stdout
    assert shown.index("First?") < shown.index("Second?") < shown.index("Third?")
    job = tmp_path / "job.jsonl"
    job.write_text(json.dumps({"paths": str(folder), "question": "q?"}) + "\n")
    ran = run(backend, tmp_path, "job", str(job), "--quiet")
    assert ran.exit_code == 0, ran.output
    listed = run(backend, tmp_path, "sessions", "list")
    assert listed.exit_code == 0, listed.output
    job_row = next(line for line in listed.stdout.splitlines() if "  job  " in line)
    rows = json.loads(run(backend, tmp_path, "sessions", "list", "--json").stdout)
    job_id = next(row["job_id"] for row in rows if row["kind"] == "job")
    assert job_id and f"job {job_id}: " in job_row


def test_doctor_suggests_fp8_kv_only_where_the_server_takes_it() -> None:
    from longctx.backends.engines import find_profile

    vllm = find_profile("vllm")
    assert vllm is not None
    # A checkpoint with calibrated KV scales (doctor reads them): fp8 where the server takes it.
    scaled = {"checkpoint_kv_scales": True}
    gpu = {"cache_dtype": "auto", "block_size": "16", "kv_cache_memory_bytes": "None", **scaled}
    cpu = {"cache_dtype": "auto", "block_size": "128", "kv_cache_memory_bytes": str(2 * 2**30), **scaled}
    assert any("fp8" in finding.flag for finding in vllm.advise(gpu))
    assert not any("fp8" in finding.flag for finding in vllm.advise(cpu))  # the CPU build takes none
    # Without scales (or unknown), none: fp8 at scale 1.0 lost answers when measured.
    assert not any("fp8" in finding.flag for finding in vllm.advise({**gpu, "checkpoint_kv_scales": False}))
    assert not any("fp8" in finding.flag for finding in vllm.advise({**gpu, "checkpoint_kv_scales": None}))


def test_pages_without_text_are_named_with_the_flag_that_sends_them(
    backend: Backend, folder: Path, tmp_path: Path
) -> None:
    from longctx.testing.pdfs import write_scanned_pdf, write_text_pdf

    write_scanned_pdf(folder / "scan.pdf", ["A scanned page", "Another"])
    write_text_pdf(folder / "mixed.pdf", ["Some text here", None])
    packed = run(
        backend, tmp_path, "pack", str(folder), "--tokenizer", "estimate", "-o", str(tmp_path / "p.txt")
    )
    assert packed.exit_code == 0, packed.output
    line = next(line for line in packed.stderr.splitlines() if "pages without text" in line)
    assert "2 documents have pages without text" in line
    assert "mixed.pdf (page 2)" in line and "scan.pdf (pages 1, 2)" in line
    assert "--pdf-pages auto" in line and "longctx serve --cpu-demo --vision" in line
    asked = run(backend, tmp_path, "ask", str(folder), "What?", "--no-stream")
    assert "pages without text" in asked.stderr
    auto = run(backend, tmp_path, "pack", str(folder), "--tokenizer", "estimate", "--pdf-pages", "auto",
               "-o", str(tmp_path / "q.txt"))  # fmt: skip
    assert "pages without text" not in auto.stderr


def test_a_file_too_large_is_refused_part_way_through_its_count_and_the_count_shows_progress(
    tmp_path: Path,
) -> None:
    from test_pack_lower_bound import RecordingVllm

    from longctx.backends.tokenizer import CHUNK_CHARS
    from longctx.errors import BudgetError
    from longctx.options.groups import CorpusOptions, Limits

    class OverTheNetwork(RecordingVllm):
        """Each tokenize answered after 50 ms, as a server's is: an answer that is only this process's
        work held the interpreter, and on a loaded machine the eight counting threads sent all 24
        pieces before the thread that stops the count was scheduled (a fresh clone's run, 2026-12-06)."""

        def handle(self, request: httpx2.Request) -> httpx2.Response:
            if request.url.path == "/tokenize":
                time.sleep(0.05)
            return super().handle(request)

    fake = OverTheNetwork()  # 4 characters a token, a 32k window
    backend = connect("http://fake-engine:8000/v1", transport=fake.transport())
    big = tmp_path / "big"
    big.mkdir()
    # 6 MB: under the characters' bound (6 M / 1,024 < 31k tokens), about 48 times the budget counted.
    (big / "big.txt").write_text("lorem ipsum dolor sit amet\n" * (6 * 1024 * 1024 // 27))
    said: list[str] = []
    with Store.open(tmp_path / "home") as store:
        corpus = CorpusOptions(limits=Limits(max_file_bytes=60_000_000))
        session = RepoSession(str(big), backend=backend, store=store, corpus=corpus, on_progress=said.append)
        with pytest.raises(BudgetError, match="the rest was not tokenized") as refused:
            session.ask("What?")
    pieces = (6 * 1024 * 1024) // CHUNK_CHARS
    counted = [text for text in fake.tokenized if len(text) > 1000]
    assert len(counted) < pieces, len(counted)  # stopped part way: the rest never sent
    assert refused.value.total_tokens > refused.value.budget_tokens
    assert any("M characters" in message for message in said), said
    # A file that fits is counted whole and asked.
    fits = tmp_path / "fits"
    fits.mkdir()
    (fits / "notes.txt").write_text("lorem ipsum dolor sit amet\n" * 3000)  # ~20k tokens of a 31k budget
    with Store.open(tmp_path / "home") as store, RepoSession(str(fits), backend=backend, store=store) as ok:
        assert ok.ask("What?").text == fake.answer


@pytest.mark.parametrize("takes_images", [True, False], ids=["vision-model", "text-only-model"])
def test_pdf_pages_default_to_auto_only_where_the_servers_model_takes_images(
    folder: Path, tmp_path: Path, takes_images: bool
) -> None:
    import httpx2

    from longctx.testing.pdfs import write_scanned_pdf

    write_scanned_pdf(folder / "scan.pdf", ["A scanned page"])
    fake = FakeEngine(engine="sglang", block=1, context_length=10**7)  # the fake counts an image's base64

    def handler(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/model_info":  # SGLang's model card
            return httpx2.Response(200, json={"has_image_understanding": takes_images})
        if request.url.path == "/v1/tokenize":  # four characters a token, as the fake counts
            body = json.loads(request.content)
            prompt = body.get("prompt") or json.dumps(body.get("messages"))
            prompts = prompt if isinstance(prompt, list) else [prompt]
            tokens = [[1] * max(1, len(text) // 4) for text in prompts]
            return httpx2.Response(200, json={"tokens": tokens if isinstance(prompt, list) else tokens[0]})
        return fake.handle(request)

    backend = connect("http://fake-engine:8000/v1", transport=httpx2.MockTransport(handler))
    asked = run(backend, tmp_path, "ask", str(folder), "What does the scan say?", "--no-stream")
    assert asked.exit_code == 0, asked.output
    question = json.dumps(fake.chat_bodies[-1]["messages"])
    if takes_images:
        assert "image_url" in question and "pages without text" not in asked.stderr
    else:
        assert "image_url" not in json.dumps(fake.chat_bodies)  # a text-only model never gets an image
        assert "scan.pdf (page 1)" in asked.stderr and "--pdf-pages auto" in asked.stderr


def test_serve_refuses_a_taken_port_at_once_and_says_its_flags() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = CliRunner().invoke(main, ["serve", "--cpu-demo", "--port", str(port)])
    assert refused.exit_code == cli.EXIT_USAGE and f"--port {port} is taken" in refused.stderr
    shown = CliRunner().invoke(main, ["serve", "--help"]).output
    assert "--port" in shown and "--vision" in shown and "SIGTERM" in shown


def test_sigterm_and_sighup_raise_as_ctrl_c_within_serve() -> None:
    import os
    import signal

    from longctx.cli.serve import _signals_stop

    for number in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(KeyboardInterrupt), _signals_stop():
            os.kill(os.getpid(), number)
            import time

            time.sleep(5)  # the handler raises before this ends
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored after
