"""Numbers datafog-core does not find: phone numbers in national format (validated by
phonenumbers, Google's libphonenumber, for the spec's regions), JCB and Diners cards
(Luhn-checked by python-stdnum) and US social security numbers written with spaces. Each
pattern finds candidates in a chunk of prompts; the libraries decide. Both libraries are
imported on the first candidate: most chunks hold none."""

import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from llm_assets.compliance.spec import Entity

# Each pattern starts with a literal or a digit, which the regular expression engine looks
# for quickly; what must not come before a match (a lookbehind would make every position a
# start) is checked on the few matches.

_NATIONAL_PHONE = re.compile(r"0\d{1,4}\)?(?:[ .\-/]?\d){5,11}+")
"""A number written with its national trunk prefix 0 (UK, Germany, France, Japan,
Australia, ...): North American and +country numbers are datafog-core's. The digits are
taken possessively and what follows is checked on the match (`_runs_on`): a lookahead over
the rest of a digit run would rescan it for every candidate in it."""
_TRUNK_IN_BRACKETS = re.compile(r"\+\d{1,3}[ .\-]?\(0\)[ .\-]?\d(?:[ .\-/]?\d){4,12}+")
"""+49 (0)30 1234567, +44 (0) 20 7946 0958: the country code, then the national trunk
prefix in brackets, which is dialled only from inside the country."""
_DOTTED_CARD = re.compile(r"[2-6]\d{3}(?:\.\d{3,6}){2,4}+")
"""4111.1111.1111.1111: card groups joined by dots (datafog-core takes spaces and dashes)."""
_SSN_LABELLED = re.compile(
    r"(?i:ssn|ss#|social security(?: number| no\.?)?)[\s:#.\-\"'=]{0,6}"
    r"(\d{3}[ \-]?\d{2}[ \-]?\d{4})"
)
"""An SSN after its label, glued to it or not (SSN536228726, SSN: 536 22 8726)."""
_DATE = re.compile(r"\d{1,4}[./\-]\d{1,2}[./\-]\d{1,4}")
_CARD_3 = re.compile(r"3\d{3}(?:[ \-]?\d){10,15}(?![\d\-])")
"""Cards starting with 3 (JCB 3528-3589, Diners 300-305, 36, 38, 39) in any grouping."""
_SSN_SPACED = re.compile(r"\d{3} \d{2} \d{4}(?![\d ]\d)")
"""Looked for only in a chunk that speaks of SSNs (`_SSN_WORDS`): nine digits in 3-2-4 groups
are as often something else, and the search costs two microseconds a prompt."""
_SSN_WORDS = ("ssn", "social security", "ss#")

NOT_A_PHONE = re.compile(
    r"(?i:order|invoice|ticket|tracking|ref(?:erence)?|account|acct|case|sku|no\.|#|"
    r"n\.?[°o]|no|nr\.?|n\.|commande|referen\w{0,6}|customer|client\w{0,2}|kunden\w{0,8}|"
    r"klant\w{0,8}|artikel\w{0,8}|article|po|barcode|upc(?:-a)?|ean(?:-13)?|isbn|serial|seri no|"
    r"serie|kod\w{0,2}|code|инн|кпп|бик|огрн|артикул|номер\w{0,2}(?: заказа)?|договор\w{0,2}|"
    r"番号|संख्या|מספר(?: לקוח)?|رقم(?: العميل)?|facture|bestell?\w{0,8}|rechnung\w{0,8}|"
    r"auftrag\w{0,8}|"
    r"kunden\w{0,8}|pedido|factura|ordine|fattura|bestelling|factuur|zamówieni[ae]|"
    r"faktur[ay]|encomenda|заказ|счёт|sipariş|fatura|注文番号|注文|订单号?|訂單|ऑर्डर नंबर|"
    r"ऑर्डर|(?:ال)?طلب(?: رقم)?|رقم (?:ال)?طلب|הזמנה(?: מספר)?|מספר הזמנה)"
    r"[\s:#.\-]{0,6}$"
)
"""Words that make a number in front of them an order, invoice, customer, article or
reference number, not a phone, in the languages tickets are written in; matched in the
normalized view, where "n.º" is "n.o" and "№" is "No"."""
_PHONE_LABEL = re.compile(
    r"(?i:\b(?:phone|tel|telephone|mobile|mobil|cell|fax|handy|call|ring|whatsapp|tél|"
    r"téléphone|telefon|telefono|teléfono|telefoon|numéro|телефон|тел|τηλ|טלפון|هاتف)|電話|携帯)"
    r"[\s:#.\-]{0,3}(?:no\.?|nr\.?|number|nummer|numero|número|numéro|num\.?|#|番号)?"
    r"[\s:#.\-]{0,4}$"
)
"""A label that says the number after it is a phone, even after "no." or "#"."""
_SSN_LABEL = re.compile(r"(?i:ssn|ss#|social security)[\w\s:#.\-\"',=]{0,20}$")
_FILE_NAME = re.compile(r"[\w\-.]*\.[A-Za-z][A-Za-z0-9]{0,4}")
_NAME_END = ")]}>,;:!?'\""


