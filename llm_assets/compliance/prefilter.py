"""Which prompts of a chunk could hold a value a detector finds: only those are scanned.

Most prompts hold nothing: no run of nine digits, no "@", no key-shaped token, no password
word with a value after it. One pass of one automaton over a chunk's prompts (RE2, through
pyarrow, which the outputs are written with anyway) finds those that hold a *trigger*; the
detectors then scan only them, each with the `CONTEXT` characters that stood before it, and
every other prompt has no finding without being scanned.

Exactness: every value a detector can find contains one of the triggers below, or (a password
whose word ends the prompt before) follows a prompt that ends as `_CARRY_OVER` says. The
triggers are looser than the detectors (anything a detector's pattern or datafog-core's code
can match, with no check digits, labels or look-arounds) and are written for the detectors
of this package and datafog-core 0.4.4 (`VERIFIED_DATAFOG`); with another version of
datafog-core every prompt is scanned. tests/test_pii_prefilter.py holds the scan with and
without the pre-filter to the same findings on arbitrary text.

- digits: "+" and a digit; nine digits (or a 0 and six more) with at most two spaces, dots,
  dashes, slashes or brackets between each two; a digit, a dot and a digit; two letters and
  two digits and eleven more letters or digits (an IBAN); colons around up to four hex digits
  (IPv6);
- "@", "://", a run of 16 key characters ([A-Za-z0-9_-.+/=~]);
- words: authorization, mysql, xox, -----begin, putty-user-key, dot, "at" in brackets;
- a password word followed by what `secrets._PASSWORD_VALUE` takes before a value, and a value
  of six or more characters with a digit or symbol among them; a password word at the end of
  a prompt (with what may stand between it and a value), which flags the next prompt too.

The triggers run on the lower-cased prompts, as the detectors' word searches do, so the words
need no case folding. Python's `\\s` is spelled out (it holds U+001C-U+001F, which RE2's does
not) and `\\d` is `\\p{Nd}`; a test holds both to Python's.
"""

import functools
import importlib.metadata
import re
from array import array
from collections.abc import Sequence
from typing import Any

from llm_assets.compliance.secrets import PASSWORD_WORDS

VERIFIED_DATAFOG = frozenset({"0.4.4"})
"""datafog-core versions whose detectors the triggers were written against."""

CONTEXT = 256
"""Characters before a scanned prompt that are scanned with it: the detectors look back at
most about 80 (a password word, up to 48 characters and "is" before its value across the
separator; a phone or SSN label 24), so a prompt is scanned with what it would have seen."""

_SPACE = "\\t\\n\\x0b\\x0c\\r\\x1c-\\x1f "
"""What Python's `\\s` matches in a normalized view, as the body of an RE2 class: the view
turns every other space (NBSP, U+2028, ...) into one of these (compliance.normalize)."""
_S = f"[{_SPACE}]"
_GAP = f"[{_SPACE}.\\-()/]{{0,2}}"
"""What may stand between two digits of a number any detector takes."""
_OTHER_DIGIT = "[^\\P{Nd}0-9]"
"""A decimal digit of another script than ASCII (Python's `\\d` takes it): a prompt with one
is scanned, so that the other triggers need only ASCII digits, which RE2 compiles quickly."""
_IN_VALUE = "[^\\t\\n\\x0b\\x0c\\r\\x1c-\\x1f ,;]"
"""What a password's value may hold, or more (secrets.NOT_IN_A_VALUE ends it)."""
_VALUE_CHAR = "[0-9!@#$%^&*]"
_VERB = f"[^{_SPACE}0-9!-/:-@\\[-`{{-~]{{1,4}}"
"""What `secrets._PASSWORD_VALUE` takes as a verb ("is", "est", "это", "है"), or more: one to
four characters, none of them a space, a digit or ASCII punctuation. Lower-cased, a verb may
be written with a dotless i, which the case-blind pattern takes for an i."""
_RE2_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")
_WORDS = "(?:" + "|".join(_RE2_SPECIAL.sub(r"\\\1", word) for word in PASSWORD_WORDS) + ")"
_BEFORE_VALUE = (
    f"(?:[^\\n:=：]{{0,48}}(?:[:=：]|{_S}{_VERB}{_S}|[は是为為])|[は是为為]|{_S})?"
    f"{_S}{{0,4}}[:=：]?{_S}{{0,4}}[「『\"'“‘]?"
)
"""What `secrets._PASSWORD_VALUE` takes before a value."""
_VALUE = (
    f"(?:{_VALUE_CHAR}{_IN_VALUE}{{5}}|{_IN_VALUE}{_VALUE_CHAR}{_IN_VALUE}{{4}}|"
    f"{_IN_VALUE}{{2}}{_VALUE_CHAR}{_IN_VALUE}{{3}}|{_IN_VALUE}{{3}}{_VALUE_CHAR}{_IN_VALUE}{{2}}|"
    f"{_IN_VALUE}{{4}}{_VALUE_CHAR}{_IN_VALUE}|{_IN_VALUE}{{5,}}{_VALUE_CHAR})"
)
"""Six or more characters of a value with a digit or symbol among them."""
_ENDS_BEFORE_VALUE = f"(?:[^\\n:=：]{{0,48}}(?:[:=：]|{_S}{_VERB}|[は是为為])|[は是为為])?{_S}*"
"""What may follow a password word at the end of a prompt when its value begins the next one:
the separator between two prompts of a chunk is five whitespace characters, which the two
`\\s{0,4}` of a password's prefix (and the `\\s` after a verb) can span."""

