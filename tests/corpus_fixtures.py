"""Builders for corpus tests: isolated git, repositories, PDFs, planted secrets.

Secrets are assembled at run time from pieces, so this file (and the test
files) never contain a complete credential: a scan of this repository, or a
push protection, does not trip on them.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import hashlib
import os
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from longctx.testing.pdfs import text_pdf

_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_UPPER_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_BASE64 = _ALNUM + "+/"


def token(seed: str, length: int, alphabet: str = _ALNUM) -> str:
    """A deterministic random-looking string of ``length`` characters from ``alphabet``."""
    out: list[str] = []
    counter = 0
    while len(out) < length:
        digest = hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        out.extend(alphabet[byte % len(alphabet)] for byte in digest)
        counter += 1
    return "".join(out[:length])


def planted_secrets() -> dict[str, str]:
    """One credential per content rule, keyed by the rule name that must catch it."""
    key_body = "\n".join(token(f"rsa{i}", 64, _BASE64) for i in range(6))
    return {
        "aws-access-key-id": "AK" + "IA" + token("aws", 16, _UPPER_DIGITS),
        "aws-secret-access-key": "aws_secret" + "_access_key = " + token("awssecret", 40, _BASE64),
        "github-token": "gh" + "p_" + token("ghp", 36),
        "github-fine-grained-token": "github" + "_pat_" + token("ghpat1", 22) + "_" + token("ghpat2", 59),
        "gitlab-token": "gl" + "pat-" + token("glpat", 20),
        "private-key": "-----BEGIN RSA "
        + "PRIVATE KEY-----\n"
        + key_body
        + "\n-----END RSA PRIVATE KEY-----",
        "slack-token": "xo" + "xb-" + "123456789012-1234567890123-" + token("slack", 24),
        "slack-webhook": "https://hooks.slack" + ".com/services/T0ABCDEF1/B0ABCDEF2/" + token("hook", 24),
        "stripe-secret-key": "sk" + "_live_" + token("stripe", 24),
        "google-api-key": "AI" + "za" + token("google", 35),
        "openai-api-key": "sk-" + "proj-" + token("oai1", 40) + "T3Blbk" + "FJ" + token("oai2", 40),
        "anthropic-api-key": "sk-" + "ant-api03-" + token("ant", 90),
        "npm-token": "np" + "m_" + token("npm", 36),
        "pypi-token": "py" + "pi-AgEIcHlwaS5vcmc" + token("pypi", 60),
        "sendgrid-api-key": "S" + "G." + token("sg1", 22) + "." + token("sg2", 43),
        "huggingface-token": "h" + "f_" + token("hf", 34, _LETTERS),
        "credential-assignment": "db_pass" + "word=" + token("dbpass", 24),
    }


def credential_formats() -> dict[str, str]:
    """Credentials in the formats real scanners accept beyond the planted ones, each as a config line."""
    return {
        "classic token, 40 characters": "GITHUB_TOKEN=" + "gh" + "p_" + token("ghp40", 40),
        "app installation token": "token: " + "gh" + "s_" + token("ghs", 36),
        "user-to-server token": "gh" + "u_" + token("ghu", 36),
        "OAuth token": "gh" + "o_" + token("gho", 36),
        "refresh token, long": "gh" + "r_" + token("ghr", 76),
        "fine-grained token, long": "github" + "_pat_" + token("fg1", 22) + "_" + token("fg2", 70),
        "API key in YAML": "  api_key: " + token("yaml", 32),
        "secret in JSON": '{"client_secret": "' + token("json", 40, _BASE64) + '"}',
        "token in shell": "export SERVICE_TOKEN='" + token("shell", 28) + "'",
        "password in TOML": 'password = "' + token("toml", 20) + '"',
        "hex key in Go": 'signingKey := "' + token("go", 32, "0123456789abcdef") + '"',
    }


def secret_fragments(secret: str) -> list[str]:
    """The parts of a planted secret that must never leak: the secret and, for blocks, each line of it."""
    parts = [secret]
    parts.extend(line for line in secret.splitlines() if len(line) >= 20 and "PRIVATE KEY" not in line)
    if "=" in secret:
        parts.append(secret.split("=", 1)[1].strip())
    return parts


def git(repo: Path, *arguments: str, env: dict[str, str] | None = None) -> str:
    """Run git in ``repo`` and return its output; fail the test on error."""
    result = subprocess.run(
        ["git", *arguments],
        cwd=repo,
        capture_output=True,
        env={**os.environ, **(env or {})},
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"git {' '.join(arguments)} failed: {result.stderr.decode(errors='replace')}")
    return result.stdout.decode("utf-8", "surrogateescape")


def commit(repo: Path, message: str, *, when: int) -> None:
    """Commit everything staged with author and committer time ``when`` (unix seconds)."""
    date = f"@{when} +0000"
    git(
        repo,
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        message,
        env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date},
    )


def init_repo(path: Path) -> Path:
    """Create an empty repository at ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    return path


