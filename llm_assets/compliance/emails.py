"""E-mail addresses datafog-core does not find: (start, end) of each in a chunk of prompts'
normalized views (so a full-width ＠ is already "@").

- Internationalised addresses: a name or a domain in any script (jörg@müller.de,
  用户@例子.广告). Looked for only in a chunk that is not all ASCII; ASCII ones are
  datafog-core's.
- Obfuscated addresses: "anna [at] example [dot] com", "anna(at)example.de", "anna at example
  dot org", "anna @ example.de". Looked for only in a chunk that holds a bracketed "at", a
  spelled-out "dot" or an "@" beside a space: "at" alone is too common a word to say
  anything.

Every quantifier is bounded (64 for a name, 63 per domain label, as RFC 5321 allows), so a
text is scanned in linear time whatever it holds.
"""

import re
from collections.abc import Callable, Iterator

_MARKS = "\u0300-\u036f\u0900-\u0dff\u0e00-\u0e7f\u1000-\u109f"
"""Combining marks and the Indic, Thai and Myanmar blocks, whose vowel signs are marks: not
word characters to `re`, but part of a name (राहुल@डाटामेल.भारत)."""
_UNICODE_EMAIL = re.compile(
    rf"(?<![\w.+\-{_MARKS}])[\w.+\-{_MARKS}]{{1,64}}@[\w\-{_MARKS}]{{1,63}}"
    rf"(?:\.[\w\-{_MARKS}]{{1,63}}){{1,8}}"
)

_AT = (
    r"(?:\s{0,3}[\[\(\{<]\s{0,2}at\s{0,2}[\]\)\}>]\s{0,3}|\s{1,3}at\s{1,3}"
    r"|\s{1,3}@\s{0,3}|@\s{1,3})"
)
_DOT = r"(?:\s{0,3}[\[\(\{<]\s{0,2}dot\s{0,2}[\]\)\}>]\s{0,3}|\s{1,3}dot\s{1,3}|\.)"
_OBFUSCATED = re.compile(
    rf"(?i)(?<![\w.+\-])([\w.+\-]{{1,64}}){_AT}([\w\-]{{1,63}}(?:{_DOT}[\w\-]{{1,63}}){{1,6}})"
)
_BRACKETED = re.compile(r"(?i)[\[\(\{<]\s{0,2}(?:at|dot)\s{0,2}[\]\)\}>]")
_NEEDLES = ("at)", "at]", "at}", "at>", "dot", " @", "@ ")
_TLD = re.compile(rf"(?:[^\W\d_]|[{_MARKS}]){{2,24}}")


def emails(
    joined: str, lowered: str, chunk: Callable[[], str] | None = None
) -> Iterator[tuple[int, int]]:
    """(start, end) of each address found in `joined` (`lowered` is it in lower case; `chunk`,
    when these are some of a chunk's prompts, gives the whole chunk lower-cased, whose needles
    count)."""
    if "@" in joined and not joined.isascii():
        for match in _UNICODE_EMAIL.finditer(joined):
            if not match.group().isascii() and _TLD.fullmatch(match.group().rsplit(".", 1)[1]):
                yield match.span()
    if _may_be_obfuscated(joined, lowered, chunk):
        for match in _OBFUSCATED.finditer(joined):
            if _obfuscated(match):
                yield match.span()


def _may_be_obfuscated(joined: str, lowered: str, chunk: Callable[[], str] | None) -> bool:
    """Whether the chunk holds a needle. Asked of the whole chunk only when these prompts lack
    one and hold what an obfuscated address needs besides ("@" or an "at" in brackets)."""
    if any(needle in lowered for needle in _NEEDLES):
        return True
    if chunk is None or ("@" not in joined and _BRACKETED.search(joined) is None):
        return False
    whole = chunk()
    return any(needle in whole for needle in _NEEDLES)


def _obfuscated(match: re.Match[str]) -> bool:
    """Whether a candidate is an address written to dodge harvesters, not a sentence: "at" in
    brackets or a spelled-out "dot", and a top-level domain of letters at the end ("see you at
    home dot" is not one; "ask bob at acme dot com" is)."""
    whole = match.group()
    domain = match.group(2)
    last = re.split(r"(?i)\s*[\[\(\{<]?\s*dot\s*[\]\)\}>]?\s*|\.", domain)[-1]
    if not _TLD.fullmatch(last) or last.lower() in ("at", "dot"):
        return False
    spelled_dot = re.search(r"(?i)(?:^|[\s\[\(\{<])dot(?:$|[\s\]\)\}>])", domain) is not None
    spaced_at = "@" in whole
    return _BRACKETED.search(whole) is not None or spelled_dot or spaced_at
