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


def test_a_real_key_after_a_published_placeholder_is_still_found() -> None:
    # The placeholder is skipped, not the rest of the file.
    real = planted_secrets()["aws-access-key-id"]
    text = f"example = 'AKIAIOSFODNN7EXAMPLE'\n\nkey_id = '{real}'\n"
    assert [(f.rule, f.line) for f in find_secrets(text)] == [("aws-access-key-id", 3)]


def test_a_file_with_many_keys_gives_the_first_findings_up_to_the_limit() -> None:
    # Past limit * 4 matches the scan stops: the file is still flagged, with its first ten findings.
    keys = [f"k{n} = 'AKIA{token(f'many{n}', 16, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567')}'" for n in range(60)]
    findings = find_secrets("\n".join(keys) + "\n")
    assert [(f.rule, f.line) for f in findings] == [("aws-access-key-id", line) for line in range(1, 11)]
    assert len(find_secrets("\n".join(keys), limit=3)) == 3


def test_an_assignment_is_found_in_a_file_with_non_ascii_text() -> None:
    # "İ" lowers to two characters: word positions found in a lowered copy must still be the text's.
    value = token("unicode", 24)
    text = f"# café, naïve, 🙂, İİİ\nAPI_TOKEN = '{value}'\nprint('ünïcode İ')\nSecret: {value}\n"
    assert [(f.rule, f.line) for f in find_secrets(text)] == [
        ("credential-assignment", 2),
        ("credential-assignment", 4),
    ]


def test_lines_are_counted_from_a_leading_blank_line() -> None:
    value = token("leading", 24)
    text = f"\nAPI_TOKEN = '{value}'\nkey_id = '{planted_secrets()['aws-access-key-id']}'\n"
    assert [(f.rule, f.line) for f in find_secrets(text)] == [
        ("credential-assignment", 2),
        ("aws-access-key-id", 3),
    ]


def test_an_elided_value_is_not_a_credential() -> None:
    assert find_secrets("api_key = 'sk7Qm2Zp9Xr4Wt8Lv'\n") != ()
    assert find_secrets("api_key = 'sk7Qm2Zp9Xr4Wt8Lv...'\n") == ()


@pytest.mark.parametrize(
    ("value", "flagged"),
    [
        ("kqmwzrxj11223344", True),  # 3.5 bits per character exactly: the threshold is inclusive
        ("kkqmwzrx11223344", False),  # 3.375 bits: too plain
        ("kqmwzrxj12abcdef", True),  # two digits
        ("kqmwzrxj1abcdefg", False),  # one digit: a word with a number, not a credential
        ("0123456789+/_.~=", False),  # no letter
    ],
)
def test_the_entropy_threshold_and_the_digit_rule(value: str, flagged: bool) -> None:
    assert bool(find_secrets(f"api_token = '{value}'\n")) is flagged


@pytest.mark.parametrize("alphabet", ["0123456789abcdef", "0123456789ABCDEF"])
@pytest.mark.parametrize("length", [40, 64])
def test_a_git_object_id_or_a_sha256_is_not_a_credential(alphabet: str, length: int) -> None:
    digest = token(f"hex{length}", length, alphabet)
    assert find_secrets(f"release_token = '{digest}'\n") == ()
    # Any other length of hex is a key like any other (many services' keys are hex).
    assert find_secrets(f"release_token = '{token('hex48', 48, alphabet)}'\n") != ()


@pytest.mark.parametrize(
    "name", ["key_sha256", "KEY_HASH", "key_digest", "key_checksum", "key_fingerprint", "key_type"]
)
def test_a_name_of_a_digest_of_a_key_is_not_a_credential(name: str) -> None:
    value = token("digest-name", 24)
    assert find_secrets(f"{name} = '{value}'\n") == ()
    assert find_secrets(f"key_id = '{value}'\n") != ()


@pytest.mark.parametrize(
    "word", ["example", "Sample", "xxxx", "placeholder", "changeme", "your", "dummy", "REDACTED"]
)
def test_a_value_holding_a_placeholder_word_is_not_a_credential(word: str) -> None:
    value = token("placeholder-word", 20)
    assert find_secrets(f"api_key = '{value}'\n") != ()
    assert find_secrets(f"api_key = '{value}{word}'\n") == ()


@pytest.mark.parametrize("name", ["tls.server.pem", "backup.2024.key", "my.cert.p12", "a.pem"])
def test_a_key_file_is_known_by_its_last_suffix(name: str) -> None:
    assert secret_file_rule(name) == "private-key-file"
