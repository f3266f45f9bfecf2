"""A counter window's settle and check, read against a fake engine's /metrics that the test moves by hand.

The fake engines of the session tests update their counters at once; real engines publish them a
moment after the response, their tier counters do not start at zero, and a server can restart or
a connection be closed while a window is open. These tests open and close the windows directly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import httpx2
import pytest
from fake_engine import FakeEngine

from longctx.backends.base import Backend, connect
from longctx.report import CounterCheck
from longctx.store import CounterCheckRecord, CounterSkip, RequestRecord, SessionRecord, Store
from longctx.usage import Usage
from longctx.verification import counters
from longctx.verification.counters import CounterSnapshot, combine_checks, stored_check

URL = "http://windows.test/v1"


def record(cached: int | None, url: str = URL) -> RequestRecord:
    usage = Usage(1000, cached, None, 5, 0.1, 0.2)
    return RequestRecord("r", "s", None, "ask", 0.0, url, "vllm", "fake-model", usage, 1)


def served(fake: FakeEngine) -> Backend:
    return connect(URL, transport=fake.transport())


def one_check(snapshot: CounterSnapshot, *records: RequestRecord) -> CounterCheckRecord:
    checks = snapshot.close("s", None, records).wait(timeout=15)
    assert checks is not None, "the window did not settle"
    (check,) = checks
    return check


def test_a_settle_waits_for_counters_published_after_the_response() -> None:
    """vLLM and SGLang update /metrics a moment after the answer: the settle reads again until it is in."""
    fake = FakeEngine(hits_total=1000)
    with served(fake) as backend:
        snapshot = CounterSnapshot.take(backend)
        late = threading.Timer(0.4, lambda: setattr(fake, "hits_total", 1300))
        late.start()
        check = one_check(snapshot, record(300))
        late.join()
    assert (check.before, check.after, check.reported) == (1000, 1300, 300)
    combined = combine_checks([check])
    assert combined is not None and combined.matches is True and combined.note == ""


def test_a_settle_stops_once_the_counter_is_quiet_when_it_falls_short() -> None:
    """A counter that never reaches what was reported is read until quiet, then checked as a shortfall."""
    fake = FakeEngine(hits_total=50)
    with served(fake) as backend:
        snapshot = CounterSnapshot.take(backend)
        fake.hits_total = 80
        check = one_check(snapshot, record(100))
    assert (check.before, check.after) == (50, 80)
    combined = combine_checks([check])
    assert combined is not None and combined.matches is False and "70 tokens fewer" in combined.note


def test_tier_counters_count_their_growth_over_the_window_not_their_totals() -> None:
    """A server that served host hits before the window: only those in the window are the call's."""
    fake = FakeEngine(tiers="vllm-by-source", block=1, hits_total=5000, host_hits_total=2000)
    with served(fake) as backend:
        snapshot = CounterSnapshot.take(backend)
        fake.hits_total += 700
        fake.host_hits_total += 200
        check = one_check(snapshot, record(700))
    assert check.tier_source == "by_source"
    # Disk and peer hits (external, beyond the host) did not grow: none of the call's.
    assert check.host_tokens == 200 and check.external_tokens == 0
    assert check.loaded_bytes == 200 * fake.bytes_per_token
    combined = combine_checks([check])
    assert combined is not None and combined.matches is True
    assert (combined.host_tokens, combined.external_tokens) == (200, 0)
    assert "host memory" not in combined.note  # counted by the server, not inferred


def test_a_shortfall_with_nothing_loaded_from_the_host_is_reported_not_counted_as_host_hits() -> None:
    """A server counting bytes only: without bytes back from the host, a shortfall is a mismatch."""
    fake = FakeEngine(tiers="vllm-transfers", block=1, hits_total=100, host_hits_total=10)
    with served(fake) as backend:
        snapshot = CounterSnapshot.take(backend)
        fake.hits_total += 60  # the GPU counter grew by 60; the responses say 100; no bytes came back
        check = one_check(snapshot, record(100))
    assert check.tier_source == "transfers" and check.host_tokens == 0 and check.loaded_bytes == 0
    combined = combine_checks([check])
    assert combined is not None and combined.matches is False and "40 tokens fewer" in combined.note


