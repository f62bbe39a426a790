"""A labelled sample of support-ticket texts for measuring personal-data and credential detectors.

Three kinds of case, all made from one seed, so the same seed and the same demo corpus give the
same texts and labels:

- `ticket`: support tickets put together by the demo generator (llm_assets/demo/data.py) from
  its corpus. About one in five gets one or two sentences with a value inserted (an e-mail
  address, a phone number, a card, an IBAN, a US SSN, an IP address or a credential) in the
  formats customers really write them; the rest are clean, as most real tickets are. Their
  own order numbers, amounts, versions, tracking and invoice numbers, dates and
  "Visa ending in 1234" are what a detector must leave alone. The e-mail addresses some
  templates mention are labelled too.
- `hard`: one value per text in an awkward format: phones national and international,
  cards with spaces, dashes or none (Amex and Diners groupings too), IBANs of several
  countries printed and compact, SSNs with and without separators, IPv4 and IPv6 in URLs and
  with ports, vendor keys (AWS, OpenAI `sk-proj-`, Anthropic `sk-ant-`, GitHub, Slack,
  Stripe, Google), JWT bearer tokens, PEM private keys, credential URIs and passwords.
- `negative`: texts with values that look like the above and are not: order, ticket,
  invoice and tracking numbers, dates, times, version strings, prices, percentages,
  serial numbers, card-like numbers that fail the Luhn check, SSN-like numbers no SSN can
  be, UUIDs and commit hashes. Nothing in them may be flagged.

Every label is (entity type, exact value, its span in the text); the types are the seven of
`llm_assets.compliance.spec.ENTITIES`. A credential URI is labelled whole, a password only
its value, a PEM key from its BEGIN line to its END line.

`python bench/pii_sample.py` prints the sample's counts and a few cases of each kind.
"""

import base64
import datetime as dt
import json
import random
import re
import string
import sys
import unicodedata
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llm_assets.compliance.spec import ENTITIES  # noqa: E402
from llm_assets.demo.corpus import CATEGORIES, TONES, Slots, corpus
from llm_assets.demo.data import _add_typos, _body_sentences

SEED = 20261203
TICKETS = 3000
HARD_PER_FORMAT = 6
NEGATIVES_PER_FORMAT = 8
WITH_VALUES_SHARE = 0.2
START_DAY = dt.date(2026, 11, 2)


class Label(NamedTuple):
    entity: str
    start: int
    end: int
    value: str


class Case(NamedTuple):
    case_id: str
    kind: str  # ticket | hard | negative
    text: str
    labels: tuple[Label, ...]


class Value(NamedTuple):
    """A value to insert: its type, and the text that is the value."""

    entity: str
    text: str


Part = str | Value
_SLOT = re.compile(r"\{(\w+)\}")


def compose(template: str, **values: Part) -> tuple[str, tuple[Label, ...]]:
    """Fill `{name}` slots; a `Value` becomes a label at the place it lands."""
    out: list[str] = []
    labels: list[Label] = []
    pos = 0
    pieces = _SLOT.split(template)
    for i, piece in enumerate(pieces):
        if i % 2 == 0:
            out.append(piece)
            pos += len(piece)
            continue
        value = values[piece]
        text = value.text if isinstance(value, Value) else value
        if isinstance(value, Value):
            labels.append(Label(value.entity, pos, pos + len(text), text))
        out.append(text)
        pos += len(text)
    return "".join(out), tuple(labels)


# --- values -------------------------------------------------------------------------------

_DIGITS = string.digits
_ALNUM = string.ascii_letters + string.digits
_B64URL = _ALNUM + "-_"
_B64 = _ALNUM + "+/"
_DOMAINS = (
    "gmail.com",
    "outlook.com",
    "yahoo.co.uk",
    "proton.me",
    "web.de",
    "orange.fr",
    "icloud.com",
    "hotmail.com",
    "acme-industries.io",
    "mail.example.org",
    "uni-hamburg.de",
    "northwind.co",
)


def _d(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_DIGITS) for _ in range(n))


