"""Counter checks of calls that overlap in one process: one shared window, counted once, exact."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from fake_engine import FakeEngine, Fault

from longctx.backends.base import Backend, connect
from longctx.errors import LongctxError
from longctx.sessions import Session, resume
from longctx.store import Store, StoredPack
from longctx.verification import counters

URL = "http://counters.test/v1"
PACK = StoredPack(
    fingerprint="c" * 64,
    format_version="test/1",
    system="You answer questions about the documents.",
    prefix="<documents>\n" + "the quick brown fox\n" * 300 + "</documents>\n\n",
    summary={"title": "fixture"},
)
HELD = "a question the server holds"


class HoldingServer:
    """A fake engine that holds the request asking :data:`HELD` until :attr:`release` is set."""

    def __init__(self) -> None:
        self.fake = FakeEngine(block=1)
        self.release = threading.Event()
        self.holding = threading.Event()

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/chat/completions") and HELD in request.content.decode():
            self.holding.set()
            assert self.release.wait(timeout=30), "the test never released the held request"
        return self.fake.handle(request)

    def connect(self) -> Backend:
        """A connection of its own (as each source of an MCP server has), to the same URL."""
        return connect(URL, transport=httpx2.MockTransport(self.handle))


@pytest.fixture
def server() -> Iterator[HoldingServer]:
    held = HoldingServer()
    yield held
    held.release.set()


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "home")


def held_ask(session: Session) -> threading.Thread:
    """Ask :data:`HELD` on a thread; the server holds it until released."""
    thread = threading.Thread(target=session.ask, args=(HELD,))
    thread.start()
    return thread


def test_sessions_asking_one_server_at_once_each_match_its_counter(
    server: HoldingServer, store: Store
) -> None:
    """Two sessions, two connections, one server: each call counts in the other's window.

    A's request is in flight through all of B's turns, so the server's
    counter over A's window grows by B's hits too. Checked alone, A's turn
    mismatched (the MCP server's concurrent tool calls failed this way on CI).
    """
    first, second = Session(server.connect(), PACK, store=store), Session(server.connect(), PACK, store=store)
    second.ask("warm the prefix?")  # B's pack is in the cache: its next turns hit it
    assert counters.wait_for_checks(10)
    thread = held_ask(first)
    assert server.holding.wait(10)
    second.ask("one?")
    second.ask("two?")
    server.release.set()
    thread.join(10)

    mine, theirs = first.report().counter_check, second.report().counter_check
    assert mine is not None and theirs is not None
    assert mine.matches is True and theirs.matches is True, (mine, theirs)
    # A's window held B's two turns: their hits are in its counter growth, named as others'.
    assert mine.others_reported > 0 and mine.server_delta == mine.reported + mine.others_reported
    assert "other calls of this process" in mine.note
    assert f"grew by {mine.server_delta:,}: matches (" in " ".join(first.report().to_text().split())
    # Stored as one window: A's and B's rows of it share its id and its readings.
    (stored,) = store.sessions.counter_checks([first.id])
    shared = [
        check for check in store.sessions.counter_checks([second.id]) if check.window_id == stored.window_id
    ]
    assert len(shared) == 2 and {(c.before, c.after) for c in shared} == {(stored.before, stored.after)}
    # Across both sessions the window's growth counts once and matches all that was reported.
    both = counters.combine_checks(
        [*store.sessions.counter_checks([first.id]), *store.sessions.counter_checks([second.id])]
    )
    assert both is not None and both.matches and both.others_reported == 0
    assert both.server_delta == both.reported == server.fake.hits_total > 0


def test_a_call_that_fails_leaves_its_window(server: HoldingServer, store: Store) -> None:
    """A request that raises closes its window: later checks still settle, and match."""
    session = Session(server.connect(), PACK, store=store)
    session.ask("first?")
    server.fake.faults.append(Fault(status=400, body={"error": "bad request"}))
    with pytest.raises(LongctxError):
        session.ask("refused?")
    session.ask("after?")
    assert counters.wait_for_checks(10), "a failed call's window stayed open: no check can settle"
    check = session.report().counter_check
    assert check is not None and check.matches is True, check


def test_a_batch_returns_without_its_check_while_another_call_holds_the_window(
    server: HoldingServer, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch's answers do not wait for another session's call; the session's report has the check."""
    monkeypatch.setattr(counters, "BATCH_CHECK_SECONDS", 0.3)
    holder, batcher = (
        Session(server.connect(), PACK, store=store),
        Session(server.connect(), PACK, store=store),
    )
    thread = held_ask(holder)
    assert server.holding.wait(10)
    batch = batcher.ask_many(["x?", "y?"])
    assert len(batch.answers) == 2
    check = batch.report.counter_check
    assert check is not None and check.matches is None and "still running" in check.note, check
    assert check.counter == "vllm:prefix_cache_hits_total"
    server.release.set()
    thread.join(10)
    settled = batcher.report().counter_check
    assert settled is not None and settled.matches is True, settled
    assert len(store.sessions.counter_checks([batcher.id, *batcher.branch_ids()])) == 1


class OtherClient:
    """A fake engine that another client (another process) also asks, once during each call of the session.

    Its request shares the session's pack, so the server's hit counter
    grows by more than the session's responses reported: the soak's false
    alarm, many processes on one replica.
    """

    def __init__(self, engine: str, *, count_queries: bool = True) -> None:
        self.fake = FakeEngine(engine=engine, block=1)
        self.count_queries = count_queries
        self.asked = 0
        self.unseen = 0  # the other process's prompt tokens, as the server counted them

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/metrics" and not self.count_queries:
            # An engine without a query counter: the line is not there.
            text = self.fake.handle(request).text
            kept = [line for line in text.splitlines(keepends=True) if "queries" not in line]
            return httpx2.Response(200, text="".join(kept))
        response = self.fake.handle(request)
        if request.url.path.endswith("/chat/completions"):
            messages = json.loads(request.content)["messages"]
            other = [*messages[:-1], {"role": "user", "content": "another process's question?"}]
            before = self.fake.queries_total
            self.fake.handle(httpx2.Request("POST", f"{URL}/chat/completions", json={"messages": other}))
            self.asked, self.unseen = self.asked + 1, self.unseen + self.fake.queries_total - before
        return response


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_another_processs_requests_in_the_window_skip_the_check_and_say_why(
    engine: str, store: Store
) -> None:
    """The query counter grew by more prompt tokens than this process sent: no check, a stored note.

    The other process's request reads the session's pack from the cache:
    without the query counter its hits would read as "counted N more".
    """
    server = OtherClient(engine)
    session = Session(connect(URL, transport=httpx2.MockTransport(server.handle)), PACK, store=store)
    session.ask("one?")
    assert counters.wait_for_checks(10) and server.asked == 1
    check = session.report().counter_check
    assert check is not None and check.matches is None, check
    assert f"no counter check on {URL}: other clients' requests reached it in the window" in check.note
    assert f"({server.unseen:,} prompt tokens this process did not send" in check.note, check.note
    assert store.sessions.counter_checks([session.id]) == []
    (skip,) = store.sessions.counter_skips([session.id])
    assert skip.note in check.note
    # A resumed session's report says it too.
    resumed = resume(session.id, store=store).report().counter_check
    assert resumed is not None and resumed.matches is None and "other clients' requests" in resumed.note


def test_a_window_waits_for_the_server_to_count_its_own_prompts_not_only_enough_hits(store: Store) -> None:
    """Another client's hits can reach the expected count before the server publishes this call's request.

    Engines publish a request's counts a moment after its response. Here
    the other client's request is counted at once and the session's only at
    the second reading after it: read then, the other's shorter prompt
    looked like no more than the session sent, and its hits like a mismatch.
    """
    fake = FakeEngine(block=1)
    hidden: list[tuple[int, int]] = []  # the session's last request's hits and queries, not published yet
    reads_after = [0]
    other_on = [False]

    def handle(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/metrics" and hidden:
            reads_after[0] += 1
            if reads_after[0] == 2:
                hits, queries = hidden.pop()
                fake.hits_total, fake.queries_total = fake.hits_total + hits, fake.queries_total + queries
        if not (other_on[0] and request.url.path.endswith("/chat/completions")):
            return fake.handle(request)
        hits, queries = fake.hits_total, fake.queries_total
        response = fake.handle(request)
        hidden.append((fake.hits_total - hits, fake.queries_total - queries))
        fake.hits_total, fake.queries_total = hits, queries
        messages = json.loads(request.content)["messages"]
        other = [*messages[:-1], {"role": "user", "content": "other?"}]
        fake.handle(httpx2.Request("POST", f"{URL}/chat/completions", json={"messages": other}))
        return response

    session = Session(connect(URL, transport=httpx2.MockTransport(handle)), PACK, store=store)
    session.ask("warm the prefix?")
    session.report()  # its window has settled: the next turn opens one of its own
    other_on[0] = True
    session.ask("a question much longer than the other client's, " * 4)
    check = session.report().counter_check
    assert reads_after[0] >= 2 and not hidden, (
        "the window ended before the server counted the session's request"
    )
    assert check is not None and check.matches is True, check  # the first turn's
    assert "other clients' requests reached it in the window" in check.note, check.note
    assert len(store.sessions.counter_checks([session.id])) == 1


def test_without_a_query_counter_another_processs_hits_are_still_a_mismatch(store: Store) -> None:
    """Where the engine counts no queries nothing tells the traffic apart: the check says "more", and why."""
    server = OtherClient("vllm", count_queries=False)
    session = Session(connect(URL, transport=httpx2.MockTransport(server.handle)), PACK, store=store)
    session.ask("warm the prefix?")
    session.ask("one?")
    check = session.report().counter_check
    assert check is not None and check.matches is False and check.reported is not None, check
    assert check.server_delta == server.fake.hits_total > check.reported
    assert f"{check.server_delta - check.reported:,} tokens more" in check.note
    assert "other clients' traffic" in check.note


def test_a_window_over_every_replica_reads_each_counter_once() -> None:
    """A job's window (take_all) reads each replica's /metrics once when it opens, not twice."""
    fakes = {url: FakeEngine(block=1) for url in ("http://one.test/v1", "http://two.test/v1")}
    metrics: list[str] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/metrics":
            metrics.append(request.url.host)
        return fakes[f"http://{request.url.host}/v1"].handle(request)

    with connect(list(fakes), transport=httpx2.MockTransport(handle)) as backend:
        metrics.clear()  # discovery reads /metrics too
        snapshot = counters.CounterSnapshot.take_all(backend)
        assert sorted(metrics) == ["one.test", "two.test"]
        checks = snapshot.close("job", None, []).wait(timeout=10)
    assert checks is not None and {check.base_url for check in checks} == set(fakes)


LEFT_OPEN = """
import counter_settling
from fake_engine import FakeEngine

from longctx.backends.base import connect
from longctx.verification.counters import CounterSnapshot


def test_leaves_its_counter_window_open(monkeypatch):
    monkeypatch.setattr(counter_settling, "SETTLE_SECONDS", 0.3)
    backend = connect("http://left-open.test/v1", transport=FakeEngine(block=1).transport())
    CounterSnapshot.take(backend)  # never closed: its window can never settle


def test_closes_its_counter_window():
    backend = connect("http://closed.test/v1", transport=FakeEngine(block=1).transport())
    with CounterSnapshot.take(backend):
        pass
"""


def test_a_test_whose_counter_checks_do_not_settle_fails_at_teardown(pytester: pytest.Pytester) -> None:
    """The shared teardown fails the test that left a window open, with why, in its bound; not the next."""
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text(encoding="utf-8"))
    pytester.makepyfile(test_left_open=LEFT_OPEN)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--timeout=60")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        ["*ERROR at teardown of test_leaves_its_counter_window_open*", "*did not settle within 0.3 s*"]
    )
    assert result.duration < 30


