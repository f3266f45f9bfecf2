"""Jobs over many packs (longctx.jobs.job, ``longctx job``) against fake servers.

The real-engine side (two vLLM replicas, a job larger than their KV
caches, a crash and a resume; SGLang): tests/test_jobs_engines.py.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import httpx2
import pytest
from click.testing import CliRunner
from corpus_fixtures import commit, git, init_repo, isolated_git
from fake_engine import FakeEngine, Fault

from longctx import Job, JobItem, JobOptions, JobProgress, JobReport, read_job
from longctx.backends.base import Backend, connect
from longctx.backends.engines import VLLM, registered
from longctx.cli import EXIT_OK, Runtime, main
from longctx.cli.app import EXIT_ITEMS_FAILED
from longctx.errors import ConfigError, SessionClosed
from longctx.jobs.keys import AnswerFacts
from longctx.jobs.room import KvRoom
from longctx.options.groups import RequestOptions, ServerOptions
from longctx.sessions import RepoSession
from longctx.store import Store

URLS = [f"http://replica-{i}:8000/v1" for i in range(2)]
FAKE = "http://fake-engine:8000/v1"

__all__ = ["isolated_git"]  # a fixture: autouse in this module (git sees no user configuration)


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


def test_a_job_runs_once_and_says_so_when_run_again(backend: Backend, store: Store, tmp_path: Path) -> None:
    job = Job(interleaved(make_repos(tmp_path, 1), 1), backend=backend, store=store)
    assert job.run().failed == ()
    with pytest.raises(SessionClosed, match="make a new Job"):
        job.run()
    assert Job(job.items, backend=backend, store=store).run().resumed == 1  # a new job reuses the answer


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
    stored = store.sessions.answered_under(f"job:{Job(items).id}:")
    assert len(stored) == 6 and len({(t.session_id, t.position) for t in stored.values()}) == 6
    assert sorted(Job(items).stored_answers(store)) == list(range(6))

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
    room = KvRoom({"a": 1000, "b": None}, share=0.9, limit=10)
    assert room.fits("a", 5000)  # a replica always takes one pack, however large
    room.take("a", 600)
    assert not room.fits("a", 400) and room.fits("a", 300)  # 900 of 1000 may be claimed
    room.take("b", 10)
    assert not room.fits("b", 1)  # size unknown: one pack at a time
    room.give_back("a", 600)
    assert room.fits("a", 900) and room.in_flight == 1
    full = KvRoom({"a": None, "b": None}, share=1.0, limit=1)
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


def test_a_replica_back_after_the_job_began_counts_in_the_jobs_counter_check(
    store: Store, tmp_path: Path
) -> None:
    """Down when the job opens its window, back when its packs are asked: they are checked there too."""
    engines = {url: FakeEngine(block=1) for url in URLS}  # engines with counters
    down = {URLS[0]}

    def route(request: httpx2.Request) -> httpx2.Response:
        url = f"http://{request.url.host}:8000/v1"
        if url in down:
            raise httpx2.ConnectError("connection refused (replica stopped)", request=request)
        return engines[url].handle(request)

    # vLLM's counters; no tokenize route on the fakes, so the packs are counted with the estimate.
    with registered(dataclasses.replace(VLLM, tokenize_path=None)):
        backend = connect(
            ServerOptions(base_url=URLS, replica_retry_seconds=0.01), transport=httpx2.MockTransport(route)
        )
        down.clear()  # back; the backend finds out when a pack's request tries it again
        time.sleep(0.05)
        report = Job(interleaved(make_repos(tmp_path, 4), 2), backend=backend, store=store).run()
    assert not report.failed
    assert {result.replica for result in report.results} == set(URLS)  # its packs went back to it
    check = report.counter_check
    assert check is not None and check.matches is True, check
    assert "could not read" not in check.note, check.note
    cached = sum(result.usage.cached_tokens or 0 for result in report.results if result.usage is not None)
    assert check.reported == cached > 0, (check, cached)


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


# -- what an answer is keyed by ------------------------------------------------------


def make_git_repos(root: Path, count: int) -> list[Path]:
    repos = []
    for number in range(count):
        repo = init_repo(root / f"repo{number}")
        (repo / "main.py").write_text(f"def answer():\n    return {number}\n" + "# filler line\n" * 40)
        git(repo, "add", "main.py")
        commit(repo, "first", when=1_700_000_000)
        repos.append(repo)
    return repos


def test_a_job_asks_again_what_a_commit_or_an_option_changed_and_reuses_the_rest(
    backend: Backend, fake: FakeEngine, store: Store, tmp_path: Path
) -> None:
    repos = make_git_repos(tmp_path, 2)
    items = interleaved(repos, 2)

    def run(request: RequestOptions | None = None, *, fresh: bool = False) -> tuple[int, JobReport]:
        sent = len(fake.chat_bodies)
        options = JobOptions(fresh=fresh)
        report = Job(items, backend=backend, store=store, request=request, options=options).run()
        assert not report.failed
        return len(fake.chat_bodies) - sent, report

    asked, first = run()
    assert asked == 4 and [r.asked_because for r in first.results] == ["new"] * 4
    asked, same = run()
    assert asked == 0 and same.resumed == 4 and "asked again" not in same.summary_line()

    # A commit in repo0: its two items are asked again, repo1's are reused.
    (repos[0] / "main.py").write_text("def answer():\n    return 42\n" + "# filler line\n" * 40)
    git(repos[0], "add", "main.py")
    commit(repos[0], "second", when=1_700_000_100)
    asked, changed = run()
    assert asked == 2 and changed.resumed == 2
    again = {r.item.paths[0]: r.asked_because for r in changed.results if not r.resumed}
    assert again == {str(repos[0]): "the pack's content changed"}
    assert "2 asked again (2 because the pack's content changed)" in changed.summary_line()
    assert all("return 42" in body["messages"][1]["content"] for body in fake.chat_bodies[-2:])

    # Another --max-tokens: every answer may differ, every item is asked again.
    asked, longer = run(RequestOptions(max_tokens=99))
    assert asked == 4 and longer.asked_again == {"max_tokens changed (512 -> 99)": 4}
    asked, reused = run(RequestOptions(max_tokens=99))
    assert asked == 0 and reused.resumed == 4
    # Back to the earlier option: the answers stored under it are still valid.
    asked, back = run()
    assert asked == 0 and back.resumed == 4

    # fresh: everything again, and those answers are the ones reused from then on.
    asked, fresh = run(fresh=True)
    assert asked == 4 and fresh.asked_again == {"asked fresh (--fresh)": 4}
    asked, after = run()
    assert asked == 0 and [r.session_id for r in after.results] == [r.session_id for r in fresh.results]


def test_another_model_or_server_asks_again(fake: FakeEngine, store: Store, tmp_path: Path) -> None:
    items = interleaved(make_repos(tmp_path, 1), 2)
    Job(items, backend=connect(FAKE, transport=fake.transport()), store=store).run()
    other = FakeEngine(engine="generic", block=1, model="other-model")
    report = Job(items, backend=connect(FAKE, transport=other.transport()), store=store).run()
    assert report.asked_again == {"the model changed (fake-model -> other-model)": 2}
    moved = Job(items, backend=connect(URLS[0], transport=other.transport()), store=store).run()
    assert moved.asked_again == {"the server URLs changed": 2}
    assert Job(items, backend=connect(URLS[0], transport=other.transport()), store=store).run().resumed == 2


def test_the_servers_engine_and_version_are_in_the_key() -> None:
    info = connect(FAKE, transport=FakeEngine(engine="generic").transport()).info
    request = RequestOptions()
    facts = AnswerFacts.of("f" * 64, info, [FAKE], request)
    upgraded = AnswerFacts.of(
        "f" * 64, dataclasses.replace(info, profile=VLLM, version="0.33.0"), [FAKE], request
    )
    assert facts.digest != upgraded.digest
    # What a session's record keeps cannot tell the two apart: decide() names the server then.
    kept = {"content": "f" * 64, "model": info.model, "urls": [FAKE], "options": dict(facts.options)}
    assert facts.changes_from(kept) == upgraded.changes_from(kept) == []
    salted = AnswerFacts.of("f" * 64, info, [FAKE], RequestOptions(cache_salt="other", dispatch="lead"))
    assert salted.digest == facts.digest  # the salt and the dispatch do not change an answer


def test_an_answer_stored_under_an_older_key_is_asked_again(
    backend: Backend, store: Store, tmp_path: Path
) -> None:
    items = interleaved(make_repos(tmp_path, 1), 1)
    job = Job(items, backend=backend, store=store)
    with RepoSession(items[0].paths[0], backend=backend, store=store) as session:
        session.ask_many([items[0].question], keys=[f"job:{job.id}:0"])  # the key of longctx before facts
    report = Job(items, backend=backend, store=store).run()
    assert report.resumed == 0
    assert report.asked_again == {"stored by an earlier longctx without the answer's facts": 1}


def test_job_command_fresh_asks_everything_again(backend: Backend, fake: FakeEngine, tmp_path: Path) -> None:
    job_file = tmp_path / "job.jsonl"
    job_file.write_text(
        "".join(json.dumps(i.to_dict()) + "\n" for i in interleaved(make_repos(tmp_path, 1), 2))
    )
    runner = CliRunner()
    assert (
        runner.invoke(main, ["job", str(job_file), "-q"], obj=Runtime(backend=backend)).exit_code == EXIT_OK
    )
    sent = len(fake.chat_bodies)
    fresh = runner.invoke(main, ["job", str(job_file), "--fresh"], obj=Runtime(backend=backend))
    assert fresh.exit_code == EXIT_OK and len(fake.chat_bodies) == sent + 2
    assert "2 asked again (2 because asked fresh (--fresh))" in fresh.stderr
    lines = [json.loads(line) for line in fresh.stdout.splitlines()]
    assert [line["asked_because"] for line in lines] == ["asked fresh (--fresh)"] * 2


class _Interrupting(FakeEngine):
    """A fake whose ``after``-th chat request sends this process SIGINT (a Ctrl-C) before answering."""

    after: int = 3

    def chat(self, request: httpx2.Request) -> httpx2.Response:
        if len(self.chat_bodies) + 1 == self.after:
            os.kill(os.getpid(), signal.SIGINT)
        return super().chat(request)


def test_job_command_interrupted_leaves_a_valid_partial_results_file(tmp_path: Path) -> None:
    fake = _Interrupting(engine="generic", block=1)
    backend = connect(FAKE, transport=fake.transport())
    repos = make_repos(tmp_path, 3)
    job_file = tmp_path / "job.jsonl"
    job_file.write_text("".join(json.dumps(item.to_dict()) + "\n" for item in interleaved(repos, 2)))
    out = tmp_path / "out.jsonl"
    command = ["job", str(job_file), "-o", str(out), "--packs-in-flight", "1", "--concurrency", "1"]
    runner = CliRunner()
    stopped = runner.invoke(main, command, obj=Runtime(backend=backend))
    assert stopped.exit_code != EXIT_OK and "items answered and stored" in stopped.stderr
    text = out.read_text()
    assert text.endswith("\n")
    lines = [json.loads(line) for line in text.splitlines()]  # every line whole
    assert 2 <= len(lines) < 6, lines
    assert all(line["answer"] == fake.answer and "error" not in line for line in lines)
    assert f"the {len(lines)} done so far are in {out}" in stopped.stderr

    fake.after = 0
    finished = runner.invoke(main, command, obj=Runtime(backend=backend))
    assert finished.exit_code == EXIT_OK, finished.output
    done = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["index"] for line in done] == list(range(6))  # rewritten in item order at the end
    assert sum(line["resumed"] for line in done) >= len(lines)
