"""Credential patterns for what datafog-core does not find: (start, end) of each in a chunk of
prompts. Patterns that start with a literal are searched for directly, which is quick; those
that ignore case or start with an alternative cost a microsecond or more per prompt, so they
are searched only in a chunk that holds their needle (lower-cased), as few do."""

import re
from collections.abc import Iterator

# detect-secrets 1.5.0 (Apache-2.0), plugins/aws.py, openai.py, slack.py, private_key.py,
# github_token.py, jwt.py and basic_auth.py, copied: importing detect-secrets takes half a
# second and `requests` into every worker process of the shards step.
_AWS_ACCESS_KEY_ID = re.compile(r"(?:A3T[A-Z0-9]|ABIA|ACCA|AKIA|ASIA)[0-9A-Z]{16}")
_OPENAI_LEGACY_KEY = re.compile(r"sk-[A-Za-z0-9-_]*[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}")
_GITHUB_TOKEN = re.compile(r"(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9_]{36}")
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*\.?[A-Za-z0-9_.+/=-]*")
_SLACK_TOKEN = re.compile(r"xox(?:a|b|p|o|s|r)-(?:\d+-)+[a-z0-9]+", flags=re.IGNORECASE)
_SLACK_WEBHOOK = re.compile(
    r"https://hooks\.slack\.com/services/T[a-zA-Z0-9_]+/B[a-zA-Z0-9_]+/[a-zA-Z0-9_]+",
    flags=re.IGNORECASE,
)
_PRIVATE_KEY = re.compile(
    "|".join(
        (
            r"BEGIN DSA PRIVATE KEY",
            r"BEGIN EC PRIVATE KEY",
            r"BEGIN OPENSSH PRIVATE KEY",
            r"BEGIN PGP PRIVATE KEY BLOCK",
            r"BEGIN PRIVATE KEY",
            r"BEGIN RSA PRIVATE KEY",
            r"BEGIN SSH2 ENCRYPTED PRIVATE KEY",
            r"PuTTY-User-Key-File-2",
        )
    )
)
_PRIVATE_KEY_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----")
# Basic auth in a URL (detect-secrets' BasicAuthDetector, here anchored on "://" so that it
# is searched for as a literal; the scheme in front is added to the finding).
_URL_PASSWORD = re.compile(r"://[^\s:/?#@]+:[^\s/?#@]+@[^\s/?#]+")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*$")

# Ours: keys neither library knows yet, secrets written out in prose or in a config line.
_CURRENT_KEYS = re.compile(r"sk-(?:proj|svcacct|admin|ant-[a-z]+\d*)-[A-Za-z0-9_\-]{20,}")
_GOOGLE_KEY = re.compile(r"AIza[0-9A-Za-z_\-]{35}")
_GITHUB_PAT = re.compile(r"github_pat_[A-Za-z0-9_]{22,}")
_PASSWORD = re.compile(
    r"(?i:\b(?:password|passwd|passcode|pwd)(?:\s+(?:is|was))?\s*[:=]?\s*)"
    r"(?=\S*[\d!@#$%^&*])[^\s,;]{6,}"
)
"""A password written out: a value with a digit or a symbol after the word (and an optional
"is"), so that "the new password is rejected" is not one."""
_AWS_SECRET = re.compile(
    r"(?i:aws[\w.\-]{0,20}(?:secret|key)[\w.\-]{0,20}[\"']?\s*[:=]\s*[\"']?)"
    r"[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])"
)

_DIRECT = (
    _AWS_ACCESS_KEY_ID,
    _OPENAI_LEGACY_KEY,
    _GITHUB_TOKEN,
    _GITHUB_PAT,
    _JWT,
    _CURRENT_KEYS,
    _GOOGLE_KEY,
)
_NEEDLED = (
    ("xox", _SLACK_TOKEN),
    ("hooks.slack.com", _SLACK_WEBHOOK),
    ("pass", _PASSWORD),
    ("pwd", _PASSWORD),
    ("aws", _AWS_SECRET),
)


def _whole_private_key(text: str, match: re.Match[str]) -> tuple[int, int]:
    """A private key header found: the block from its dashes to its END line (or the end of
    the text), so a redaction takes the key, not just its header."""
    start = text.rfind("-----", max(0, match.start() - 8), match.start())
    start = start if start >= 0 else match.start()
    end = _PRIVATE_KEY_END.search(text, match.end())
    return start, end.end() if end else len(text)


def credentials(joined: str, lowered: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each credential found in `joined` (`lowered` is it in lower case)."""
    for pattern in _DIRECT:
        for match in pattern.finditer(joined):
            if pattern is not _JWT or match.end() - match.start() >= 30:
                yield match.start(), match.end()
    searched = set()
    for needle, pattern in _NEEDLED:
        if pattern in searched or needle not in lowered:
            continue
        searched.add(pattern)
        for match in pattern.finditer(joined):
            yield match.start(), match.end()
    if "private key" in lowered or "putty-user-key" in lowered:
        for match in _PRIVATE_KEY.finditer(joined):
            yield _whole_private_key(joined, match)
    for match in _URL_PASSWORD.finditer(joined):
        scheme = _SCHEME.search(joined, max(0, match.start() - 20), match.start())
        yield scheme.start() if scheme else match.start(), match.end()