def _chars(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _ascii(name: str) -> str:
    return unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().replace("'", "")


def email(rng: random.Random, first: str | None = None, last: str | None = None) -> str:
    words = corpus()
    first = _ascii(first or rng.choice(words.first_names))
    last = _ascii(last or rng.choice(words.last_names))
    domain = rng.choice(_DOMAINS)
    user = rng.choice(
        (
            f"{first}.{last}".lower(),
            f"{first[0]}{last}".lower(),
            f"{first}_{last}{rng.randint(1, 99)}".lower(),
            f"{first}.{last}+{rng.choice(('billing', 'lumo', 'orders'))}".lower(),
            f"{first}.{last}",
            f"{last}.{first[0]}".lower(),
            f"{first}{rng.randint(1970, 2005)}".lower(),
        )
    )
    return f"{user}@{domain}"


def _us_number(rng: random.Random) -> tuple[str, str, str]:
    area = rng.choice(("212", "312", "415", "503", "512", "617", "646", "702", "206", "303"))
    exchange = f"{rng.randint(2, 9)}{rng.randint(0, 9)}{rng.randint(1, 9)}"
    if exchange[1:] == "11":
        exchange = exchange[0] + "24"
    return area, exchange, _d(rng, 4)


def phone(rng: random.Random, style: str | None = None) -> str:
    style = style or rng.choice(_PHONE_STYLES)
    if style.startswith("us"):
        a, e, s = _us_number(rng)
        return {
            "us_paren": f"({a}) {e}-{s}",
            "us_dash": f"{a}-{e}-{s}",
            "us_dot": f"{a}.{e}.{s}",
            "us_space": f"{a} {e} {s}",
            "us_intl": f"+1 {a} {e} {s}",
            "us_intl_dash": f"+1-{a}-{e}-{s}",
            "us_e164": f"+1{a}{e}{s}",
            "us_1paren": f"1 ({a}) {e}-{s}",
        }[style]
    if style == "uk_london":
        return f"020 7{_d(rng, 3)} {_d(rng, 4)}"
    if style == "uk_london_intl":
        return f"+44 20 7{_d(rng, 3)} {_d(rng, 4)}"
    if style == "uk_mobile":
        return f"07{rng.choice('45789')}{_d(rng, 2)} {_d(rng, 6)}"
    if style == "uk_mobile_intl":
        return f"+44 7{rng.choice('45789')}{_d(rng, 2)} {_d(rng, 6)}"
    if style == "de_berlin":
        return f"030 {rng.randint(2, 9)}{_d(rng, 7)}"
    if style == "de_mobile_intl":
        return f"+49 151 {rng.randint(1, 9)}{_d(rng, 7)}"
    if style == "de_mobile":
        return f"0151 {rng.randint(1, 9)}{_d(rng, 7)}"
    if style == "fr_mobile":
        return f"06 {_d(rng, 2)} {_d(rng, 2)} {_d(rng, 2)} {_d(rng, 2)}"
    if style == "fr_intl":
        return f"+33 6 {_d(rng, 2)} {_d(rng, 2)} {_d(rng, 2)} {_d(rng, 2)}"
    if style == "fr_dots":
        return f"01.{_d(rng, 2)}.{_d(rng, 2)}.{_d(rng, 2)}.{_d(rng, 2)}"
    if style == "in_mobile":
        return f"+91 9{_d(rng, 4)} {_d(rng, 5)}"
    if style == "jp_tokyo":
        return f"03-{rng.randint(3, 6)}{_d(rng, 3)}-{_d(rng, 4)}"
    if style == "br_mobile":
        return f"+55 11 9{rng.randint(6, 9)}{_d(rng, 3)}-{_d(rng, 4)}"
    if style == "au_mobile":
        return f"04{rng.choice('0123')}{_d(rng, 1)} {_d(rng, 3)} {_d(rng, 3)}"
    if style == "au_intl":
        return f"+61 4{rng.choice('0123')}{_d(rng, 1)} {_d(rng, 3)} {_d(rng, 3)}"
    raise ValueError(style)


_PHONE_STYLES = (
    "us_paren",
    "us_dash",
    "us_dot",
    "us_space",
    "us_intl",
    "us_intl_dash",
    "us_e164",
    "us_1paren",
    "uk_london",
    "uk_london_intl",
    "uk_mobile",
    "uk_mobile_intl",
    "de_berlin",
    "de_mobile",
    "de_mobile_intl",
    "fr_mobile",
    "fr_intl",
    "fr_dots",
    "in_mobile",
    "jp_tokyo",
    "br_mobile",
    "au_mobile",
    "au_intl",
)


def luhn_digit(partial: str) -> str:
    total = 0
    for i, ch in enumerate(reversed(partial)):
        n = int(ch)
        if i % 2 == 0:
            n *= 2
            if n > 9:
                n -= 9
        total += n
    return str((10 - total % 10) % 10)


def luhn_ok(number: str) -> bool:
    digits = re.sub(r"\D", "", number)
    return luhn_digit(digits[:-1]) == digits[-1]


_CARD_BRANDS: dict[str, tuple[tuple[str, ...], int, tuple[int, ...]]] = {
    # brand: (prefixes, length, grouping)
    "visa": (("4",), 16, (4, 4, 4, 4)),
    "mastercard": (("51", "52", "53", "54", "55", "2221", "2720"), 16, (4, 4, 4, 4)),
    "amex": (("34", "37"), 15, (4, 6, 5)),
    "discover": (("6011", "65"), 16, (4, 4, 4, 4)),
    "jcb": (("3528", "3589"), 16, (4, 4, 4, 4)),
    "diners": (("36",), 14, (4, 6, 4)),
}


def card_digits(rng: random.Random, brand: str) -> str:
    prefixes, length, _ = _CARD_BRANDS[brand]
    partial = rng.choice(prefixes)
    partial += _d(rng, length - 1 - len(partial))
    return partial + luhn_digit(partial)


def group(digits: str, sizes: tuple[int, ...], sep: str) -> str:
    out, i = [], 0
    for size in sizes:
        out.append(digits[i : i + size])
        i += size
    return sep.join(out)


def card(rng: random.Random, brand: str | None = None, sep: str | None = None) -> str:
    brand = brand or rng.choice(("visa", "visa", "mastercard", "mastercard", "amex", "discover"))
    sep = rng.choice((" ", " ", "-", "")) if sep is None else sep
    return group(card_digits(rng, brand), _CARD_BRANDS[brand][2], sep)


_IBAN_BBAN: dict[str, Callable[[random.Random], str]] = {
    "DE": lambda r: _d(r, 18),
    "GB": lambda r: r.choice(("NWBK", "BARC", "LOYD", "HBUK")) + _d(r, 14),
    "FR": lambda r: _d(r, 10) + _d(r, 11) + _d(r, 2),
    "NL": lambda r: r.choice(("ABNA", "INGB", "RABO")) + _d(r, 10),
    "IT": lambda r: r.choice(string.ascii_uppercase) + _d(r, 10) + _d(r, 12),
    "CH": lambda r: _d(r, 17),
    "AT": lambda r: _d(r, 16),
    "PL": lambda r: _d(r, 24),
}


def iban_compact(rng: random.Random, country: str | None = None) -> str:
    country = country or rng.choice(tuple(_IBAN_BBAN))
    bban = _IBAN_BBAN[country](rng)
    numeric = "".join(str(int(c, 36)) for c in bban + country + "00")
    check = 98 - int(numeric) % 97
    return f"{country}{check:02d}{bban}"


def iban(rng: random.Random, country: str | None = None, spaced: bool | None = None) -> str:
    compact = iban_compact(rng, country)
    spaced = rng.random() < 0.6 if spaced is None else spaced
    return " ".join(compact[i : i + 4] for i in range(0, len(compact), 4)) if spaced else compact


def ssn_parts(rng: random.Random) -> tuple[str, str, str]:
    area = rng.randint(1, 899)
    if area == 666:
        area = 667
    return f"{area:03d}", f"{rng.randint(1, 99):02d}", f"{rng.randint(1, 9999):04d}"


def ssn(rng: random.Random, sep: str | None = None) -> str:
    sep = rng.choice(("-", "-", "-", " ")) if sep is None else sep
    return sep.join(ssn_parts(rng))


def ipv4(rng: random.Random, private: bool | None = None) -> str:
    private = rng.random() < 0.4 if private is None else private
    if private:
        return rng.choice(
            (
                f"192.168.{rng.randint(0, 10)}.{rng.randint(2, 254)}",
                f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(2, 254)}",
            )
        )
    first = rng.choice((24, 31, 46, 73, 81, 88, 94, 109, 151, 176, 185, 203, 212))
    return f"{first}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"


