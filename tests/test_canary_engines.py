"""The cache canary on the real CPU engines: it passes on a sound cache, and catches a perturbed one.

- On vLLM and SGLang (tiny model, greedy), cold and cached answers agree:
  the verdict is ``same`` or ``within tolerance``; the measured spreads are
  printed (``-s``) for docs/canary.md.
- A proxy in front of the real server that changes the answers it serves
  from the cache (a logprob, or a token id) is caught: ``diverged``, with
  both outputs as evidence, and ``longctx doctor --canary`` exits 10.
- A session runs the canary on its own pack under its own salt.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from fault_proxy import FaultProxy

from longctx.backends.base import connect
from longctx.cli.app import EXIT_CANARY, Runtime, main
from longctx.options.groups import RequestOptions
from longctx.sessions import Session
from longctx.store import Store, StoredPack
from longctx.testing import LocalServer
from longctx.verification.canary import CANARY_QUESTION, canary


def test_the_canary_passes_on_a_real_engine(engine_server: LocalServer) -> None:
    with connect(engine_server.api_base) as backend:
        engine = backend.info.engine
        result = canary(backend)
    cold, again, cached = result.runs
    print(
        f"\n{engine}: cold vs cold {result.spread.largest_difference!r},"
        f" cold vs cached {result.comparisons[0].largest_difference!r}"
        f" ({cached.cached_tokens} of {cached.prompt_tokens} cached), tolerance {result.tolerance:.3g},"
        f" verdict {result.verdict}; text {cold.text!r}"
    )
    assert cold.cached_tokens == again.cached_tokens == 0  # fresh salts: computed cold
    assert cached.cached_tokens and cached.cached_tokens > cached.prompt_tokens // 2  # type: ignore[operator]
    assert cold.token_ids and len(cold.logprobs) == len(cold.token_ids)
    assert cold.token_ids == again.token_ids  # greedy is deterministic on one CPU server
    assert result.verdict in {"same", "within tolerance"}, result.to_text()


@pytest.mark.parametrize("perturb", ["logprob", "token"])
def test_a_proxy_that_perturbs_cached_answers_is_caught_with_the_evidence(
    engine_server: LocalServer, perturb: str
) -> None:
    proxy = FaultProxy("127.0.0.1", engine_server.port, perturb=perturb)
    try:
        with connect(proxy.base_url) as backend:
            result = canary(backend)
            runner = CliRunner()
            cli = runner.invoke(main, ["doctor", "--canary", "--no-probe"], obj=Runtime(backend=backend))
    finally:
        proxy.close()
    print(f"\n{perturb}: {result.to_text()}")
    assert proxy.perturbed >= 2  # the canary's cached run, and the CLI's
    assert result.verdict == "diverged"
    worst = result.largest_divergence
    assert worst is not None and worst.run == "cached"
    if perturb == "logprob":
        assert worst.first_difference is None and worst.at == 0
        assert worst.largest_difference == pytest.approx(1.0, abs=1e-3)
    else:
        assert worst.first_difference == 0
        assert "cached ids:" in result.to_text()  # both outputs' ids, as evidence
    assert cli.exit_code == EXIT_CANARY, cli.output
    assert "diverged" in cli.output


@pytest.mark.vllm
def test_a_session_runs_the_canary_on_its_own_pack(vllm_server: LocalServer, tmp_path: Path) -> None:
    body = "".join(f"def handler_{n}(event):\n    return event.get('k{n}', {n})\n" for n in range(150))
    pack = StoredPack(
        fingerprint="e" * 64,
        format_version="test/1",
        system="You answer questions about the repository.",
        prefix=f"<repository>\n{body}</repository>\n\n",
        summary={"title": "canary pack"},
    )
    request = RequestOptions(max_tokens=8, temperature=0.0, cache_salt="canary-tenant")
    with connect(vllm_server.api_base) as backend, Store.open(tmp_path / "home") as store:
        session = Session(backend, pack, store=store, request=request)
        session.ask("What does handler_3 return?")
        result = session.canary()
    cached = result.run("cached")
    print(f"\nsession pack: {result.to_text()}")
    assert cached.salt == "canary-tenant"
    # The session's own cache held the pack: its whole prefix, read back.
    assert cached.cached_tokens and cached.prompt_tokens
    assert cached.cached_tokens >= cached.prompt_tokens - 256
    assert result.verdict in {"same", "within tolerance"}, result.to_text()
    assert session.canaries.results == (result,)
    assert CANARY_QUESTION not in [turn.question for turn in session.turns]  # the canary adds no turn
