"""The words of the demo's support tickets, and the values that fill their templates.

The text lives in `corpus.yaml`, shipped in the package; the generator (data.py)
decides how a ticket is put together. Keeping the words as data lets the pools grow without
touching code. The model checks on load that every category and every tone has its pools and
that every value is a string, so a gap, or a value YAML read as a number, fails at once and
names the table instead of surfacing as a KeyError halfway through a run.

`Slots` fills the `{placeholders}` of the templates: each value is drawn on first use and then
reused, so one ticket mentions one order, one product and one date throughout.
"""

import datetime as dt
import functools
import random
import unicodedata
from importlib import resources
from typing import Self

import yaml
from pydantic import BaseModel, ConfigDict, StrictStr, model_validator

CORPUS_FILE = "corpus.yaml"
CATEGORIES: tuple[str, ...] = (
    "billing",
    "technical_issue",
    "account_access",
    "shipping",
    "product_feedback",
)
TONES: tuple[str, ...] = ("polite", "neutral", "frustrated")
PERSONAL_KINDS: tuple[str, ...] = ("email", "phone", "iban", "ip_address", "card", "credential")
"""The kinds of personal data tickets carry, named as the compliance detector names them."""

# Strict strings: a value YAML reads as a number or a boolean is refused, not converted.
Pool = tuple[StrictStr, ...]


class Problem(BaseModel):
    """A problem statement and the subjects a customer would plausibly write above it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: StrictStr
    subjects: Pool


class PersonalData(BaseModel):
    """How customers write personal data: value formats and the sentences that carry them.

    E-mail addresses are made from the customer's name, so they have sentences but no format.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    formats: dict[str, Pool]
    sentences: dict[str, Pool]

    @model_validator(mode="after")
    def _every_kind(self) -> Self:
        kinds = set(PERSONAL_KINDS)
        if set(self.formats) != kinds - {"email"} or not all(self.formats.values()):
            raise ValueError(
                f"personal_data.formats needs a non-empty list for each of "
                f"{', '.join(sorted(kinds - {'email'}))}"
            )
        if set(self.sentences) != kinds or not all(self.sentences.values()):
            raise ValueError(
                f"personal_data.sentences needs a non-empty list for each of "
                f"{', '.join(sorted(kinds))}"
            )
        for kind, pool in self.sentences.items():
            for sentence in pool:
                if sentence.count("{value}") != 1:
                    raise ValueError(
                        f"personal_data.sentences.{kind}: {sentence!r} needs {{value}} once"
                    )
        return self