def ipv6(rng: random.Random, style: str | None = None) -> str:
    groups = [f"{rng.randint(0, 0xFFFF):x}" for _ in range(8)]
    style = style or rng.choice(("full", "compressed", "link_local"))
    if style == "full":
        return "2001:0db8:" + ":".join(f"{int(g, 16):04x}" for g in groups[2:])
    if style == "compressed":
        return f"2a02:{groups[1]}:{groups[2]}::{groups[6]}:{groups[7]}"
    return f"fe80::{groups[4]}:{groups[5]}:{groups[6]}:{groups[7]}"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(rng: random.Random) -> str:
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    claims = {"sub": _d(rng, 10), "name": rng.choice(corpus().first_names), "iat": 1764000000}
    claims["iat"] += rng.randint(0, 10**6)
    payload = _b64url(json.dumps(claims, separators=(",", ":")).encode())
    return f"{header}.{payload}.{_chars(rng, _B64URL, 43)}"


def pem(rng: random.Random, kind: str | None = None, lines: int | None = None) -> str:
    kind = kind or rng.choice(("RSA ", "OPENSSH ", "EC ", ""))
    lines = lines or rng.randint(2, 5)
    body = "\n".join(_chars(rng, _B64, 64) for _ in range(lines))
    return f"-----BEGIN {kind}PRIVATE KEY-----\n{body}\n-----END {kind}PRIVATE KEY-----"