def test_responses_without_cached_token_counts_give_the_server_figure_only() -> None:
    fake = FakeEngine(hits_total=10)
    with served(fake) as backend:
        snapshot = CounterSnapshot.take(backend)
        fake.hits_total = 250
        check = one_check(snapshot, record(None), record(None))
    assert (check.before, check.after, check.reported, check.others_reported) == (10, 250, None, None)
    assert check.requests == 2
    combined = combine_checks([check])
    assert combined is not None and combined.matches is None and combined.server_delta == 240
    assert combined.counter == check.counter == "vllm:prefix_cache_hits_total"
    assert "did not report cached tokens" in combined.note


def test_a_window_whose_server_restarted_gives_no_check_and_a_note_kept_for_a_resume(tmp_path: Path) -> None:
    """Readings of two server processes cannot be compared: no check, and the store keeps why."""
    fake = FakeEngine(hits_total=500)
    store = Store.open(tmp_path / "home")
    store.sessions.create_session(SessionRecord("s", 0.0, "test", "windows", None, None, None))
    with served(fake) as backend:
        snapshot = CounterSnapshot.take(backend)
        fake.started += 60  # another process answers /metrics now
        fake.hits_total = 20
        pending = snapshot.close_into(store, "s", [record(100)])
        pending.wait(timeout=15)
    assert pending.error is None
    assert pending.result is not None and pending.result.matches is None
    assert "another server process" in pending.result.note
    assert store.sessions.counter_checks(["s"]) == []
    [skip] = store.sessions.counter_skips(["s"])
    assert "another server process" in skip.note
    resumed = stored_check(store, ["s"])
    assert resumed is not None and resumed.matches is None and "another server process" in resumed.note
    store.close()


def test_the_counter_is_read_through_an_earlier_connection_when_the_latest_is_closed() -> None:
    """Two calls on one server with connections of their own: one closed, the other still reads."""
    fake = FakeEngine(hits_total=0)
    first, second = served(fake), served(fake)
    snapshots = CounterSnapshot.take(first), CounterSnapshot.take(second)
    fake.hits_total = 90
    second.close()  # its owner closed it before the window settled
    settling = [snapshot.close("s", None, [record(45)]) for snapshot in snapshots]
    checks = [settle.wait(timeout=15) for settle in settling]
    first.close()
    assert all(found is not None and len(found) == 1 for found in checks), checks
    assert {(c.before, c.after) for found in checks for c in found or []} == {(0, 90)}
    assert counters.wait_for_checks(5)


@pytest.mark.parametrize("wait", [0.0, 0.3])
def test_a_call_joining_a_settling_window_is_counted_in_it(wait: float) -> None:
    """A call that joins while the window settles keeps it open: one window, both calls' hits."""
    fake = FakeEngine(hits_total=0)
    with served(fake) as backend:
        early = CounterSnapshot.take(backend)
        fake.hits_total = 40
        first = early.close("s", None, [record(40)])
        threading.Event().wait(wait)
        late = CounterSnapshot.take(backend)
        fake.hits_total = 100
        second = late.close("s", None, [record(60)])
        mine, theirs = first.wait(timeout=15), second.wait(timeout=15)
    assert mine is not None and theirs is not None
    combined = combine_checks([*mine, *theirs])
    assert combined is not None and combined.matches is True and combined.server_delta == 100


def test_host_hits_a_server_counts_in_bytes_only_are_inferred_and_said() -> None:
    fake = FakeEngine(
        tiers="vllm-transfers", block=1, hits_total=100, host_hits_total=10, bytes_per_token=1 << 24
    )
    with served(fake) as backend:
        snapshot = CounterSnapshot.take(backend)
        fake.hits_total += 100
        fake.host_hits_total += 40  # 40 of the 100 came back from the host: 640 MiB
        check = one_check(snapshot, record(100))
    assert (check.host_tokens, check.loaded_bytes) == (40, 40 << 24)
    combined = combine_checks([check])
    assert combined is not None and combined.matches is True and combined.server_delta == 100
    assert combined.note.startswith("40 of the tokens came from host memory (0.62 GiB loaded back")


def test_a_window_where_another_call_reported_no_counts_has_no_expected_figure() -> None:
    mine = CounterCheckRecord("s", None, URL, "c", 0, 100, 60, 1, others_reported=None, window_id="w")
    combined = combine_checks([mine])
    assert combined is not None and combined.matches is None and combined.reported is None


