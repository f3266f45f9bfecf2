"""longctx lint, proxy and retention against the real CPU engines (the tiny model)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from longctx import Job, JobItem, JobOptions
from longctx.backends.base import connect
from longctx.lint import ServerRenderer, lint_requests, read_log, requests_from_lines
from longctx.lint.proxy import RecordingProxy
from longctx.lint.replay import replay
from longctx.options.groups import RequestOptions
from longctx.serving.retention import measure_retention
from longctx.store import Store
from longctx.testing.harness import EngineHarness
from longctx.testing.servers import LocalServer, start_vllm

DOC = "".join(f"Line {n}: the retry policy lives in module {n % 7} and waits {n} ms.\n" for n in range(120))


def chat(system: str, user: str) -> str:
    return json.dumps(
        {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    )


def test_lint_and_replay_agree_with_the_server(engine_server: LocalServer, tmp_path: Path) -> None:
    """Siblings, a turn and a timestamp break: the served engine simulated equals its cache."""
    log = [
        chat("You answer questions about code.", DOC + "Q: where is the retry policy?"),
        chat("You answer questions about code.", DOC + "Q: how long does it wait?"),
        chat("You answer questions about code. Today is 2026-12-05 10:31.", DOC + "Q: which module?"),
        chat("You answer questions about code. Today is 2026-12-06 09:02.", DOC + "Q: which module?"),
    ]
    requests = requests_from_lines(log)
    with connect(engine_server.api_base) as backend:
        server = backend.server_for(None)
        renderer = ServerRenderer(backend.tokenizer())
        report = lint_requests(requests, renderer, block_tokens=server.cache_block_tokens or 16)
        assert report.requests[1].cause == "question"
        assert report.requests[3].cause == "timestamp"
        (timestamp,) = [f for f in report.findings if f.cause == "timestamp"]
        assert timestamp.request == "#3" and timestamp.ancestor == "#2"
        assert "2026-12-0" in timestamp.before + timestamp.after
        replayed = replay(requests, renderer, backend)
    assert replayed.failed == 0
    assert [r.reported for r in replayed.requests] == [r.simulated for r in replayed.requests]
    assert replayed.simulated_tokens > 0
    engine_model = "sglang" if server.profile.prefix_cache == "radix" else "vllm"
    assert [r.simulated for r in replayed.requests] == [row.cached[engine_model] for row in report.requests]
    check = replayed.counter_check
    assert check is not None
    assert check.matches is not False, check
    assert replayed.matches


def test_replay_beside_another_clients_traffic_is_no_false_error(vllm_server: LocalServer) -> None:
    """Another client on the server meanwhile: the counter check says so instead of a mismatch."""
    import threading
    import urllib.request

    stop = threading.Event()

    def other_client() -> None:
        body = json.dumps(
            {
                "model": "tiny-llama",
                "prompt": DOC + "other client",
                "max_tokens": 1,
                "cache_salt": uuid.uuid4().hex,
            }
        ).encode()
        while not stop.is_set():
            request = urllib.request.Request(
                vllm_server.api_base + "/completions", data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                response.read()

    log = [
        chat("You answer questions about code.", DOC + f"Q{n}: where is the retry policy?") for n in range(4)
    ]
    requests = requests_from_lines(log)
    with connect(vllm_server.api_base) as backend:
        renderer = ServerRenderer(backend.tokenizer())
        thread = threading.Thread(target=other_client, daemon=True)
        thread.start()
        try:
            replayed = replay(requests, renderer, backend)
        finally:
            stop.set()
            thread.join(60)
    assert replayed.failed == 0
    assert [r.reported for r in replayed.requests] == [r.simulated for r in replayed.requests]
    check = replayed.counter_check
    assert check is not None and check.matches is None, check
    assert "other" in check.note or "client" in check.note, check.note
    assert replayed.matches


def test_replay_never_matches_after_failed_requests(vllm_server: LocalServer) -> None:
    """A request the server refuses (over its window) fails the replay, whatever the others did."""
    too_long = json.dumps({"prompt": list(range(1, 40_000))})
    requests = requests_from_lines([chat("s", DOC + "Q?"), too_long])
    with connect(vllm_server.api_base) as backend:
        replayed = replay(requests, ServerRenderer(backend.tokenizer()), backend)
    assert replayed.failed == 1
    assert not replayed.matches
    assert "FAILED" in replayed.to_text() and "MISMATCH" in replayed.to_text()


def test_proxy_records_an_openai_client_and_its_counters_agree(
    engine_server: LocalServer, tmp_path: Path
) -> None:
    """An application on the openai SDK, pointed at the proxy: streamed and plain pass, the log lints."""
    log_path = tmp_path / "recorded.jsonl"
    with connect(engine_server.api_base) as backend:
        model = backend.server_for(None).model
        proxy = RecordingProxy(engine_server.api_base, log_path).start(backend=backend)
        try:
            client = openai.OpenAI(
                base_url=proxy.url + "/v1", api_key="sk-secret-never-stored", max_retries=0
            )
            messages: list[Any] = [
                {"role": "system", "content": "You answer."},
                {"role": "user", "content": DOC + "Q1?"},
            ]
            plain = client.chat.completions.create(
                model=model, messages=messages, max_tokens=4, temperature=0
            )
            assert plain.choices[0].message.content is not None
            stream = client.chat.completions.create(
                model=model,
                messages=[*messages[:1], {"role": "user", "content": DOC + "Q2?"}],
                max_tokens=4,
                temperature=0,
                stream=True,
            )
            chunks: list[Any] = list(stream)
            pieces = [chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices]
            assert pieces
            check = proxy.counter_check()
        finally:
            proxy.close()
        raw = log_path.read_text()
        assert "sk-secret-never-stored" not in raw and "authorization" not in raw.lower()
        recorded = read_log(log_path)
        assert len(recorded) == 2
        assert all(r.reported.status == 200 and r.reported.cached_tokens is not None for r in recorded)
        assert recorded[1].reported.cached_tokens and recorded[1].reported.ttft_seconds is not None
        server = backend.server_for(None)
        report = lint_requests(
            recorded, ServerRenderer(backend.tokenizer()), block_tokens=server.cache_block_tokens or 16
        )
    engine_model = "sglang" if server.profile.prefix_cache == "radix" else "vllm"
    # The server's cached tokens of the second request are what the simulation of its engine says.
    assert report.requests[1].reported_cached == report.requests[1].cached[engine_model]
    assert report.requests[1].cause == "question"
    assert check is not None and check.matches is not False, check


# -- retention ------------------------------------------------------------------------------------------

_SMALL_VLLM = "vllm-small-kv"
SMALL_KV_ARGS = [
    "--num-gpu-blocks-override",
    "48",
    "--max-model-len",
    "4096",
]


def _start_small_vllm(harness: EngineHarness) -> LocalServer:
    """vLLM with 48 blocks of KV (6,144 tokens at the CPU build's block 128) and a 4,096-token window."""
    env = harness.environment("vllm")
    return start_vllm(
        env,
        harness.model(),
        harness.base_dir,
        name=_SMALL_VLLM,
        # 1 GiB of KV memory asked (the harness's 2 GiB may not be free on a shared machine), 48 blocks used.
        extra_args=SMALL_KV_ARGS,
        kv_cache_gib=1,
    )


@pytest.fixture(scope="module")
def small_vllm(longctx_harness: EngineHarness) -> Iterator[LocalServer]:
    server = longctx_harness.extra_server(_SMALL_VLLM, _start_small_vllm)
    yield server
    longctx_harness.stop_extra(_SMALL_VLLM)


@pytest.mark.vllm
def test_a_job_scheduled_by_the_measured_figure_keeps_every_pack_until_its_siblings(
    small_vllm: LocalServer, tmp_path: Path
) -> None:
    """The measured retention, as KV tokens, is what the job scheduler takes (``JobOptions.kv_tokens``)."""
    with connect(small_vllm.api_base) as backend:
        measured = measure_retention(backend, 1200, packs=7)
        assert measured.kv_tokens is not None
        folders = []
        for number in range(4):
            folder = tmp_path / f"pack{number}"
            folder.mkdir()
            (folder / "code.py").write_text(
                "".join(f"def f{number}_{line}(x):\n    return x * {line} + {number}\n" for line in range(90))
            )
            folders.append(folder)
        items = [
            JobItem((str(f),), f"Question {q}: what does f{q} return?") for q in range(3) for f in folders
        ]
        request = RequestOptions(max_tokens=2, temperature=0.0, cache_salt=uuid.uuid4().hex)
        options = JobOptions(kv_tokens=measured.kv_tokens, packs_in_flight=4)
        with Store.open(tmp_path / "home") as store:
            report = Job(items, backend=backend, store=store, request=request, options=options).run()
    assert not report.failed
    block = 128
    for folder in folders:
        usages = [r.usage for r in report.results if r.item.paths == (str(folder),) and r.usage is not None]
        cached = sorted(u.cached_tokens or 0 for u in usages)
        shared = min(u.prompt_tokens or 0 for u in usages) - 40
        assert all(c >= shared - shared % block - block for c in cached[1:]), (folder.name, cached)


@pytest.mark.vllm
def test_retention_measured_on_vllm_beside_the_estimate(small_vllm: LocalServer) -> None:
    with connect(small_vllm.api_base) as backend:
        report = measure_retention(backend, 1000, packs=9)
    print(report.to_text())
    assert report.kept_packs is not None
    assert 1 <= report.kept_packs < report.packs_sent
    assert report.server_kv_tokens is not None and report.estimated_packs is not None
    assert abs(report.kept_packs - report.estimated_packs) <= 2
    kept = [p for p in report.probes if p.kept]
    assert all(p.cached_tokens and p.cached_tokens >= 512 for p in kept)
    assert report.kv_tokens is not None and report.kv_tokens >= 1000


def test_retention_measured_on_sglang_beside_the_estimate(sglang_server: LocalServer) -> None:
    """The shared SGLang server holds 40,000 tokens: packs of 4,000, about ten."""
    with connect(sglang_server.api_base) as backend:
        report = measure_retention(backend, 4000, packs=14)
    print(report.to_text())
    assert report.kept_packs is not None
    assert 2 <= report.kept_packs < report.packs_sent
    if report.estimated_packs is not None:
        assert abs(report.kept_packs - report.estimated_packs) <= 3


# -- the commands, as a user runs them ------------------------------------------------------------------

ENTRY_POINT = Path(sys.executable).parent / "longctx"


def test_lint_command_replays_a_log_against_the_server(vllm_server: LocalServer, tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    log.write_text("".join(chat("You answer.", DOC + f"Q{n}?") + "\n" for n in range(3)))
    command = [str(ENTRY_POINT), "lint", str(log), "--base-url", vllm_server.api_base, "--replay"]
    result = subprocess.run(
        [*command, "--format", "json"], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["models"][0]["block_tokens"] == 128  # the server's block size, read from the server
    assert data["replay"]["matches"] and data["replay"]["failed"] == 0
    assert [r["reported"] for r in data["replay"]["requests"]] == [
        r["cached"]["vllm"] for r in data["requests"]
    ]


def test_lint_command_exits_on_a_failed_replay(vllm_server: LocalServer, tmp_path: Path) -> None:
    """A replayed request the server refuses is the documented replay exit, not a quiet success."""
    from longctx.cli.app import EXIT_REPLAY_MISMATCH

    log = tmp_path / "requests.jsonl"
    log.write_text(
        chat("You answer.", DOC + "Q?") + "\n" + json.dumps({"prompt": list(range(1, 40_000))}) + "\n"
    )
    command = [str(ENTRY_POINT), "lint", str(log), "--base-url", vllm_server.api_base, "--replay"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == EXIT_REPLAY_MISMATCH, (result.stdout, result.stderr)
    assert "does not match" in result.stderr


def test_retention_command_on_sglang(sglang_server: LocalServer) -> None:
    result = subprocess.run(
        [str(ENTRY_POINT), "retention", "--base-url", sglang_server.api_base, "--pack-tokens", "3000",
         "--packs", "3", "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["kept_packs"] == 3 and data["saturated"]  # three packs fit 40,000 tokens: all kept
    assert data["estimated_packs"] >= 3 and data["kv_tokens"] >= 8000
