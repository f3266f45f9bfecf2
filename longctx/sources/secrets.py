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
(about 0.1 s for the 37 MB of text in CPython's standard library), and one
keyword-plus-entropy pass (:data:`ASSIGNMENT_RULE`): a value of 16 or more
token characters, with two digits or more and at least 3.5 bits of entropy
per character, assigned to a name holding ``token``, ``secret``,
``passw``, ``key`` or ``credential`` (``GITHUB_TOKEN=...``,
``"db_password": "..."``). ``password = "hunter2"`` is not flagged (too
short, too plain); each rule's false-positive count on the standard library
and a large package tree is measured by ``benchmarks/secrets_fp.py`` and
kept in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import collections
import math
import re
from typing import Final

from longctx.recordtypes import record_type

__all__ = [
    "ASSIGNMENT_RULE",
    "RULE_NAMES",
    "SecretFinding",
    "find_secrets",
    "redact_if_secret",
    "secret_file_rule",
]


@record_type(slots=True)
class SecretFinding:
    """A credential found in text: which rule matched, and on which line (1-based)."""

    rule: str
    line: int


@record_type(slots=True)
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
        # Classic personal (ghp_), OAuth (gho_), user-to-server (ghu_),
        # server-to-server (ghs_, the app installation token) and refresh
        # (ghr_) tokens: 36 characters today, up to 255 accepted as GitHub
        # documents the format may grow (TruffleHog accepts the same range).
        r"(?<=gh[pousr]_)(?<![A-Za-z0-9]gh._)[A-Za-z0-9]{36,255}(?![A-Za-z0-9])",
    ),
    # Fine-grained personal tokens: 22 characters, "_", 59 characters today.
    _ContentRule("github-fine-grained-token", "_", r"(?<=github_pat_)[A-Za-z0-9_]{82,255}(?![A-Za-z0-9_])"),
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

ASSIGNMENT_RULE: Final = "credential-assignment"
"""The keyword-plus-entropy rule: a high-entropy value assigned to a credential-like name."""

RULE_NAMES: Final[tuple[str, ...]] = (*(rule.name for rule in _CONTENT_RULES), ASSIGNMENT_RULE)
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


# The keyword-plus-entropy rule. A case-insensitive expression of the
# credential words is tried at every position (twenty times slower than the
# four passes above on the standard library), so the words are found in an
# ASCII-lowered copy, and the assignment after each one is matched from
# there: about as fast as the four passes together.
_CREDENTIAL_WORDS: Final = ("token", "secret", "passw", "key", "credential")
# The words, found from a literal character of their own (a lookbehind
# checks the letters before it): the engine scans for a leading literal as
# fast as str.find does, and "token" and "key" share their "k", "secret" and
# "credential" their "c", so three scans of the copy find the five words. A
# group per word; no word overlaps itself or another's match, so each
# occurrence is found, as str.find would find it.
_WORD_SCANS: Final = (
    re.compile(r"k(?:(?<=tok)(?P<token>en)|(?P<key>ey))"),
    re.compile(r"c(?:(?<=sec)(?P<secret>ret)|(?P<credential>redential))"),
    re.compile(r"(?P<passw>w)(?<=passw)"),
)
_ASSIGNMENT: Final = re.compile(
    # The rest of the name, an optional closing quote, the operator of
    # Python, shell, YAML, TOML, JSON, Go or PHP, and the value, quoted or
    # not, that ends where the quote or the token ends (a value followed by
    # "(" or "[" is an expression, not a literal). An unquoted value must end
    # its line (a comment, a "," or ";" may follow) or a string (TOKEN=... in
    # quotes): "key: Type | None" is an annotation.
    r"(?P<rest>[A-Za-z0-9_]{0,12})[\"']?[ \t]{0,5}(?::=|=>|[:=])[ \t]{0,5}"
    r"(?:(?P<quote>[\"'])(?P<quoted>[A-Za-z0-9+/_.~=-]{16,256})(?P=quote)"
    r"|(?P<bare>[A-Za-z0-9+/_.~=-]{16,256})(?=[\"']|[ \t]*[,;]?[ \t]*(?:#|\r?\n|\Z)))"
)
# Names of digests, not of credentials ("key_sha256": a digest of a key).
_DIGEST_NAMES: Final = ("sha", "hash", "digest", "checksum", "fingerprint", "type")
_HEX_DIGEST: Final = re.compile(r"[0-9a-fA-F]{40}|[0-9a-fA-F]{64}")
_CONSTANT_NAME: Final = re.compile(r"_?[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
_DOTTED_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_ENTROPY_BITS: Final = 3.5  # bits per character; English words and identifiers stay below it
_PLACEHOLDER_WORDS: Final = (
    "example",
    "sample",
    "xxxx",
    "placeholder",
    "changeme",
    "your",
    "dummy",
    "redacted",
)


def _entropy(value: str) -> float:
    """Shannon entropy of ``value``'s characters, in bits per character."""
    total = len(value)
    return -sum(count / total * math.log2(count / total) for count in collections.Counter(value).values())


def _looks_random(value: str) -> bool:
    """A value that reads as a credential: mixed letters and digits, high entropy, not a name."""
    if sum(character.isdigit() for character in value) < 2 or not any(c.isalpha() for c in value):
        return False
    lowered = value.lower()
    if any(word in lowered for word in _PLACEHOLDER_WORDS):
        return False
    if value.endswith("...") or _DOTTED_NAME.fullmatch(value) or _CONSTANT_NAME.fullmatch(value):
        return False  # elided, module.attribute, a dotted setting name, another constant's name
    if _HEX_DIGEST.fullmatch(value):  # a git object id or a sha256
        return False
    return _entropy(value) >= _ENTROPY_BITS


def _assignment_findings(text: str) -> list[SecretFinding]:
    """Assignments of a high-entropy value to a name holding a credential word."""
    lowered = text.lower() if text.isascii() else text.encode("ascii", "replace").decode("ascii").lower()
    # Where each word ends, by word: findings come word by word, each word's
    # in text order (the order the caller's cut at limit * 4 relies on).
    ends: dict[str, list[int]] = {word: [] for word in _CREDENTIAL_WORDS}
    for scan in _WORD_SCANS:
        for found in scan.finditer(lowered):
            ends[found.lastgroup or ""].append(found.end())
    findings: list[SecretFinding] = []
    for word, word_ends in ends.items():
        for end in word_ends:
            match = _ASSIGNMENT.match(text, end)
            if (
                match is not None
                and not any(name in match.group("rest").lower() for name in _DIGEST_NAMES)
                and _looks_random(match.group("quoted") or match.group("bare"))
            ):
                findings.append(SecretFinding(ASSIGNMENT_RULE, text.count("\n", 0, end - len(word)) + 1))
    return findings


def find_secrets(text: str, *, limit: int = 10) -> tuple[SecretFinding, ...]:
    """Find credentials in ``text``: at most ``limit`` findings, ordered by line then rule."""
    findings: list[SecretFinding] = _assignment_findings(text)[: limit * 4]
    for pattern, rule_names in _PASSES:
        for match in pattern.finditer(text):
            if _PLACEHOLDER_MARK in match.group():
                continue
            rule = rule_names[match.lastgroup or ""]
            line = text.count("\n", 0, match.start()) + 1
            findings.append(SecretFinding(rule, line))
            if len(findings) >= limit * 4:
                break
    # A line a specific rule names needs no second, vaguer finding.
    specific = {finding.line for finding in findings if finding.rule != ASSIGNMENT_RULE}
    findings = [f for f in findings if f.rule != ASSIGNMENT_RULE or f.line not in specific]
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
