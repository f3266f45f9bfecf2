"""Credential detection: every rule fires on its format, ordinary code does not."""

from __future__ import annotations

import sysconfig
import time
from pathlib import Path

import pytest
from corpus_fixtures import credential_formats, planted_secrets, token

from longctx.sources.secrets import RULE_NAMES, find_secrets, redact_if_secret, secret_file_rule


def test_every_rule_has_a_planted_secret() -> None:
    assert set(planted_secrets()) == set(RULE_NAMES)


@pytest.mark.parametrize("rule", sorted(planted_secrets()))
def test_each_rule_finds_its_secret_and_reports_the_line(rule: str) -> None:
    secret = planted_secrets()[rule]
    text = f"import os\n\n\nCONFIG = {{\n    'value': '{secret}',\n}}\n"
    findings = find_secrets(text)
    assert [(finding.rule, finding.line) for finding in findings] == [(rule, 5)]


@pytest.mark.parametrize("rule", sorted(planted_secrets()))
def test_findings_never_carry_the_secret(rule: str) -> None:
    secret = planted_secrets()[rule]
    findings = find_secrets(f"x = '{secret}'")
    assert findings, f"the planted {rule} secret was not found"
    for finding in findings:
        assert secret not in repr(finding)
        assert secret not in str(finding)
    assert redact_if_secret(f"bad object {secret}") == f"(message withheld: it matches the {rule} pattern)"


@pytest.mark.parametrize(
    "rule",
    ["aws-access-key-id", "npm-token", "huggingface-token"],
)
def test_a_token_glued_to_a_longer_word_is_not_a_token(rule: str) -> None:
    secret = planted_secrets()[rule]
    assert find_secrets("x" + secret) == ()
    assert find_secrets(secret + "x") == ()


def test_github_tokens_longer_than_36_are_tokens_but_not_glued_to_a_word() -> None:
    secret = planted_secrets()["github-token"]
    assert find_secrets("x" + secret) == ()
    assert [finding.rule for finding in find_secrets(secret + "x")] == ["github-token"]


@pytest.mark.parametrize("name", sorted(credential_formats()))
def test_each_credential_format_is_found(name: str) -> None:
    line = credential_formats()[name]
    findings = find_secrets(f"# settings\n{line}\n")
    assert [finding.line for finding in findings] == [2], name


@pytest.mark.parametrize(
    "name",
    [
        "token",
        "API_TOKEN",
        "Secret",
        "db_passwd",
        "KEY",
        "credentials",
        "secretKey",
        "tokenkey",
        "myCredential",
    ],
)
def test_every_credential_word_is_found_in_any_case_and_next_to_another(name: str) -> None:
    value = token("assigned", 24)
    findings = find_secrets(f"x = 1\n{name} = '{value}'\n{name}: {value}\n")
    # Two words in one name ("secretKey") give a finding each.
    assert {(finding.rule, finding.line) for finding in findings} == {
        ("credential-assignment", 2),
        ("credential-assignment", 3),
    }


def test_a_github_token_in_a_config_file_is_named_by_its_own_rule() -> None:
    text = "[auth]\nGITHUB_TOKEN=" + "gh" + "p_" + token("cfg", 40) + "\n"
    assert [(finding.rule, finding.line) for finding in find_secrets(text)] == [("github-token", 2)]


def test_published_placeholders_are_not_secrets() -> None:
    assert find_secrets("aws_access_key_id = AKIAIOSFODNN7EXAMPLE") == ()
    assert find_secrets("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY") == ()


@pytest.mark.parametrize(
    "text",
    [
        # A PEM parser mentions the header without holding a key.
        'if line.startswith("-----BEGIN PRIVATE KEY-----"):\n    return parse(lines)\n',
        "PEM_HEADER = '-----BEGIN RSA PRIVATE KEY-----'\nPEM_FOOTER = '-----END RSA PRIVATE KEY-----'\n",
        # Prefixes in prose and identifiers.
        "GitHub tokens start with ghp_ and AWS keys with AKIA; Slack ones with xoxb-.\n",
        "def sk_live_mode(self): return self.hf_model_name\n",
        "npm_config_cache = os.environ['npm_config_cache']\n",
        # Long identifiers, hashes and base64 data.
        "sha = 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855'\n",
        "DATA = b'"
        + token("blob", 200, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
        + "'\n",
        "secret_key = settings.SECRET_KEY\n",
        "AWS_SECRET_ACCESS_KEY = os.environ['AWS_SECRET_ACCESS_KEY']\n",
        # Credential-named assignments of values that are not credentials.
        'password = "hunter2"\n',
        "token = get_token(request)\n",
        'TOKEN_TYPE = "bearer_token_v2"\n',
        "api_key: ${API_KEY}\n",
        "secret_key = self.config.secret_key_2024\n",
        'key = "section.subsection.option_name"\n',
        'SECRET_KEY = "your-secret-key-here-123456"\n',
        'password: "xxxxxxxxxxxxxxxx1234"\n',
        "    tokens_per_second = 1234567890123456\n",
    ],
)
def test_ordinary_code_is_not_flagged(text: str) -> None:
    assert find_secrets(text) == ()


def test_the_standard_library_sources_are_not_flagged() -> None:
    """Every .py file of the running Python's standard library is clean.

    (Its test suite's .pem files do hold private keys: those are flagged, rightly.)
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    flagged = []
    scanned = 0
    for path in stdlib.rglob("*.py"):
        if "site-packages" in path.parts:
            continue
        scanned += 1
        text = path.read_bytes().decode("utf-8", "replace")
        if find_secrets(text):
            flagged.append(path.relative_to(stdlib))
    assert scanned > 500
    assert flagged == []


@pytest.mark.parametrize(
    "text",
    [
        "-----BEGIN PRIVATE KEY-----" + "A" * 39 + "-" * 5000,
        ("-----BEGIN A B C " * 2000) + "PRIVATE KEY-----",
        "aws" + "_" * 20 + "secret" + " " * 5000 + "=",
        "xoxb-" + "1234567-" * 5000,
        "sk-" + "a" * 50_000,
        ("ghp_" + "a" * 35 + " ") * 2000,
        "_" * 200_000 + "-" * 200_000 + "I" * 200_000 + "." * 200_000,
    ],
)
def test_adversarial_input_scans_in_linear_time(text: str) -> None:
    started = time.perf_counter()
    find_secrets(text)
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        (".env", "dotenv-file"),
        (".env.local", "dotenv-file"),
        (".env.production", "dotenv-file"),
        ("prod.env", "dotenv-file"),
        (".ENV", "dotenv-file"),
        ("server.pem", "private-key-file"),
        ("server.key", "private-key-file"),
        ("keystore.p12", "private-key-file"),
        ("id_rsa", "private-key-file"),
        ("id_ed25519", "private-key-file"),
        (".netrc", "credentials-file"),
        (".pgpass", "credentials-file"),
        (".git-credentials", "credentials-file"),
        (".env.example", None),
        (".env.sample", None),
        ("id_rsa.pub", None),
        ("environment.py", None),
        ("key.py", None),
        ("keys.md", None),
        (".pem", None),  # a dot file named after the extension is not a key file
    ],
)
def test_secret_file_names(name: str, rule: str | None) -> None:
    assert secret_file_rule(name) == rule