def test_one_prompt_token_more_than_this_process_sent_is_other_traffic(store: Store) -> None:
    """The boundary: a counter read early grows by less, so any growth past what was sent is another's."""
    fake = FakeEngine(engine="vllm", block=1)

    def handle(request: httpx2.Request) -> httpx2.Response:
        response = fake.handle(request)
        if request.url.path.endswith("/chat/completions"):
            fake.queries_total += 1  # another process's one-token prompt, counted in the window
        return response

    session = Session(connect(URL, transport=httpx2.MockTransport(handle)), PACK, store=store)
    session.ask("one?")
    assert counters.wait_for_checks(10)
    check = session.report().counter_check
    assert check is not None and check.matches is None, check
    assert "(1 prompt tokens this process did not send" in check.note, check.note


def test_a_response_without_its_prompt_tokens_cannot_tell_other_traffic_and_is_still_checked(
    store: Store,
) -> None:
    fake = FakeEngine(engine="vllm", block=1)

    def handle(request: httpx2.Request) -> httpx2.Response:
        response = fake.handle(request)
        if not request.url.path.endswith("/chat/completions"):
            return response
        events = []
        for sent in response.text.splitlines():
            line = sent
            if sent.startswith("data: {"):
                event = json.loads(sent[len("data: ") :])
                if event.get("usage"):
                    event["usage"].pop("prompt_tokens")
                line = f"data: {json.dumps(event)}"
            events.append(line)
        return httpx2.Response(
            200, text="\n".join(events) + "\n", headers={"content-type": "text/event-stream"}
        )

    session = Session(connect(URL, transport=httpx2.MockTransport(handle)), PACK, store=store)
    session.ask("one?")
    assert counters.wait_for_checks(10)
    check = session.report().counter_check
    assert check is not None and check.matches is True, check
    assert "other clients' requests" not in (check.note or "")
