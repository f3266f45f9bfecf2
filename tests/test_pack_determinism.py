"""Same inputs, same bytes: a golden pack; packs built under other seeds, locales, folders, listing orders.

Set ``PACK_GOLDEN_UPDATE=1`` to rewrite the golden files after a deliberate
format change (which must come with a new FORMAT_VERSION).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pack_fixtures import corpus_of, document

from longctx.packing import FORMAT_VERSION, Pack, build_pack
from longctx.sources import SkipReason
from longctx.sources.corpus import Corpus, load_corpus

GOLDEN = Path(__file__).parent / "fixtures" / "pack"
REPOSITORY = Path(__file__).resolve().parent.parent

PDF_TEXT = (
    "--- page 1 of 3 ---\nIntroduction\nThe pack is stable.\n"
    "--- page 2 of 3 ---\n"
    "--- page 3 of 3 ---\nConclusion\n"
)
NOTEBOOK_TEXT = "# %% [markdown]\n# Title\nSome prose.\n\n# %% [code]\nprint('hello')\n\n# %% [raw]\n"


def golden_corpus() -> Corpus:
    """The fixture corpus: unicode, spaces, a PDF's pages, a notebook, odd paths, skipped files."""
    documents = [
        document(
            "README.md", "# Fixture\n\nA corpus for the golden pack. ```code``` inside.\n", kind="markdown"
        ),
        document("src/main.py", "def main() -> int:\n    return 42\n"),
        document("src/ünïcödé.py", "NAME = 'naïve café 中文 \U0001f600'\n"),
        document("docs/with space.md", "Spaces in the path.\n", kind="markdown"),
        document("papers/paper.pdf", PDF_TEXT, kind="pdf"),
        document("nb/analysis.ipynb", NOTEBOOK_TEXT, kind="notebook"),
        document("new\nline.txt", "newline in the name", kind="text"),
        document("latin\udce9-name.txt", "undecodable name\n", kind="text"),
        document("fence.md", "````\n``` not a fence\n</documents>\nQuestion:\n", kind="markdown"),
        document("empty.txt", "", kind="text"),
    ]
    return corpus_of(documents, {"bin/blob.bin": SkipReason.BINARY, ".env": SkipReason.SECRET})


def _digest(pack: Pack) -> str:
    return hashlib.sha256((pack.system + "\0" + pack.prefix).encode("utf-8")).hexdigest()


def test_golden_pack_bytes() -> None:
    pack = build_pack(golden_corpus())
    files = {
        "system.txt": pack.system.encode("utf-8"),
        "prefix.txt": pack.prefix.encode("utf-8"),
        "fingerprints.json": json.dumps(
            {
                "format_version": pack.format_version,
                "fingerprint": pack.fingerprint,
                "sections": {section.name: section.fingerprint for section in pack.sections},
            },
            indent=1,
            sort_keys=True,
            ensure_ascii=True,
        ).encode()
        + b"\n",
    }
    if os.environ.get("PACK_GOLDEN_UPDATE") == "1":
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for name, content in files.items():
            (GOLDEN / name).write_bytes(content)
    for name, content in files.items():
        assert (GOLDEN / name).read_bytes() == content, (
            f"{name} differs from the golden file: a change to the pack's bytes needs a new "
            f"FORMAT_VERSION (now {FORMAT_VERSION}) and PACK_GOLDEN_UPDATE=1"
        )
    assert json.loads((GOLDEN / "fingerprints.json").read_text())["format_version"] == FORMAT_VERSION


_SCRIPT = """
import hashlib, sys
sys.path.insert(0, sys.argv[1])
from test_pack_determinism import golden_corpus, _digest
from longctx.packing import build_pack
from longctx.sources.corpus import Corpus, load_corpus
print(_digest(build_pack(golden_corpus())))
print(_digest(build_pack(load_corpus(sys.argv[2]))))
"""


def _make_folder(root: Path, order: list[str]) -> Path:
    contents = {
        "b/z.py": "Z = 1\n",
        "a.py": "A = 1\n",
        "B.md": "upper\n",
        "b/ä.txt": "umlaut\n",
        "b/a b.txt": "space\n",
        "c/d/e.txt": "deep\n",
    }
    for name in order:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(contents[name], encoding="utf-8")
    return root


@pytest.mark.parametrize(
    ("seed", "locale_name"),
    [("0", "C"), ("1", "C.UTF-8"), ("12345", "tr_TR.UTF-8"), ("random", "de_DE.UTF-8")],
)
def test_same_bytes_across_processes_seeds_locales_and_folders(
    tmp_path: Path, seed: str, locale_name: str
) -> None:
    order = ["a.py", "b/z.py", "B.md", "b/ä.txt", "b/a b.txt", "c/d/e.txt"]
    reference_folder = _make_folder(tmp_path / "one" / "corpus", order)
    expected_golden = _digest(build_pack(golden_corpus()))
    expected_folder = _digest(build_pack(load_corpus(reference_folder)))

    # The same files created in another order, in another place, read from another working directory.
    other_folder = _make_folder(tmp_path / "two" / "corpus", list(reversed(order)))
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    environment = {
        **{key: value for key, value in os.environ.items() if not key.startswith("LC_")},
        "PYTHONHASHSEED": seed,
        "LC_ALL": locale_name,
        "LANG": locale_name,
    }
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(Path(__file__).parent), str(other_folder)],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    golden_digest, folder_digest = result.stdout.split()
    assert golden_digest == expected_golden
    assert folder_digest == expected_folder


def test_a_copied_folder_packs_to_the_same_bytes(tmp_path: Path) -> None:
    source = _make_folder(
        tmp_path / "x" / "corpus", ["c/d/e.txt", "a.py", "b/ä.txt", "B.md", "b/z.py", "b/a b.txt"]
    )
    copy = tmp_path / "y" / "deeper" / "corpus"
    shutil.copytree(source, copy)
    first, second = build_pack(load_corpus(source)), build_pack(load_corpus(copy))
    assert first.prefix == second.prefix
    assert first.fingerprint == second.fingerprint
    assert str(tmp_path) not in first.prefix