def test_the_stored_check_adds_pending_records_and_keeps_one_calls_only(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "home")
    store.sessions.create_session(SessionRecord("s", 0.0, "test", "windows", None, None, None))
    stored = CounterCheckRecord("s", "b1", URL, "c", 0, 10, 10, 1, window_id="w1")
    store.sessions.record(stored, CounterSkip("s", "no counter check: stored", "b1"))
    pending = CounterCheckRecord("s", "b2", URL, "c", 10, 30, 20, 1, window_id="w2")
    skip = CounterSkip("s", "no counter check: pending", "b2")
    both = stored_check(store, ["s"], pending=([pending], [skip]))
    assert both is not None and (both.server_delta, both.reported) == (30, 30)
    assert "no counter check: stored" in both.note and "no counter check: pending" in both.note
    second = stored_check(store, ["s"], pending=([pending], [skip]), where=lambda r: r.batch_id == "b2")
    assert second is not None and (second.server_delta, second.reported) == (20, 20)
    assert "pending" in second.note and "stored" not in second.note
    store.close()


def test_a_turns_check_is_stored_and_returned_off_the_answers_path(tmp_path: Path) -> None:
    fake = FakeEngine(hits_total=0)
    store = Store.open(tmp_path / "home")
    store.sessions.create_session(SessionRecord("s", 0.0, "test", "windows", None, None, None))
    with served(fake) as backend:
        snapshot = CounterSnapshot.take(backend)
        fake.hits_total = 64
        pending = snapshot.close_into(store, "s", [record(64)])
        result = pending.wait(timeout=15)
        # A call that checked nothing leaves a pending check with no result, at once.
        idle = CounterSnapshot.around(backend, None, enabled=False).close_into(store, "s", [])
    assert result is not None and result.matches is True and result.server_delta == 64
    assert [(c.before, c.after) for c in store.sessions.counter_checks(["s"])] == [(0, 64)]
    assert idle.wait(timeout=0) is None and idle.result is None
    store.close()


def test_a_check_that_fails_to_store_keeps_the_error_and_a_wait_is_bounded(tmp_path: Path) -> None:
    fake = FakeEngine(hits_total=0)
    store = Store.open(tmp_path / "home")
    with served(fake) as backend:
        pending = CounterSnapshot.take(backend).close_into(store, "no such session", [record(0)])
        pending.wait(timeout=15)
    assert pending.error is not None  # the store refused the row: kept, never raised
    release = threading.Event()

    def finish() -> None:
        release.wait(10)

    slow = counters.PendingCheck(finish)
    started = time.monotonic()
    assert slow.wait(timeout=0.05) is None
    assert time.monotonic() - started < 5
    release.set()
    store.close()


def test_a_request_that_fails_over_is_counted_on_the_replica_it_went_to() -> None:
    fakes = {url: FakeEngine(block=1, hits_total=5) for url in ("http://one.test/v1", "http://two.test/v1")}
    routed = httpx2.MockTransport(lambda request: fakes[f"http://{request.url.host}/v1"].handle(request))
    with connect(list(fakes), transport=routed) as backend:
        home = backend.server_for(None).api_url
        away = next(url for url in fakes if url != home)
        snapshot = CounterSnapshot.take(backend)
        snapshot.follow(away)
        snapshot.follow(away)  # joined once
        fakes[away].hits_total += 30
        checks = snapshot.close("s", None, [record(30, away)]).wait(timeout=15)
    assert checks is not None
    by_url = {check.base_url: check for check in checks}
    assert set(by_url) == {home, away}
    assert (by_url[away].before, by_url[away].after, by_url[away].reported) == (5, 35, 30)
    assert by_url[home].reported is None and by_url[home].requests == 0
    # A snapshot that checks nothing follows nowhere.
    quiet = CounterSnapshot()
    quiet.follow(away)
    assert quiet.close("s", None, []).wait(timeout=1) == []


def test_more_hits_than_reported_are_counted_as_the_difference() -> None:
    fake = FakeEngine(hits_total=1000)
    with served(fake) as backend:
        snapshot = CounterSnapshot.take(backend)
        fake.hits_total += 150
        check = one_check(snapshot, record(100))
    combined = combine_checks([check])
    assert combined is not None and combined.matches is False
    assert combined.note.startswith("the server counted 50 tokens more than the responses reported")