def committed_repo(path: Path, files: Mapping[str, str | bytes], *, message: str = "init") -> Path:
    """A repository at ``path`` holding ``files`` (relative path -> text or bytes), all in one commit.

    The committer is named on git's command line, so this works in modules
    without :func:`isolated_git` too.
    """
    init_repo(path)
    for name, content in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    identity = ("-c", "user.name=t", "-c", "user.email=t@example.com")
    git(path, *identity, "add", "-A")
    git(path, *identity, "commit", "-qm", message)
    return path


@pytest.fixture(autouse=True)
def isolated_git(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Git sees no user or system configuration: a fresh global config, known identity, no hooks.

    Returns the global config file, so a test can add ``core.excludesFile``.
    Modules that need it import this fixture, which makes it autouse there.
    """
    home = tmp_path_factory.mktemp("git-home")
    config = home / ".gitconfig"
    config.write_text(
        "[user]\n\tname = Corpus Test\n\temail = corpus@example.invalid\n"
        "[init]\n\tdefaultBranch = main\n"
        '[protocol "file"]\n\tallow = always\n'
        "[core]\n\tautocrlf = false\n"
    )
    for name in list(os.environ):
        if name.startswith("GIT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    yield config


def make_pdf(
    pages: list[str | None], *, user_password: str | None = None, owner_password: str | None = None
) -> bytes:
    """A PDF whose pages hold ``pages`` (None: a page with no text, like a scan), optionally encrypted."""
    return text_pdf(pages, user_password=user_password, owner_password=owner_password)


LFS_POINTER = (
    b"version https://git-lfs.github.com/spec/v1\n"
    b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
    b"size 12345\n"
)

NOTEBOOK = """{
 "cells": [
  {"cell_type": "markdown", "metadata": {}, "source": ["# Title\\n", "Some prose."]},
  {"cell_type": "code", "execution_count": 3, "metadata": {},
   "outputs": [{"output_type": "stream", "name": "stdout", "text": ["OUTPUT-MUST-NOT-APPEAR\\n"]}],
   "source": "print('hello')\\n"},
  {"cell_type": "raw", "metadata": {}, "source": []}
 ],
 "metadata": {"kernelspec": {"name": "python3"}},
 "nbformat": 4,
 "nbformat_minor": 5
}
"""


@dataclass(frozen=True)
class AdversarialRepository:
    """A repository full of traps, and the manifest status each considered path must get.

    ``unreadable`` must be made unreadable by the test (by injecting a
    failing ``os.open``): tests run as root, where ``chmod 000`` does not
    stop reads. ``secrets`` are the credentials planted in it.
    """

    root: Path
    expected: dict[str, tuple[str, str | None]]
    unreadable: Path
    secrets: dict[str, str]


def build_adversarial_repository(base: Path) -> AdversarialRepository:
    """Build the adversarial repository under ``base`` (see AdversarialRepository)."""
    secrets = planted_secrets()
    outside = base / "outside"
    outside.mkdir()
    (outside / "target.txt").write_text("OUTSIDE-THE-ROOT\n")
    library = init_repo(base / "library")
    (library / "lib.py").write_text("def library(): pass\n")
    git(library, "add", ".")
    commit(library, "library", when=1_400_000_000)

    root = init_repo(base / "repo")

    def write(relative: str, content: str | bytes) -> Path:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    expected: dict[str, tuple[str, str | None]] = {}
    included = ("included", None)

    def plant(relative: str, content: str | bytes, status: tuple[str, str | None]) -> Path:
        expected[relative] = status
        return write(relative, content)

    plant(".gitignore", "*.log\nbuild/\n", included)
    write("build/out.js", "ignored\n")
    write("app.log", "ignored\n")
    plant("sub/.gitignore", "*.tmp\n!keep.tmp\n", included)
    write("sub/drop.tmp", "ignored\n")
    plant("sub/keep.tmp", "kept by negation\n", included)
    plant("src/main.py", "def main():\n    return 42\n", included)
    plant("src/util.py", "VERSION = 1\n", included)
    plant("bin/blob.bin", bytes(range(256)) * 4, ("skipped", "binary"))
    plant("notes.txt", b"looks like text\x00but has a NUL\n", ("skipped", "binary"))
    plant("picture.png", "this .png holds text\n", included)
    plant("data/latin1.txt", b"caf\xe9 cr\xe8me\n", included)
    plant("data/stray.txt", "naïve\n".encode() + b"\xff\n", included)
    plant("docs/bom8.md", codecs.BOM_UTF8 + "# Títle\n".encode(), included)
    plant("docs/utf16le.txt", codecs.BOM_UTF16_LE + "utf-16 le ✓\n".encode("utf-16-le"), included)
    plant("docs/utf16be.txt", codecs.BOM_UTF16_BE + "utf-16 be ✓\n".encode("utf-16-be"), included)
    plant("crlf.txt", b"one\r\ntwo\rthree\n", included)
    plant("empty.txt", "", included)
    plant("big.txt", "x" * (4 * 1024 * 1024) + "\n", ("skipped", "too-large"))
    plant("with space.txt", "spaces\n", included)
    plant("ünïcödé.md", "unicode name\n", included)
    plant("new\nline.txt", "newline in the name\n", included)
    plant(os.fsdecode(b"latin\xe9-name.txt"), "undecodable name\n", included)
    plant("assets/model.bin", LFS_POINTER, ("skipped", "lfs-pointer"))
    plant(
        ".env",
        f"DATABASE_URL=postgres://app@db/app\nAWS_KEY={secrets['aws-access-key-id']}\n",
        ("skipped", "secret"),
    )
    plant(
        "config/settings.py",
        f"DEBUG = False\nAWS_ACCESS_KEY_ID = '{secrets['aws-access-key-id']}'\n"
        f"GITHUB_TOKEN = '{secrets['github-token']}'\n{secrets['aws-secret-access-key']!s}\n",
        ("skipped", "secret"),
    )
    plant("keys/deploy.pem", secrets["private-key"] + "\n", ("skipped", "secret"))
    plant("id_rsa", secrets["private-key"] + "\n", ("skipped", "secret"))
    plant("nb/analysis.ipynb", NOTEBOOK, included)
    plant("nb/broken.ipynb", '{"cells": [', ("skipped", "corrupt"))
    plant("papers/paper.pdf", make_pdf(["Introduction", None, "Conclusion"]), included)
    plant("papers/locked.pdf", make_pdf(["Hidden"], user_password="pw"), ("skipped", "encrypted"))
    plant("papers/truncated.pdf", make_pdf(["Cut short"])[:300], ("skipped", "corrupt"))
    unreadable = plant("locked.txt", "nobody may read this\n", ("skipped", "unreadable"))
    plant("pipe", "a file that becomes a FIFO\n", ("skipped", "not-a-regular-file"))
    plant("gone.txt", "deleted in the work tree\n", ("skipped", "unreadable"))
    for link, target, status in (
        ("loop-a", "loop-b", ("skipped", "symlink-loop")),
        ("loop-b", "loop-a", ("skipped", "symlink-loop")),
        ("self-loop", "self-loop", ("skipped", "symlink-loop")),
        ("escape.txt", "../outside/target.txt", ("skipped", "symlink-outside-root")),
        ("escape-absolute.txt", str(outside / "target.txt"), ("skipped", "symlink-outside-root")),
        ("main-link.py", "src/main.py", included),
        ("docs-link", "docs", ("skipped", "not-a-regular-file")),
    ):
        os.symlink(target, root / link)
        expected[link] = status
    git(root, "add", ".")
    commit(root, "everything", when=1_500_000_000)
    git(root, "submodule", "add", "-q", str(library), "vendor/lib")
    expected[".gitmodules"] = included
    expected["vendor/lib/"] = ("skipped", "submodule")
    commit(root, "submodule", when=1_500_000_100)

    # The working tree moves on.
    write("src/util.py", "VERSION = 2\n")
    (root / "gone.txt").unlink()
    (root / "pipe").unlink()
    os.mkfifo(root / "pipe")
    plant("scratch.py", "print('untracked')\n", included)
    write("debug.log", "ignored, untracked\n")
    nested = init_repo(root / "experiments")
    (nested / "trial.py").write_text("trial\n")
    expected["experiments/"] = ("skipped", "submodule")
    return AdversarialRepository(root, expected, unreadable, secrets)


@contextlib.contextmanager
def refusing_to_open(monkeypatch: pytest.MonkeyPatch, locked: Path) -> Iterator[None]:
    """Make ``os.open`` fail with EACCES for ``locked`` only.

    This is how the tests simulate an unreadable file: they run as root,
    where ``chmod 000`` does not stop reads.
    """
    real_open = os.open

    def guarded_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path) == str(locked):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(os, "open", guarded_open)
        yield