TRIGGERS = "|".join(
    (
        _OTHER_DIGIT,
        "\\+[0-9]",
        f"[0-9](?:{_GAP}[0-9]){{8}}",
        f"0(?:{_GAP}[0-9]){{6}}",
        "[0-9]\\.[0-9]",
        ":[0-9a-f]{0,4}:",
        "[a-z]{2}[0-9]{2}(?:[ \\-]?[a-z0-9]){11}",
        "@",
        "://",
        "[a-z0-9_\\-.+/=~]{16}",
        "authorization|mysql|xox|-----begin|putty-user-key|dot",
        f"[\\[({{<]{_S}{{0,2}}at",
        _WORDS + _BEFORE_VALUE + _VALUE,
        _WORDS + _ENDS_BEFORE_VALUE + "\\z",
    )
)
"""A lower-cased prompt without a match holds nothing any detector finds (see the module's
docstring); one followed by a separator may match where the prompt alone would not."""
_CARRY_OVER = re.compile(
    _WORDS
    + r"(?:[^\n:=：]{0,48}(?:[:=：]|\s[^\s\d!-/:-@\[-`{-~]{1,4}|[は是为為])|[は是为為])?\s*\Z"
)
"""The last alternative of TRIGGERS in Python: whether a prompt's password value may begin in
the next prompt."""
_CARRY_REACH = 80
"""A password word and what may follow it up to the end of a prompt, at most (whitespace at
the end aside)."""


@functools.cache
def _usable() -> bool:
    """Whether the triggers hold for the installed datafog-core, and RE2 is there to run."""
    try:
        version = importlib.metadata.version("datafog-core")
    except importlib.metadata.PackageNotFoundError:
        return False
    if version not in VERIFIED_DATAFOG:
        return False
    try:
        _flags(_texts("x", [0], [1]))
    except (ImportError, NotImplementedError, ValueError):  # pyarrow built without RE2
        return False
    return True


def suspects(lowered: str, starts: Sequence[int], ends: Sequence[int]) -> list[int] | None:
    """The positions of the texts that must be scanned, in order, of the texts at
    `lowered[starts[i]:ends[i]]` (a chunk's texts joined, lower-cased); None when the
    pre-filter cannot tell (another datafog-core, a text that is not valid Unicode) and every
    text must be scanned."""
    if not starts or not _usable():
        return None
    try:
        texts = _texts(lowered, starts, ends)
    except UnicodeEncodeError:  # a lone surrogate
        return None
    picked = _flags(texts)
    carried = [at + 1 for at in picked if at + 1 < len(starts) and _carries(lowered, ends[at])]
    return sorted({*picked, *carried}) if carried else picked


def _texts(lowered: str, starts: Sequence[int], ends: Sequence[int]) -> Any:
    """The texts as an Arrow array, each with what follows it up to the next (a text followed
    by anything matches at least what it matches alone), made from the chunk's bytes and
    their offsets: `pa.array` would import pandas into a shards worker."""
    import pyarrow as pa

    if lowered.isascii():
        data = lowered.encode("ascii")
        offsets = array("q", starts)
        offsets.append(len(lowered))
    else:
        data = lowered.encode("utf-8")
        offsets = array("q", [0])
        for start, following in zip(starts, [*starts[1:], len(lowered)], strict=True):
            offsets.append(offsets[-1] + len(lowered[start:following].encode("utf-8")))
    return pa.LargeStringArray.from_buffers(len(starts), pa.py_buffer(offsets), pa.py_buffer(data))


def _flags(texts: Any) -> list[int]:
    """The positions of the texts with a trigger. Arrow's own allocator is not used: it keeps
    tens of MB of a worker's memory for the few bytes of flags."""
    import pyarrow as pa
    import pyarrow.compute as pc

    pool = pa.system_memory_pool()
    flags = pc.match_substring_regex(texts, TRIGGERS, memory_pool=pool)
    return pc.indices_nonzero(flags, memory_pool=pool).to_pylist()


def _carries(lowered: str, end: int) -> bool:
    """Whether the text ending at `end` ends with a password word a value may follow in the
    next text."""
    last = end
    while last > 0 and lowered[last - 1].isspace():
        last -= 1
    return _CARRY_OVER.search(lowered, max(0, last - _CARRY_REACH), last) is not None