_B32 = string.ascii_uppercase + "234567"

CREDENTIALS: dict[str, Callable[[random.Random], str]] = {
    "aws_access_key": lambda r: "AKIA" + _chars(r, _B32, 16),
    "aws_secret_key": lambda r: _chars(r, _B64, 40),
    "openai_project": lambda r: "sk-proj-" + _chars(r, _B64URL, 156),
    "openai_legacy": lambda r: "sk-" + _chars(r, _ALNUM, 20) + "T3BlbkFJ" + _chars(r, _ALNUM, 20),
    "anthropic": lambda r: "sk-ant-api03-" + _chars(r, _B64URL, 93) + "AA",
    "github_classic": lambda r: "ghp_" + _chars(r, _ALNUM, 36),
    "github_fine": lambda r: "github_pat_" + _chars(r, _ALNUM, 22) + "_" + _chars(r, _ALNUM, 59),
    "slack_bot": lambda r: f"xoxb-{_d(r, 12)}-{_d(r, 13)}-{_chars(r, _ALNUM, 24)}",
    "slack_user": lambda r: (
        f"xoxp-{_d(r, 12)}-{_d(r, 12)}-{_d(r, 13)}-{_chars(r, 'abcdef0123456789', 32)}"
    ),
    "slack_webhook": lambda r: (
        "https://hooks.slack.com/services/T"
        + _chars(r, _B32, 8)
        + "/B"
        + _chars(r, _B32, 10)
        + "/"
        + _chars(r, _ALNUM, 24)
    ),
    "stripe": lambda r: "sk_live_" + _chars(r, _ALNUM, 24),
    "google": lambda r: "AIza" + _chars(r, _B64URL, 35),
    "jwt": jwt,
    "pem": pem,
    "credential_uri": lambda r: r.choice(
        (
            f"postgresql://app_user:{_chars(r, _ALNUM, 14)}@db.internal.example:5432/lumo",
            f"mysql://root:{_chars(r, _ALNUM, 10)}@mysql.acme-industries.io/orders",
            f"mongodb+srv://admin:{_chars(r, _ALNUM, 12)}@cluster0.ab1cd.mongodb.net/prod",
            f"redis://:{_chars(r, _ALNUM, 16)}@cache.example.net:6379/0",
            f"amqp://lumo:{_chars(r, _ALNUM, 12)}@rabbit.example.org:5672/",
        )
    ),
    "password": lambda r: (
        r.choice(("Tr0ub4dor&3", "hunter2!", "S3cure-Pass", "Lumo2026!", "qwerty123")) + _d(r, 2)
    ),
}

# How a credential of each kind is written in a ticket; `{v}` is the labelled value.
_CREDENTIAL_CONTEXT: dict[str, tuple[str, ...]] = {
    "aws_access_key": (
        "The S3 export uses access key {v} and it says AccessDenied.",
        "AWS_ACCESS_KEY_ID={v}",
    ),
    "aws_secret_key": ("aws_secret_access_key = {v}", 'export AWS_SECRET_ACCESS_KEY="{v}"'),
    "openai_project": (
        "I pasted my OpenAI key {v} into the integration settings.",
        "OPENAI_API_KEY={v}",
    ),
    "openai_legacy": ("our old key was {v}, is it still valid?", "openai.api_key = '{v}'"),
    "anthropic": (
        'curl -H "x-api-key: {v}" https://api.anthropic.com/v1/messages',
        "The Claude integration has key {v} configured.",
    ),
    "github_classic": (
        "The GitHub sync uses the token {v}.",
        "git clone https://{v}@github.com/acme/lumo-scripts.git",
    ),
    "github_fine": ("GITHUB_TOKEN={v}", "I created a fine-grained token {v} for the action."),
    "slack_bot": ("Slack bot token: {v}", "SLACK_BOT_TOKEN={v}"),
    "slack_user": ("the user token is {v}",),
    "slack_webhook": ("Alerts go to the webhook {v} but nothing arrives in the channel.",),
    "stripe": ("STRIPE_SECRET_KEY={v}", "Our shop plugin is set up with {v}."),
    "google": ("GOOGLE_API_KEY={v}", "The maps widget uses key {v}."),
    "jwt": (
        "The webhook call sends 'Authorization: Bearer {v}' and still gets a 401.",
        "Authorization: Bearer {v}",
    ),
    "pem": ("Here is the key the camera exported:\n{v}\nIs that the right format?",),
    "credential_uri": ("DATABASE_URL={v}", "The report job connects to {v} and times out."),
    "password": (
        "My password is {v} if you need to log in and check.",
        "login: admin / password: {v}",
    ),
}