def test_notes_are_joined_with_a_semicolon_and_a_notes_only_check_names_no_counter() -> None:
    assert combine_checks([]) is None
    alone = combine_checks([], notes=("no counter check: a", "no counter check: b"))
    assert alone == CounterCheck(
        counter="",
        server_delta=None,
        reported=None,
        matches=None,
        note="no counter check: a; no counter check: b",
    )
    short = CounterCheckRecord("s", None, URL, "c", 0, 10, 30, 1)
    combined = combine_checks([short], notes=("no counter check: b",))
    assert combined is not None and combined.note.endswith("declare the router); no counter check: b")
    # Another call's hits and the host tokens a server counts in bytes: both said.
    shared = CounterCheckRecord(
        "s", None, URL, "c", 0, 60, 60, 1, others_reported=40, window_id="w",
        host_tokens=40, loaded_bytes=40 << 24, tier_source="transfers",
    )  # fmt: skip
    both = combine_checks([shared])
    assert both is not None and both.matches is True
    assert both.note == (
        "40 of the tokens were cached by other calls of this process in the same window; 40 of the tokens"
        " came from host memory (0.62 GiB loaded back; the server counts bytes only, so the tokens are the"
        " responses' cached tokens less its GPU counter)"
    )
    mixed = combine_checks([replace(shared, window_id="w2", tier_source="by_source"), shared])
    assert mixed is not None and mixed.tier_source == "by_source+transfers"


def test_bytes_loaded_without_a_shortfall_are_no_host_hits_and_unknown_counts_infer_none() -> None:
    fake = FakeEngine(tiers="vllm-transfers", block=1, hits_total=100, host_hits_total=10)
    with served(fake) as backend:
        snapshot = CounterSnapshot.take(backend)
        fake.hits_total += 100
        fake.host_hits_total += 5  # bytes came back, but the GPU counter has all the reported hits
        check = one_check(snapshot, record(95))
        unknown = CounterSnapshot.take(backend)
        fake.hits_total += 5
        fake.host_hits_total += 5
        no_counts = one_check(unknown, record(None))
    assert check.host_tokens == 0 and check.loaded_bytes == 5 * fake.bytes_per_token
    assert no_counts.host_tokens is None and no_counts.tier_source == "transfers"
    unknown_check = combine_checks([no_counts])
    assert unknown_check is not None and unknown_check.matches is None
    assert unknown_check.tier_source == "transfers" and unknown_check.loaded_bytes == 5 * fake.bytes_per_token


def test_tier_counters_that_appear_during_the_window_count_from_zero() -> None:
    fake = FakeEngine(block=1, hits_total=100)
    with served(fake) as backend:
        snapshot = CounterSnapshot.take(backend)
        fake.tiers, fake.host_hits_total = "vllm-by-source", 0
        fake.hits_total += 30
        fake.host_hits_total += 10
        check = one_check(snapshot, record(30))
    assert check.tier_source == "by_source" and check.host_tokens == 10


def test_a_check_keeps_its_batch_and_a_restart_after_a_first_reading_still_gives_no_check() -> None:
    fake = FakeEngine(hits_total=0)
    with served(fake) as backend:
        snapshot = CounterSnapshot.take(backend)
        fake.hits_total = 50  # short of the 100 reported: the settle reads on
        restart = threading.Timer(0.3, lambda: setattr(fake, "started", fake.started + 60))
        restart.start()
        settling = snapshot.close("s", "batch-1", [record(100)])
        checks = settling.wait(timeout=15)
        restart.join()
        batch = CounterSnapshot.take(backend)
        fake.hits_total += 20
        [kept] = batch.close("s", "batch-2", [record(20)]).wait(timeout=15) or []
    assert checks == [] and "another server process" in " ".join(settling.notes)
    assert kept.batch_id == "batch-2"


def test_a_wait_of_zero_returns_at_once_while_the_window_is_open() -> None:
    fake = FakeEngine(hits_total=0)
    with served(fake) as backend:
        holder = CounterSnapshot.take(backend)
        settling = CounterSnapshot.take(backend).close("s", None, [record(0)])
        started = time.monotonic()
        assert settling.wait(timeout=0) is None
        assert time.monotonic() - started < 0.5
        holder.close("s", None, [])
        assert settling.wait(timeout=15) is not None


