"""Personal data planted into the demo's tickets, the way customers write it: contact details
in a few, a card number in one per hundred, one pasted API key per run. The values are
fictional (reserved phone ranges, documentation IP ranges, the networks' test cards, IBANs
with check digits computed on made-up accounts), and the planting has a random stream of its
own, so tickets without personal data are the same with or without it."""

import dataclasses
import random
import re
from collections.abc import Sequence
from typing import Any, Protocol

from stdnum import iban

from llm_assets.demo.corpus import CATEGORIES, corpus, email_address

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


class Host(Protocol):
    """A generated ticket personal data may go into."""

    kind: str
    row: dict[str, Any]
    category: str | None


CONTACT_PERCENT = 3
"""Whole percent of a day's tickets that give contact details, in turn over the run: a phone
number, an IBAN for a refund, an IP address, an e-mail address. None on a day of fewer than
34 tickets. With the problem templates that mention the customer's e-mail address, about one
ticket in eight carries contact data."""
BLOCKED_EVERY = 100
"""A day holds one ticket with a card number or a credential per this many tickets: the run's
first such ticket pastes the one API key, the others a card number. So a day blocks under 1%
of its items, far within the default compliance.max_blocked_rate, and none below 100 tickets."""
_CONTACT_TURN: tuple[str, ...] = ("phone", "iban", "ip_address", "email")
_HOST_CATEGORIES: dict[str, tuple[str, ...]] = {
    "iban": ("billing",),
    "card": ("billing",),
    "ip_address": ("technical_issue",),
    "credential": ("technical_issue",),
}
"""Where a kind's sentences make sense (a refund to an IBAN is a billing matter); other kinds
go into tickets of any category."""
_KEY_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_MAX_SENTENCES = 6
_MAX_HOST_BODY = 800


def _personal_value(kind: str, customer: str, rng: random.Random) -> str:
    if kind == "email":
        first, _, last = customer.partition(" ")
        return email_address(first, last, rng)
    value = "".join(
        str(rng.randrange(10)) if c == "#" else rng.choice(_KEY_CHARS) if c == "%" else c
        for c in rng.choice(corpus().personal_data.formats[kind])
    )
    if kind != "iban":
        return value
    country, _, account = value.partition(" ")
    number = country + iban.calc_check_digits(f"{country}00{account}") + account
    return iban.format(number) if rng.random() < 0.7 else number


def _with_sentence(body: str, sentence: str) -> str:
    """`sentence` before the body's last sentence (often a sign-off), or after a body of two."""
    cuts = [m.start() for m in _SENTENCE_END.finditer(body)]
    cut = cuts[-1] if len(cuts) >= 2 else len(body)
    return f"{body[:cut]} {sentence}{body[cut:]}"


@dataclasses.dataclass
class Planting:
    """The run's own random stream for personal data, and how far its turns have got."""

    rng: random.Random
    contacts: int = 0
    key_pasted: bool = False


def plant_personal_data(entries: Sequence[Host], tickets_per_day: int, plan: Planting) -> None:
    """Personal data into a day's good tickets: CONTACT_PERCENT contact details, and one card
    number or the run's API key per BLOCKED_EVERY tickets; one kind per ticket at most."""
    wanted = [
        _CONTACT_TURN[(plan.contacts + i) % len(_CONTACT_TURN)]
        for i in range(tickets_per_day * CONTACT_PERCENT // 100)
    ]
    wanted += ["card"] * (tickets_per_day // BLOCKED_EVERY)
    words = corpus().personal_data
    for kind in wanted:
        if kind == "card" and not plan.key_pasted:
            kind = "credential"
        hosts = [
            e
            for e in entries
            if e.kind == "good"
            and "personal_data" not in e.row
            and e.category in _HOST_CATEGORIES.get(kind, CATEGORIES)
            and len(e.row["body"]) <= _MAX_HOST_BODY
            and len(_SENTENCE_END.split(e.row["body"])) < _MAX_SENTENCES
        ]
        if not hosts:
            continue
        host = plan.rng.choice(hosts)
        value = _personal_value(kind, host.row["customer"], plan.rng)
        sentence = plan.rng.choice(words.sentences[kind]).format(value=value)
        host.row["body"] = _with_sentence(host.row["body"], sentence)
        host.row["personal_data"] = {kind: [value]}
        if kind in _CONTACT_TURN:
            plan.contacts += 1
        elif kind == "credential":
            plan.key_pasted = True
