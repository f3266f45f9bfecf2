"""The store on a PostgreSQL server (longctx.store.postgres, .dialect, .location), shared by many machines.

Against the real server the test session starts (tests/store_backends.py): one
migration list on both stores, a newer schema refused; two clients with
separate homes sharing leases, answers and pack token ids; a lease ended by
time alone, and a stalled run's answer refused; the server down and back; the
URL's password in no output, message or row; ``sessions prune`` on the server.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from fake_engine import FakeEngine
from test_job_leases import ENTRY_POINT, SlowEngine, make_items, over_http, questions_asked

from longctx import Job, JobOptions
from longctx.backends.base import connect
from longctx.cli import main
from longctx.config import ServerOptions
from longctx.errors import ConfigError, LeaseLost, StoreError
from longctx.store import (
    CounterSkip,
    LeaseHolder,
    PruneRule,
    RequestRecord,
    SessionRecord,
    Store,
    StoredPackIds,
    TurnRecord,
)
from longctx.store.db import MIGRATIONS, split_statements
from longctx.store.dialect import PRIMARY_KEYS, postgres_migration
from longctx.store.location import checked_store, redacted_url
from longctx.testing.postgres import ROLE_PASSWORD, PostgresServer
from longctx.usage import Usage

FAKE = "http://fake-engine:8000/v1"
STORE_SOURCES = Path(__file__).resolve().parent.parent / "longctx" / "store"


def open_client(home: Path, url: str) -> Store:
    """One client machine: its own home folder, the shared store."""
    return Store.open(home, database_url=url)


def turn_and_request(session_id: str, position: int = 0) -> tuple[TurnRecord, RequestRecord]:
    usage = Usage(10, 5, None, 2, None, None)
    request = RequestRecord(
        f"r-{session_id}-{position}", session_id, None, "turn", 1.0, "http://x/v1", "vllm", "m", usage, 1
    )
    turn = TurnRecord(session_id, position, "q?", "a.", "a.", None, request.id, time.time())
    return turn, request


def all_text(url: str) -> str:
    """Every row of every table of the store, as text: what a reader of the database sees."""
    with psycopg.connect(url) as connection:
        tables = [
            row[0]
            for row in connection.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            )
        ]
        return "\n".join(str(connection.execute(f"SELECT * FROM {table}").fetchall()) for table in tables)


# -- one schema, one numbering -----------------------------------------------------------


def test_every_replaced_table_has_the_key_the_dialect_upserts_on(postgres_url: str, tmp_path: Path) -> None:
    with open_client(tmp_path / "a", postgres_url):
        pass
    with psycopg.connect(postgres_url) as connection:
        keys: dict[str, list[str]] = {}
        for table, column in connection.execute(
            "SELECT tc.table_name, kcu.column_name FROM information_schema.table_constraints tc"
            " JOIN information_schema.key_column_usage kcu ON kcu.constraint_name = tc.constraint_name"
            " AND kcu.table_schema = tc.table_schema WHERE tc.constraint_type = 'PRIMARY KEY'"
            " AND tc.table_schema = current_schema() ORDER BY kcu.ordinal_position"
        ):
            keys.setdefault(table, []).append(column)
    for table, key in PRIMARY_KEYS.items():
        assert tuple(keys[table]) == key, table
    replaced = {
        table
        for path in STORE_SOURCES.glob("*.py")
        for table in re.findall(r"INSERT OR REPLACE INTO (\w+)", path.read_text())
    }
    assert replaced and replaced <= set(PRIMARY_KEYS)


def test_an_older_schema_is_upgraded_keeping_its_rows_and_a_newer_one_refused(
    postgres_url: str, tmp_path: Path
) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as connection:  # as longctx of schema 7 left it
        for script in MIGRATIONS[:7]:
            for statement in split_statements(script):
                connection.execute(postgres_migration(statement).replace("%%", "%"))  # type: ignore[arg-type]
        connection.execute("CREATE TABLE longctx_schema (version INTEGER NOT NULL)")
        connection.execute("INSERT INTO longctx_schema VALUES (7)")
        connection.execute("INSERT INTO token_counts VALUES ('tok', 'abc', 42)")
    with open_client(tmp_path / "a", postgres_url) as store:
        assert store.caches.token_counts("tok", ["abc"]) == {"abc": 42}
        assert store.database.query("SELECT version FROM longctx_schema")[0]["version"] == len(MIGRATIONS)
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        connection.execute("UPDATE longctx_schema SET version = 999")
    with pytest.raises(StoreError, match="schema version 999, newer than this longctx") as caught:
        open_client(tmp_path / "b", postgres_url)
    assert ROLE_PASSWORD not in str(caught.value) and "[redacted]" in str(caught.value)


# -- two machines, one store ---------------------------------------------------------------


def test_an_answer_and_a_packs_ids_stored_by_one_client_are_found_by_the_other(
    postgres_url: str, tmp_path: Path
) -> None:
    with (
        open_client(tmp_path / "one", postgres_url) as one,
        open_client(tmp_path / "two", postgres_url) as two,
    ):
        one.sessions.create_session(SessionRecord("s1", 1.0, "session", "t", None, None, None, {}))
        turn, request = turn_and_request("s1")
        one.sessions.commit_turn(turn, request, key="mine:1")
        one.caches.save_pack_ids("tokenizer-id", "fp", StoredPackIds((1, 2, 3), (4,)))
        assert two.sessions.answered(["mine:1"])["mine:1"].answer == "a."
        assert two.caches.pack_ids("tokenizer-id", "fp") == StoredPackIds((1, 2, 3), (4,))
        assert two.caches.pack_ids("another-tokenizer", "fp") is None


def test_a_job_answered_on_one_machine_is_reused_on_the_other(postgres_url: str, tmp_path: Path) -> None:
    fake = FakeEngine(engine="generic", block=1)
    items = make_items(tmp_path, packs=2, questions=2)
    reports = []
    for machine in ("one", "two"):
        with (
            connect(FAKE, transport=fake.transport()) as backend,
            open_client(tmp_path / machine, postgres_url) as store,
        ):
            reports.append(Job(items, backend=backend, store=store).run())
    assert reports[0].asked == len(items) and reports[1].asked == 0
    assert len(fake.chat_bodies) == len(items)
    assert [result.answer for result in reports[1].results] == [fake.answer] * len(items)


def test_a_dead_runs_lease_ends_by_time_alone_even_with_its_process_gone_here(
    postgres_url: str, tmp_path: Path
) -> None:
    fake = FakeEngine(engine="generic", block=1)
    items = make_items(tmp_path, packs=1, questions=1)
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead = LeaseHolder("killed", int(ended.stdout), os.uname().nodename)  # a process of "this" host, gone
    with (
        connect(FAKE, transport=fake.transport()) as backend,
        open_client(tmp_path / "a", postgres_url) as store,
    ):
        job = Job(items, backend=backend, store=store, options=JobOptions(lease_seconds=1.5))
        key = _lease_key(job, backend, store, tmp_path)
        assert store.leases.take([key], dead, 1.5)[0].state == "taken"
        assert (
            store.leases.take([key], LeaseHolder("other", 1, "h"), 1.5)[0].state == "held"
        )  # no process check
        started = time.monotonic()
        report = job.run()
    assert report.asked == 1 and len(fake.chat_bodies) == 1
    assert time.monotonic() - started >= 1.2  # taken over once the lease lapsed, by the server's clock


def _lease_key(job: Job, backend: object, store: Store, tmp_path: Path) -> str:
    from test_job_leases import _answer_keys

    (key,) = [key.rsplit(":", 1)[0] for key in _answer_keys(list(job.items), backend, store, tmp_path)]
    return key


def test_a_stalled_run_cannot_store_an_item_another_run_took_over(postgres_url: str, tmp_path: Path) -> None:
    with (
        open_client(tmp_path / "one", postgres_url) as one,
        open_client(tmp_path / "two", postgres_url) as two,
    ):
        for store, session in ((one, "s1"), (two, "s2")):
            store.sessions.create_session(SessionRecord(session, 1.0, "session", "t", None, None, None, {}))
        one.leases.hold_for("run-one", 0.5)
        two.leases.hold_for("run-two", 0.5)
        assert one.leases.take(["job:j:0:f"], LeaseHolder("run-one", 1, "one"), 0.5)[0].state == "taken"
        time.sleep(0.7)  # run one stalls: its lease lapses unrenewed, and run two takes the item over
        assert two.leases.take(["job:j:0:f"], LeaseHolder("run-two", 2, "two"), 30)[0].state == "taken"
        stalled, _ = turn_and_request("s1")
        with pytest.raises(LeaseLost, match="run-two"):
            one.sessions.commit_turn(stalled, turn_and_request("s1")[1], key="job:j:0:f:aaaa")
        assert one.sessions.turns("s1") == [] and one.sessions.answered_under("job:j:") == {}
        turn, request = turn_and_request("s2")
        two.sessions.commit_turn(turn, request, key="job:j:0:f:bbbb")
        assert list(one.sessions.answered_under("job:j:")) == ["job:j:0:f:bbbb"]
        # A lapsed lease no other run took is still the run's: its answer is stored, the lease renewed.
        assert one.leases.take(["job:j:1:f"], LeaseHolder("run-one", 1, "one"), 0.5)[0].state == "taken"
        time.sleep(0.7)
        turn, request = turn_and_request("s1", 0)
        one.sessions.commit_turn(turn, request, key="job:j:1:f:cccc")
        assert "job:j:1:f:cccc" in two.sessions.answered_under("job:j:")


def test_two_machines_ask_every_item_exactly_once(postgres_url: str, tmp_path: Path) -> None:
    fake = SlowEngine(engine="generic", block=1)
    fake.delay = 0.3
    items = make_items(tmp_path, packs=2, questions=3)
    job_file = tmp_path / "job.jsonl"
    job_file.write_text("".join(json.dumps(item.to_dict()) + "\n" for item in items))
    base = {k: v for k, v in os.environ.items() if not k.startswith("LONGCTX_")}
    with over_http(fake) as url:
        runs = []
        for machine in ("one", "two"):  # separate homes and process trees; one database
            home = tmp_path / machine
            home.mkdir()
            environment = base | {
                "HOME": str(home),
                "LONGCTX_HOME": str(home / "longctx"),
                "LONGCTX_CONFIG": str(home / "none.toml"),
                "LONGCTX_STORE": postgres_url,
            }
            command = [str(ENTRY_POINT), "job", str(job_file), "--base-url", url, "--packs-in-flight", "1"]
            runs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         env=environment, cwd=home, start_new_session=True))  # fmt: skip
        outputs = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err for _, err in outputs]
    asked = questions_asked(fake)
    assert sorted(asked) == sorted(item.question for item in items) and set(asked.values()) == {1}, asked
    for out, err in outputs:
        assert ROLE_PASSWORD not in out + err
        assert [json.loads(line)["answer"] for line in out.splitlines()] == [fake.answer] * len(items)
    assert not (tmp_path / "one" / "longctx" / "longctx.db").exists()  # nothing stored in a home
    with open_client(tmp_path / "check", postgres_url) as store:
        assert len(store.sessions.answered_under(f"job:{Job(items).id}:")) == len(items)
        assert store.leases.holders() == {}


# -- the server down, and back ---------------------------------------------------------------


def test_while_the_server_is_down_a_write_fails_clearly_and_the_next_one_after_it_is_back_goes_on(
    postgres_server: PostgresServer, postgres_url: str, tmp_path: Path
) -> None:
    with open_client(tmp_path / "a", postgres_url) as store:
        store.sessions.create_session(SessionRecord("s", 1.0, "session", "t", None, None, None, {}))
        postgres_server.halt()
        try:
            turn, request = turn_and_request("s")
            with pytest.raises(StoreError) as caught:
                store.sessions.commit_turn(turn, request, key="k")
        finally:
            postgres_server.begin()
        message = str(caught.value)
        assert "cannot be reached" in message and "Nothing of this write was kept" in message
        assert ROLE_PASSWORD not in message and "[redacted]" in message
        store.sessions.commit_turn(turn, request, key="k")  # connected again: the same write, once
        assert [t.position for t in store.sessions.turns("s")] == [0]


def test_after_a_server_restart_the_next_read_and_write_connect_again_at_once(
    postgres_server: PostgresServer, postgres_url: str, tmp_path: Path
) -> None:
    with open_client(tmp_path / "a", postgres_url) as store:
        store.sessions.create_session(SessionRecord("s", 1.0, "session", "t", None, None, None, {}))
        postgres_server.restart()  # the client's connection is gone; it does not know yet
        assert [s.id for s in store.sessions.sessions()] == ["s"]
        postgres_server.restart()
        turn, request = turn_and_request("s")
        store.sessions.commit_turn(turn, request, key="k")
        assert store.sessions.answered(["k"])["k"].position == 0


def test_a_write_cut_in_the_middle_leaves_nothing_of_it(
    postgres_server: PostgresServer, postgres_url: str, tmp_path: Path
) -> None:
    def cut(connection: object, key: str) -> None:  # mid-transaction: the server ends this client's session
        postgres_server.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'longctx'"
        )

    with open_client(tmp_path / "a", postgres_url) as store:
        store.sessions.create_session(SessionRecord("s", 1.0, "session", "t", None, None, None, {}))
        store.sessions._check_key = cut
        turn, request = turn_and_request("s")
        new = SessionRecord("branch", 2.0, "sibling", "t", None, "s", 0, {})
        with pytest.raises(StoreError):
            store.sessions.commit_turn(turn, request, new_session=new, key="k")
        store.sessions._check_key = None
        assert store.sessions.turns("s") == [] and store.sessions.answered(["k"]) == {}
        assert [s.id for s in store.sessions.sessions(include_branches=True)] == ["s"]
        assert store.sessions.requests() == []


# -- credentials -------------------------------------------------------------------------------


def test_the_urls_password_is_in_no_message_option_output_or_row(postgres_url: str, tmp_path: Path) -> None:
    assert ROLE_PASSWORD in postgres_url
    assert ROLE_PASSWORD not in redacted_url(postgres_url) and "[redacted]" in redacted_url(postgres_url)
    options = ServerOptions(store=postgres_url)
    assert ROLE_PASSWORD not in repr(options) and "store" not in options.to_dict()
    with pytest.raises(ConfigError) as refused:
        checked_store(postgres_url.replace("postgresql://", "mysql://"))
    assert ROLE_PASSWORD not in str(refused.value)
    unreachable = re.sub(r"@127\.0\.0\.1:\d+/", "@127.0.0.1:1/", postgres_url)
    with pytest.raises(StoreError) as caught:
        open_client(tmp_path / "x", unreachable)
    assert ROLE_PASSWORD not in str(caught.value) and "cannot be reached" in str(caught.value)
    fake = FakeEngine(engine="generic", block=1)
    items = make_items(tmp_path, packs=1, questions=2)
    with (
        connect(FAKE, transport=fake.transport()) as backend,
        open_client(tmp_path / "a", postgres_url) as store,
    ):
        Job(items, backend=backend, store=store).run()
    runner = CliRunner()
    with open_client(tmp_path / "a", postgres_url) as store:
        session_id = store.sessions.sessions()[0].id
    for arguments in (["sessions", "list", "--json"], ["sessions", "list"], ["sessions", "show", session_id]):
        shown = runner.invoke(main, arguments, env={"LONGCTX_STORE": postgres_url})
        assert shown.exit_code == 0 and ROLE_PASSWORD not in shown.output + (shown.stderr or "")
    assert ROLE_PASSWORD not in all_text(postgres_url)


def test_sessions_prune_works_on_the_server(postgres_url: str, tmp_path: Path) -> None:
    with open_client(tmp_path / "a", postgres_url) as store:
        for number in range(3):
            session = f"s{number}"
            store.sessions.create_session(
                SessionRecord(session, 1.0 + number, "session", "t", None, None, None, {})
            )
            _, request = turn_and_request(session)
            store.sessions.commit_turn(
                TurnRecord(session, 0, "q?", "a.", "a.", None, request.id, 1.0 + number), request
            )
    runner = CliRunner()
    pruned = runner.invoke(
        main, ["sessions", "prune", "--keep", "1", "--json"], env={"LONGCTX_STORE": postgres_url}
    )
    assert pruned.exit_code == 0, pruned.output
    data = json.loads(pruned.stdout)
    assert sorted(tree["root_id"] for tree in data["pruned"]) == ["s0", "s1"]
    with open_client(tmp_path / "b", postgres_url) as store:
        assert [s.id for s in store.sessions.sessions()] == ["s2"]
        assert store.sessions.requests(session_ids=["s0", "s1"]) == []


def test_a_role_with_the_documented_privileges_alone_reads_writes_and_prunes(
    postgres_server: PostgresServer, postgres_url: str, tmp_path: Path
) -> None:
    with open_client(tmp_path / "owner", postgres_url):
        pass  # the owner's first connection creates the tables
    schema = postgres_url.rsplit("%3D", 1)[1]
    password = "client-pw-9"
    postgres_server.sql(f"CREATE ROLE client_{schema} LOGIN PASSWORD '{password}'")
    for grant in (  # docs/store.md, "Least privileges"
        f"GRANT CONNECT ON DATABASE longctx TO client_{schema}",
        f"GRANT USAGE ON SCHEMA {schema} TO client_{schema}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO client_{schema}",
        f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO client_{schema}",
    ):
        postgres_server.sql(grant, database="longctx")
    client_url = re.sub(r"//longctx:[^@]+@", f"//client_{schema}:{password}@", postgres_url)
    fake = FakeEngine(engine="generic", block=1)
    items = make_items(tmp_path, packs=1, questions=2)
    with (
        connect(FAKE, transport=fake.transport()) as backend,
        open_client(tmp_path / "c", client_url) as store,
    ):
        assert Job(items, backend=backend, store=store).run().asked == 2
        store.caches.save_token_counts("t", {"a" * 64: 3})
        store.sessions.record(CounterSkip(store.sessions.sessions()[0].id, "a note"))
        pruned = store.sessions.prune(PruneRule(older_than_seconds=0, in_use_seconds=0))
        assert pruned.pruned and store.sessions.sessions() == []
    with pytest.raises(StoreError, match="privilege"), open_client(tmp_path / "d", client_url) as store:
        store.database.query("CREATE TABLE not_allowed (x INTEGER)")


def test_the_store_is_chosen_by_option_variable_or_project_file_in_that_order(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / ".longctx.toml").write_text(f'store = "{postgres_url}"\n')
    monkeypatch.chdir(project)
    with Store.open(tmp_path / "home") as store:
        assert store.location == redacted_url(postgres_url)
    monkeypatch.setenv("LONGCTX_STORE", "sqlite")  # the variable wins over the file
    with Store.open(tmp_path / "home") as store:
        assert store.location == str(tmp_path / "home" / "longctx.db")
        with Store.open(tmp_path / "home", database_url=postgres_url) as chosen:  # the option over both
            assert chosen.location == redacted_url(postgres_url)
    monkeypatch.setenv("LONGCTX_STORE", postgres_url.replace("postgresql:", "mysql:"))
    with pytest.raises(ConfigError, match="LONGCTX_STORE") as refused:
        Store.open(tmp_path / "home")
    assert ROLE_PASSWORD not in str(refused.value)