def test_a_window_opens_on_the_replica_that_serves_the_affinity_key() -> None:
    fakes = {url: FakeEngine(block=1) for url in ("http://one.test/v1", "http://two.test/v1")}
    routed = httpx2.MockTransport(lambda request: fakes[f"http://{request.url.host}/v1"].handle(request))
    with connect(list(fakes), transport=routed) as backend:
        default = backend.server_for(None).api_url
        key = next(f"key{n}" for n in range(100) if backend.server_for(f"key{n}").api_url != default)
        url = backend.server_for(key).api_url
        checks = (
            CounterSnapshot.around(backend, key, enabled=True).close("s", None, [record(0, url)]).wait(15)
        )
    assert checks is not None and [check.base_url for check in checks] == [url]


class MetricsHook:
    """A fake engine whose next /metrics reads run ``actions`` first, one per read, answering as before it."""

    def __init__(self, fake: FakeEngine) -> None:
        self.fake = fake
        self.actions: list[Callable[[], None]] = []

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/metrics" and self.actions:
            answer = self.fake.handle(request)  # what the server says now...
            self.actions.pop(0)()  # ...then it moves on
            return answer
        return self.fake.handle(request)

    def connect(self) -> Backend:
        return connect(URL, transport=httpx2.MockTransport(self.handle))


def test_a_counter_that_moves_after_the_first_read_is_read_again_when_counts_are_unknown() -> None:
    """No cached-token counts: nothing to expect, so the settle waits for a quiet counter, not one read."""
    hook = MetricsHook(FakeEngine(hits_total=100))
    with hook.connect() as backend:
        snapshot = CounterSnapshot.take(backend)
        hook.actions.append(lambda: setattr(hook.fake, "hits_total", 180))
        check = one_check(snapshot, record(None))
    assert (check.before, check.after) == (100, 180)


def test_a_call_that_joins_and_leaves_while_the_settle_reads_is_waited_for() -> None:
    """The settle's read missed the other call's hits: it reads again until they are in."""
    hook = MetricsHook(FakeEngine(hits_total=100))
    with hook.connect() as backend, hook.connect() as other:
        snapshot = CounterSnapshot.take(backend)
        hook.fake.hits_total = 130
        results: list[list[CounterCheckRecord] | None] = []

        def another_call() -> None:
            # Joins the open period (no read), leaves with 20 reported, and its hits land.
            joined = CounterSnapshot.take(other)
            results.append(joined.close("s", None, [record(20)]).wait(timeout=0))
            hook.fake.hits_total = 150

        hook.actions.append(another_call)
        check = one_check(snapshot, record(30))
    assert (check.before, check.after, check.reported, check.others_reported) == (100, 150, 30, 20)
    assert counters.wait_for_checks(5)


def test_a_call_without_counts_in_a_shared_window_leaves_the_others_figure_unknown() -> None:
    fake = FakeEngine(hits_total=0)
    with served(fake) as first, served(fake) as second:
        silent, counted = CounterSnapshot.take(first), CounterSnapshot.take(second)
        fake.hits_total = 50
        silent_settling = silent.close("s", None, [record(None)])
        [check] = counted.close("s", None, [record(50)]).wait(timeout=15) or []
        silent_settling.wait(timeout=15)
    assert check.reported == 50 and check.others_reported is None
    combined = combine_checks([check])
    assert combined is not None and combined.matches is None


def test_a_server_that_stops_answering_metrics_gives_no_check_and_says_so() -> None:
    fake = FakeEngine(hits_total=10)
    with served(fake) as backend:
        snapshot = CounterSnapshot.take(backend)
        fake.engine = "generic"  # /metrics is gone
        settling = snapshot.close("s", None, [record(10)])
        checks = settling.wait(timeout=15)
    assert checks == []
    assert any("could not be read after the window" in note for note in settling.notes)


