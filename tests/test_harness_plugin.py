"""The pytest plugin's rules, checked by running inner pytest sessions."""

from __future__ import annotations

import textwrap

import pytest

INNER_CONFTEST = """
pytest_plugins = ["longctx.testing.pytest_plugin"]
"""

# Stands in for a real engine so the inner session does not boot one: the
# plugin's rules are the same whatever the server is.
ADOPTING_CONFTEST = textwrap.dedent(
    """
    import sys, textwrap
    import pytest
    from longctx.testing.pytest_plugin import harness_of
    from longctx.testing.servers import http_ok, start_server

    pytest_plugins = ["longctx.testing.pytest_plugin"]

    SCRIPT = textwrap.dedent('''
        import http.server, sys
        print("inner engine says: loaded weights", flush=True)
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers()
            def log_message(self, *a):
                pass
        http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    ''')

    @pytest.hookimpl(trylast=True)
    def pytest_configure(config):
        script = config.rootpath / "fake_engine.py"
        script.write_text(SCRIPT)
        server = start_server(
            "vllm", [sys.executable, str(script), "{port}"], log_dir=config.rootpath / "logs",
            ready=lambda s: http_ok(s.base_url + "/"),
        )
        harness_of(config).adopt("vllm", server)
    """
)


def test_a_skipped_real_engine_test_fails_the_run(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.vllm
        def test_engine():
            pytest.skip("server not available")

        def test_unit():
            assert True
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["*real-engine tests skipped*", "SKIPPED *test_engine*", "*this fails the run*"]
    )


def test_skips_can_be_allowed_explicitly(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LONGCTX_ALLOW_ENGINE_SKIPS", "1")
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.sglang
        def test_engine():
            pytest.skip("not here")
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*allowed by LONGCTX_ALLOW_ENGINE_SKIPS=1*"])


def test_a_server_dying_mid_test_fails_it_with_the_log_tail(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(ADOPTING_CONFTEST)
    pytester.makepyfile(
        """
        import os, signal

        def test_server_dies(vllm_server):
            os.kill(vllm_server.pid, signal.SIGKILL)
            vllm_server.process.wait()

        def test_next_one_is_refused(vllm_server):
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, errors=1)
    result.stdout.fnmatch_lines(["*exited with code -9*", "*inner engine says: loaded weights*"])


def test_server_fixtures_carry_the_engine_marker(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(ADOPTING_CONFTEST)
    pytester.makepyfile(
        """
        def test_uses_vllm(vllm_server):
            assert vllm_server.alive()

        def test_plain():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "vllm")
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["*real-engine tests*", "vllm: 1 passed"])


def test_extra_servers_tests_run_grouped_before_the_shared_ones_and_each_server_stops_after_its_last(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(
        INNER_CONFTEST
        + textwrap.dedent(
            """
            import pytest

            @pytest.hookimpl(trylast=True)
            def pytest_collection_finish(session):
                guard = session.config.pluginmanager.get_plugin("longctx-engine-guard")
                print("ORDER", [item.name for item in session.items])
                print("STOPS", sorted((k.split("::")[-1], v) for k, v in guard.stop_after.items()))
            """
        )
    )
    pytester.makepyfile(
        """
        def test_fleet(vllm_fleet): pass
        def test_vllm_vision(vllm_vision_server): pass
        def test_no_report(sglang_without_cache_report): pass
        def test_sglang_vision_1(sglang_vision_server): pass
        def test_shared(vllm_server): pass
        def test_sglang_vision_2(sglang_vision_server): pass
        def test_unit(): pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q", "-s")
    result.stdout.fnmatch_lines(
        [
            "ORDER ['test_unit', 'test_no_report', 'test_sglang_vision_1', "
            "'test_sglang_vision_2', 'test_vllm_vision', 'test_shared', 'test_fleet']",
            "STOPS [('test_no_report', ['sglang-without-cache-report']), "
            "('test_sglang_vision_2', ['sglang-vision']), ('test_vllm_vision', ['vllm-vision'])]",
        ]
    )


def test_scripts_tests_three_selections_partition_the_suite(pytester: pytest.Pytester) -> None:
    """scripts/test's selections: "not vllm and not sglang", "(vllm or sglang) and not fleet", "fleet".

    Every test carries the markers that place it in exactly one: a fleet test is also vLLM's.
    """
    pytester.makeconftest(
        INNER_CONFTEST
        + textwrap.dedent(
            """
            import pytest

            @pytest.hookimpl(trylast=True)
            def pytest_collection_finish(session):
                for item in session.items:
                    marks = sorted({m.name for m in item.iter_markers()} & {"vllm", "sglang", "fleet"})
                    print("MARKS", item.name, ",".join(marks))
            """
        )
    )
    pytester.makepyfile(
        """
        def test_fleet(vllm_fleet): pass
        def test_shared(vllm_server): pass
        def test_real(real_engine_server): pass
        def test_unit(): pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q", "-s")
    marks = dict(line.split()[1:] if len(line.split()) == 3 else (line.split()[1], "")
                 for line in result.stdout.lines if line.startswith("MARKS "))  # fmt: skip
    assert marks == {
        "test_fleet": "fleet,vllm",
        "test_shared": "vllm",
        "test_real[vllm]": "vllm",
        "test_real[sglang]": "sglang",
        "test_unit": "",
    }


@pytest.mark.parametrize(("given", "seen"), [(None, "1"), ("3", "3")])
def test_the_sessions_servers_run_one_intra_op_thread_unless_the_caller_chose(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, given: str | None, seen: str
) -> None:
    """Servers inherit the session's environment (longctx.testing.servers.server_environment)."""
    if given is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", given)
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(
        f"""
        from pathlib import Path
        from longctx.testing.servers import server_environment

        def test_threads(tmp_path):
            assert server_environment(tmp_path)["OMP_NUM_THREADS"] == "{seen}"
        """
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
