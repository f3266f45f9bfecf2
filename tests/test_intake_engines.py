"""The first day against real engines: the warm start's cached share, and `longctx serve --cpu-demo`."""

from __future__ import annotations

import sysconfig
import uuid
from pathlib import Path

import pytest

from longctx.backends.base import connect
from longctx.config import RequestOptions
from longctx.sessions import Session
from longctx.store import Store, StoredPack
from longctx.testing import LocalServer

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def _pack() -> StoredPack:
    """About 2,500 tokens of standard-library text, unique per call (its first request is cold)."""
    nonce = uuid.uuid4().hex
    return StoredPack(
        fingerprint=nonce + nonce,
        format_version="test/1",
        system=f"Answer questions about the documents. [{nonce}]",
        prefix=f"<documents>\n{(STDLIB / 'argparse.py').read_text()[:10_000]}\n</documents>\n\n",
        summary={"title": "stdlib text"},
    )


def test_a_warm_start_says_how_much_of_the_pack_the_server_had_cached(
    engine_server: LocalServer, tmp_path: Path
) -> None:
    """The pack was computed for another store's session: the warm request reads it from the cache."""
    backend = connect(engine_server.api_base)
    pack = _pack()
    with Store.open(tmp_path / "first") as store:
        Session(backend, pack, store=store, request=RequestOptions(max_tokens=2)).ask("Warm the prefix.")
    with Store.open(tmp_path / "second") as store:
        request = RequestOptions(max_tokens=2, warm_start=True)
        with Session(backend, pack, store=store, request=request) as session:
            assert session.warming is not None
            result = session.warming.wait(timeout=120)
    assert result is not None and result.usage is not None, result
    assert result.usage.cached_tokens is not None and result.usage.cached_tokens > 2000, result.usage
    assert "unknown" not in result.summary_line()


@pytest.mark.sglang
def test_a_warm_start_on_a_server_that_reports_no_cached_tokens_says_which_switch_is_missing(
    sglang_without_cache_report: LocalServer, tmp_path: Path
) -> None:
    backend = connect(sglang_without_cache_report.api_base)
    request = RequestOptions(max_tokens=2, warm_start=True)
    with (
        Store.open(tmp_path / "home") as store,
        Session(backend, _pack(), store=store, request=request) as session,
    ):
        assert session.warming is not None
        result = session.warming.wait(timeout=120)
    assert result is not None and result.usage is not None and result.usage.cached_tokens is None
    assert result.summary_line().startswith("warm start: pack prefilled (unknown of ")
    assert "start it with --enable-cache-report" in result.summary_line()
