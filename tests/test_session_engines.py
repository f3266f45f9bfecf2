"""Sessions against the real vLLM and SGLang servers: caching, counters, faults, crashes."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from corpus_fixtures import committed_repo, make_pdf
from engine_helpers import common_prefix_length, tokenize_messages
from fault_proxy import FaultProxy

from longctx.backends.base import Backend, connect
from longctx.errors import ContextOverflow
from longctx.options.groups import CorpusOptions, RequestOptions, ServerOptions
from longctx.packing import Budget, build_shards
from longctx.retry import RetryPolicy
from longctx.serving.doctor import diagnose
from longctx.sessions import DocSession, RepoSession, Session, ShardedSession
from longctx.sessions.answers import Answer, Batch, history_form
from longctx.sessions.reuse import answer_reuse
from longctx.sources.corpus import load_corpus
from longctx.store import Store, StoredPack
from longctx.testing import LocalServer, TinyModel

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def text_pack(chars: int = 20_000) -> StoredPack:
    """A pack-shaped prefix of standard-library text, unique per call (cold first request).

    20,000 characters are about 5,000 tokens: past SGLang's 4,096-token prefill chunk and many of
    vLLM's 128-token blocks, which is all the cache tests need; 40,000 proved nothing more and cost
    the prefills twice.
    """
    body = (STDLIB / "argparse.py").read_text()[:chars]
    nonce = uuid.uuid4().hex
    return StoredPack(
        fingerprint=nonce + nonce,
        format_version="test/1",
        system=f"Answer questions about the documents. [{nonce}]",
        prefix=f"<documents>\n{body}\n</documents>\n\n",
        summary={"title": "stdlib text"},
    )


def block_round(tokens: int, block: int | None) -> int:
    block = block or 1
    return tokens - tokens % block


@pytest.fixture
def backend(engine_server: LocalServer) -> Iterator[Backend]:
    backend = connect(engine_server.api_base)
    yield backend
    backend.close()


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(tmp_path / "home")


def make_repository(
    root: Path, names: Sequence[str] = ("argparse.py", "dataclasses.py", "typing.py")
) -> Path:
    """A git repository of standard-library files, with a nonce so its pack is new to the server."""
    files = {name: (STDLIB / name).read_text() for name in names}
    return committed_repo(root, {**files, "README.md": f"# fixture {uuid.uuid4()}\n"}, message="fixture")


def test_ask_many_reads_the_shared_prefix_from_the_cache(
    engine_server: LocalServer, tiny_model: TinyModel, backend: Backend, store: Store, tmp_path: Path
) -> None:
    # textwrap.py: about 5.6k tokens, past the 4,096 asked for (two of SGLang's prefill chunks).
    # Size costs here: eight siblings decode over the whole prefix (functools.py's 10k tokens took
    # SGLang's CPU build 9.7 s, dataclasses.py's 17k 22 s).
    repository = make_repository(tmp_path / "repo", ("textwrap.py",))
    session = RepoSession(
        repository, backend=backend, store=store, request=RequestOptions(max_tokens=8, concurrency=8)
    )
    assert session.full_pack.prefix_tokens is not None and session.full_pack.prefix_tokens >= 4096
    assert not session.full_pack.estimated
    questions = [f"Question {i}: what does part {i} do?" for i in range(8)]
    shared = common_prefix_length(
        tokenize_messages(engine_server, tiny_model, session.messages(questions[0])),
        tokenize_messages(engine_server, tiny_model, session.messages(questions[1])),
    )
    assert shared >= 4096
    batch = session.ask_many(questions)
    block = backend.info.cache_block_tokens
    theoretical = 7 * block_round(shared, block)
    cached = batch.report.cached_tokens
    assert cached is not None
    assert cached >= 0.99 * theoretical, f"{cached} cached of {theoretical} possible (block {block})"
    assert batch.report.counter_check is not None
    assert batch.report.counter_check.matches, batch.report.counter_check
    # The profile's tier metric (vLLM 0.32's hits by source, SGLang's cache_source label) is there.
    reading = backend.counters()[backend.info.api_url]
    assert reading is not None and reading.by_source is not None, reading
    assert reading.by_source.get("device", 0) > 0, reading


@pytest.mark.parametrize("dispatch", ["together", "lead", "admitted"])
def test_every_dispatch_caches_the_prefix_for_a_batch_larger_than_its_concurrency(
    engine_server: LocalServer, tiny_model: TinyModel, backend: Backend, store: Store, dispatch: str
) -> None:
    """Seven siblings, three in flight: the refill keeps the prefix cached for the last ones too."""
    session = Session(
        backend, text_pack(), store=store,
        request=RequestOptions(max_tokens=8, concurrency=3, dispatch=dispatch),
    )  # fmt: skip
    questions = [f"Question {i}: what does part {i} do?" for i in range(7)]
    shared = common_prefix_length(
        tokenize_messages(engine_server, tiny_model, session.messages(questions[0])),
        tokenize_messages(engine_server, tiny_model, session.messages(questions[1])),
    )
    batch = session.ask_many(questions)
    assert batch.report.dispatch is not None and batch.report.dispatch.startswith(f"{dispatch}, up to 3 ")
    reachable = block_round(shared, backend.info.cache_block_tokens)
    followers = sorted(answer.usage.cached_tokens or 0 for answer in batch)[1:]
    if engine_server.name == "sglang" and dispatch == "together":
        # Measured: SGLang's siblings sent with the lead read only the lead's prefilled chunks
        # (8,192 of a 10,004-token pack) and prefill the rest again, which is why auto does not pick
        # together there. The refills, sent once a slot frees, still read the whole prefix.
        refills = len(questions) - 3
        assert all(cached >= reachable for cached in followers[-refills:]), (followers, reachable)
    else:
        assert all(cached >= reachable for cached in followers), (followers, reachable)
    assert batch.report.counter_check is not None and batch.report.counter_check.matches


def test_each_turn_reuses_the_whole_previous_prompt(backend: Backend, store: Store) -> None:
    session = Session(backend, text_pack(), store=store, request=RequestOptions(max_tokens=16))
    answers = [session.ask(f"Turn {i}: tell me more.") for i in range(5)]
    block = backend.info.cache_block_tokens
    for previous, answer in itertools.pairwise(answers):
        assert previous.usage.prompt_tokens is not None and answer.usage.cached_tokens is not None
        reachable = block_round(previous.usage.prompt_tokens, block)
        assert answer.usage.cached_tokens >= 0.99 * reachable, (answer.usage, previous.usage)
    report = session.report()
    assert report.counter_check is not None and report.counter_check.matches, report.counter_check
    assert report.counter_check.server_delta == report.cached_tokens
    assert report.prefill_seconds_saved is not None and report.prefill_seconds_saved > 0


def test_async_turns_and_siblings_read_the_cache_and_async_with_closes_their_connections(
    engine_server: LocalServer, store: Store
) -> None:
    """The async driver on a real engine, in a session that made its own connection (``async with``)."""

    async def conversation() -> tuple[Backend, list[Answer], Batch]:
        async with Session(
            pack=text_pack(20_000), server=ServerOptions(engine_server.api_base), store=store,
            request=RequestOptions(max_tokens=8),
        ) as session:  # fmt: skip
            turns = [await session.aask(f"Turn {i}: what is this about?") for i in range(2)]
            batch = await session.aask_many([f"Question {i}: what does part {i} do?" for i in range(3)])
            return session.backend, turns, batch

    backend, (first, second), batch = asyncio.run(conversation())
    block = backend.info.cache_block_tokens
    assert first.usage.prompt_tokens is not None and second.usage.cached_tokens is not None
    assert second.usage.cached_tokens >= 0.99 * block_round(first.usage.prompt_tokens, block), second.usage
    # The siblings share the whole history: each reads at least the second turn's prompt from the cache.
    assert second.usage.prompt_tokens is not None
    for answer in batch.answers:
        assert answer.usage.cached_tokens is not None
        assert answer.usage.cached_tokens >= 0.99 * block_round(second.usage.prompt_tokens, block)
    assert batch.report.counter_check is not None and batch.report.counter_check.matches
    assert backend.is_closed  # the async client's connections too, on the loop that opened them


def test_after_a_commit_to_the_oldest_file_the_layered_pack_is_read_from_the_cache(
    backend: Backend, store: Store, tmp_path: Path
) -> None:
    # Three small files (about 5.5k tokens): the layering needs a file before the tail, not size,
    # and the plain pack's cached header must stay under a tenth of what the layers keep.
    repository = make_repository(tmp_path / "repo", ("bisect.py", "fnmatch.py", "shlex.py"))
    before = RepoSession(repository, backend=backend, store=store, request=RequestOptions(max_tokens=4))
    before.ask("What does the text wrapper do?")
    old = before.full_pack
    assert old.prefix_tokens is not None
    # Everything before the listing: what a commit that only changes the tail keeps.
    kept = sum(section.tokens or 0 for section in old.sections[:-2])
    # README.md sorts first (one commit, ties by path): the plain order loses all after the header.
    assert old.documents[0].path == "README.md"
    readme = repository / "README.md"
    readme.write_text(readme.read_text() + "One more line.\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(repository)]
    subprocess.run([*git, "commit", "-qam", "edit the oldest file"], check=True)

    layered = RepoSession(repository, backend=backend, store=store, request=RequestOptions(max_tokens=4))
    answer = layered.ask("And the heap queue?")
    plain = RepoSession(
        repository,
        backend=backend,
        store=store,
        corpus=CorpusOptions(max_stale_share=0),
        request=RequestOptions(max_tokens=4),
    )
    plain_answer = plain.ask("And the heap queue, without layers?")

    assert any(section.name == "earlier:README.md" for section in layered.full_pack.sections)
    block = backend.info.cache_block_tokens
    assert answer.usage.cached_tokens is not None and plain_answer.usage.cached_tokens is not None
    assert answer.usage.cached_tokens >= 0.99 * block_round(kept, block), (answer.usage, kept)
    # The plain pack moved README.md to the end: no more than the header, the opening, the old
    # README's section and a fence line's tokens of the next one were still cached.
    opening = sum(section.tokens or 0 for section in old.sections[:3])
    assert plain_answer.usage.cached_tokens <= opening + 64, (plain_answer.usage, opening)
    assert plain_answer.usage.cached_tokens < 0.2 * answer.usage.cached_tokens, plain_answer.usage


def test_a_second_doc_session_over_the_same_pdfs_reads_their_text_from_the_store(
    backend: Backend, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pypdf

    folder = tmp_path / "papers"
    folder.mkdir()
    (folder / "report.pdf").write_bytes(make_pdf([f"Findings {uuid.uuid4()}", "The cache holds prefixes."]))
    (folder / "memo.pdf").write_bytes(make_pdf(["Prefill is the cost of long prompts."]))
    first = DocSession(folder, backend=backend, store=store, request=RequestOptions(max_tokens=8))
    # Sessions read their files on first use: this one reads (and parses) them now.
    assert len(first.full_pack.documents) == 2

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("pypdf parsed a PDF whose text the store keeps")

    monkeypatch.setattr(pypdf, "PdfReader", refuse)
    second = DocSession(folder, backend=backend, store=store, request=RequestOptions(max_tokens=8))

    assert second.full_pack.fingerprint == first.full_pack.fingerprint
    answer = second.ask("What is the cost of long prompts?")
    assert answer.text and (answer.usage.prompt_tokens or 0) > 0


def test_a_cache_salt_keeps_sessions_apart(backend: Backend, store: Store) -> None:
    pack = text_pack()
    Session(backend, pack, store=store, request=RequestOptions(max_tokens=4)).ask("warm the prefix")
    salted = Session(
        backend, pack, store=store, request=RequestOptions(max_tokens=4, cache_salt="tenant-b")
    ).ask("same prefix?")
    plain = Session(backend, pack, store=store, request=RequestOptions(max_tokens=4)).ask(
        "same prefix again?"
    )
    assert salted.usage.cached_tokens == 0
    assert plain.usage.cached_tokens and plain.usage.cached_tokens > 4000


def test_stored_history_is_what_the_template_renders(
    engine_server: LocalServer, tiny_model: TinyModel
) -> None:
    raw = "<think>\nworking it out\n</think>\n\nThe answer is 42."
    base = [{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}]
    rendered_raw = tokenize_messages(
        engine_server,
        tiny_model,
        [*base, {"role": "assistant", "content": raw}, {"role": "user", "content": "q2"}],
    )
    rendered_kept = tokenize_messages(
        engine_server,
        tiny_model,
        [*base, {"role": "assistant", "content": history_form(raw)}, {"role": "user", "content": "q2"}],
    )
    assert rendered_raw == rendered_kept


def test_faults_are_retried_without_losing_or_duplicating_turns(
    engine_server: LocalServer, store: Store
) -> None:
    host, port = "127.0.0.1", engine_server.port
    proxy = FaultProxy(host, port, stall_seconds=20)
    try:
        backend = connect(
            ServerOptions(proxy.base_url, stall_timeout=3.0),
            retry=RetryPolicy(attempts=8, initial_wait=0.1, max_wait=1.0),
        )
        # Text prompts: with token ids the pack's /tokenize calls would go through the proxy too and
        # take faults meant for the turns (the ids path's own fallbacks are tested in test_prompt_ids).
        options = RequestOptions(max_tokens=32, prompt_ids=False)
        session = Session(backend, text_pack(20_000), store=store, request=options)
        proxy.faults.extend(["drop", "503", "429:1", "stall", "cut"])
        started = time.monotonic()
        first = session.ask("first, through every fault")
        elapsed = time.monotonic() - started
        second = session.ask("second, clean")
        proxy.faults.extend(["503", "drop"])
        third = session.ask("third, two faults")
    finally:
        proxy.close()
    assert first.attempts == 6
    assert elapsed >= 1.0 + 3.0  # the Retry-After second and the stall timeout were waited
    assert second.attempts == 1 and third.attempts == 3
    stored = store.sessions.turns(session.id)
    assert [turn.question for turn in stored] == [
        "first, through every fault",
        "second, clean",
        "third, two faults",
    ]
    assert [turn.position for turn in stored] == [0, 1, 2]
    requests = store.sessions.requests(session_ids=[session.id])
    assert [r.attempts for r in requests] == [6, 1, 3]
    assert third.usage.cached_tokens and third.usage.cached_tokens > 0


CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from longctx.backends.base import connect
    from longctx.options.groups import RequestOptions
    from longctx.sessions import Session
    from longctx.store import Store, StoredPack

    url, home, prefix_file = sys.argv[1:4]
    pack = StoredPack("c" * 64, "test/1", "Answer about the documents.", Path(prefix_file).read_text(), {})
    # ignore_eos: the random model may end an answer at once, and turn 2 must outlast the kill.
    request = RequestOptions(max_tokens=8, extra_body={"ignore_eos": True})
    session = Session(connect(url), pack, store=Store.open(Path(home)), request=request)
    print("session", session.id, flush=True)
    for turn in range(100):
        print("asking", turn, flush=True)
        session.ask(f"question {turn}", max_tokens=8 if turn < 2 else 2000)
        print("committed", turn, flush=True)
    """
)


