"""Numbers datafog-core does not find: phone numbers in national format (validated by
phonenumbers, Google's libphonenumber, for the spec's regions), JCB and Diners cards
(Luhn-checked by python-stdnum) and US social security numbers written with spaces. Each
pattern finds candidates in a chunk of prompts; the libraries decide. Both libraries are
imported on the first candidate: most chunks hold none."""

import re
from collections.abc import Iterator, Sequence

from llm_assets.compliance.spec import Entity

# Each pattern starts with a literal or a digit, which the regular expression engine looks
# for quickly; what must not come before a match (a lookbehind would make every position a
# start) is checked on the few matches.

_NATIONAL_PHONE = re.compile(r"0\d{1,4}\)?(?:[ .\-/]?\d){5,11}(?![\w.\-/]*\d)")
"""A number written with its national trunk prefix 0 (UK, Germany, France, Japan,
Australia, ...): North American and +country numbers are datafog-core's."""
_DATE = re.compile(r"\d{1,4}[./\-]\d{1,2}[./\-]\d{1,4}")
_CARD_3 = re.compile(r"3\d{3}(?:[ \-]?\d){10,15}(?![\d\-])")
"""Cards starting with 3 (JCB 3528-3589, Diners 300-305, 36, 38, 39) in any grouping."""
_SSN_SPACED = re.compile(r"\d{3} \d{2} \d{4}(?![\d ]\d)")
"""Looked for only in a chunk that speaks of SSNs (`_SSN_WORDS`): nine digits in 3-2-4 groups
are as often something else, and the search costs two microseconds a prompt."""
_SSN_WORDS = ("ssn", "social security", "ss#")

NOT_A_PHONE = re.compile(
    r"(?i:order|invoice|ticket|tracking|ref(?:erence)?|account|acct|case|sku|no\.|#)"
    r"[\s:#.\-]*$"
)
"""Words that make a number in front of them an order or account number, not a phone."""


def _card_brand(digits: str) -> bool:
    head = int(digits[:4])
    if 3528 <= head <= 3589:
        return len(digits) in (16, 17, 18, 19)
    if 3000 <= head <= 3059 or digits[:2] in ("36", "38", "39"):
        return len(digits) in (14, 15, 16, 17, 18, 19)
    return False


def numbers(
    joined: str, lowered: str, phone_regions: Sequence[str]
) -> Iterator[tuple[Entity, int, int]]:
    """(entity, start, end) of each number found in a chunk of prompts."""
    if phone_regions:
        yield from _national_phones(joined, phone_regions)
    cards = [
        m
        for m in _CARD_3.finditer(joined)
        if _free(joined, m.start(), "-") and _card_brand(re.sub(r"\D", "", m[0]))
    ]
    if cards:
        from stdnum import luhn

        for match in cards:
            if luhn.is_valid(re.sub(r"\D", "", match.group())):
                yield "card", match.start(), match.end()
    if not any(word in lowered for word in _SSN_WORDS):
        return
    for match in _SSN_SPACED.finditer(joined):
        area, group, serial = match.group().split(" ")
        valid = area not in ("000", "666") and area[0] != "9" and group != "00"
        if valid and serial != "0000" and _free(joined, match.start(), ""):
            yield "national_id", match.start(), match.end()


def _free(text: str, start: int, also: str) -> bool:
    """Whether the match at `start` begins a number: no digit, letter or `also` before it."""
    return start == 0 or not (text[start - 1].isalnum() or text[start - 1] in also)


def _national_phones(joined: str, regions: Sequence[str]) -> Iterator[tuple[Entity, int, int]]:
    candidates = []
    for match in _NATIONAL_PHONE.finditer(joined):
        start = match.start()
        if start and joined[start - 1] == "(":
            start -= 1
        elif not _free(joined, start, "+.-/"):
            continue
        if not _DATE.fullmatch(match.group()) and not is_order_number(joined, start):
            candidates.append((start, match.end()))
    if not candidates:
        return
    import phonenumbers

    for start, end in candidates:
        for region in regions:
            try:
                number = phonenumbers.parse(joined[start:end], region)
            except phonenumbers.NumberParseException:
                break
            if phonenumbers.is_valid_number(number):
                yield "phone", start, end
                break


def is_order_number(text: str, start: int) -> bool:
    """Whether the number at `start` follows a word that makes it an order, invoice, ticket or
    account number."""
    return NOT_A_PHONE.search(text, max(0, start - 16), start) is not None
