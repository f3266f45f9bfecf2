"""Credential detection: file names and content patterns.

Two checks, both cheap:

- :func:`secret_file_rule` flags files whose *name* says they hold secrets
  (``.env``, ``*.pem``, ``id_rsa``...);
- :func:`find_secrets` flags text that contains a well-known credential
  format (private key blocks, AWS access keys, GitHub, GitLab, Slack,
  Stripe, Google, OpenAI, Anthropic, npm, PyPI, SendGrid, Hugging Face
  tokens).

Findings name the rule and the line, never the matched text: a finding is
safe to log, to put in a manifest and in an exception message.

The content scan makes four passes of compiled expressions over the text
(about 0.1 s for the 37 MB of text in CPython's standard library). The
rules aim at near-zero false positives on ordinary source code: generic
"password = ..." assignments are not flagged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = ["RULE_NAMES", "SecretFinding", "find_secrets", "redact_if_secret", "secret_file_rule"]


@dataclass(frozen=True, slots=True)
class SecretFinding:
    """A credential found in text: which rule matched, and on which line (1-based)."""

    rule: str
    line: int


@dataclass(frozen=True, slots=True)
class _ContentRule:
    name: str
    anchor: str
    pattern: str


# Each rule is written from an *anchor* character inside the token (a
# lookbehind checks what comes before it). Rules that share an anchor are
# compiled into one expression that starts with that literal character, and
# for such expressions CPython's engine scans for the literal at C speed and
# tries the alternatives only where it occurs. An expression that does not
# start with a literal is tried at every position, about seven times slower
# on the standard library, so: one pass per anchor, four anchors in all. The
# lookbehinds that reject a token glued to a longer word keep false positives
# down. No expression has nested unbounded repetition, so no input makes
# them backtrack catastrophically.
_CONTENT_RULES: Final[tuple[_ContentRule, ...]] = (
    _ContentRule(
        "private-key",
        "-",
        # The header alone is common in PEM parsers; a key also has a body.
        r"----BEGIN (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----"
        r"(?:[^-]|-(?!----END)){0,300}?[A-Za-z0-9+/]{40}",
    ),
    _ContentRule("gitlab-token", "-", r"(?<=glpat-)[A-Za-z0-9_-]{20}"),
    _ContentRule(
        "slack-token",
        "-",
        r"(?<=xox[abposre]-)(?<![A-Za-z0-9]xox.-)(?:[0-9]{6,}-)+[A-Za-z0-9]{8,}",
    ),
    _ContentRule("openai-api-key", "-", r"(?<=sk-)[A-Za-z0-9_-]{20,200}T3BlbkFJ[A-Za-z0-9_-]{20,}"),
    _ContentRule("anthropic-api-key", "-", r"(?<=sk-ant-)(?:api|admin)[0-9]{2}-[A-Za-z0-9_-]{80,}"),
    _ContentRule("pypi-token", "-", r"(?<=pypi-)AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}"),
    _ContentRule(
        "github-token",
        "_",
        r"(?<=gh[pousr]_)(?<![A-Za-z0-9]gh._)[A-Za-z0-9]{36}(?![A-Za-z0-9])",
    ),
    _ContentRule("github-fine-grained-token", "_", r"(?<=github_pat_)[A-Za-z0-9_]{82}"),
    _ContentRule("npm-token", "_", r"(?<=npm_)(?<![A-Za-z0-9]npm_)[A-Za-z0-9]{36}(?![A-Za-z0-9])"),
    _ContentRule("huggingface-token", "_", r"(?<=hf_)(?<![A-Za-z0-9]hf_)[A-Za-z]{34}(?![A-Za-z0-9])"),
    _ContentRule("stripe-secret-key", "_", r"(?<=[rs]k_live_)[0-9A-Za-z]{20,}"),
    _ContentRule(
        "aws-secret-access-key",
        "_",
        r"(?i:(?<=secret_)(?:access_)?key)[\"']?\s{0,5}[:=]\s{0,5}[\"']?"
        r"[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])",
    ),
    _ContentRule(
        "aws-access-key-id",
        "I",
        r"(?<=A[KSB]I)(?<![A-Za-z0-9]A[KSB]I)A[A-Z0-9]{16}(?![A-Za-z0-9])",
    ),
    _ContentRule("google-api-key", "I", r"(?<=AI)(?<![A-Za-z0-9]AI)za[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])"),
    _ContentRule(
        "sendgrid-api-key",
        ".",
        r"(?<=SG\.)[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])",
    ),
    _ContentRule(
        "slack-webhook",
        ".",
        r"(?<=hooks\.)slack\.com/services/T[A-Z0-9]{6,12}/B[A-Z0-9]{6,12}/[A-Za-z0-9]{20,}",
    ),
)

# A cheap check every rule of an anchor passes (the character before the
# anchor, mostly): it rejects most occurrences of a common anchor such as
# "_" before the alternatives are tried, a quarter of the scan time.
_ANCHOR_GATES: Final[dict[str, str]] = {
    "-": r"(?:(?<=[tkiabposre]-)|(?=----B))",
    "_": r"(?<=[pousrmfetT]_)",
    "I": r"(?<=[KSBA]I)",
    ".": r"(?<=[Gs]\.)",
}

RULE_NAMES: Final[tuple[str, ...]] = tuple(rule.name for rule in _CONTENT_RULES)
"""The content rules, by name, as findings report them."""


def _group_name(rule_name: str) -> str:
    return rule_name.replace("-", "_")


def _compile_passes() -> tuple[tuple[re.Pattern[str], dict[str, str]], ...]:
    anchors: dict[str, list[_ContentRule]] = {}
    for rule in _CONTENT_RULES:
        anchors.setdefault(rule.anchor, []).append(rule)
    passes = []
    for anchor, rules in anchors.items():
        alternatives = "|".join(f"(?P<{_group_name(rule.name)}>{rule.pattern})" for rule in rules)
        pattern = re.compile(f"{re.escape(anchor)}{_ANCHOR_GATES[anchor]}(?:{alternatives})")
        passes.append((pattern, {_group_name(rule.name): rule.name for rule in rules}))
    return tuple(passes)


_PASSES: Final = _compile_passes()

# Published placeholders (AWS documents AKIAIOSFODNN7EXAMPLE and a secret
# key ending in EXAMPLEKEY) match the rules; real tokens never spell it.
_PLACEHOLDER_MARK: Final = "EXAMPLE"

_DOTENV_EXAMPLE_SUFFIXES: Final = frozenset(
    {"example", "sample", "template", "dist", "defaults", "default", "schema"}
)
_KEY_FILE_SUFFIXES: Final = frozenset(
    {".pem", ".key", ".p8", ".p12", ".pfx", ".jks", ".keystore", ".ppk", ".asc.key"}
)
_SSH_KEY_NAMES: Final = frozenset(
    {"id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk"}
)
_CREDENTIAL_FILE_NAMES: Final = frozenset(
    {".netrc", "_netrc", ".pgpass", ".git-credentials", ".htpasswd", ".pypirc"}
)


def secret_file_rule(name: str) -> str | None:
    """Return the rule name when a file called ``name`` (a base name) holds secrets by convention.

    ``.env`` and ``.env.<anything>`` except ``.env.example`` and the like,
    ``*.env``; private key and keystore files (``*.pem``, ``*.key``,
    ``*.p12``, ``id_rsa``...); credential stores (``.netrc``, ``.pgpass``,
    ``.git-credentials``, ``.htpasswd``, ``.pypirc``).
    """
    lowered = name.lower()
    if lowered == ".env" or lowered.endswith(".env"):
        return "dotenv-file"
    if lowered.startswith(".env."):
        suffix = lowered.removeprefix(".env.")
        return None if suffix in _DOTENV_EXAMPLE_SUFFIXES else "dotenv-file"
    if lowered in _SSH_KEY_NAMES:
        return "private-key-file"
    dot = lowered.rfind(".")
    if dot > 0 and lowered[dot:] in _KEY_FILE_SUFFIXES:
        return "private-key-file"
    if lowered in _CREDENTIAL_FILE_NAMES:
        return "credentials-file"
    return None


def find_secrets(text: str, *, limit: int = 10) -> tuple[SecretFinding, ...]:
    """Find credentials in ``text``: at most ``limit`` findings, ordered by line then rule."""
    findings: list[SecretFinding] = []
    for pattern, rule_names in _PASSES:
        for match in pattern.finditer(text):
            if _PLACEHOLDER_MARK in match.group():
                continue
            rule = rule_names[match.lastgroup or ""]
            line = text.count("\n", 0, match.start()) + 1
            findings.append(SecretFinding(rule, line))
            if len(findings) >= limit * 4:
                break
    findings.sort(key=lambda finding: (finding.line, finding.rule))
    return tuple(findings[:limit])


def redact_if_secret(message: str) -> str:
    """Return ``message`` unless it contains a credential; then a placeholder that names the rule.

    For messages that come from third-party parsers and may quote the
    document they failed on.
    """
    findings = find_secrets(message, limit=1)
    if not findings:
        return message
    return f"(message withheld: it matches the {findings[0].rule} pattern)"
