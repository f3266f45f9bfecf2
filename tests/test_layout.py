"""The layout's rules (docs/architecture.md): no import circle, modules under 800 lines, functions under 80,
one home per library.

The imports are read from the source, not from a running interpreter, so
an import inside a function counts like one at the top (hiding a circle
in a function does not hide it here); only imports under ``if
TYPE_CHECKING:`` are left out, since they never run.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "longctx"
MAX_LINES = 800
MAX_FUNCTION_LINES = 80

# Each third-party library is imported by one module (or one folder) only.
LIBRARY_HOMES = {
    "git": ("longctx/sources/git.py",),
    "pypdf": ("longctx/sources/pdf.py",),
    "pypdfium2": ("longctx/sources/page_images.py",),
    "tiktoken": ("longctx/tokens/tokenizers.py",),
    "tenacity": ("longctx/retry.py",),
    "httpx2": ("longctx/backends/httpx2_bridge.py",),
    "click": ("longctx/cli/",),
    "mcp": ("longctx/mcp/server.py",),
    "jsonschema": ("longctx/schemas.py",),
    "llm": ("longctx/llm_plugin.py",),
    "charset_normalizer": ("longctx/sources/decoding.py",),
    "jinja2": ("longctx/lint/rendering.py",),
    "gguf": ("longctx/testing/gguf_conversion.py",),
    "numpy": ("longctx/testing/gguf_conversion.py",),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py")) if "standins" not in path.parts}


@functools.cache
def _tree(name: str) -> ast.Module:
    """Module ``name`` parsed, once for every test here (the exports test asks for some hundreds of times)."""
    return ast.parse(MODULES[name].read_text(encoding="utf-8"), filename=str(MODULES[name]))


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: all of them but those under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for branch in node.orelse for n in _runtime_imports_of(branch))
            continue
        yield from _runtime_imports_of(node)


def _runtime_imports_of(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _runtime_imports(node)


def _resolve(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The longctx modules ``node`` (in ``module``) makes Python import."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names if alias.name in MODULES)
        return
    base = node.module or ""
    if node.level:
        package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        if submodule in MODULES:
            yield submodule
        elif base in MODULES:
            yield base


def _all_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, those under ``if TYPE_CHECKING:`` included."""
    yield from (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


def import_graph(*, type_level: bool = False) -> dict[str, set[str]]:
    """Each module's imports of other longctx modules; with ``type_level``, type-only ones too."""
    imports = _all_imports if type_level else _runtime_imports
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        graph[name] = {target for node in imports(_tree(name)) for target in _resolve(name, node)} - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (as the list of modules around it), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circle_in_longctx() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_no_import_circle_at_the_type_level() -> None:
    """Two modules that name each other's types are one concept split in two, or a layer upside down."""
    cycle = find_cycle(import_graph(type_level=True))
    assert cycle is None, "circle through type-only imports: " + " -> ".join(cycle or [])


def test_the_circle_check_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_a_function_level_import_counts_and_a_type_checking_one_does_not() -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from longctx.packing import Pack\n"
        "def f():\n    from longctx.store import Store\n"
    )
    found = {target for node in _runtime_imports(tree) for target in _resolve("longctx.sources.corpus", node)}
    assert found == {"longctx.store"}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_over_800_lines(name: str) -> None:
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(ROOT)} has {lines} lines; split it by concept"


def long_functions(tree: ast.AST, limit: int = MAX_FUNCTION_LINES) -> Iterator[tuple[str, int, int]]:
    """(name, line, length) of each function or method in ``tree`` longer than ``limit`` lines.

    A function's length runs from its ``def`` line to its last line,
    docstring and blank lines included, decorators not.
    """
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > limit:
                yield node.name, node.lineno, length


def test_no_function_over_80_lines() -> None:
    """A function is a paragraph a reader can hold: past 80 lines, split it where the reader would."""
    strays = [
        f"{MODULES[name].relative_to(ROOT)}:{line} {function} has {length} lines"
        for name in MODULES
        for function, line, length in long_functions(_tree(name))
    ]
    assert not strays, strays


def test_the_length_check_finds_a_long_method_and_spares_an_80_line_function() -> None:
    fits = "def fits():\n" + "    x = 1\n" * 79  # 80 lines with its def
    over = "class C:\n    async def over(self):\n" + "        x = 1\n" * 80  # 81 lines
    assert list(long_functions(ast.parse(fits + over))) == [("over", 82, 81)]


def test_each_library_is_imported_in_its_one_home() -> None:
    strays: list[str] = []
    for name, path in MODULES.items():
        relative = path.relative_to(ROOT).as_posix()
        for node in ast.walk(_tree(name)):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                roots = {node.module.split(".")[0]}
            else:
                continue
            for library in roots & set(LIBRARY_HOMES):
                if not relative.startswith(LIBRARY_HOMES[library]) and not name.startswith("longctx.testing"):
                    strays.append(f"{relative} imports {library}")
    assert not strays, strays