def test_a_call_that_joins_during_the_settles_last_read_settles_the_window_when_it_leaves() -> None:
    hook = MetricsHook(FakeEngine(hits_total=0))
    with hook.connect() as backend, hook.connect() as other:
        snapshot = CounterSnapshot.take(backend)
        hook.fake.hits_total = 10
        joined: list[CounterSnapshot] = []
        hook.actions.append(lambda: joined.append(CounterSnapshot.take(other)))
        first = snapshot.close("s", None, [record(10)])
        assert first.wait(timeout=0.5) is None  # the window is open again
        hook.fake.hits_total = 25
        second = joined[0].close("s", None, [record(15)])
        mine, theirs = first.wait(timeout=15), second.wait(timeout=15)
    assert mine is not None and theirs is not None
    combined = combine_checks([*mine, *theirs])
    assert combined is not None and combined.matches is True and combined.server_delta == 25


def test_a_settle_reads_only_the_replica_of_its_window() -> None:
    fakes = {url: FakeEngine(block=1) for url in ("http://one.test/v1", "http://two.test/v1")}
    reads: list[str] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/metrics":
            reads.append(request.url.host)
        return fakes[f"http://{request.url.host}/v1"].handle(request)

    with connect(list(fakes), transport=httpx2.MockTransport(handle)) as backend:
        home = backend.server_for(None).api_url
        reads.clear()
        snapshot = CounterSnapshot.take(backend)
        checks = snapshot.close("s", None, [record(0, home)]).wait(timeout=15)
    assert checks is not None and len(checks) == 1
    assert set(reads) == {home.split("/")[2]}


def test_a_snapshot_is_closed_once() -> None:
    fake = FakeEngine(hits_total=0)
    with served(fake) as backend:
        snapshot = CounterSnapshot.take(backend)
        assert snapshot.close("s", None, []).wait(timeout=15) is not None
        with pytest.raises(RuntimeError, match=r"^a counter snapshot is closed once$"):
            snapshot.close("s", None, [])


def test_requests_answered_by_a_replica_the_call_could_not_read_are_named() -> None:
    fake = FakeEngine(hits_total=0)
    with served(fake) as backend:
        snapshot = CounterSnapshot.take(backend)
        settling = snapshot.close("s", None, [record(0), record(5, "http://elsewhere.test/v1")])
        assert settling.wait(timeout=15) is not None
    assert (
        "no counter check: 1 request(s) answered by http://elsewhere.test/v1, whose counter this call"
        " could not read" in settling.notes
    )


def test_a_call_joining_an_open_window_reads_no_counter_and_either_connection_reads_it_after() -> None:
    reads: list[str] = []
    fake = FakeEngine(hits_total=0)

    def handle(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/metrics":
            reads.append(request.url.host)
        return fake.handle(request)

    first = connect(URL, transport=httpx2.MockTransport(handle))
    second = connect(URL, transport=httpx2.MockTransport(handle))
    reads.clear()
    snapshots = CounterSnapshot.take(first), CounterSnapshot.take(second)
    assert len(reads) == 1  # the window was open: the second call joined it without a read
    fake.hits_total = 40
    first.close()  # the first call's owner closed its connection: the second's reads the counter
    settling = [snapshot.close("s", None, [record(20)]) for snapshot in snapshots]
    checks = [settle.wait(timeout=15) for settle in settling]
    second.close()
    assert all(found is not None and [(c.before, c.after) for c in found] == [(0, 40)] for found in checks)


def test_a_call_opening_the_window_while_another_reads_the_counter_joins_it() -> None:
    """Two calls start at once: the second to finish its first read joins the window the first opened."""
    hook = MetricsHook(FakeEngine(hits_total=0))
    with hook.connect() as backend, hook.connect() as other:
        opened: list[CounterSnapshot] = []
        hook.actions.append(lambda: opened.append(CounterSnapshot.take(other)))
        late = CounterSnapshot.take(backend)  # its read lets the other call open the window first
        hook.fake.hits_total = 30
        first = opened[0].close("s", None, [record(10)])
        second = late.close("s", None, [record(20)])
        mine, theirs = first.wait(timeout=15), second.wait(timeout=15)
    assert mine is not None and theirs is not None, (
        "a call's leaving was not counted: the window never settled"
    )
    assert {c.window_id for c in [*mine, *theirs]} == {mine[0].window_id}
    combined = combine_checks([*mine, *theirs])
    assert combined is not None and combined.matches is True and combined.server_delta == 30
