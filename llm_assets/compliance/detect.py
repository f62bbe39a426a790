"""Personal data and credentials in rendered prompts, found by maintained libraries.

- datafog-core (Rust): e-mail addresses, North American and +country phone numbers, payment
  cards (Luhn-checked), US social security numbers, IP addresses, and credentials it knows
  (API keys of several vendors, bearer tokens, credential URIs).
- python-stdnum: IBANs of every country, by their mod-97 checksum and national format.
- `numbers`: national phone formats validated by phonenumbers for the spec's regions, JCB
  and Diners cards, SSNs written with spaces.
- `secrets`: the key patterns of detect-secrets' plugins, the fixed token prefixes of
  gitleaks' rules, and ours for passwords written out.
- `emails`: addresses with non-ASCII names or domains, and obfuscated ones ("anna [at]
  example [dot] com").

What is scanned is each text's normalized view (`normalize`: NFKC, no format characters, one
kind of space and dash); a finding is mapped back to its span in the original text, which is
what a policy replaces. No pattern backtracks over more than a bounded stretch of text, so a
text is scanned in time linear in its length, whatever it holds.

Texts are scanned a chunk at a time, joined into one string: one call into the scanner per
chunk instead of one per item (bench/pii_detectors.py has the comparison behind these
choices). Of a chunk, only the texts `prefilter` picks are joined and scanned, each with
what stood before it; the others hold nothing any detector finds, which is most of them, and
what keeps a million prompts within a few seconds.
"""

import bisect
import itertools
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

import datafog_core

from llm_assets.compliance.emails import emails
from llm_assets.compliance.normalize import View, view
from llm_assets.compliance.numbers import in_a_name, is_order_number, labelled, numbers
from llm_assets.compliance.prefilter import CONTEXT, suspects
from llm_assets.compliance.secrets import credentials
from llm_assets.compliance.spec import PHONE_REGIONS, Entity


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
_SCAN_ENTITIES = sorted(_DATAFOG)

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

_IBAN_CANDIDATE = re.compile(
    r"[0-9][0-9](?<=[A-Za-z][A-Za-z][0-9][0-9])(?:[ \-]?[A-Za-z0-9]){11,30}"
)
"""Printed, compact, dashed or in lower case, found by its check digits: digits are rare in
prose, so a pattern that starts with them is tried at few places (one that starts with a
letter in either case is tried at most); the country code is the two letters before them,
and the word boundary is checked on the (few) matches."""
_VERSION = re.compile(
    r"(?i:\b(?:version|ver|v|build|release|firmware|fw|rev|r|versión|versione|versie|wersja|"
    r"versão|версия|バージョン|版本)\.?(?:\s{1,3}(?:to|is|from|auf|von|à|a|de|naar|na|do))?)"
    r"[ :#=\"']{0,3}$"
)
"""Words that make a dotted number after them a version, not an IP address."""


def _iban_length(candidate: str) -> int:
    """The length of the valid IBAN the candidate starts with (0: none): the candidate may
    run on into a following word in capitals ("DE89 3704 0044 0532 0130 00 ASAP")."""
    # Imported on the first candidate: python-stdnum takes a quarter of a second to import,
    # and most chunks of prompts hold no IBAN-like string at all.
    from stdnum import iban

    while True:
        if iban.is_valid(candidate.upper()):
            return len(candidate)
        cut = max(candidate.rfind(" "), candidate.rfind("-"))
        if cut < 15:
            return 0
        candidate = candidate[:cut]


def _raw_findings(
    joined: str, phone_regions: Sequence[str], chunk: Callable[[], str] | None = None
) -> Iterator[tuple[Entity, int, int]]:
    """The findings in a chunk of texts; `chunk`, when only some texts of a chunk are
    scanned, gives the whole chunk lower-cased (two detectors look for their words there)."""
    for found in datafog_core.scan(joined, config={"entities": _SCAN_ENTITIES}):
        span = found.codepoint_range
        entity = _DATAFOG[found.entity_type]
        if entity == "phone" and joined[span.start] != "+" and is_order_number(joined, span.start):
            continue
        if not _plausible(joined, entity, span.start, span.end):
            continue
        yield entity, span.start, span.end
    for match in _IBAN_CANDIDATE.finditer(joined):
        start = match.start() - 2
        if start == 0 or not joined[start - 1].isalnum():
            length = _iban_length(joined[start : match.end()])
            if length:
                yield "iban", start, start + length
    lowered = joined.lower()
    yield from numbers(joined, lowered, phone_regions, chunk)
    for start, end in emails(joined, lowered, chunk):
        yield "email", start, end
    for start, end in credentials(joined, lowered):
        yield "credential", start, end