def credential(rng: random.Random, kind: str | None = None) -> tuple[str, str]:
    """A sentence with one credential, and the credential."""
    kind = kind or rng.choice(tuple(CREDENTIALS))
    value = CREDENTIALS[kind](rng)
    return rng.choice(_CREDENTIAL_CONTEXT[kind]), value


# --- tickets ------------------------------------------------------------------------------

_INSERTS: dict[str, tuple[str, ...]] = {
    "email": (
        "You can also reach me at {v}.",
        "Please send the invoice to {v} instead.",
        "My old login was {v}, in case that helps.",
        "(cc {v})",
        "Contact: {v}",
    ),
    "phone": (
        "You can call me on {v} after 5pm.",
        "My number is {v}.",
        "Best to text {v} if it's urgent.",
        "Phone: {v}",
        "Call me back at {v} please.",
        "I'm on {v} all day.",
    ),
    "card": (
        "The card I used is {v}, expiry 08/27.",
        "It was charged to card number {v}.",
        "card: {v}",
        "I tried {v} twice and it was declined both times.",
    ),
    "iban": (
        "Please send the refund to my IBAN {v}.",
        "Bank details for the refund: {v}.",
        "Refund to {v} please, not to the card.",
    ),
    "national_id": (
        "The tax form asked for my SSN, it's {v}.",
        "SSN: {v}",
        "My social security number {v} is on the account already.",
    ),
    "ip_address": (
        "My router gives the camera the address {v}.",
        "The hub shows IP {v} in the app.",
        "Our office's public IP is {v}, if you need to allow it.",
        "It only fails when I connect from {v}.",
    ),
}
_INSERT_WEIGHTS: dict[str, float] = {
    "email": 0.2,
    "phone": 0.25,
    "card": 0.1,
    "iban": 0.1,
    "national_id": 0.08,
    "ip_address": 0.12,
    "credential": 0.15,
}
_CATEGORY_WEIGHTS = (0.22, 0.26, 0.18, 0.20, 0.14)


def _inserted(rng: random.Random, entity: str, first: str, last: str) -> tuple[str, str]:
    """(sentence template with `{v}`, value) for one inserted value of `entity`."""
    if entity == "credential":
        return credential(rng)
    value = {
        "email": lambda: email(rng, first, last),
        "phone": lambda: phone(rng),
        "card": lambda: card(rng),
        "iban": lambda: iban(rng),
        "national_id": lambda: ssn(rng),
        "ip_address": lambda: ipv4(rng) if rng.random() < 0.8 else ipv6(rng),
    }[entity]()
    return rng.choice(_INSERTS[entity]), value


def tickets(rng: random.Random, count: int) -> list[Case]:
    words = corpus()
    cases: list[Case] = []
    for i in range(count):
        category = rng.choices(CATEGORIES, weights=_CATEGORY_WEIGHTS)[0]
        tone = rng.choice(TONES)
        channel = rng.choice(("email", "chat", "web", "phone"))
        first, last = rng.choice(words.first_names), rng.choice(words.last_names)
        day = START_DAY + dt.timedelta(days=i % 28)
        slots = Slots(rng, day, first, last)
        sentences, _ = _body_sentences(category, tone, channel, slots, rng)
        if rng.random() < 0.15:
            at = rng.randrange(len(sentences))
            sentences[at] = _add_typos(sentences[at], rng)
        pieces: list[tuple[str, dict[str, Part]] | str] = list(sentences)
        if rng.random() < WITH_VALUES_SHARE:
            kinds = rng.choices(
                tuple(_INSERT_WEIGHTS),
                weights=tuple(_INSERT_WEIGHTS.values()),
                k=rng.choice((1, 1, 2)),
            )
            for entity in kinds:
                template, value = _inserted(rng, entity, first, last)
                at = rng.randint(1, len(pieces))
                pieces.insert(at, (template, {"v": Value(entity, value)}))
        if rng.random() < 0.5:
            pieces.append(f"\n\n{first}")
        text, labels = _join(pieces)
        if "email" in slots:
            address = slots["email"]
            labels += tuple(
                Label("email", m.start(), m.end(), address)
                for m in re.finditer(re.escape(address), text)
            )
        cases.append(Case(f"ticket-{i:05d}", "ticket", text, tuple(sorted(labels))))
    return cases


