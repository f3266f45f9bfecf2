"""A small real repository with known answers: the fact questions the real-model tests and benchmarks ask.

:func:`write_fact_repository` makes a git repository of two modules of the
Python standard library (real code, copied from this interpreter's stdlib)
and a small project around them (a README, a settings module, a changelog)
whose facts no model can know from training. :data:`FACTS` are ten questions
about it, each with a rule that a right answer matches (a regular
expression, case-insensitive), so an answer is checked by rule, never by eye.

Planted sentences (:data:`PLANTED`) are facts written into the first, a
middle and the last document of the pack (the pack's own order, see
:func:`planted_positions`), to show the model reads every depth of it.
``filler`` pads the repository with more standard-library modules, for the
benchmark's larger packs; the facts stay the same.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from longctx.recordtypes import record_type

__all__ = [
    "FACTS",
    "FILLER_MODULES",
    "PLANTED",
    "Fact",
    "Planted",
    "document_order",
    "planted_positions",
    "score",
    "write_fact_repository",
]

STDLIB = Path(sysconfig.get_paths()["stdlib"])
MODULES = ("bisect.py", "colorsys.py")
"""The standard-library modules of the repository (about 2,800 tokens with the project's own files)."""
FILLER_MODULES = (
    "getopt.py", "fnmatch.py", "sched.py", "glob.py", "graphlib.py", "queue.py", "shlex.py",
    "textwrap.py", "heapq.py", "calendar.py", "locale.py", "gettext.py", "tempfile.py",
    "argparse.py", "difflib.py", "inspect.py", "pathlib.py",
)  # fmt: skip
"""Further standard-library modules, in this order, that pad the repository for larger packs."""


@record_type
class Fact:
    """A question with a known answer: a right answer matches ``expected`` (a regex, case-insensitive)."""

    question: str
    expected: str
    source: str

    def right(self, answer: str) -> bool:
        return re.search(self.expected, answer, re.IGNORECASE) is not None


@record_type
class Planted:
    """A sentence planted in one document of the pack, a question about it, and the rule its answer meets."""

    where: str
    sentence: str
    question: str
    expected: str

    def right(self, answer: str) -> bool:
        return re.search(self.expected, answer, re.IGNORECASE) is not None


README = """# skyline-tools

Small command-line helpers of the Skyline observatory, built on a few modules
of the Python standard library (bisect for sorted exposure tables, colorsys
for false-colour images).

The maintainer is Ingrid Halvorsen. The project is released under the
BSD-3-Clause licence.

Run the tests with `make check`.
"""

SETTINGS = '''"""Settings of skyline-tools, read once at start."""

DEFAULT_PORT = 8417
"""The port the exposure server listens on."""

MAX_RETRIES = 6
"""How many times a failed upload to the archive is retried."""

ARCHIVE_HOST = "archive.skyline.example"
"""Where finished exposures are uploaded."""

EXPOSURE_UNIT = "milliseconds"
"""The unit of every exposure time in the tables."""
'''

CHANGELOG = """# Changes

## 2.4.0

- Exposure tables are kept sorted with bisect.insort.
- The false-colour images use HLS instead of HSV.

## 2.3.1

- The upload retry count went from 4 to 6.
"""

FACTS: tuple[Fact, ...] = (
    Fact(
        "Which port does the exposure server listen on? Answer with the number.",
        r"\b8417\b",
        "settings.py",
    ),
    Fact(
        "How many times is a failed upload retried? Answer with the number.",
        r"\b6\b|\bsix\b",
        "settings.py",
    ),
    Fact(
        "Who is the maintainer of skyline-tools?",
        r"Ingrid Halvorsen|Halvorsen",
        "README.md",
    ),
    Fact("Under which licence is skyline-tools released?", r"BSD", "README.md"),
    Fact(
        "To which host are finished exposures uploaded?",
        r"archive\.skyline\.example",
        "settings.py",
    ),
    Fact(
        "Which function of bisect.py finds the insertion point to the left of any equal items?",
        r"bisect_left",
        "bisect.py",
    ),
    Fact(
        "Which constant of colorsys.py holds the value 1.0/3.0? Give its name.",
        r"ONE_THIRD",
        "colorsys.py",
    ),
    Fact(
        "Which function of colorsys.py converts RGB to HLS? Give its name.",
        r"rgb_to_hls",
        "colorsys.py",
    ),
    Fact(
        "In which release did the upload retry count change, according to the changelog?",
        r"2\.3\.1",
        "CHANGES.md",
    ),
    Fact("In what unit are exposure times given?", r"millisecond", "settings.py"),
)
"""Ten questions about :func:`write_fact_repository`'s repository, with the rule a right answer meets."""

PLANTED: tuple[Planted, ...] = (
    Planted(
        "start",
        "The observatory's night assistant is called Tobias Wennerholm.",
        "What is the name of the observatory's night assistant?",
        r"Wennerholm",
    ),
    Planted(
        "middle",
        "The spare telescope key is kept in locker 73.",
        "In which locker is the spare telescope key kept? Answer with the number.",
        r"\b73\b",
    ),
    Planted(
        "end",
        "The dome motor was last serviced by the firm Kvarnstrom Mekanik.",
        "Which firm last serviced the dome motor?",
        r"Kvarnstr",
    ),
)
"""Sentences planted at the start, in the middle and at the end of the pack, with their questions."""


def write_fact_repository(folder: Path, *, filler: int = 0, planted: bool = False) -> Path:
    """Write the repository into ``folder`` (created), commit it with git, and return it.

    ``filler``: how many of :data:`FILLER_MODULES` to add under ``vendor/``.
    ``planted``: write each of :data:`PLANTED` as a line into the document at
    its place in the pack's order (:func:`planted_positions`): the first, the
    middle one, the last. Every file is committed at once, so the pack's
    order (stability, ties by path) is the order of the paths.
    """
    folder.mkdir(parents=True, exist_ok=True)
    for name in MODULES:
        shutil.copy(STDLIB / name, folder / name)
    (folder / "README.md").write_text(README)
    (folder / "settings.py").write_text(SETTINGS)
    (folder / "CHANGES.md").write_text(CHANGELOG)
    if filler:
        (folder / "vendor").mkdir(exist_ok=True)
        for name in FILLER_MODULES[:filler]:
            shutil.copy(STDLIB / name, folder / "vendor" / name)
    if planted:
        for plant, path in zip(PLANTED, planted_positions(document_order(folder)), strict=True):
            _plant(folder / path, plant.sentence)
    _commit(folder)
    return folder


def document_order(folder: Path) -> list[str]:
    """The paths of ``folder``'s documents in the order longctx packs them."""
    from longctx import load_corpus

    return [document.path for document in load_corpus(folder).documents]


def planted_positions(order: Sequence[str]) -> tuple[str, str, str]:
    """The documents that hold the start, middle and end sentences: first, middle, last of ``order``."""
    return order[0], order[len(order) // 2], order[-1]


def _plant(path: Path, sentence: str) -> None:
    """Put ``sentence`` in the middle of ``path`` (a comment line for Python, a line of prose otherwise)."""
    lines = path.read_text().splitlines(keepends=True)
    line = f"# Note: {sentence}\n" if path.suffix == ".py" else f"\nNote: {sentence}\n\n"
    # Between two lines at the document's middle, moved down to a line that begins at column 0 so a
    # comment never lands inside a string or an indented block.
    index = len(lines) // 2
    while index < len(lines) and (lines[index][:1].isspace() or lines[index].startswith(('"', "'"))):
        index += 1
    lines.insert(index, line)
    path.write_text("".join(lines))


def _commit(folder: Path) -> None:
    git = ["git", "-c", "user.name=longctx", "-c", "user.email=tests@longctx.invalid"]
    if not (folder / ".git").exists():
        subprocess.run([*git, "init", "-q"], cwd=folder, check=True)
    subprocess.run([*git, "add", "-A"], cwd=folder, check=True)
    subprocess.run([*git, "commit", "-qm", "skyline-tools", "--allow-empty"], cwd=folder, check=True)


def score(facts: Sequence[Fact | Planted], answers: Sequence[str]) -> int:
    """How many of ``answers`` are right by their fact's rule (in order)."""
    return sum(fact.right(answer) for fact, answer in zip(facts, answers, strict=True))
