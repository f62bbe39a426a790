"""The view of a text that the detectors scan, and the way back to the text itself.

People write values with whatever their keyboard, phone or word processor gives them: a card in
full-width digits, groups joined by NO-BREAK or THIN SPACE, a ZERO WIDTH SPACE or a soft hyphen
pasted inside a number, a full-width @, an e-mail whose accents are decomposed (NFD), an SSN
with a non-breaking hyphen. The detectors' patterns are written for one form of each, so they
scan a normalized view of the text:

- NFKC: compatibility forms become their plain characters (４ → 4, ＠ → @), and a letter with
  combining marks is composed (o + U+0308 → ö);
- format characters (Unicode category Cf: zero-width spaces and joiners, soft hyphen, BOM,
  bidirectional marks) are removed;
- every space separator becomes " ", a line or paragraph separator "\\n", every dash and
  minus sign "-".

The view keeps, for each of its characters, where in the original it came from, so that a
finding replaces its whole span in the original text: a card with zero-width spaces inside is
redacted with them, never half. Text that is all ASCII, most of it, is its own view.
"""

import functools
import json
import re
import unicodedata
from pathlib import Path
from typing import NamedTuple


class View(NamedTuple):
    """The normalized text, and for each of its characters the original span it came from
    (`starts[i]` to `ends[i]`, end exclusive); both None when the text is its own view."""

    text: str
    starts: list[int] | None = None
    ends: list[int] | None = None

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The original span of the view's characters start..end (end exclusive, > start)."""
        if self.starts is None or self.ends is None:
            return start, end
        return self.starts[start], self.ends[end - 1]


_DASHES = "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\u2e3a\u2e3b\ufe58\ufe63\uff0d"
_LINE_BREAKS = "\u2028\u2029\x85"


def _replacement(cluster: str) -> str:
    """What the view shows for a character, or a character and its combining marks."""
    if len(cluster) == 1:
        category = unicodedata.category(cluster)
        if category == "Cf":
            return ""
        if cluster in _LINE_BREAKS:
            return "\n"
        if category in ("Zs", "Zl", "Zp"):
            return " "
        if cluster in _DASHES:
            return "-"
    out = unicodedata.normalize("NFKC", cluster)
    # NFKC turns U+2011 into U+2010 and leaves the other dashes: fold what it gives.
    return "".join("-" if c in _DASHES else (" " if c.isspace() and c != "\n" else c) for c in out)


class _Tables(NamedTuple):
    one: dict[int, str]
    """Characters the view shows as one other character (４ → 4, NBSP → space): the whole
    text is translated at once, and offsets do not move."""
    other: re.Pattern[str]
    """Runs of format characters, which the view drops: the only characters left to change
    in a text that is NFKC already."""
    clusters: re.Pattern[str]
    """A character with its combining marks, or one of `other`: for text NFKC would compose."""


TABLES_FILE = Path(__file__).with_name("normalize_tables.json")
"""The tables as `write_tables` made them, for the Unicode version they name."""


@functools.cache
def _tables() -> _Tables:
    """Made on the first non-ASCII text: read from TABLES_FILE when it was made for this
    Python's Unicode version, else scanned (a third of a second, which every CLI run, run
    worker and code server would pay)."""
    return stored_tables(unicodedata.unidata_version) or scanned_tables()


def stored_tables(unidata_version: str) -> _Tables | None:
    """TABLES_FILE's tables, if it holds those of `unidata_version`."""
    try:
        stored = json.loads(TABLES_FILE.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    if stored.get("unidata_version") != unidata_version:
        return None
    one = {int(point): out for point, out in stored["one"].items()}
    return _Tables(one, re.compile(stored["other"]), re.compile(stored["clusters"]))


def write_tables(path: Path = TABLES_FILE) -> None:
    """Store the scanned tables for this Python's Unicode version (run after a Python
    upgrade changes it: `python -c "from llm_assets.compliance.normalize import
    write_tables; write_tables()"`)."""
    tables = scanned_tables()
    stored = {
        "unidata_version": unicodedata.unidata_version,
        "one": {str(point): out for point, out in sorted(tables.one.items())},
        "other": tables.other.pattern,
        "clusters": tables.clusters.pattern,
    }
    path.write_text(json.dumps(stored, indent=0) + "\n", encoding="utf-8")


def scanned_tables() -> _Tables:
    """The tables from every code point's replacement (`_replacement`)."""
    one: dict[int, str] = {}
    other = [ord(c) for c in _LINE_BREAKS if len(_replacement(c)) != 1]
    marks = []
    for point in range(0x80, 0x30000):
        char = chr(point)
        if unicodedata.category(char)[0] == "M":
            marks.append(point)
            continue
        out = _replacement(char)
        if out == char:
            continue
        if len(out) == 1:
            one[point] = out
        else:
            other.append(point)
    mark_class = _ranges(marks)
    dropped = [point for point in other if not _replacement(chr(point))]
    return _Tables(
        one,
        re.compile(f"[{_ranges(dropped)}]+"),
        re.compile(f"[^{mark_class}]?[{mark_class}]+|[{_ranges(other)}]"),
    )


def _ranges(points: list[int]) -> str:
    """A character class body for the code points, as ranges."""
    parts = []
    points = sorted(set(points))
    at = 0
    while at < len(points):
        end = at
        while end + 1 < len(points) and points[end + 1] == points[end] + 1:
            end += 1
        first, last = points[at], points[end]
        parts.append(re.escape(chr(first)) + ("-" + re.escape(chr(last)) if last > first else ""))
        at = end + 1
    return "".join(parts)


def view(text: str) -> View:
    """The text as the detectors scan it (see the module's docstring)."""
    if text.isascii():
        return View(text)
    tables = _tables()
    # Same length as the text: a character's position is the same in both.
    same_length = text.translate(tables.one)
    if not unicodedata.is_normalized("NFKC", same_length):
        return _composed(same_length, tables.clusters)
    if tables.other.search(same_length) is None:
        return View(same_length)
    # What is left to do is to drop format characters: keep the others' positions.
    starts: list[int] = []
    at = 0
    for match in tables.other.finditer(same_length):
        starts.extend(range(at, match.start()))
        at = match.end()
    starts.extend(range(at, len(same_length)))
    return View(tables.other.sub("", same_length), starts, [at + 1 for at in starts])


def _composed(text: str, clusters: re.Pattern[str]) -> View:
    """The view of a text NFKC would compose: each character with its combining marks, and
    each character shown as none or several, replaced one by one."""
    pieces: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    at = 0
    for match in clusters.finditer(text):
        begin, end = match.span()
        if begin > at:
            pieces.append(text[at:begin])
            starts.extend(range(at, begin))
            ends.extend(range(at + 1, begin + 1))
        out = _replacement(match.group())
        pieces.append(out)
        starts.extend([begin] * len(out))
        ends.extend([end] * len(out))
        at = end
    pieces.append(text[at:])
    starts.extend(range(at, len(text)))
    ends.extend(range(at + 1, len(text) + 1))
    return View("".join(pieces), starts, ends)
