"""False positives of longctx's secret rules on two large corpora nobody wrote credentials into.

Scans every text file (no NUL byte in its first 8 KiB) of this Python's
standard library (site-packages left out) and of the site-packages folder
of the running interpreter's environment with
:func:`longctx.sources.secrets.find_secrets`, and counts the findings per
rule. Neither corpus holds a live credential, so every finding is a false
positive, with one exception that the table names: private keys in test
fixtures (real key material made for tests; packing them is what the rule
is there to prevent, so they count as true positives).

Run alone (``python benchmarks/secrets_fp.py [--write]``) or as the
``secrets`` section of ``benchmarks/run``; ``--write`` rewrites the
``secrets-false-positives`` section of docs/benchmarks.md. Every finding is
printed to stderr as ``corpus: path:line rule`` for review (never the
matched text).
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from longctx.sources.secrets import RULE_NAMES, find_secrets

SECTION = "secrets-false-positives"
_SNIFF = 8192
_TEST_KEY_RULE = "private-key"


@dataclass
class Scan:
    """What one corpus gave: files and bytes scanned, findings per rule, the time the scan took."""

    name: str
    root: Path
    files: int = 0
    size: int = 0
    seconds: float = 0.0
    findings: Counter[str] = field(default_factory=Counter)
    files_flagged: Counter[str] = field(default_factory=Counter)


def _texts(root: Path, skip: str | None) -> list[tuple[Path, str]]:
    texts = []
    for folder, folders, names in os.walk(root):
        folders[:] = sorted(name for name in folders if name not in ("__pycache__", skip))
        for name in sorted(names):
            path = Path(folder) / name
            try:
                if not path.is_file() or path.is_symlink():
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            if b"\0" in data[:_SNIFF]:
                continue
            texts.append((path, data.decode("utf-8", "replace")))
    return texts


def scan(name: str, root: Path, *, skip: str | None = None) -> Scan:
    """Scan the text files under ``root`` (``skip``: a folder name left out) and count findings."""
    result = Scan(name, root)
    texts = _texts(root, skip)
    started = time.perf_counter()
    for path, text in texts:
        findings = find_secrets(text, limit=1000)
        result.files += 1
        result.size += len(text)
        for rule in {finding.rule for finding in findings}:
            result.files_flagged[rule] += 1
        for finding in findings:
            result.findings[finding.rule] += 1
            print(f"{name}: {path.relative_to(root)}:{finding.line} {finding.rule}", file=sys.stderr)
    result.seconds = time.perf_counter() - started
    return result


def corpora() -> list[Scan]:
    """The standard library and the running environment's site-packages."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    purelib = Path(sysconfig.get_paths()["purelib"])
    return [scan("standard library", stdlib, skip="site-packages"), scan("site-packages", purelib)]


def table(scans: list[Scan]) -> str:
    """The docs/benchmarks.md section for ``scans``."""
    lines = [
        "## Secret rules: false positives on code nobody put credentials in",
        "",
        "`benchmarks/secrets_fp.py` runs `find_secrets` over every text file of two corpora: "
        + "; ".join(
            f"{scan.name} ({scan.files:,} files, {scan.size / 2**20:.0f} MiB of text, scanned in"
            f" {scan.seconds:.1f} s)"
            for scan in scans
        )
        + ". The site-packages are those of the environment the script runs in (longctx's test extra:"
        " mypy, hypothesis, cryptography, IPython, GitPython, pypdf, rich...). Neither holds a live"
        " credential, so every finding is a false positive, except private keys in test fixtures: real"
        " key material made for tests, which the private-key rule is right to keep out of a pack."
        " Each cell: findings (files).",
        "",
        "| rule | " + " | ".join(scan.name for scan in scans) + " |",
        "|---|" + "---:|" * len(scans),
    ]
    for rule in RULE_NAMES:
        cells = [f"{scan.findings[rule]} ({scan.files_flagged[rule]})" for scan in scans]
        lines.append(f"| {rule} | " + " | ".join(cells) + " |")
    false_positives = [
        sum(count for rule, count in scan.findings.items() if rule != _TEST_KEY_RULE) for scan in scans
    ]
    lines += [
        "",
        "False positives outside the private-key rule: "
        + ", ".join(f"{count} in the {scan.name}" for scan, count in zip(scans, false_positives, strict=True))
        + ".",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite the section of docs/benchmarks.md")
    args = parser.parse_args()
    body = table(corpora())
    print(body)
    if args.write:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench import write_section

        write_section(SECTION, body)


if __name__ == "__main__":
    main()
