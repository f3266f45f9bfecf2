"""scripts/mutants.py: each module's run gets its own tests, and the equivalents list is well formed."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutants_script", ROOT / "scripts" / "mutants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_modules_run_mutates_only_it_against_only_its_tests() -> None:
    script = _script()
    settings = script.load_settings()
    module = "longctx/sources/secrets.py"
    narrowed = tomllib.loads(script.scratch_pyproject(settings, module))
    table = narrowed["tool"]["mutmut"]
    assert table["only_mutate"] == [module]
    assert table["pytest_add_cli_args_test_selection"] == settings.tests[module]
    assert table["source_paths"] == ["longctx"]
    # The rest of pyproject.toml is kept (pytest's settings apply inside the run too).
    assert narrowed["tool"]["pytest"] == tomllib.loads(settings.pyproject)["tool"]["pytest"]
    for tests in settings.tests.values():
        # Test files, and ``--deselect FILE::TEST`` pairs leaving out a test that cannot see a mutant.
        pairs = list(zip(["", *tests[:-1]], tests, strict=True))  # (the argument before, the argument)
        named = [arg for _, arg in pairs if arg != "--deselect"]
        assert tests and all((ROOT / arg.split("::", 1)[0]).is_file() for arg in named), tests
        assert all("::" in arg for before, arg in pairs if before == "--deselect"), tests


def test_every_equivalent_names_a_mutated_module_its_line_and_a_reason() -> None:
    script = _script()
    equivalents = script.load_equivalents()
    modules = {m.removesuffix(".py").replace("/", ".") for m in script.load_settings().tests}
    assert equivalents
    for name, entry in equivalents.items():
        assert name.rsplit(".", 1)[0] in modules, name
        assert entry.line and len(entry.reason) > 10, name


def test_the_score_leaves_out_equivalent_and_unrun_mutants() -> None:
    script = _script()
    result = script.ModuleResult(
        "m.py", statuses={"a": "killed", "b": "timeout", "c": "survived", "d": "survived", "e": "not checked"}
    )
    result.equivalent = ["d"]
    assert (result.killed, result.survived, result.not_run) == (2, 2, 1)
    assert result.score is not None and round(result.score, 1) == 66.7
    assert "| m.py | 5 | 2 | 2 | 1 | 1 | 66.7% |" in script.table([result])