def _join(pieces: list[tuple[str, dict[str, Part]] | str]) -> tuple[str, tuple[Label, ...]]:
    """Sentences joined by spaces; a plain string is literal text, a pair is filled."""
    text = ""
    labels: list[Label] = []
    after_line = False
    for piece in pieces:
        part, part_labels = (
            compose(*piece[:1], **piece[1]) if isinstance(piece, tuple) else (piece, ())
        )
        line = not part.endswith((".", "!", "?", ")"))
        breaks = line or after_line  # a key=value line or a bare label stands on its own line
        sep = "" if not text or part.startswith("\n") else "\n" if breaks else " "
        after_line = line
        offset = len(text) + len(sep)
        labels += [
            Label(lb.entity, lb.start + offset, lb.end + offset, lb.value) for lb in part_labels
        ]
        text += sep + part
    return text, tuple(labels)


# --- hard positives -----------------------------------------------------------------------


_SEP_NAMES = {" ": "spaces", "-": "dashes", "": "none"}


def _hard_formats() -> list[tuple[str, str, Callable[[random.Random], str]]]:
    """(format name, sentence template with `{v}`, value maker)."""
    formats: list[tuple[str, str, Callable[[random.Random], str]]] = []
    frames = (
        "Please call me on {v}.",
        "Phone: {v}",
        "{v} (mobile, WhatsApp too)",
        "reach me at {v} — evenings are best",
    )
    for n, style in enumerate(_PHONE_STYLES):
        formats.append((f"phone/{style}", frames[n % len(frames)], lambda r, s=style: phone(r, s)))
    formats.append(("phone/us_ext", "Office: {v} ext. 204", lambda r: phone(r, "us_paren")))
    card_frames = ("Card number: {v}", "I paid with {v} on the 3rd.", "cc={v}", "{v}")
    for n, (brand, sep) in enumerate(
        (b, s)
        for b in ("visa", "mastercard", "amex", "discover", "jcb", "diners")
        for s in (" ", "-", "")
    ):
        formats.append(
            (
                f"card/{brand}/{_SEP_NAMES[sep]}",
                card_frames[n % len(card_frames)],
                lambda r, b=brand, s=sep: card(r, b, s),
            )
        )
    iban_frames = (
        "IBAN: {v}",
        "Please wire the refund to {v}.",
        "Konto {v} (Girokonto)",
        "iban={v}",
    )
    for n, (country, spaced) in enumerate((c, s) for c in _IBAN_BBAN for s in (True, False)):
        formats.append(
            (
                f"iban/{country}/{'spaced' if spaced else 'compact'}",
                iban_frames[n % len(iban_frames)],
                lambda r, c=country, s=spaced: iban(r, c, s),
            )
        )
    formats += [
        ("ssn/dashes", "SSN: {v}", lambda r: ssn(r, "-")),
        ("ssn/spaces", "social security no. {v}", lambda r: ssn(r, " ")),
        ("ssn/none", "My SSN is {v}.", lambda r: ssn(r, "")),
        ("ssn/form", "SSN#: {v} DOB: 04/12/1986", lambda r: ssn(r, "-")),
        ("ip/v4_public", "Blocked login attempts from {v} last night.", lambda r: ipv4(r, False)),
        ("ip/v4_private", "The camera's address is {v} on my LAN.", lambda r: ipv4(r, True)),
        ("ip/v4_port", "the hub listens on {v}:8443", lambda r: ipv4(r)),
        (
            "ip/v4_url",
            "I open http://{v}/setup in the browser and get a timeout.",
            lambda r: ipv4(r, True),
        ),
        ("ip/v6_full", "client ip={v}", lambda r: ipv6(r, "full")),
        (
            "ip/v6_compressed",
            "Requests come from {v} according to my router.",
            lambda r: ipv6(r, "compressed"),
        ),
        (
            "ip/v6_link_local",
            "The hub reports {v} as its address.",
            lambda r: ipv6(r, "link_local"),
        ),
        (
            "ip/v6_bracket_port",
            "curl https://[{v}]:443/health hangs",
            lambda r: ipv6(r, "compressed"),
        ),
        ("email/plus", "Reply to {v} please.", lambda r: email(r)),
        ("email/angle", "From: Jane Doe <{v}>", lambda r: email(r)),
        ("email/json", '{{"customer_email": "{v}", "plan": "Pro"}}', lambda r: email(r)),
        ("email/start", "{v} is the account owner.", lambda r: email(r)),
    ]
    for kind in CREDENTIALS:
        for n, template in enumerate(_CREDENTIAL_CONTEXT[kind]):
            formats.append((f"credential/{kind}/{n}", template, CREDENTIALS[kind]))
    return formats


