"""Jobs on the real engines: one prefill per pack, the KV size each server reports, a crash and a resume.

Two vLLM replicas behind the job, every pack on one of them:
tests/test_fleet.py. Against fake servers: tests/test_jobs.py.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from longctx import Job, JobItem, JobOptions
from longctx.backends.base import connect
from longctx.options.groups import RequestOptions
from longctx.store import Store
from longctx.testing import LocalServer

ENTRY_POINT = Path(sys.executable).parent / "longctx"


def make_folders(root: Path, count: int, lines: int = 120) -> list[Path]:
    """``count`` folders of distinct code, about ``lines`` x 12 tokens each."""
    folders = []
    for number in range(count):
        folder = root / f"pack{number}"
        folder.mkdir(parents=True)
        body = "".join(
            f"def f{number}_{line}(x):\n    return x * {line} + {number}\n" for line in range(lines)
        )
        (folder / "code.py").write_text(body)
        folders.append(folder)
    return folders


def interleaved(folders: list[Path], questions: int) -> list[JobItem]:
    return [
        JobItem((str(folder),), f"Question {q}: what does f{q} return in {folder.name}?")
        for q in range(questions)
        for folder in folders
    ]


def test_a_job_prefills_each_pack_once_and_reads_the_kv_size(
    engine_server: LocalServer, tmp_path: Path
) -> None:
    folders = make_folders(tmp_path / "packs", 3)
    items = interleaved(folders, 3)
    request = RequestOptions(max_tokens=4, temperature=0.0, cache_salt=uuid.uuid4().hex)
    with connect(engine_server.api_base) as backend, Store.open(tmp_path / "home") as store:
        kv = backend.info.kv_cache_tokens
        report = Job(items, backend=backend, store=store, request=request).run()
        block = backend.info.cache_block_tokens or 1
    # The size the server reports: vLLM's kv_cache_size_tokens, SGLang's max_total_num_tokens.
    assert kv is not None and kv > 10_000
    assert not report.failed and report.packs == 3
    for folder in folders:
        mine = [r for r in report.results if r.item.paths == (str(folder),)]
        assert len(mine) == 3 and all(r.usage is not None for r in mine)
        prompts = [r.usage.prompt_tokens or 0 for r in mine if r.usage]
        cached = sorted(r.usage.cached_tokens or 0 for r in mine if r.usage)
        # One cold prefill; the two others read all but the question's tail from the cache.
        assert cached[0] < block or cached[0] < 0.5 * prompts[0]
        shared = min(prompts) - 40
        assert all(c >= 0.99 * (shared - shared % block) for c in cached[1:]), (cached, prompts)
    # The job's own check of the server counter over the whole run.
    assert report.counter_check is not None and report.counter_check.matches, report.counter_check


def test_no_more_packs_in_flight_on_a_replica_than_its_kv_cache_holds(
    vllm_server: LocalServer, tmp_path: Path
) -> None:
    folders = make_folders(tmp_path / "packs", 3)
    request = RequestOptions(max_tokens=8, temperature=0.0, cache_salt=uuid.uuid4().hex)
    # A KV cache said to hold one pack (about 1,500 tokens) and little more.
    options = JobOptions(kv_tokens=2_500, packs_in_flight=3)
    with connect(vllm_server.api_base) as backend, Store.open(tmp_path / "home") as store:
        report = Job(
            interleaved(folders, 2), backend=backend, store=store, request=request, options=options
        ).run()
        spans = []
        for folder in folders:
            ids = [r.session_id for r in report.results if r.item.paths == (str(folder),)]
            records = store.sessions.requests(session_ids=[sid for sid in ids if sid])
            ends = [r.started_at + (r.usage.total_seconds or 0.0) for r in records]
            spans.append((min(r.started_at for r in records), max(ends)))
    assert not report.failed
    spans.sort()
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end - 0.05, spans  # one pack at a time: the next starts when the last ended


def test_a_killed_job_command_resumes_without_asking_an_answer_twice(
    vllm_server: LocalServer, tmp_path: Path
) -> None:
    folders = make_folders(tmp_path / "packs", 3)
    job_file = tmp_path / "job.jsonl"
    items = interleaved(folders, 4)
    job_file.write_text("".join(json.dumps(item.to_dict()) + "\n" for item in items))
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LONGCTX_")}
    env.update({"LONGCTX_HOME": str(home), "LONGCTX_BASE_URL": vllm_server.api_base})
    # Long answers and one pack at a time, so the kill lands mid-job.
    command = [str(ENTRY_POINT), "job", str(job_file), "--max-tokens", "64", "--packs-in-flight", "1", "-q"]
    job = Job(items)

    partial = tmp_path / "partial.jsonl"
    process = subprocess.Popen(
        [*command, "-o", str(partial)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 240
    stored_before = 0
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if (home / "longctx.db").exists():
            with Store.open(home) as store:
                stored_before = len(job.stored_answers(store))
        if stored_before >= 2 or process.poll() is not None:
            break
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert 2 <= stored_before < len(items), "the kill should land mid-job"
    # The results file holds the items done before the kill, each line whole (written as they came).
    text = partial.read_text()
    done = [json.loads(line) for line in text.splitlines()]
    assert text.endswith("\n") and len(done) >= stored_before - 1 and len(done) < len(items)
    assert all(line["answer"] is not None for line in done)

    again = subprocess.run(command[:-1], env=env, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr
    lines = [json.loads(line) for line in again.stdout.splitlines()]
    assert [line["question"] for line in lines] == [item.question for item in items]
    assert all(line["answer"] is not None and "error" not in line for line in lines)
    resumed = sum(line["resumed"] for line in lines)
    assert resumed >= stored_before
    assert "from an earlier run" in again.stderr
    with Store.open(home) as store:
        stored = store.sessions.answered_under(f"job:{job.id}:")
        assert len(stored) == len(items)
        # One turn per key: no question was answered twice.
        assert len({(turn.session_id, turn.position) for turn in stored.values()}) == len(items)
        sibling_turns = sum(
            len(store.sessions.turns(child.id))
            for record in store.sessions.sessions()
            for child in store.sessions.children(record.id)
        )
    # Every turn stored belongs to one item: a request the kill cut off left nothing.
    assert sibling_turns == len(items)


def test_two_job_commands_at_once_ask_every_item_exactly_once(
    vllm_server: LocalServer, tmp_path: Path
) -> None:
    """Two runs of one job file at the same time, one store: each item has one owner (its lease)."""
    folders = make_folders(tmp_path / "packs", 2, lines=60)
    items = interleaved(folders, 3)
    job_file = tmp_path / "job.jsonl"
    job_file.write_text("".join(json.dumps(item.to_dict()) + "\n" for item in items))
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LONGCTX_")}
    env.update({"LONGCTX_HOME": str(home), "LONGCTX_BASE_URL": vllm_server.api_base})
    command = [str(ENTRY_POINT), "job", str(job_file), "--max-tokens", "16", "--packs-in-flight", "1", "-q"]
    runs = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=600) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err for _, err in outputs]
    lines = [[json.loads(line) for line in out.splitlines()] for out, _ in outputs]
    for results in lines:
        assert all(line["answer"] and "error" not in line for line in results), results
    # Each item asked by one process; the other took its answer from the store.
    assert [sum(not line["resumed"] for line in pair) for pair in zip(*lines, strict=True)] == [1] * len(
        items
    )
    with Store.open(home) as store:
        assert len(store.sessions.answered_under(f"job:{Job(items).id}:")) == len(items)
        # Every request either process sent is in the store (jobs send no warm start): one per item.
        assert len(store.sessions.requests()) == len(items)
        assert store.leases.holders() == {}
