"""The personal-data pre-filter changes no finding: a chunk scanned with it (only the prompts it
picks, each with what stood before it) has exactly the findings of the chunk scanned whole, on
arbitrary text, on values as people write them and on texts built to reach across prompts."""

import importlib.metadata
import re
import unicodedata

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_assets.compliance import prefilter, secrets
from llm_assets.compliance.detect import scan
from llm_assets.compliance.normalize import view
from llm_assets.compliance.policy import screen
from llm_assets.compliance.spec import DEFAULT_PII
from tests.test_compliance import NOT_PERSONAL, SAMPLES
from tests.test_pii_forms import FOUND, NOT_FOUND

VALUES = [value for values in SAMPLES.values() for value in values] + [
    around.format(value) for _, value, around in FOUND
]
PIECES = [
    *VALUES,
    *NOT_FOUND,
    *NOT_PERSONAL,
    "+49 30 1234567",
    "0301234567",
    "536 22 8726",
    "123-45-6789",
    "4111.1111.1111.1111",
    "3530 1113 3330 0000",
    "10.0.0.1",
    "fe80::1",
    "1:2:3:4:5:6:7:8",
    "de89370400440532013000",
    "anna [ at ] example.com",
    "anna\t@example.com",
    "bob at acme dot com",
    "SSN",
    "social security number",
    "ss#",
    "Phone:",
    "order",
    "Rechnung",
    "password",
    "Password is",
    "passwort:",
    "mot de passe",
    "ΚΩΔΙΚΌΣ",
    "şifre",
    "dır",
    "IS",
    "ıs",
    "は",
    "abc123!x",
    "Tr0ub4dor&3",
    "Authorization: Bearer abcdefghijklmn0123",
    '"authorization": "Bearer abc.def"',
    "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----",
    "PuTTY-User-Key-File-3",
    "mysql -u root -pS3cr3tPassw0rd",
    "api_key = 'ab12cd34ef56gh78ij90'",
    "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "xoxb-1-abc",
    "https://user:pa55word@example.com/x",
    "eyJhbGciOiJub25lIn0.e30.",
    "\u0130stanbul",
    "١٢٣٤٥٦٧٨٩٠١",
    "０３０ １２３４５６７",
    "\u00a0",
    "\u200b",
    "\u2028",
    "\n\n\x1f\n\n",
    "1234567",
    "version 4.2.1.3",
]

_pieces = st.sampled_from(PIECES)
_filler = st.text(max_size=40)
_glue = st.sampled_from(["", " ", "\n", ": ", " is ", "\u00a0", "\t", ".", "-", "\n\n"])


@st.composite
def prompts(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.one_of(_pieces, _filler), max_size=6))
    return "".join(part + draw(_glue) for part in parts)


_long = st.builds(lambda text, times: text * times, prompts(), st.integers(1, 40))
_chunks = st.lists(st.one_of(prompts(), prompts(), prompts(), _long, _filler), max_size=10)


def _same(texts: list[str]) -> None:
    assert scan(texts) == scan(texts, prefilter=False)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_chunks)
def test_the_prefilter_changes_no_finding(texts: list[str]) -> None:
    _same(texts)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=200), max_size=8))
def test_the_prefilter_changes_no_finding_on_any_unicode(texts: list[str]) -> None:
    _same(texts)


def test_the_prefilter_changes_no_finding_on_the_values_people_write() -> None:
    _same(PIECES)
    _same([text for piece in PIECES for text in ("ordinary words here", piece)])


def test_a_password_whose_word_ends_the_prompt_before_is_found_in_both_scans() -> None:
    texts = ["nothing here", "the wifi password is", "abc123!x for the guests", "plain"]
    found = scan(texts)
    assert found[2] and found[2][0].entity == "credential"
    assert found == scan(texts, prefilter=False)


def test_words_in_prompts_never_scanned_still_count_for_the_chunk() -> None:
    # An SSN in 3-2-4 groups counts only in a chunk that speaks of SSNs, a bracketed "at"
    # only in one with a needle: the words may be in prompts the pre-filter passes over.
    far = "ordinary words " * 40
    for texts in (
        ["SSN list follows", far, "ids 536 22 8726"],
        ["see the dot", far, "mail anna [ at ] example.com"],
    ):
        assert scan(texts) == scan(texts, prefilter=False)
        assert any(scan(texts))
    # A capital dotted I lower-cases longer, and a chunk with one reads secrets otherwise.
    texts = ["\u0130stanbul", far, "api_key = 'ab12cd34ef56gh78ij90'"]
    assert scan(texts) == scan(texts, prefilter=False)


def test_a_prompt_after_a_long_one_is_scanned_with_what_stood_before_it() -> None:
    before = "filler words " * 40 + "phone:"
    texts = [before, "0301234567", "Bestellung", "0301234567"]
    assert scan(texts) == scan(texts, prefilter=False)


def test_most_ordinary_prompts_are_not_scanned() -> None:
    texts = [
        f"Subject: Refund still not received\n\nHi, order {100_000 + n} is the problem. "
        "The reset email arrives, but the new password is rejected every time. Thank you!"
        for n in range(1000)
    ]
    lowered = "\n\n\x1f\n\n".join(texts).lower()
    starts = [n * (len(texts[0]) + 5) for n in range(len(texts))]
    ends = [start + len(texts[0]) for start in starts]
    assert prefilter.suspects(lowered, starts, ends) == []
    assert all(s.text == t for s, t in zip(screen(texts, DEFAULT_PII), texts, strict=True))


def test_the_prefilter_is_in_use_with_the_installed_datafog_core() -> None:
    assert importlib.metadata.version("datafog-core") in prefilter.VERIFIED_DATAFOG
    assert prefilter.suspects("x", [0], [1]) is not None


def test_re2_takes_every_digit_python_takes() -> None:
    digits = [chr(c) for c in range(0x110000) if re.fullmatch(r"\d", chr(c))]
    other = pc.match_substring_regex(pa.array(digits), prefilter._OTHER_DIGIT)
    assert all(d in "0123456789" or hit for d, hit in zip(digits, other.to_pylist(), strict=True))


def test_a_normalized_view_holds_only_ascii_spaces() -> None:
    spaced = [
        chr(c)
        for c in range(0x110000)
        if not 0xD800 <= c < 0xE000
        and any(s.isspace() for s in unicodedata.normalize("NFKC", chr(c)) + chr(c))
    ]
    for char in spaced:
        shown = view(f"a{char}b").text
        assert all(s in " \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f" for s in shown if s.isspace()), char


def test_only_dotted_capital_i_changes_length_in_lower_case() -> None:
    assert [c for c in range(0x110000) if len(chr(c).lower()) != 1] == [0x130]


def test_a_verb_before_a_password_is_one_to_four_letters_in_any_case() -> None:
    (verbs,) = re.findall(r"\\s\(\?:([^)]*)\)\\s", secrets._PASSWORD_VALUE.pattern)
    assert all(1 <= len(verb) <= 4 for verb in verbs.split("|"))
    either_case = re.compile(f"(?i)[{verbs.replace('|', '')}]")
    for code in range(0x110000):
        if either_case.fullmatch(chr(code)):
            assert not re.fullmatch(r"[\s\d!-/:-@\[-`{-~]", chr(code).lower()), hex(code)