class DemoCorpus(BaseModel):
    """Every table of `corpus.yaml`; pools are tuples so `random` draws from them as is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    first_names: Pool
    last_names: Pool
    email_domains: Pool
    products: Pool
    cameras: Pool
    plans: Pool
    devices: Pool
    browsers: Pool
    carriers: Pool
    cities: Pool
    rooms: Pool
    features: Pool
    integrations: Pool
    error_codes: Pool
    subjects: dict[str, Pool]
    problems: dict[str, tuple[Problem, ...]]
    category_openers: dict[str, Pool]
    tone_openers: dict[str, Pool]
    details: dict[str, Pool]
    tried: dict[str, Pool]
    asides: dict[str, Pool]
    closers: dict[str, Pool]
    feedback_closers: dict[str, Pool]
    misspellings: dict[StrictStr, StrictStr]
    log_levels: Pool
    log_sources: Pool
    log_messages: Pool
    personal_data: PersonalData

    @model_validator(mode="after")
    def _every_category_and_tone(self) -> Self:
        by_category = ("subjects", "problems", "category_openers", "details", "tried", "asides")
        by_tone = ("tone_openers", "closers", "feedback_closers")
        for names, keys in ((by_category, CATEGORIES), (by_tone, TONES)):
            for name in names:
                table = getattr(self, name)
                if set(table) != set(keys) or not all(table.values()):
                    raise ValueError(
                        f"{name} needs a non-empty list for each of {', '.join(keys)}; "
                        f"it has {', '.join(k for k, v in table.items() if v) or 'none'}"
                    )
        if not set(self.cameras) <= set(self.products):
            raise ValueError("every camera must also be in products")
        return self


@functools.cache
def corpus() -> DemoCorpus:
    """The corpus shipped in the package (read once per process)."""
    text = resources.files("llm_assets.demo").joinpath(CORPUS_FILE).read_text(encoding="utf-8")
    return DemoCorpus.model_validate(yaml.safe_load(text))


_MONTHS: tuple[str, ...] = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip
# Slots filled by one draw from the corpus pool of that name.
_POOL_SLOTS: dict[str, str] = {
    "plan": "plans",
    "device": "devices",
    "error_code": "error_codes",
    "browser": "browsers",
    "carrier": "carriers",
    "city": "cities",
    "room": "rooms",
    "feature": "features",
    "integration": "integrations",
}
# Slots filled by a whole number from an inclusive range.
_NUMBER_SLOTS: dict[str, tuple[int, int]] = {
    "n": (2, 5),
    "days_n": (3, 14),
    "m": (2, 15),
    "inv": (10_000_000, 99_999_999),
    "years": (2, 6),
}


class Slots(dict[str, str]):
    """Template values made on first use, so one ticket mentions one order, one product, ..."""

    def __init__(self, rng: random.Random, day: dt.date, first: str, last: str) -> None:
        super().__init__(first=first)
        self._rng = rng
        self._day = day
        self._last = last

    def __missing__(self, key: str) -> str:
        value = self._make(key)
        self[key] = value
        return value

    def _money(self) -> str:
        return f"${self._rng.randint(8, 349)}.{self._rng.choice(('00', '49', '95', '99'))}"

    def _make(self, key: str) -> str:
        r = self._rng
        if key in _POOL_SLOTS:
            return r.choice(getattr(corpus(), _POOL_SLOTS[key]))
        if key in _NUMBER_SLOTS:
            return str(r.randint(*_NUMBER_SLOTS[key]))
        if key in ("product", "camera", "product2"):
            return self._product(key)
        if key in ("date", "order_date"):
            return self._past_date(key)
        if key == "email":
            return self._email()
        if key == "order":
            return f"LM-{r.randint(100000, 999999)}"
        if key == "amount":
            return self._money()
        if key == "amount2":
            while (other := self._money()) == self["amount"]:
                pass
            return other
        if key == "card":
            return f"{r.choice(('Visa', 'Mastercard', 'Amex'))} ending in {r.randint(0, 9999):04d}"
        if key == "app_version":
            return f"{r.randint(4, 5)}.{r.randint(0, 19)}.{r.randint(0, 9)}"
        if key == "fw":
            return f"{r.randint(2, 3)}.{r.randint(0, 9)}.{r.randint(10, 99)}"
        if key == "tracking":
            alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"
            return "".join(r.choice(alphabet) for _ in range(r.choice((12, 14, 18))))
        if key == "year":
            return str(self._day.year - r.randint(1, 7))
        if key == "last4":
            return f"{r.randint(0, 9999):04d}"
        raise KeyError(key)

    def _product(self, key: str) -> str:
        """A camera slot and a product slot name the same device when the ticket has both."""
        r, words = self._rng, corpus()
        if key == "product":
            return self["camera"] if "camera" in self else r.choice(words.products)
        if key == "camera":
            if self.get("product") in words.cameras:
                return self["product"]
            camera = r.choice(words.cameras)
            self.setdefault("product", camera)
            return camera
        return r.choice([p for p in words.products if p != self["product"]])

    def _past_date(self, key: str) -> str:
        """Orders are placed well before anything that happens to them."""
        back = self._rng.randint(1, 10) if key == "date" else self._rng.randint(12, 30)
        past = self._day - dt.timedelta(days=back)
        return f"{_MONTHS[past.month - 1]} {past.day}"

    def _email(self) -> str:
        return email_address(self["first"], self._last, self._rng)


def email_address(first: str, last: str, rng: random.Random) -> str:
    """first.last, sometimes with a number, at one of the corpus's example domains."""
    user = _ascii(f"{first}.{last}").lower().replace("'", "")
    if rng.random() < 0.4:
        user = f"{user}{rng.randint(1, 99)}"
    return f"{user}@{rng.choice(corpus().email_domains)}"


def _ascii(text: str) -> str:
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