def hard_cases(rng: random.Random, per_format: int) -> list[Case]:
    cases: list[Case] = []
    for name, template, make in _hard_formats():
        entity = {"ip": "ip_address", "ssn": "national_id"}.get(
            name.split("/")[0], name.split("/")[0]
        )
        template = template.replace("{{", "\x00").replace("}}", "\x01")
        for n in range(per_format):
            text, labels = compose(template, v=Value(entity, make(rng)))
            text = text.replace("\x00", "{").replace("\x01", "}")
            cases.append(Case(f"hard-{name}-{n}", "hard", text, labels))
    return cases


# --- negatives ----------------------------------------------------------------------------


def _luhn_failing(r: random.Random, brand: str, sep: str) -> str:
    digits = card_digits(r, brand)
    bad = str((int(digits[-1]) + r.randint(1, 9)) % 10)
    return group(digits[:-1] + bad, _CARD_BRANDS[brand][2], sep)


def _bad_ssn(r: random.Random) -> str:
    area, grp, serial = ssn_parts(r)
    return r.choice(
        (
            f"000-{grp}-{serial}",
            f"666-{grp}-{serial}",
            f"9{_d(r, 2)}-{grp}-{serial}",
            f"{area}-00-{serial}",
            f"{area}-{grp}-0000",
        )
    )


NEGATIVES: tuple[tuple[str, str, Callable[[random.Random], str]], ...] = (
    ("order_lm", "Order {v} still hasn't shipped.", lambda r: f"LM-{r.randint(100000, 999999)}"),
    (
        "order_long",
        "My order #{v} was split into two parcels.",
        lambda r: f"{r.randint(1, 9)}{_d(r, 9)}",
    ),
    ("order_dashed", "order no. {v}", lambda r: f"{_d(r, 3)}-{_d(r, 7)}-{_d(r, 7)}"),
    (
        "ticket_id",
        "This is a follow-up to ticket {v}.",
        lambda r: f"TCK-{20261101 + r.randint(0, 29)}-{_d(r, 4)}",
    ),
    ("ticket_hash", "Re: case #{v}", lambda r: _d(r, 6)),
    ("invoice", "Invoice {v} lists the wrong address.", lambda r: f"INV-2026-{_d(r, 6)}"),
    ("invoice_digits", "Invoice number {v} was paid on time.", lambda r: _d(r, 8)),
    (
        "date_iso",
        "It started on {v} and hasn't stopped.",
        lambda r: f"2026-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
    ),
    (
        "date_slash",
        "Delivery was promised for {v}.",
        lambda r: f"{r.randint(1, 28):02d}/{r.randint(1, 12):02d}/2026",
    ),
    ("date_us", "charged on {v}", lambda r: f"{r.randint(1, 12)}/{r.randint(1, 28)}/2026"),
    (
        "timestamp",
        "The log says {v} ERROR stream timeout.",
        lambda r: (
            f"2026-11-{r.randint(10, 28)}T{r.randint(0, 23):02d}:"
            f"{r.randint(0, 59):02d}:{r.randint(0, 59):02d}Z"
        ),
    ),
    (
        "time",
        "The camera goes offline at {v} every night.",
        lambda r: f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}",
    ),
    (
        "time_range",
        "Please call between {v}.",
        lambda r: f"{r.randint(8, 11)}:00-{r.randint(13, 18)}:30",
    ),
    (
        "version",
        "Since updating to {v} the app crashes.",
        lambda r: f"{r.randint(1, 9)}.{r.randint(0, 20)}.{r.randint(0, 99)}",
    ),
    (
        "version_v",
        "firmware v{v} is installed",
        lambda r: f"{r.randint(2, 3)}.{r.randint(0, 9)}.{r.randint(10, 99)}",
    ),
    (
        "build",
        "Windows build {v}",
        lambda r: f"10.0.{r.randint(19041, 26100)}.{r.randint(1000, 4999)}",
    ),
    (
        "tracking_ups",
        "UPS tracking {v} shows no movement.",
        lambda r: f"1Z{_chars(r, string.ascii_uppercase + _DIGITS, 6)}{_d(r, 10)}",
    ),
    (
        "tracking_usps",
        "USPS says {v} was delivered.",
        lambda r: f"9400 {_d(r, 4)} {_d(r, 4)} {_d(r, 4)} {_d(r, 4)} {_d(r, 2)}",
    ),
    ("tracking_fedex", "FedEx tracking number {v}", lambda r: f"{_d(r, 4)} {_d(r, 4)} {_d(r, 4)}"),
    ("tracking_dhl", "DHL: {v}", lambda r: f"JD{_d(r, 18)}"),
    (
        "price",
        "I was charged {v} instead of $99.",
        lambda r: f"${r.randint(1, 9)},{_d(r, 3)}.{r.choice(('00', '49', '99'))}",
    ),
    (
        "price_eur",
        "Der Preis war {v} statt 89,00 €.",
        lambda r: f"{r.randint(100, 999)},{r.choice(('00', '50', '95'))} €",
    ),
    ("percent", "Battery drops {v} an hour.", lambda r: f"{r.randint(1, 40)}.{r.randint(0, 9)}%"),
    ("card_ending", "The charge was on my Visa ending in {v}.", lambda r: _d(r, 4)),
    ("card_masked", "Card: {v}", lambda r: f"**** **** **** {_d(r, 4)}"),
    (
        "luhn_fail_visa",
        "There is a charge from card {v} that is not mine.",
        lambda r: _luhn_failing(r, "visa", " "),
    ),
    ("luhn_fail_mc", "reference {v}", lambda r: _luhn_failing(r, "mastercard", "-")),
    ("luhn_fail_plain", "account ref {v}", lambda r: _luhn_failing(r, "visa", "")),
    ("luhn_fail_amex", "Booking {v}", lambda r: _luhn_failing(r, "amex", " ")),
    ("ssn_invalid", "Member id {v}", _bad_ssn),
    ("serial", "Serial number: {v}", lambda r: f"LH{_d(r, 2)}-{_d(r, 4)}-{_d(r, 4)}"),
    ("serial_digits", "S/N {v}", lambda r: _d(r, 12)),
    (
        "model",
        "Model {v}, bought in 2024.",
        lambda r: f"LC-{r.randint(2019, 2026)}-{r.choice('XSPR')}{r.randint(1, 9)}",
    ),
    ("error_code", "Error {v} again.", lambda r: f"0x{_chars(r, '0123456789ABCDEF', 8)}"),
    (
        "uuid",
        "Request id {v}",
        lambda r: "-".join(_chars(r, "0123456789abcdef", n) for n in (8, 4, 4, 4, 12)),
    ),
    ("commit", "Crash in build {v}", lambda r: _chars(r, "0123456789abcdef", 40)),
    (
        "resolution",
        "The stream is {v} at 30 fps.",
        lambda r: r.choice(("1920x1080", "2560x1440", "1280x720")),
    ),
    ("zip", "I moved to {v} last month.", lambda r: f"Springfield, IL {r.randint(62701, 62799)}"),
    (
        "quantity_phone_like",
        "We have {v} devices across 12 sites.",
        lambda r: f"{r.randint(1, 9)},{_d(r, 3)}",
    ),
    (
        "mac",
        "Device MAC {v}",
        lambda r: ":".join(_chars(r, "0123456789ABCDEF", 2) for _ in range(6)),
    ),
    (
        "placeholder_key",
        "Set OPENAI_API_KEY={v} in the .env file.",
        lambda r: r.choice(("your-api-key-here", "<YOUR_KEY>", "sk-...", "changeme")),
    ),
    (
        "sort_code",
        "Gift card code {v}",
        lambda r: "-".join(_chars(r, string.ascii_uppercase + _DIGITS, 4) for _ in range(4)),
    ),
)