def _imported_names(name: str) -> Iterator[tuple[str, str, int]]:
    """(module, name, line) of each name that module ``name`` imports from another longctx module."""
    for node in ast.walk(_tree(name)):
        if not isinstance(node, ast.ImportFrom) or node.level or node.module not in MODULES:
            continue
        for alias in node.names:
            if f"{node.module}.{alias.name}" not in MODULES:  # a name, not a submodule
                yield node.module, alias.name, node.lineno


def _exported(module: str) -> set[str] | None:
    """The names ``module`` exports: its literal ``__all__``, or a lazy package's export table."""
    table = _export_table(_tree(module))
    if table is not None:
        return set(table)
    for node in _tree(module).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return None


def _export_table(tree: ast.Module) -> dict[str, str] | None:
    """A lazy package's ``_EXPORTS`` (each public name and the module it loads from), or None."""
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "_EXPORTS" and node.value:
            return dict(ast.literal_eval(node.value))
    return None


def _type_checking_reexports(tree: ast.Module) -> dict[str, str]:
    """Each name imported under a top-level ``if TYPE_CHECKING:`` and its module (a re-export: ``X as X``)."""
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom):
                    for alias in statement.names:
                        key = (
                            alias.name
                            if alias.asname == alias.name
                            else f"{alias.name} (not `as {alias.name}`)"
                        )
                        found[key] = statement.module or ""
    return found


def test_a_lazy_packages_type_checking_imports_are_its_export_table() -> None:
    """A lazy package's names stand twice, once for each reader, and must agree.

    ``_EXPORTS`` for the interpreter (which imports a name on first use, and
    makes ``__all__`` of it), the ``if TYPE_CHECKING:`` imports for type
    checkers (``X as X``, so that they see a re-export).
    """
    lazy = {name: table for name in MODULES if (table := _export_table(_tree(name))) is not None}
    assert {"longctx", "longctx.packing"} <= set(lazy)
    for name, table in lazy.items():
        assert _type_checking_reexports(_tree(name)) == table, name


def test_the_export_check_finds_a_missing_and_a_plain_import() -> None:
    tree = ast.parse(
        '_EXPORTS: dict[str, str] = {"A": "m", "B": "m"}\nif TYPE_CHECKING:\n    from m import A\n'
    )
    assert _type_checking_reexports(tree) != _export_table(tree)
    assert _type_checking_reexports(tree) == {"A (not `as A`)": "m"}


def test_no_module_imports_a_private_name_of_another() -> None:
    strays = [
        f"{name}:{line} imports {module}.{imported}"
        for name in MODULES
        for module, imported, line in _imported_names(name)
        if imported.startswith("_")
    ]
    assert not strays, strays


def test_modules_talk_through_what_each_exports() -> None:
    """A name imported from another longctx module is in that module's ``__all__`` (packing/ first of all)."""
    strays = [
        f"{name}:{line} imports {imported}, which {module}.__all__ does not list"
        for name in MODULES
        if not name.startswith("longctx.testing")
        for module, imported, line in _imported_names(name)
        if (exported := _exported(module)) is not None and imported not in exported
    ]
    assert not strays, strays


# Reads of the environment outside config.py, each with why it is not a setting there.
ENVIRONMENT_READERS = {
    "longctx.sources.git": "git's own environment (locale, its executable), not a longctx setting",
    "longctx.cli.questions": "the terminal's TERM (whether it shows hyperlinks), not a longctx setting",
    "longctx.backends.http": "the proxies the environment names (*_proxy), read as httpx2 reads them",
}


def test_config_and_settings_are_the_only_readers_of_longctx_settings() -> None:
    strays: list[str] = []
    for name in MODULES:
        if name in (
            "longctx.options.groups",
            "longctx.options.settings",
            *ENVIRONMENT_READERS,
        ) or name.startswith("longctx.testing"):
            continue
        for node in ast.walk(_tree(name)):
            text = ast.unparse(node) if isinstance(node, (ast.Attribute, ast.keyword)) else ""
            if isinstance(node, ast.Attribute) and text in ("os.environ", "os.getenv"):
                strays.append(f"{name}:{node.lineno} reads {text}")
            elif isinstance(node, ast.keyword) and node.arg in ("envvar", "auto_envvar_prefix"):
                strays.append(f"{name}:{node.lineno} gives click {node.arg}")
    assert not strays, strays


def _package_docstring_misses(package: Path) -> list[str]:
    """The modules of ``package`` its ``__init__`` docstring does not name (``module`` or ``module.py``)."""
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    named = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", docstring))
    modules = sorted(
        path.stem if path.is_file() else path.name
        for path in package.iterdir()
        if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()
    )
    return [module for module in modules if module not in named]