def _card_brand(digits: str) -> bool:
    head = int(digits[:4])
    if 3528 <= head <= 3589:
        return len(digits) in (16, 17, 18, 19)
    if 3000 <= head <= 3059 or digits[:2] in ("36", "38", "39"):
        return len(digits) in (14, 15, 16, 17, 18, 19)
    return False


def numbers(
    joined: str,
    lowered: str,
    phone_regions: Sequence[str],
    chunk: Callable[[], str] | None = None,
) -> Iterator[tuple[Entity, int, int]]:
    """(entity, start, end) of each number found in a chunk of prompts; `chunk`, when these
    are some of a chunk's prompts, gives the whole chunk lower-cased, whose SSN words count."""
    if phone_regions:
        yield from _national_phones(joined, phone_regions)
    if "(0)" in joined:
        yield from _trunk_in_brackets(joined)
    cards = [
        m
        for m in _CARD_3.finditer(joined)
        if _free(joined, m.start(), "-") and _card_brand(re.sub(r"\D", "", m[0]))
    ]
    cards += [
        m
        for m in _DOTTED_CARD.finditer(joined)
        if _free(joined, m.start(), ".") and not _digit_follows(joined, m.end(), ".")
    ]
    if cards:
        from stdnum import luhn

        for match in cards:
            digits = re.sub(r"\D", "", match.group())
            if 13 <= len(digits) <= 19 and luhn.is_valid(digits):
                yield "card", match.start(), match.end()
    if not _speaks_of_ssns(joined, lowered, chunk):
        return
    for match in _SSN_SPACED.finditer(joined):
        if _ssn_valid(match.group()) and _free(joined, match.start(), ""):
            yield "national_id", match.start(), match.end()
    for match in _SSN_LABELLED.finditer(joined):
        if _ssn_valid(match.group(1)) and not _digit_follows(joined, match.end(1), ""):
            yield "national_id", match.start(1), match.end(1)


def _speaks_of_ssns(joined: str, lowered: str, chunk: Callable[[], str] | None) -> bool:
    """Whether the chunk holds an SSN word. Asked of the whole chunk only when these prompts
    lack one and hold an SSN in 3-2-4 groups (the only finding another prompt's word makes)."""
    if any(word in lowered for word in _SSN_WORDS):
        return True
    if chunk is None or _SSN_SPACED.search(joined) is None:
        return False
    whole = chunk()
    return any(word in whole for word in _SSN_WORDS)


def _ssn_valid(digits: str) -> bool:
    """Whether nine digits (with separators or not) can be an SSN."""
    digits = re.sub(r"\D", "", digits)
    area, group, serial = digits[:3], digits[3:5], digits[5:]
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


def _digit_follows(text: str, end: int, also: str) -> bool:
    """Whether the number ending at `end` runs on: a digit next, or `also` then a digit."""
    if end < len(text) and text[end].isdigit():
        return True
    return end + 1 < len(text) and text[end] in also and text[end + 1].isdigit()


def labelled(text: str, entity: Entity, start: int) -> bool:
    """Whether a label in front says the number at `start` is a phone (or an SSN)."""
    label = _PHONE_LABEL if entity == "phone" else _SSN_LABEL
    return label.search(text, max(0, start - 24), start) is not None