def negative_cases(rng: random.Random, per_format: int) -> list[Case]:
    cases: list[Case] = []
    for name, template, make in NEGATIVES:
        for n in range(per_format):
            text, _ = compose(template, v=make(rng))
            cases.append(Case(f"negative-{name}-{n}", "negative", text, ()))
    return cases


def build_sample(
    seed: int = SEED,
    ticket_count: int = TICKETS,
    hard_per_format: int = HARD_PER_FORMAT,
    negatives_per_format: int = NEGATIVES_PER_FORMAT,
) -> list[Case]:
    """The whole sample; each part has its own random stream, so resizing one keeps the others."""
    sample = [
        *tickets(random.Random(f"{seed}-tickets"), ticket_count),
        *hard_cases(random.Random(f"{seed}-hard"), hard_per_format),
        *negative_cases(random.Random(f"{seed}-negatives"), negatives_per_format),
    ]
    for case in sample:
        for label in case.labels:
            assert case.text[label.start : label.end] == label.value, case
            assert label.entity in ENTITIES, case
    return sample


def main() -> None:
    sample = build_sample()
    kinds = Counter(c.kind for c in sample)
    labels = Counter(lb.entity for c in sample for lb in c.labels)
    clean = sum(1 for c in sample if c.kind == "ticket" and not c.labels)
    print(f"{len(sample)} texts: {dict(kinds)}; clean tickets {clean}")
    print("labels:", dict(labels))
    rng = random.Random(0)
    for kind in ("ticket", "hard", "negative"):
        for case in rng.sample(
            [c for c in sample if c.kind == kind and (c.labels or kind != "ticket")], 4
        ):
            print(
                f"--- {case.case_id} {[(lb.entity, lb.value) for lb in case.labels]}\n{case.text}"
            )


if __name__ == "__main__":
    main()