def test_every_package_docstring_names_each_of_its_modules() -> None:
    # The top package's docstring is the public API's; docs/architecture.md is its map (below).
    packages = [
        path.parent for path in sorted(Path("longctx").rglob("__init__.py")) if path.parent.name != "longctx"
    ]
    assert len(packages) > 5
    missing = {str(package): misses for package in packages if (misses := _package_docstring_misses(package))}
    assert not missing, missing


def test_the_architecture_map_names_every_top_level_module_and_package() -> None:
    text = Path("docs/architecture.md").read_text()
    tops = [
        path for path in Path("longctx").iterdir() if path.suffix == ".py" or (path / "__init__.py").is_file()
    ]
    unnamed = [
        path.name
        for path in tops
        if path.name not in ("__init__.py", "__main__.py")
        and f"`{path.name}`" not in text
        and f"`{path.name}/`" not in text
    ]
    assert not unnamed, unnamed


def test_the_package_docstring_check_finds_an_unnamed_module(tmp_path: Path) -> None:
    package = tmp_path / "room"
    package.mkdir()
    (package / "__init__.py").write_text('"""A room: :mod:`room.named` holds one thing."""\n')
    (package / "named.py").write_text("")
    (package / "stray.py").write_text("")
    assert _package_docstring_misses(package) == ["stray"]


# What a package's face may hold beside its re-exports: its docstring, the lazy export table and
# its hook, ``__all__``, and the top package's version.
_FACE_NAMES = {"__all__", "_EXPORTS", "__getattr__", "__dir__", "__version__"}


def _face_strays(tree: ast.Module) -> list[str]:
    """What a package ``__init__`` holds beyond re-exports: code, or an import it does not hand on."""
    exported = set()
    for node in tree.body:
        assigned = (
            isinstance(node, (ast.Assign, ast.AugAssign)) and "__all__" in ast.unparse(node).split("=")[0]
        )
        if assigned and isinstance(node.value, (ast.List, ast.Tuple)):  # type: ignore[attr-defined]
            exported |= set(ast.literal_eval(node.value))  # type: ignore[attr-defined]
    table = _export_table(tree)
    exported |= set(table or ())
    strays: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.ImportFrom) and node.module in ("__future__", "typing", "longctx.exports"):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            handed = [alias.asname or alias.name for alias in node.names]
            strays += [
                f"line {node.lineno}: imports {name} without exporting it"
                for name in handed
                if name not in exported
            ]
            continue
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AnnAssign, ast.AugAssign))
            else []
        )
        names = {name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)}
        if targets and names <= _FACE_NAMES:
            continue
        strays.append(
            f"line {node.lineno}: {type(node).__name__} {getattr(node, 'name', ast.unparse(node)[:40])}"
        )
    return strays


def test_a_package_face_only_re_exports() -> None:
    """A package's ``__init__`` hands on names of its modules and holds no code of its own."""
    faces = {name: _face_strays(_tree(name)) for name, path in MODULES.items() if path.name == "__init__.py"}
    assert len(faces) > 10
    strays = {name: found for name, found in faces.items() if found}
    assert not strays, strays


def test_the_face_check_finds_code_and_an_import_not_handed_on() -> None:
    tree = ast.parse('"""A face."""\nfrom m import A, B\n__all__ = ["A"]\nclass C:\n    pass\n')
    assert _face_strays(tree) == ["line 2: imports B without exporting it", "line 4: ClassDef C"]


# Modules inside a package the CLI may take names from, each with why its package's face does not.
CLI_REACHES_IN = {
    "longctx.store.permissions": "the chat's history file is private like the store's; the store's face is "
    "its parts and records (tests/test_store.py holds it)",
}


def _cli_reaches_in() -> list[str]:
    """Each import of the CLI that takes a name from a module inside a package rather than its face.

    The CLI stands on the library's public names: ``longctx``'s, a package's
    (its ``__init__``'s ``__all__``) and the root modules' (``longctx.outputs``).
    """
    strays = []
    for name in MODULES:
        if not name.startswith("longctx.cli"):
            continue
        for node in ast.walk(_tree(name)):
            if (
                not isinstance(node, ast.ImportFrom)
                or node.level
                or not (node.module or "").startswith("longctx.")
            ):
                continue
            module = node.module or ""
            if module.startswith("longctx.cli") or module.count(".") == 1 or module in CLI_REACHES_IN:
                continue  # its own modules, a package's face or a root module
            strays.append(f"{name}:{node.lineno} imports from {module}")
    return strays


def test_the_cli_takes_library_names_from_package_faces_and_root_modules() -> None:
    strays = _cli_reaches_in()
    assert not strays, strays
    faces = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    for name in MODULES:
        if name.startswith("longctx.cli"):
            for module, imported, line in _imported_names(name):
                if module in faces and not module.startswith("longctx.cli"):
                    assert imported in (_exported(module) or ()), f"{name}:{line} {module}.{imported}"
