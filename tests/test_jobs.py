"""Jobs over many packs (longctx.sessions.jobs, ``longctx job``) against fake servers.

The real-engine side (two vLLM replicas, a job larger than their KV
caches, a crash and a resume; SGLang): tests/test_jobs_engines.py.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import httpx2
import pytest
from click.testing import CliRunner
from fake_engine import FakeEngine, Fault

from longctx import Job, JobItem, JobOptions, JobProgress, read_job
from longctx.backends.base import Backend, connect
from longctx.cli import EXIT_OK, Runtime, main
from longctx.cli.app import EXIT_ITEMS_FAILED
from longctx.config import RequestOptions, ServerOptions
from longctx.errors import ConfigError
from longctx.sessions import RepoSession
from longctx.sessions.jobs import _Room
from longctx.store import Store

URLS = [f"http://replica-{i}:8000/v1" for i in range(2)]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "store")


def make_repos(root: Path, count: int) -> list[Path]:
    repos = []
    for number in range(count):
        repo = root / f"repo{number}"
        repo.mkdir(parents=True)
        (repo / "main.py").write_text(f"def answer():\n    return {number}\n" + "# filler line\n" * 40)
        repos.append(repo)
    return repos


def interleaved(repos: list[Path], questions: int) -> list[JobItem]:
    """Questions spread round-robin across the packs, as a plain client would send them."""
    return [
        JobItem((str(repo),), f"question {q} about {repo.name}?") for q in range(questions) for repo in repos
    ]


def prefix_of(prompt: str) -> str:
    """Which repository a fake prompt is about (its first message holds the pack)."""
    return next(
        word for word in ("repo0", "repo1", "repo2", "repo3") if f"{word}/" in prompt or word in prompt
    )


# -- reading a job file ------------------------------------------------------------


def test_read_job_takes_a_path_or_a_list_and_keeps_the_order(tmp_path: Path) -> None:
    job_file = tmp_path / "job.jsonl"
    job_file.write_text(
        '{"paths": "a", "question": "one?"}\n\n{"paths": ["a", "b"], "question": "two?", "id": 7}\n'
    )
    items = read_job(job_file)
    assert items == (JobItem(("a",), "one?"), JobItem(("a", "b"), "two?", "7"))
    assert read_job(io.StringIO(job_file.read_text())) == items


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "line 2: not JSON"),
        ('["a", "q"]', "line 2: expected an object with paths and question, got list"),
        ('{"paths": "a"}', "line 2: missing 'question'"),
        ('{"paths": "a", "question": "q", "pathz": 1}', "line 2: unknown key 'pathz'"),
        ('{"paths": 3, "question": "q"}', "line 2: 'paths' must be a string or a list of strings"),
        ('{"paths": "a", "question": "  "}', "line 2: a job item's question is empty"),
        ('{"paths": [], "question": "q"}', "line 2: a job item needs at least one path"),
    ],
)
def test_a_bad_line_is_refused_naming_the_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    job_file = tmp_path / "job.jsonl"
    job_file.write_text('{"paths": "a", "question": "fine?"}\n' + line + "\n")
    with pytest.raises(ConfigError) as caught:
        read_job(job_file)
    assert str(caught.value).startswith(f"{job_file} {message}")


def test_an_empty_or_missing_job_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ConfigError, match="holds no items"):
        read_job(tmp_path / "empty.jsonl")
    with pytest.raises(ConfigError, match="cannot read the job file"):
        read_job(tmp_path / "missing.jsonl")


# -- scheduling --------------------------------------------------------------------


def test_each_packs_questions_go_out_together_and_share_one_prefill(
    backend: Backend, fake: FakeEngine, store: Store, tmp_path: Path
) -> None:
    repos = make_repos(tmp_path, 3)
    items = interleaved(repos, 4)
    report = Job(items, backend=backend, store=store, options=JobOptions(packs_in_flight=1)).run()

    assert [result.index for result in report.results] == list(range(12))
    assert all(result.ok and result.answer == fake.answer for result in report.results)
    assert [result.item for result in report.results] == items
    # One pack at a time: the requests come in three runs of one pack each.
    order = [prefix_of(prompt) for prompt in fake.prompts]
    runs = [order[i] for i in range(len(order)) if i == 0 or order[i] != order[i - 1]]
    assert sorted(runs) == ["repo0", "repo1", "repo2"]
    # Within each pack every question after the first is served from the cache.
    for repo in ("repo0", "repo1", "repo2"):
        mine = [r for r in report.results if r.item.paths[0].endswith(repo)]
        assert sum(1 for r in mine if (r.usage.cached_tokens or 0) == 0) <= 1
    assert report.packs == 3 and report.resumed == 0 and report.asked == 12
    assert report.prefilled_tokens < report.prompt_tokens / 2


def test_a_job_run_again_asks_only_what_has_no_answer(
    backend: Backend, fake: FakeEngine, store: Store, tmp_path: Path
) -> None:
    repos = make_repos(tmp_path, 2)
    items = interleaved(repos, 3)
    # The first run loses one question: the server refuses it (400 is not retried).
    fake.faults.append(Fault(status=400, body={"error": {"message": "refused by the test"}}))
    first = Job(items, backend=backend, store=store, options=JobOptions(packs_in_flight=1)).run()
    assert len(first.failed) == 1 and "refused by the test" in (first.failed[0].error or "")
    sent = len(fake.chat_bodies)

    second = Job(items, backend=backend, store=store, options=JobOptions(packs_in_flight=1)).run()
    assert len(fake.chat_bodies) == sent + 1  # only the lost one
    assert not second.failed and second.resumed == 5 and second.asked == 1
    assert [r.answer for r in second.results] == [fake.answer] * 6
    # Every item answered once in the store: one key per item, one turn per key.
    keys = [Job(items).key(index) for index in range(len(items))]
    stored = store.sessions.answered(keys)
    assert len(stored) == 6 and len({(t.session_id, t.position) for t in stored.values()}) == 6

    third = Job(items, backend=backend, store=store).run()
    assert len(fake.chat_bodies) == sent + 1 and third.resumed == 6


def test_a_pack_that_cannot_be_made_fails_its_items_and_the_others_go_on(
    backend: Backend, store: Store, tmp_path: Path
) -> None:
    repos = make_repos(tmp_path, 1)
    items = [JobItem((str(tmp_path / "nowhere"),), "lost?"), JobItem((str(repos[0]),), "found?")]
    report = Job(items, backend=backend, store=store).run()
    assert not report.results[0].ok and "nowhere" in (report.results[0].error or "")
    assert report.results[1].ok


def test_answer_keys_are_refused_when_already_answered_or_given_twice(
    backend: Backend, store: Store, tmp_path: Path
) -> None:
    repo = make_repos(tmp_path, 1)[0]
    with RepoSession(str(repo), backend=backend, store=store) as session:
        session.ask_many(["a?", "b?"], keys=["k1", "k2"])
        with pytest.raises(ConfigError, match="already have a stored answer: k1"):
            session.ask_many(["a?"], keys=["k1"])
        with pytest.raises(ConfigError, match="given twice: k3"):
            session.ask_many(["a?", "b?"], keys=["k3", "k3"])
        with pytest.raises(ConfigError, match="2 keys for 1 questions"):
            session.ask_many(["a?"], keys=["k4", "k5"])
    assert set(store.sessions.answered(["k1", "k2", "k3"])) == {"k1", "k2"}


def test_room_admits_by_kv_tokens_per_replica() -> None:
    room = _Room({"a": 1000, "b": None}, share=0.9, limit=10)
    assert room.fits("a", 5000)  # a replica always takes one pack, however large
    room.take("a", 600)
    assert not room.fits("a", 400) and room.fits("a", 300)  # 900 of 1000 may be claimed
    room.take("b", 10)
    assert not room.fits("b", 1)  # size unknown: one pack at a time
    room.give_back("a", 600)
    assert room.fits("a", 900) and room.in_flight == 1
    full = _Room({"a": None, "b": None}, share=1.0, limit=1)
    full.take("a", 1)
    assert not full.fits("b", 1)  # packs_in_flight bounds them all


class _Replicas:
    """Two fake engines behind one routed transport."""

    def __init__(self) -> None:
        self.engines = {url: FakeEngine(engine="generic", block=1) for url in URLS}

    def route(self, request: httpx2.Request) -> httpx2.Response:
        return self.engines[f"http://{request.url.host}:8000/v1"].handle(request)


def test_packs_are_spread_over_replicas_and_each_stays_on_one(store: Store, tmp_path: Path) -> None:
    replicas = _Replicas()
    backend = connect(ServerOptions(base_url=URLS), transport=httpx2.MockTransport(replicas.route))
    repos = make_repos(tmp_path, 4)
    seen: list[JobProgress] = []
    report = Job(interleaved(repos, 3), backend=backend, store=store, on_progress=seen.append).run()
    assert not report.failed
    by_pack: dict[str, set[str]] = {}
    for result in report.results:
        by_pack.setdefault(result.item.paths[0], set()).add(result.replica or "")
    assert all(len(urls) == 1 for urls in by_pack.values())
    served = Counter(prefix_of(p) for engine in replicas.engines.values() for p in engine.prompts)
    assert served == Counter({repo.name: 3 for repo in repos})
    assert all(len(engine.prompts) for engine in replicas.engines.values())  # both replicas used
    assert seen[-1].answered == 12 and seen[-1].packs_done == 4 and seen[-1].packs == 4


# -- the command line --------------------------------------------------------------


def test_job_command_writes_results_in_item_order_and_resumes(
    backend: Backend, fake: FakeEngine, tmp_path: Path
) -> None:
    repos = make_repos(tmp_path, 2)
    job_file = tmp_path / "job.jsonl"
    job_file.write_text(
        "".join(
            json.dumps({"paths": str(r), "question": f"q{n}?", "id": f"{r.name}-{n}"}) + "\n"
            for n in range(2)
            for r in repos
        )
    )
    out = tmp_path / "results" / "out.jsonl"
    runner = CliRunner()
    missing = runner.invoke(main, ["job", str(job_file), "-o", str(out)], obj=Runtime(backend=backend))
    assert missing.exit_code != EXIT_OK and "out.jsonl: its folder does not exist" in missing.stderr
    assert not fake.chat_bodies  # refused before anything was asked
    out.parent.mkdir()
    result = runner.invoke(main, ["job", str(job_file), "-o", str(out)], obj=Runtime(backend=backend))
    assert result.exit_code == EXIT_OK, result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["id"] for line in lines] == ["repo0-0", "repo1-0", "repo0-1", "repo1-1"]
    assert all(line["answer"] == fake.answer and not line["resumed"] for line in lines)
    assert "4 of 4 answered over 2 packs" in result.stderr

    again = runner.invoke(main, ["job", str(job_file), "--quiet"], obj=Runtime(backend=backend))
    assert again.exit_code == EXIT_OK
    assert [json.loads(line)["resumed"] for line in again.stdout.splitlines()] == [True] * 4


def test_job_command_exits_9_when_an_item_failed_and_names_it(backend: Backend, tmp_path: Path) -> None:
    job_file = tmp_path / "job.jsonl"
    job_file.write_text(json.dumps({"paths": str(tmp_path / "gone"), "question": "q?"}) + "\n")
    result = CliRunner().invoke(main, ["job", str(job_file)], obj=Runtime(backend=backend))
    assert result.exit_code == EXIT_ITEMS_FAILED == 9
    assert json.loads(result.stdout)["error"] and "item 0:" in result.stderr


def test_job_command_refuses_a_bad_file_with_its_line(backend: Backend, tmp_path: Path) -> None:
    job_file = tmp_path / "job.jsonl"
    job_file.write_text('{"paths": "a", "question": "q", "extra": 1}\n')
    result = CliRunner().invoke(main, ["job", str(job_file)], obj=Runtime(backend=backend))
    assert result.exit_code != EXIT_OK and "line 1: unknown key 'extra'" in result.stderr


def test_a_job_reads_no_counters_behind_a_declared_router_or_when_checks_are_off(
    fake: FakeEngine, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[object] = []
    original = Backend.counters

    def counting(self: Backend, urls: object = None) -> object:
        reads.append(urls)
        return original(self, urls)  # type: ignore[arg-type]

    monkeypatch.setattr(Backend, "counters", counting)
    items = interleaved(make_repos(tmp_path, 2), 2)
    plain = connect(URLS[0], transport=fake.transport())
    assert Job(items, backend=plain, store=store, options=JobOptions(job_id="a")).run().failed == ()
    assert reads  # the job's one check over the run reads the counters
    reads.clear()
    routed = connect(
        ServerOptions(base_url=URLS[0], router_policy="vllm-router:consistent_hash"),
        transport=fake.transport(),
    )
    report = Job(items, backend=routed, store=store, options=JobOptions(job_id="b")).run()
    assert not report.failed and report.counter_check is None and reads == []
    unchecked = RequestOptions(counter_check=False)
    report = Job(items, backend=plain, store=store, request=unchecked, options=JobOptions(job_id="c")).run()
    assert not report.failed and report.counter_check is None and reads == []
