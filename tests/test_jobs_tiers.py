"""Jobs with a host tier: revisits go cheapest tier first; the GPU alone bounds what is in flight."""

from __future__ import annotations

from pathlib import Path

from fake_engine import FakeEngine
from test_jobs import make_repos, prefix_of

from longctx import Job, JobItem, JobOptions, JobProgress
from longctx.backends.base import connect
from longctx.jobs.residency import Residency
from longctx.process_state import PROCESS
from longctx.store import Store

URL = "http://tiers-job.test/v1"


def test_residency_walks_the_packs_sent_from_the_most_recent() -> None:
    residency = Residency()
    for key in ("a", "b", "c", "d"):
        residency.touch(URL, key, 100)
    tiers = {URL: (150, 300)}
    assert residency.where("d", tiers) == ("device", URL)
    # c and b: 200 and 300 tokens sent since they began, within the host's 300 (inclusive tier).
    assert residency.where("c", tiers) == ("host", URL)
    assert residency.where("b", tiers) == ("host", URL)
    assert residency.where("a", tiers) == ("cold", None)
    # Unknown GPU size: only the last pack counts as held; no host tier: the rest are gone.
    assert residency.where("d", {URL: (None, None)})[0] == "device"
    assert residency.where("c", {URL: (None, None)})[0] == "cold"
    # A pack seen again becomes the most recent.
    residency.touch(URL, "a", 100)
    assert residency.where("a", tiers)[0] == "device" and residency.where("b", tiers)[0] == "cold"
    # A replica the job does not use is not looked at.
    assert residency.where("a", {"http://other/v1": (10**9, 10**9)}) == ("cold", None)


def test_a_second_job_visits_the_gpu_then_the_host_then_the_cold_packs(tmp_path: Path) -> None:
    PROCESS.get(Residency).forget()
    fake = FakeEngine(engine="generic", block=1)
    store = Store.open(tmp_path / "store")
    repos = make_repos(tmp_path, 4)
    first = [JobItem((str(repo),), f"first question about {repo.name}?") for repo in repos]
    Job(first, backend=connect(URL, transport=fake.transport()), store=store,
        options=JobOptions(packs_in_flight=1)).run()  # fmt: skip
    (seen,) = PROCESS.get(Residency).sent().values()
    sizes = {str(key[0]).rsplit("/", 1)[-1]: tokens for key, tokens in seen}
    assert list(sizes) == ["repo0", "repo1", "repo2", "repo3"]
    # The GPU holds the last pack; the host the last three: repo0 is gone.
    gpu = sizes["repo3"] + 10
    host = sizes["repo3"] + sizes["repo2"] + sizes["repo1"]

    fake.prompts.clear()
    fake.salts.clear()
    in_flight: list[int] = []
    second = [JobItem((str(repo),), f"second question about {repo.name}?") for repo in repos]
    report = Job(
        second,
        backend=connect(URL, transport=fake.transport()),
        store=store,
        options=JobOptions(kv_tokens=gpu, kv_share=1.0, host_kv_tokens=host, packs_in_flight=4),
        on_progress=lambda progress: in_flight.append(progress.in_flight),
    ).run()
    assert all(result.ok for result in report.results)
    order = [prefix_of(prompt) for prompt in fake.prompts]
    # The GPU's pack, then the host's two (as they are read), then the cold one.
    assert order[0] == "repo3" and sorted(order[1:3]) == ["repo1", "repo2"] and order[3] == "repo0"
    assert report.packs_by_tier == {"device": 1, "host": 2, "cold": 1}
    assert "3 packs revisited first (1 likely on a GPU, 2 on a host tier)" in report.summary_line()
    # The host tier adds no room: the GPU holds one pack, so one is in flight at a time.
    assert max(in_flight) == 1
    # Results stay in item order whatever the visiting order.
    assert [result.item for result in report.results] == second


def test_without_anything_seen_the_input_order_is_kept(tmp_path: Path) -> None:
    PROCESS.get(Residency).forget()
    fake = FakeEngine(engine="generic", block=1)
    repos = make_repos(tmp_path, 3)
    items = [JobItem((str(repo),), f"q about {repo.name}?") for repo in reversed(repos)]
    messages: list[str] = []

    def heard(progress: JobProgress) -> None:
        messages.append(progress.message)

    report = Job(items, backend=connect(URL, transport=fake.transport()), store=Store.open(tmp_path / "s"),
                 options=JobOptions(packs_in_flight=1), on_progress=heard).run()  # fmt: skip
    assert [prefix_of(prompt) for prompt in fake.prompts] == ["repo2", "repo1", "repo0"]
    assert report.packs_by_tier == {"cold": 3}
    assert not any("revisits first" in message for message in messages)
