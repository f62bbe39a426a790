"""Personal data and credentials in rendered prompts, found by maintained libraries.

- datafog-core (Rust): e-mail addresses, phone numbers, payment cards (Luhn-checked), US
  social security numbers, IP addresses, and credentials it knows (API keys of several
  vendors, bearer tokens, JWTs, credential URIs, private keys).
- python-stdnum: IBANs of every country, by their mod-97 checksum and national format.
- detect-secrets: the key patterns of its plugins for AWS access keys, private key blocks,
  Slack and legacy OpenAI keys, which datafog-core does not know.
- Two patterns of our own for keys neither library knows yet (current OpenAI and Anthropic
  keys, Google API keys) and `password: ...` assignments.

Texts are scanned a chunk at a time, joined into one string: one call into the scanner per
chunk instead of one per item is what keeps a million prompts within a few seconds
(bench/pii_detectors.py has the comparison behind these choices).
"""

import bisect
import re
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import datafog_core
from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.slack import SlackDetector
from stdnum import iban

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

_DIRECT: tuple[re.Pattern[str], ...] = (
    AWSKeyDetector.denylist[0],
    OpenAIDetector.denylist[0],
    re.compile(r"sk-(?:proj|svcacct|admin|ant-[a-z]+\d*)-[A-Za-z0-9_\-]{20,}"),
    re.compile(r"AIza[0-9A-Za-z_\-]{35}"),
)
"""Credential patterns that start with a literal, which is searched for quickly."""

_PRIVATE_KEY = re.compile("|".join(p.pattern for p in PrivateKeyDetector.denylist))
_NEEDLED: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("xox", SlackDetector.denylist[0]),
    ("hooks.slack.com", SlackDetector.denylist[1]),
    ("pass", re.compile(r"(?i:\b(?:password|passwd|passcode)\s*[:=]\s*)\S{4,}")),
    ("pwd", re.compile(r"(?i:\bpwd\s*[:=]\s*)\S{4,}")),
    ("private key", _PRIVATE_KEY),
)
"""Credential patterns that ignore case or start with an alternative, which cost a
microsecond or more per prompt: searched only in a chunk that holds their needle
(lower-cased), as few do. The detect-secrets patterns are its plugins' own."""

_PRIVATE_KEY_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----")


def _whole_private_key(text: str, match: re.Match[str]) -> tuple[int, int]:
    """A private key header found: the block from its dashes to its END line (or the end of
    the text), so a redaction takes the key, not just its header."""
    start = text.rfind("-----", max(0, match.start() - 8), match.start())
    start = start if start >= 0 else match.start()
    end = _PRIVATE_KEY_END.search(text, match.end())
    return start, end.end() if end else len(text)


def _raw_findings(joined: str) -> Iterator[tuple[Entity, int, int]]:
    for found in datafog_core.scan(joined, config=_SCAN_CONFIG):
        span = found.codepoint_range
        yield _DATAFOG[found.entity_type], span.start, span.end
    for match in _IBAN_CANDIDATE.finditer(joined):
        start = match.start()
        if (start == 0 or not joined[start - 1].isalnum()) and iban.is_valid(match.group()):
            yield "iban", start, match.end()
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
