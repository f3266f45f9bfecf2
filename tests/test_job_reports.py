"""A job after it ran: its report by the id it printed, its result lines, its Ctrl-C message.

Against the fake engine through the CLI in process; the scheduling itself: tests/test_jobs.py.
"""

from __future__ import annotations

import json
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import httpx2
import pytest
from click.testing import CliRunner, Result
from fake_engine import FakeEngine

from longctx import Job, JobItem, JobOptions
from longctx.backends.base import Backend, connect
from longctx.cli import EXIT_OK, Runtime, main
from longctx.options.groups import RequestOptions
from longctx.store import Store

FAKE = "http://fake-engine:8000/v1"


def packs(root: Path, count: int) -> list[Path]:
    folders = []
    for number in range(count):
        folder = root / f"pack{number}"
        folder.mkdir(parents=True)
        (folder / "main.py").write_text(f"def answer():\n    return {number}\n" + "# filler line\n" * 40)
        folders.append(folder)
    return folders


def job_file(tmp_path: Path, folders: list[Path], questions: int = 2) -> Path:
    path = tmp_path / "job.jsonl"
    items = [{"paths": str(folder), "question": f"q{q} about {folder.name}?"} for folder in folders
             for q in range(questions)]  # fmt: skip
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def invoke(backend: Backend, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), obj=Runtime(backend=backend))


def test_report_takes_the_job_id_and_plain_report_shows_the_whole_job(
    backend: Backend, tmp_path: Path
) -> None:
    ran = invoke(backend, "job", str(job_file(tmp_path, packs(tmp_path, 3))))
    assert ran.exit_code == EXIT_OK, ran.output
    job_id = ran.stderr.split("job ", 1)[1].split(":", 1)[0]
    by_id = invoke(backend, "report", job_id, "--json")
    assert by_id.exit_code == EXIT_OK, by_id.output
    shown = json.loads(by_id.stdout)
    assert shown["title"].startswith(f"job {job_id}:")
    # Every pack's siblings, each with the question it answered.
    siblings = [line for line in shown["requests"] if line["purpose"] == "sibling"]
    assert sorted(line["question"] for line in siblings) == sorted(
        f"q{q} about pack{n}?" for n in range(3) for q in range(2)
    )
    latest = invoke(backend, "report", "--json")
    assert json.loads(latest.stdout) == shown
    table = invoke(backend, "report", job_id).stdout
    assert "question" in table and "q1 about pack2?" in table
    assert invoke(backend, "report", job_id, "--html", str(tmp_path / "r.html")).exit_code == EXIT_OK
    assert "<td>q1 about pack2?</td>" in (tmp_path / "r.html").read_text()
    missing = invoke(backend, "report", "no-such-id")
    assert missing.exit_code == 7 and "no session or job with id 'no-such-id'" in missing.stderr


def test_reused_result_lines_carry_the_keys_of_new_ones(backend: Backend, tmp_path: Path) -> None:
    path = job_file(tmp_path, packs(tmp_path, 2))
    first = invoke(backend, "job", str(path))
    again = invoke(backend, "job", str(path))
    new = [json.loads(line) for line in first.stdout.splitlines()]
    reused = [json.loads(line) for line in again.stdout.splitlines()]
    assert all(not line["resumed"] for line in new) and all(line["resumed"] for line in reused)
    assert {frozenset(line) for line in reused} == {frozenset(line) for line in new}
    # The reused line says what its answer cost, where, when it was asked.
    assert [line["usage"] for line in reused] == [line["usage"] for line in new]
    assert [line["replica"] for line in reused] == [line["replica"] for line in new]


@dataclass
class _InterruptingAtOnce(FakeEngine):
    """Sends a Ctrl-C on the first chat request and holds every answer until ``released``."""

    # Where the kernel put the Ctrl-C: it may hand a process's signal to any of its threads.
    on_main_thread: bool = True
    released: threading.Event = field(default_factory=threading.Event)
    interrupted = False

    def chat(self, request: httpx2.Request) -> httpx2.Response:
        # One Ctrl-C, at the first request: a sibling's request arriving later must not interrupt
        # whatever runs by then (another test).
        if not self.interrupted:
            self.interrupted = True
            thread = threading.main_thread() if self.on_main_thread else threading.current_thread()
            signal.pthread_kill(cast(int, thread.ident), signal.SIGINT)
        # No answer arrives before the interrupt is handled (the test releases them after the
        # command ends); ten seconds at most, so a Ctrl-C that was missed fails the test.
        self.released.wait(10.0)
        return super().chat(request)


@pytest.mark.parametrize("on_main_thread", [True, False], ids=["on-the-main-thread", "on-the-asking-thread"])
def test_ctrl_c_before_any_item_names_no_output_file(tmp_path: Path, on_main_thread: bool) -> None:
    fake = _InterruptingAtOnce(engine="generic", block=1, on_main_thread=on_main_thread)
    backend = connect(FAKE, transport=fake.transport())
    out = tmp_path / "out.jsonl"
    try:
        stopped = invoke(backend, "job", str(job_file(tmp_path, packs(tmp_path, 1))), "-o", str(out))
    finally:
        fake.released.set()
    assert stopped.exit_code != EXIT_OK and "0 of 2 items answered" in stopped.stderr
    assert not out.exists() and str(out) not in stopped.stderr


def test_an_answer_stored_at_the_index_for_another_question_is_not_compared(
    backend: Backend, tmp_path: Path
) -> None:
    # Two items answered with --max-tokens 17; the second alone run again under the same job id
    # (a file of the items to retry) takes index 0, where the first item's answer is stored.
    folder = packs(tmp_path, 1)[0]
    store = Store.open(tmp_path / "store")
    items = [JobItem((str(folder),), "first?"), JobItem((str(folder),), "second?")]
    options = JobOptions(job_id="named")
    Job(items, backend=backend, store=store, request=RequestOptions(max_tokens=17), options=options).run()
    retried = Job(items[1:], backend=backend, store=store, options=options).run()
    assert retried.results[0].asked_because == "new"
    assert retried.results[0].answer is not None
