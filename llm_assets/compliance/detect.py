"""Personal data and credentials in rendered prompts, found by maintained libraries.

- datafog-core (Rust): e-mail addresses, phone numbers, payment cards (Luhn-checked), US
  social security numbers, IP addresses, and credentials it knows (API keys of several
  vendors, bearer tokens, JWTs, credential URIs, private keys).
- python-stdnum: IBANs of every country, by their mod-97 checksum and national format.
- detect-secrets 1.5: the key patterns of its plugins for AWS access key ids, private key
  blocks, Slack tokens and webhooks and legacy OpenAI keys, which datafog-core does not know.
  They are copied here (Apache-2.0): importing detect-secrets takes half a second and
  `requests` into every worker process of the shards step.
- Patterns of our own for keys neither library knows yet (current OpenAI and Anthropic keys,
  Google API keys) and `password: ...` assignments.

Texts are scanned a chunk at a time, joined into one string: one call into the scanner per
chunk instead of one per item is what keeps a million prompts within a few seconds
(bench/pii_detectors.py has the comparison behind these choices).
"""

import bisect
import re
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import datafog_core

from llm_assets.compliance.spec import Entity


class Finding(NamedTuple):
    """One value found in a text: its type and where it is (codepoints, end exclusive)."""

    entity: Entity
    start: int
    end: int
    value: str


_DATAFOG: dict[str, Entity] = {
    "EMAIL": "email",
    "PHONE": "phone",
    "CREDIT_CARD": "card",
    "SSN": "national_id",
    "IP_ADDRESS": "ip_address",
    "API_KEY": "credential",
    "BEARER_TOKEN": "credential",
    "CREDENTIAL_URI": "credential",
    "JWT": "credential",
    "PRIVATE_KEY": "credential",
}
_SCAN_CONFIG = {"entities": sorted(_DATAFOG)}

_SEVERITY: dict[Entity, int] = {
    "credential": 0,
    "card": 1,
    "national_id": 2,
    "iban": 3,
    "email": 4,
    "phone": 5,
    "ip_address": 6,
}
"""Of two findings over the same characters the more sensitive one is kept: a Slack token's
digit groups are not phone numbers, an e-mail inside a credential URI is the credential."""

_SEPARATOR = "\n\n\x1f\n\n"
"""Between two texts of a chunk: no pattern runs across a blank line and a control character."""

_IBAN_CANDIDATE = re.compile(r"[A-Z][A-Z]\d\d(?: ?[A-Z0-9]){11,30}")
"""No \\b in front: a pattern that starts with a character class is searched for quickly; the
word boundary is checked on the (few) matches."""

# detect-secrets 1.5.0, plugins/aws.py, openai.py, slack.py and private_key.py.
_AWS_ACCESS_KEY_ID = re.compile(r"(?:A3T[A-Z0-9]|ABIA|ACCA|AKIA|ASIA)[0-9A-Z]{16}")
_OPENAI_LEGACY_KEY = re.compile(r"sk-[A-Za-z0-9-_]*[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}")
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

_DIRECT: tuple[re.Pattern[str], ...] = (
    _AWS_ACCESS_KEY_ID,
    _OPENAI_LEGACY_KEY,
    re.compile(r"sk-(?:proj|svcacct|admin|ant-[a-z]+\d*)-[A-Za-z0-9_\-]{20,}"),
    re.compile(r"AIza[0-9A-Za-z_\-]{35}"),
)
"""Credential patterns that start with a literal, which is searched for quickly."""

_NEEDLED: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("xox", _SLACK_TOKEN),
    ("hooks.slack.com", _SLACK_WEBHOOK),
    ("pass", re.compile(r"(?i:\b(?:password|passwd|passcode)\s*[:=]\s*)\S{4,}")),
    ("pwd", re.compile(r"(?i:\bpwd\s*[:=]\s*)\S{4,}")),
    ("private key", _PRIVATE_KEY),
    ("putty-user-key", _PRIVATE_KEY),
)
"""Credential patterns that ignore case or start with an alternative, which cost a
microsecond or more per prompt: searched only in a chunk that holds their needle
(lower-cased), as few do."""

_PRIVATE_KEY_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----")


def _whole_private_key(text: str, match: re.Match[str]) -> tuple[int, int]:
    """A private key header found: the block from its dashes to its END line (or the end of
    the text), so a redaction takes the key, not just its header."""
    start = text.rfind("-----", max(0, match.start() - 8), match.start())
    start = start if start >= 0 else match.start()
    end = _PRIVATE_KEY_END.search(text, match.end())
    return start, end.end() if end else len(text)


def _iban_length(candidate: str) -> int:
    """The length of the valid IBAN the candidate starts with (0: none): the candidate may
    run on into a following word in capitals ("DE89 3704 0044 0532 0130 00 ASAP")."""
    # Imported on the first candidate: python-stdnum takes a quarter of a second to import,
    # and most chunks of prompts hold no IBAN-like string at all.
    from stdnum import iban

    while True:
        if iban.is_valid(candidate):
            return len(candidate)
        cut = candidate.rfind(" ")
        if cut < 15:
            return 0
        candidate = candidate[:cut]


def _raw_findings(joined: str) -> Iterator[tuple[Entity, int, int]]:
    for found in datafog_core.scan(joined, config=_SCAN_CONFIG):
        span = found.codepoint_range
        yield _DATAFOG[found.entity_type], span.start, span.end
    for match in _IBAN_CANDIDATE.finditer(joined):
        start = match.start()
        if start == 0 or not joined[start - 1].isalnum():
            length = _iban_length(match.group())
            if length:
                yield "iban", start, start + length
    for pattern in _DIRECT:
        for match in pattern.finditer(joined):
            yield "credential", match.start(), match.end()
    lowered = joined.lower()
    for needle, pattern in _NEEDLED:
        if needle not in lowered:
            continue
        for match in pattern.finditer(joined):
            if pattern is _PRIVATE_KEY:
                yield "credential", *_whole_private_key(joined, match)
            else:
                yield "credential", match.start(), match.end()


def _resolved(found: list[tuple[Entity, int, int]]) -> list[tuple[Entity, int, int]]:
    """Overlapping findings merged into one span of the most sensitive type among them."""
    merged: list[tuple[Entity, int, int]] = []
    for entity, start, end in sorted(found, key=lambda f: (f[1], -f[2])):
        if merged and start < merged[-1][2]:
            kept, kept_start, kept_end = merged[-1]
            if _SEVERITY[entity] < _SEVERITY[kept]:
                kept = entity
            merged[-1] = (kept, kept_start, max(kept_end, end))
        else:
            merged.append((entity, start, end))
    return merged


def scan(texts: Sequence[str]) -> list[list[Finding]]:
    """Each text's findings, in order of position, overlapping ones merged."""
    if not texts:
        return []
    starts = []
    at = 0
    for text in texts:
        starts.append(at)
        at += len(text) + len(_SEPARATOR)
    joined = _SEPARATOR.join(texts)
    per_text: list[list[tuple[Entity, int, int]]] = [[] for _ in texts]
    for entity, start, end in _raw_findings(joined):
        index = bisect.bisect_right(starts, start) - 1
        offset = starts[index]
        limit = len(texts[index])
        if start - offset >= limit:
            continue  # in a separator
        per_text[index].append((entity, start - offset, min(end - offset, limit)))
    return [
        [Finding(e, s, end, text[s:end]) for e, s, end in _resolved(found)] if found else []
        for text, found in zip(texts, per_text, strict=True)
    ]