_ADDRESS_CONTEXT = re.compile(
    r"(?i:\b(?:ip|ipv4|address|addr|adresse|dirección|indirizzo|адрес|host|server|client|"
    r"from|src|dst|gateway|gw|dns|ping|connect\w*|remote|peer|inet|via|nameserver|proxy)"
    r"[\s:=#]{0,4}$)"
)
"""Words that say a dotted quad after them is an address."""


def _pinned(text: str, start: int) -> bool:
    """Whether a dotted quad is a version pinned by name: lib==8.3.24.210, or an image's tag,
    registry.example.com/shop/web:24.14.21.85."""
    if text[max(0, start - 2) : start] in ("==", "~=", ">=", "<="):
        return True
    if start < 2 or text[start - 1] != ":" or text[start - 2] == ":":
        return False
    left = start - 1
    while left > 0 and start - left < 256 and not text[left - 1].isspace():
        left -= 1
    name = text[left : start - 1]
    return "/" in name and "://" not in name


def _plausible(text: str, entity: Entity, start: int, end: int) -> bool:
    """Whether a number datafog-core found is what it took it for where it stands. A number
    with no check digit (a phone, an SSN) in a file name, path or URL is part of the name; nine
    digits in a row are an SSN only after an SSN word; a dotted quad after "version" or "v" is
    a version. A label in front says otherwise."""
    if entity == "ip_address":
        return _an_address(text, start, end)
    if entity == "email":
        return not _a_login(text, start, end)
    if entity not in ("phone", "national_id"):
        return True
    if labelled(text, entity, start):
        return True
    if text[start:end].isdigit():
        return False  # bare digits: an id in a table, a CSV column, a form, unless labelled
    return not in_a_name(text, start, end)


def _an_address(text: str, start: int, end: int) -> bool:
    """Whether a dotted quad datafog-core found is a host's address, not a version, a section
    number or a pinned release. One whose first part is under 10 and whose others are under
    32 (4.2.1.3, 3.10.2.1) is a version unless an address word or a port says otherwise: a
    public address has all four that small about once in 5,000."""
    if _VERSION.search(text, max(0, start - 20), start) or _pinned(text, start):
        return False
    parts = text[start:end].split(".")
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        return _an_ipv6(text, start, end)
    small = int(parts[0]) < 10 and all(int(p) < 32 for p in parts[1:])
    if not small:
        return True
    port = text[end : end + 2]
    followed = len(port) == 2 and port[0] in ":/" and port[1].isdigit()
    return followed or _ADDRESS_CONTEXT.search(text, max(0, start - 24), start) is not None


def _an_ipv6(text: str, start: int, end: int) -> bool:
    """Whether an IPv6-shaped finding is an address, not a MAC address, a certificate's serial
    (F6:52:CC:81:8A:AD:3E:62: pairs of hex digits) or a C++ scope (ab::cd): an address has a
    digit, groups that are not all pairs, and is not the tail of a longer colon sequence."""
    value = text[start:end]
    groups = [g for g in value.split(":") if g]
    if not any(c.isdigit() for c in value):
        return False
    if "::" not in value and all(len(g) == 2 for g in groups):
        return False
    before = text[max(0, start - 3) : start]
    return not (len(before) == 3 and before[2] == ":" and before[:2].isalnum())


def _a_login(text: str, start: int, end: int) -> bool:
    """Whether an e-mail-shaped finding is a login to a host: user@host in a URL
    (postgresql://reporting@db…) or in an SSH remote (git@github.com:acme/infra.git)."""
    if "/" in text[start:end] or text[max(0, start - 1) : start] == "/":
        return True
    return end < len(text) and text[end] == ":" and not text[end + 1 : end + 2].isdigit()


def _resolved(text: str, found: list[tuple[Entity, int, int]]) -> list[tuple[Entity, int, int]]:
    """Overlapping findings merged into one span of the most sensitive type among them, except
    that a card inside a valid IBAN or a number written with +country is not a card (a
    13-digit run passes the Luhn check one time in ten)."""
    stronger = [
        (start, end)
        for entity, start, end in found
        if entity == "iban" or (entity == "phone" and text[start] == "+")
    ]
    if stronger:
        found = [
            f
            for f in found
            if f[0] != "card" or not any(s < f[2] and f[1] < e for s, e in stronger)
        ]
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


