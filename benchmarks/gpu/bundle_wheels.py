"""The wheel folders of a GPU bundle: what the image has left out, and no package in two folders.

    python3 bundle_wheels.py IMAGE_PACKAGES [--keep PREFIX]... DIR...   # prepare: drop, then check
    python3 bundle_wheels.py --check DIR...                            # install: check only

Folders are installed in one pip call (install.sh, install-sglang.sh), which
refuses two wheels of one name even at the same version ("Cannot install
jsonschema 4.26.0 ... and jsonschema 4.26.0"). Preparing, a wheel the GPU
image already has is removed (unless its name starts with a ``--keep``
prefix), and a wheel a folder earlier on the command line holds is removed
from the later one; two versions of one package stop the preparation with
both names. ``--check`` removes nothing and fails on any package found in
two folders, before pip is run. Standard library only: it runs on the GPU
machine's bare Python.
"""

from __future__ import annotations

import os
import re
import sys


def package(file_name: str) -> str:
    """The normalized package name of a wheel or sdist file name (``jsonschema_specifications`` -> ``jsonschema-specifications``)."""
    return re.split(r"-\d", file_name)[0].lower().replace("_", "-")


def prepare(have: set[str], keep: tuple[str, ...], folders: list[str]) -> None:
    seen: dict[str, str] = {}
    for folder in folders:
        for name in sorted(os.listdir(folder)):
            if not name.endswith((".whl", ".tar.gz", ".zip")):
                continue
            key = package(name)
            if (key in have and not name.startswith(keep)) or seen.get(key, "").endswith("/" + name):
                os.remove(os.path.join(folder, name))
            elif key in seen:
                sys.exit(f"two versions of {key}: {seen[key]} and {folder}/{name}")
            else:
                seen[key] = f"{folder}/{name}"


def check(folders: list[str]) -> None:
    seen: dict[str, str] = {}
    twice = []
    for folder in folders:
        for name in sorted(os.listdir(folder)):
            if not name.endswith((".whl", ".tar.gz", ".zip")):
                continue
            key = package(name)
            if key in seen:
                twice.append(f"{key}: {seen[key]} and {folder}/{name}")
            else:
                seen[key] = f"{folder}/{name}"
    if twice:
        sys.exit("a package in two folders (pip refuses to install both): " + "; ".join(twice))


def main(arguments: list[str]) -> None:
    if arguments[:1] == ["--check"]:
        check(arguments[1:])
        return
    image_packages, rest = arguments[0], arguments[1:]
    keep: list[str] = []
    while rest[:1] == ["--keep"]:
        keep.append(rest[1])
        rest = rest[2:]
    with open(image_packages) as listed:
        have = {line.strip() for line in listed if line.strip() and not line.startswith("#")}
    prepare(have, tuple(keep), rest)
    check(rest)


if __name__ == "__main__":
    main(sys.argv[1:])