def in_a_name(text: str, start: int, end: int) -> bool:
    """Whether the number at start..end is part of a file name, a path or a URL: its word
    (what whitespace bounds, up to 256 characters either way) holds a slash or a backslash, or
    ends in a file extension after the number."""
    left = start
    while left > 0 and start - left < 256 and not text[left - 1].isspace():
        left -= 1
    right = end
    while right < len(text) and right - end < 256 and not text[right].isspace():
        right += 1
    word = text[left:right].rstrip(_NAME_END)
    if "/" in word or "\\" in word:
        return True
    tail = word[end - left :]
    return bool(tail) and tail[0] in "._-" and _FILE_NAME.fullmatch(tail) is not None


def _free(text: str, start: int, also: str) -> bool:
    """Whether the match at `start` begins a number: no digit, letter or `also` before it."""
    return start == 0 or not (text[start - 1].isalnum() or text[start - 1] in also)


def _runs_on(text: str, end: int) -> bool:
    """Whether a number ending at `end` is the start of something longer: a digit after a few
    word characters or separators (0301234567-89, 0301234567.1, 030/1234567x2)."""
    for char in text[end : end + 4]:
        if char.isdigit():
            return True
        if not (char.isalnum() or char in "._-/"):
            return False
    return False


def _trunk_in_brackets(joined: str) -> Iterator[tuple[Entity, int, int]]:
    import phonenumbers

    for match in _TRUNK_IN_BRACKETS.finditer(joined):
        if not _free(joined, match.start(), "") or _runs_on(joined, match.end()):
            continue
        try:
            number = phonenumbers.parse(match.group().replace("(0)", ""), None)
        except phonenumbers.NumberParseException:
            continue
        if phonenumbers.is_valid_number(number):
            yield "phone", match.start(), match.end()


def _national_phones(joined: str, regions: Sequence[str]) -> Iterator[tuple[Entity, int, int]]:
    candidates = []
    for match in _NATIONAL_PHONE.finditer(joined):
        start = match.start()
        if start and joined[start - 1] == "(":
            start -= 1
        elif not _free(joined, start, "+.-/)"):
            continue
        elif start >= 2 and joined[start - 1] == ":" and joined[start - 2].isdigit():
            continue  # the seconds of a time: 14:22:09.123456
        elif start >= 2 and joined[start - 1] in " .-" and joined[start - 2].isdigit():
            continue  # a group of a longer number: 4246 8763 0185 5872
        if _runs_on(joined, match.end()) or _DATE.fullmatch(match.group()):
            continue
        if labelled(joined, "phone", start) or not (
            is_order_number(joined, start)
            or in_a_name(joined, start, match.end())
            or match.group().isdigit()
        ):
            candidates.append((start, match.end()))
    if not candidates:
        return
    import phonenumbers

    for start, end in candidates:
        digits = re.sub(r"\D", "", joined[start:end])
        for region in regions:
            number = _national_number(joined[start:end], digits, region)
            if number is not None and phonenumbers.is_valid_number(number):
                yield "phone", start, end
                break


def _national_number(text: str, digits: str, region: str) -> Any:
    """The number a national-format candidate (it starts with 0) is in a region. Where the
    region's trunk prefix is a plain 0 the number is made directly, which is a tenth of the
    cost of phonenumbers' parser (a row of random digits holds thousands of candidates); other
    regions (Italy keeps its leading 0, some have other prefixes) are parsed."""
    import phonenumbers

    metadata = phonenumbers.PhoneMetadata.metadata_for_region(region.upper())
    if metadata is None:
        return None
    if region.upper() != "IT" and metadata.national_prefix == "0" and len(digits) > 1:
        return phonenumbers.PhoneNumber(
            country_code=metadata.country_code, national_number=int(digits[1:])
        )
    try:
        return phonenumbers.parse(text, region)
    except phonenumbers.NumberParseException:
        return None


def is_order_number(text: str, start: int) -> bool:
    """Whether the number at `start` follows a word that makes it an order, invoice, ticket or
    account number."""
    if NOT_A_PHONE.search(text, max(0, start - 16), start) is None:
        return False
    return not labelled(text, "phone", start)
