"""Planted secrets appear nowhere: not in the corpus text, the manifest, the logs or error messages."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from corpus_fixtures import (
    NOTEBOOK,
    build_adversarial_repository,
    credential_formats,
    isolated_git,
    make_pdf,
    planted_secrets,
    refusing_to_open,
    secret_fragments,
)

from longctx.errors import LongctxError
from longctx.options.groups import CorpusOptions
from longctx.sources.corpus import Corpus, load_corpus

__all__ = ["isolated_git"]  # imported so that it is autouse here


def _leaks(secrets: dict[str, str], *haystacks: str) -> list[str]:
    return [
        rule
        for rule, secret in secrets.items()
        for fragment in secret_fragments(secret)
        for haystack in haystacks
        if fragment in haystack
    ]


def _corpus_text(corpus: Corpus) -> str:
    return "\n".join(document.text for document in corpus.documents)


def _secret_tree(root: Path) -> dict[str, str]:
    """One file per rule, each secret surrounded by ordinary code; plus carriers of other kinds."""
    secrets = planted_secrets()
    for rule, secret in secrets.items():
        module = root / "src" / f"{rule.replace('-', '_')}.py"
        module.parent.mkdir(parents=True, exist_ok=True)
        module.write_text(f'"""Settings."""\n\nTIMEOUT = 30\nCREDENTIAL = """{secret}"""\n')
    (root / "paper.pdf").write_bytes(make_pdf(["Results", "token " + secrets["github-token"]]))
    notebook = json.loads(NOTEBOOK)
    notebook["cells"][1]["source"] = f"key = '{secrets['openai-api-key']}'\n"
    (root / "leaky.ipynb").write_text(json.dumps(notebook))
    clean_notebook = json.loads(NOTEBOOK)
    clean_notebook["cells"][1]["outputs"][0]["text"] = [secrets["slack-token"]]  # outputs are dropped
    (root / "outputs_only.ipynb").write_text(json.dumps(clean_notebook))
    broken = root / "broken.ipynb"
    broken.write_text('{"cells": [{"source": "' + secrets["npm-token"] + '"')  # invalid JSON
    (root / "truncated.pdf").write_bytes(make_pdf([secrets["stripe-secret-key"]])[:400])
    (root / ".env").write_text(f"TOKEN={secrets['gitlab-token']}\n")
    (root / "README.md").write_text("# Project\n\nNothing secret here.\n")
    return secrets


def test_planted_secrets_appear_nowhere(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    secrets = _secret_tree(tmp_path)
    caplog.set_level(logging.DEBUG)
    corpus = load_corpus([tmp_path])

    statuses = {entry.path: (entry.status, entry.reason) for entry in corpus.manifest}
    for rule in secrets:
        assert statuses[f"src/{rule.replace('-', '_')}.py"] == ("skipped", "secret"), rule
    assert statuses["paper.pdf"] == ("skipped", "secret")
    assert statuses["leaky.ipynb"] == ("skipped", "secret")
    assert statuses["outputs_only.ipynb"] == ("included", None)
    assert statuses["broken.ipynb"] == ("skipped", "corrupt")
    assert statuses["truncated.pdf"] == ("skipped", "corrupt")
    assert statuses[".env"] == ("skipped", "secret")
    assert statuses["README.md"] == ("included", None)

    haystacks = (
        _corpus_text(corpus),
        corpus.manifest.to_json(),
        json.dumps(corpus.manifest.to_dict()),
        caplog.text,
    )
    assert _leaks(secrets, *haystacks) == []
    assert all(record.getMessage() for record in caplog.records)  # the logs were captured at all


def test_the_manifest_names_the_rule_and_line_only(tmp_path: Path) -> None:
    secrets = _secret_tree(tmp_path)
    corpus = load_corpus([tmp_path])
    entry = corpus.manifest.get("src/github_token.py")
    assert entry is not None
    assert entry.notes == ("content matches github-token at line 4",)
    assert entry.sha256 is None  # not even a hash of a secret file
    pdf = corpus.manifest.get("paper.pdf")
    assert pdf is not None and pdf.notes == ("content matches github-token at line 4",)
    assert _leaks(secrets, repr(corpus.manifest)) == []


def test_adversarial_repository_secrets_appear_nowhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    adversarial = build_adversarial_repository(tmp_path)
    caplog.set_level(logging.DEBUG)
    with refusing_to_open(monkeypatch, adversarial.unreadable):
        corpus = load_corpus([adversarial.root])
    assert _leaks(adversarial.secrets, _corpus_text(corpus), corpus.manifest.to_json(), caplog.text) == []


def test_error_messages_carry_no_secrets(tmp_path: Path) -> None:
    secrets = _secret_tree(tmp_path)
    calls: list[Callable[[], object]] = [
        lambda: load_corpus([tmp_path / secrets["aws-access-key-id"]]),  # a path that does not exist
        lambda: load_corpus([tmp_path], CorpusOptions(include=["!"])),
        lambda: load_corpus([tmp_path], CorpusOptions(ordering="by-secret")),
    ]
    messages: list[str] = []
    for call in calls:
        with pytest.raises(LongctxError) as raised:
            call()
        error = raised.value
        path = getattr(error, "path", None)
        if path is not None:
            # The missing path is the caller's own argument, echoed as the CLI echoes it (str() is
            # the CLI's line); beyond it, nothing: no document's content.
            assert str(error) == f"{path}: {error.message}"
            messages.append(error.message)
        else:
            messages.append(str(error))
    assert _leaks(secrets, *messages) == []


def test_allow_secrets_includes_them_and_says_so(tmp_path: Path) -> None:
    secrets = _secret_tree(tmp_path)
    corpus = load_corpus([tmp_path], CorpusOptions(allow_secrets=True))
    by_path = {document.path: document for document in corpus.documents}
    assert secrets["aws-access-key-id"] in by_path["src/aws_access_key_id.py"].text
    assert secrets["github-token"] in by_path["paper.pdf"].text
    env = corpus.manifest.get(".env")
    assert env is not None and env.status == "included"
    assert env.notes == (
        "file name matches dotenv-file; included because secrets are allowed",
        "content matches gitlab-token at line 1; included because secrets are allowed",
    )
    entry = corpus.manifest.get("src/aws_access_key_id.py")
    assert entry is not None
    assert entry.notes == (
        "content matches aws-access-key-id at line 4; included because secrets are allowed",
    )
    assert _leaks(secrets, corpus.manifest.to_json()) == []


def test_every_credential_format_in_config_files_is_skipped_and_appears_nowhere(tmp_path: Path) -> None:
    """The formats other scanners accept (longer GitHub tokens, app tokens, credential-named assignments)."""
    formats = credential_formats()
    names = {}
    for number, (name, line) in enumerate(sorted(formats.items())):
        path = tmp_path / "config" / f"settings_{number}.cfg"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"# {name}\n[service]\ntimeout = 30\n{line}\nretries = 3\n")
        names[f"config/settings_{number}.cfg"] = name
    (tmp_path / "README.md").write_text("# Project\n")
    corpus = load_corpus(tmp_path)
    for path, name in names.items():
        entry = corpus.manifest.get(path)
        assert entry is not None and (entry.status, entry.reason) == ("skipped", "secret"), name
        assert entry.notes[0].startswith("content matches ") and entry.notes[0].endswith(" at line 4"), name
    values = {
        name: line.split("=", 1)[-1].split(": ", 1)[-1].strip("'\"{}") for name, line in formats.items()
    }
    assert _leaks(values, _corpus_text(corpus), corpus.manifest.to_json()) == []