def test_a_killed_session_resumes_with_every_completed_turn(
    engine_server: LocalServer, tmp_path: Path, store: Store
) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    prefix_file = tmp_path / "prefix.txt"
    prefix_file.write_text(text_pack(20_000).prefix)
    child = subprocess.Popen(
        [sys.executable, str(script), engine_server.api_base, str(store.path.parent), str(prefix_file)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    lines: list[tuple[str, str]] = []
    for line in child.stdout:
        kind, _, value = line.strip().partition(" ")
        lines.append((kind, value))
        if kind == "asking" and int(value) == 2:
            time.sleep(0.3)  # well inside the 2,000-token answer of turn 2 (about 4 s on this server)
            os.kill(child.pid, signal.SIGKILL)
            break
    # What the child printed up to its death: on a loaded machine the kill can land a turn later.
    lines += [(kind, value) for kind, _, value in (line.strip().partition(" ") for line in child.stdout)]
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    session_id = next(value for kind, value in lines if kind == "session")
    committed = [int(value) for kind, value in lines if kind == "committed"]
    assert committed[:2] == [0, 1]
    # The kill landed inside a turn: the last thing the child said was that it was asking.
    assert lines[-1] == ("asking", str(len(committed))), lines

    backend = connect(engine_server.api_base)
    resumed = Session.resume(session_id, backend, store=store)
    # Every completed turn, and not the one killed mid-answer.
    assert [turn.question for turn in resumed.turns] == [f"question {n}" for n in committed]
    assert all(turn.answer for turn in resumed.turns)
    assert len(store.sessions.requests(session_ids=[session_id])) == len(committed)
    after = resumed.ask("question after the crash", max_tokens=4)
    assert after.turn == len(committed)
    assert after.usage.cached_tokens and after.usage.cached_tokens > 4000


# sglang_without_cache_report: the plugin's session fixture (SGLang has no per-request switch).
@pytest.mark.sglang
def test_a_server_without_reporting_gets_the_flag_not_a_zero(
    sglang_without_cache_report: LocalServer, store: Store
) -> None:
    backend = connect(sglang_without_cache_report.api_base)
    diagnosis = diagnose(backend)
    assert "--enable-cache-report" in {finding.flag for finding in diagnosis.findings}
    session = Session(backend, text_pack(20_000), store=store, request=RequestOptions(max_tokens=4))
    session.ask("one")
    answer = session.ask("two")
    assert answer.usage.cached_tokens is None
    report = session.report()
    assert report.cached_tokens is None
    assert "--enable-cache-report" in report.summary_line()
    assert "--enable-cache-report" in report.to_text()
    # The server's own counter still saw the hits; the report shows it.
    assert report.counter_check is not None and (report.counter_check.server_delta or 0) > 4000


def test_a_sharded_session_loads_its_paths_with_the_corpus_options(
    backend: Backend, store: Store, tmp_path: Path
) -> None:
    repository = make_repository(tmp_path / "repo", ("textwrap.py",))
    (repository / ".env").write_text("SERVICE_URL=http://localhost:9000\n")  # a secret by its name
    packed_env = "``` .env\nSERVICE_URL=http://localhost:9000\n```\n"

    def prefixes(session: ShardedSession) -> str:
        return "".join(shard.pack.prefix for shard in session.shards if shard.pack is not None)

    refused = ShardedSession(repository, backend=backend, store=store, request=RequestOptions(max_tokens=8))
    allowed = ShardedSession(
        repository,
        backend=backend,
        store=store,
        corpus=CorpusOptions(allow_secrets=True),
        request=RequestOptions(max_tokens=8),
    )

    assert "``` textwrap.py\n" in prefixes(refused) and packed_env not in prefixes(refused)
    assert "``` textwrap.py\n" in prefixes(allowed) and packed_env in prefixes(allowed)
    answer = allowed.ask("Which settings does this project have?")
    assert answer.text and len(answer.shard_answers) == len(allowed.shards)


def test_map_reduce_over_shards_caches_each_shard(backend: Backend, store: Store, tmp_path: Path) -> None:
    repository = make_repository(tmp_path / "big", ("textwrap.py", "heapq.py", "shlex.py", "fnmatch.py"))
    corpus = load_corpus(repository)
    # A window far smaller than the server's forces several shards; all of
    # them together stay well inside the SGLang test server's 40k-token pool.
    budget = Budget(context_length=9_000, reserved_output_tokens=64, reserved_question_tokens=256)
    sharded = build_shards(corpus, budget=budget, tokenizer=backend.tokenizer(), store=store)
    assert len(sharded.shards) >= 2
    assert all((shard.total_tokens or 0) <= budget.prompt_budget for shard in sharded.shards)
    session = ShardedSession(
        repository, backend=backend, store=store, sharded=sharded, request=RequestOptions(max_tokens=8)
    )
    first = session.ask("What is defined here?")
    second = session.ask("And what is exported?")
    assert len(first.shard_answers) == len(sharded.shards)
    assert first.text and first.question == "What is defined here?"
    for shard_answer in second.shard_answers:
        # Each shard's second question reads that shard's prefix and first turn from the cache.
        assert (
            shard_answer.usage.cached_tokens
            and shard_answer.usage.cached_tokens > 0.9 * (shard_answer.usage.prompt_tokens or 0) - 256
        )
    report = session.report()
    purposes = [line.purpose for line in report.requests]
    assert purposes.count("reduce") == 2
    assert {f"map {i}/{len(sharded.shards)}" for i in range(1, len(sharded.shards) + 1)} <= set(purposes)
    # The server's counter grew by what every map and reduce request reported (the shards' map
    # steps overlap, so they share windows: each counted once).
    check = report.counter_check
    assert check is not None and check.matches is True and check.reported, check
    assert check.reported == report.cached_tokens, (check, report)


def test_a_file_edited_between_turns_is_appended_and_the_previous_prompt_stays_cached(
    backend: Backend, store: Store, tmp_path: Path
) -> None:
    # The edited file is a small one (bisect.py): a changed file is appended whole, twice here.
    repository = make_repository(tmp_path / "repo", ("bisect.py", "heapq.py"))
    session = RepoSession(repository, backend=backend, store=store, request=RequestOptions(max_tokens=8))
    first = session.ask("What does bisect do?")
    assert first.appended is None
    marker = f"LIVING_{uuid.uuid4().hex}"
    edited = repository / "bisect.py"
    edited.write_text(edited.read_text() + f"\n# {marker}\n")
    (repository / "README.md").unlink()
    second = session.ask("What changed in bisect.py?")

    assert second.appended is not None
    assert {change.describe() for change in second.appended.changes} == {
        "bisect.py changed",
        "README.md deleted",
    }
    last_user = session.messages("next")[-3]["content"]
    assert marker in last_user and "[deleted] README.md" in last_user
    assert first.usage.prompt_tokens is not None and second.usage.cached_tokens is not None
    reachable = block_round(first.usage.prompt_tokens, backend.info.cache_block_tokens)
    assert second.usage.cached_tokens >= 0.99 * reachable, (second.usage, first.usage)
    # Nothing changed since: the third turn appends nothing and caches the second prompt.
    third = session.ask("And now?")
    assert third.appended is None
    assert second.usage.prompt_tokens is not None and third.usage.cached_tokens is not None
    assert third.usage.cached_tokens >= 0.99 * block_round(
        second.usage.prompt_tokens, backend.info.cache_block_tokens
    )
    assert any("appended 2 changed file(s)" in note for note in session.report().notes)
    session.close()

    # Resumed, the session renders the appended turn as sent and still follows the files.
    resumed = Session.resume(session.id, backend, store=store)
    assert resumed.messages("next") == session.messages("next")
    edited.write_text(edited.read_text() + "# once more\n")
    fourth = resumed.ask("Once more?")
    assert fourth.appended is not None
    assert [change.describe() for change in fourth.appended.changes] == ["bisect.py changed"]
    assert fourth.usage.cached_tokens is not None and third.usage.prompt_tokens is not None
    assert fourth.usage.cached_tokens >= 0.99 * block_round(
        third.usage.prompt_tokens, backend.info.cache_block_tokens
    )
    # Changes that would pass the window are refused before anything is sent, with the way out.
    (repository / "big.py").write_text((STDLIB / "typing.py").read_text() * 2)
    with pytest.raises(ContextOverflow, match="start a fresh pack with `longctx chat"):
        resumed.ask("And the big file?")
    assert len(store.sessions.turns(session.id)) == 4


def test_the_generation_prompt_renders_as_the_history_does(
    engine_server: LocalServer, tiny_model: TinyModel, backend: Backend
) -> None:
    # The server generates right after the generation prompt; the next turn
    # renders the answer right after the same tokens (the old template put a
    # newline of its own there), so an answer that re-tokenises to itself is
    # served from the cache.
    base = [{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}]
    prompt = tokenize_messages(engine_server, tiny_model, base)
    answer = "The answer is 42, because the code says so."
    history = tokenize_messages(
        engine_server,
        tiny_model,
        [*base, {"role": "assistant", "content": answer}, {"role": "user", "content": "q2"}],
    )
    answer_tokens = backend.tokenizer().encode(answer)
    assert history[: len(prompt)] == prompt
    assert history[len(prompt) : len(prompt) + len(answer_tokens)] == answer_tokens


# Long enough to span three of vLLM's 128-token cache blocks, so the answer's reuse shows past the
# block rounding; 1,000 tokens showed nothing more and cost 4-9 s more per test and engine (decode on
# this CPU).
LONG_ANSWER = 400


def test_after_a_long_answer_the_next_turn_reports_the_answer_reuse(backend: Backend, store: Store) -> None:
    request = RequestOptions(max_tokens=LONG_ANSWER, temperature=0.0, extra_body={"ignore_eos": True})
    session = Session(backend, text_pack(8_000), store=store, request=request)
    first = session.ask("Explain the file.")
    # The reuse is read from the follow-up's prompt: its own answer can be short (on SGLang's CPU
    # build a second 1,000-token answer took 35 s).
    second = session.ask("Go on.", max_tokens=8)
    assert first.usage.completion_tokens == LONG_ANSWER and first.usage.prompt_tokens is not None
    assert second.usage.cached_tokens is not None
    block = backend.info.cache_block_tokens
    # At least the previous prompt (block-rounded); what is past it is the answer's reuse.
    assert second.usage.cached_tokens >= block_round(first.usage.prompt_tokens, block)
    reuse = answer_reuse(first.usage, second.usage)
    assert reuse is not None and reuse.answer_tokens == LONG_ANSWER
    assert reuse.reused_tokens == min(
        second.usage.cached_tokens - first.usage.prompt_tokens, LONG_ANSWER
    ) or (reuse.reused_tokens == 0 and second.usage.cached_tokens < first.usage.prompt_tokens)
    assert f"turn 2: {reuse.summary_line()}" in session.report().notes


def test_a_token_id_history_reads_the_whole_previous_answer_from_the_cache(
    backend: Backend, store: Store
) -> None:
    request = RequestOptions(
        max_tokens=LONG_ANSWER, temperature=0.0, extra_body={"ignore_eos": True}, token_history=True
    )
    session = Session(backend, text_pack(8_000), store=store, request=request)
    first = session.ask("Explain the file.")
    second = session.ask("Go on.", max_tokens=200)
    assert first.usage.prompt_tokens is not None and first.usage.completion_tokens == LONG_ANSWER
    assert second.usage.cached_tokens is not None
    block = backend.info.cache_block_tokens
    # Every token the server computed for the first turn is read back: its
    # prompt and its answer but the last generated token (sampled, never fed
    # back in), block-rounded (vLLM's CPU build: 128).
    computed = first.usage.prompt_tokens + LONG_ANSWER - 1
    assert second.usage.cached_tokens >= block_round(computed, block)
    reuse = answer_reuse(first.usage, second.usage)
    assert (
        reuse is not None and reuse.reused_tokens >= block_round(computed, block) - first.usage.prompt_tokens
    )
    stored = store.sessions.turns(session.id)
    assert stored[0].answer_ids is not None and len(stored[0].answer_ids) == LONG_ANSWER
    # Why ids: a sampled sequence need not be the tokenizer's own encoding of its text (two ids
    # the model chose, one id when the text is encoded again), and a text history re-sends the
    # text's encoding, which the cache misses from the first such id on. Shown on the server's
    # tokenizer, not on this answer: whether a 400-token answer of the tiny model holds such a
    # pair depends on the pack's nonce (it did not in one run of SGLang).
    tokenizer = backend.tokenizer()
    assert tokenizer.encode(" arguments") != tokenizer.encode(" arg") + tokenizer.encode("uments")
    # A resumed session rebuilds the ids from the stored answers.
    resumed = Session.resume(session.id, backend, store=store)
    third = resumed.ask("And then?", max_tokens=8)
    assert second.usage.prompt_tokens is not None and third.usage.cached_tokens is not None
    assert third.usage.cached_tokens >= block_round(second.usage.prompt_tokens + 200 - 1, block)