def scan(
    texts: Sequence[str], phone_regions: Sequence[str] = PHONE_REGIONS, *, prefilter: bool = True
) -> list[list[Finding]]:
    """Each text's findings, in order of position, overlapping ones merged; phone numbers in
    national format are those valid in one of `phone_regions`. Only the texts the pre-filter
    picks are scanned (`prefilter=False`: all, what the pre-filter is held to)."""
    if not texts:
        return []
    seen = [text if text.isascii() else view(text).text for text in texts]
    lengths = list(map(len, seen))
    steps = map(operator.add, lengths, itertools.repeat(len(_SEPARATOR)))
    starts = list(itertools.accumulate(steps, initial=0))
    starts.pop()
    ends = list(map(operator.add, starts, lengths))
    joined = _SEPARATOR.join(seen)
    # A character whose lower case is longer (U+0130) makes three detectors read the chunk's
    # word positions otherwise (llm_assets/compliance/secrets.py): such a chunk is scanned whole.
    lowered = joined.lower() if prefilter and "\u0130" not in joined else None
    picked = None if lowered is None else suspects(lowered, starts, ends)
    if lowered is None or picked is None:
        per_text = _attributed(_raw_findings(joined, phone_regions), starts, ends, None)
    elif picked:
        per_text = _scan_picked(joined, lowered, starts, ends, picked, phone_regions)
    else:
        per_text = {}
    out: list[list[Finding]] = [[] for _ in texts]
    for index, found in per_text.items():
        out[index] = _findings(texts[index], view(texts[index]), found)
    return out


def _attributed(
    found: Iterable[tuple[Entity, int, int]],
    starts: list[int],
    ends: list[int],
    kept: set[int] | None,
) -> dict[int, list[tuple[Entity, int, int]]]:
    """Findings in joined texts → per text index (of those `kept`, or all), in the text's
    coordinates; a finding that starts in a separator is none, one that runs past its text's
    end is cut there."""
    per_text: dict[int, list[tuple[Entity, int, int]]] = {}
    for entity, start, end in found:
        index = bisect.bisect_right(starts, start) - 1
        if start >= ends[index] or (kept is not None and index not in kept):
            continue
        offset = starts[index]
        per_text.setdefault(index, []).append(
            (entity, start - offset, min(end, ends[index]) - offset)
        )
    return per_text


def _scan_picked(
    joined: str,
    lowered: str,
    starts: list[int],
    ends: list[int],
    picked: list[int],
    phone_regions: Sequence[str],
) -> dict[int, list[tuple[Entity, int, int]]]:
    """Scan only the picked texts of a chunk, each with the `prefilter.CONTEXT` characters
    that precede it in the chunk: stretches of the joined chunk, separated as texts are. A
    finding is attributed by its position in the chunk, which it has in its stretch; the
    detectors that look for a word anywhere in the chunk get the whole chunk (`lowered`)."""
    spans: list[list[int]] = []
    for index in picked:
        begin = max(0, starts[index] - CONTEXT)
        if spans and begin <= spans[-1][1] + len(_SEPARATOR):
            spans[-1][1] = ends[index]
        else:
            spans.append([begin, ends[index]])
    pieces = [joined[begin:end] for begin, end in spans]
    reduced = _SEPARATOR.join(pieces)
    at_reduced = []  # where each stretch starts in `reduced`
    at = 0
    for piece in pieces:
        at_reduced.append(at)
        at += len(piece) + len(_SEPARATOR)

    def in_chunk() -> Iterator[tuple[Entity, int, int]]:
        for entity, start, end in _raw_findings(reduced, phone_regions, lambda: lowered):
            stretch = bisect.bisect_right(at_reduced, start) - 1
            shift = spans[stretch][0] - at_reduced[stretch]
            if start + shift < spans[stretch][1]:  # else in a separator between stretches
                yield entity, start + shift, end + shift

    return _attributed(in_chunk(), starts, ends, set(picked))


def _findings(text: str, seen: View, found: list[tuple[Entity, int, int]]) -> list[Finding]:
    """The findings in a text's view, resolved there and mapped to their spans in the text."""
    out: list[Finding] = []
    for entity, start, end in _resolved(seen.text, found):
        start, end = seen.span(start, end)
        if out and start < out[-1].end:  # two view spans from one original character
            last = out.pop()
            entity = entity if _SEVERITY[entity] < _SEVERITY[last.entity] else last.entity
            start = last.start
        out.append(Finding(entity, start, end, text[start:end]))
    return out
