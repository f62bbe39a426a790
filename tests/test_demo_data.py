import datetime as dt
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from stdnum import iban, luhn

from llm_assets.compliance.detect import scan
from llm_assets.demo import corpus as demo_corpus
from llm_assets.demo.data import (
    BAD_ROW_REASONS,
    BLOCKED_EVERY,
    CATEGORIES,
    CHANNELS,
    CONTACT_PERCENT,
    MISSING_ID,
    GeneratedDemo,
    generate_demo_data,
)

START = dt.date(2026, 11, 1)
DAYS = 3
PER_DAY = 120
TICKET_KEYS = {
    "ticket_id", "created_at", "customer", "channel", "subject", "body", "agent_category"
}  # fmt: skip
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")

# Words a person would key on; a crude stand-in for "a human can tell the category".
KEYWORDS: dict[str, tuple[str, ...]] = {
    "billing": (
        "charge", "bill", "invoice", "refund", "payment", "paid", "price", "discount", "$",
        "subscription", "card", "tax", "trial", "prorated",
    ),
    "technical_issue": (
        "crash", "error", "offline", "firmware", "wi-fi", "reboot", "freez", "pair", "battery",
        "recording", "notification", "automation", "dashboard", "audio", "night vision",
        "splash", "router", "reinstall",
    ),
    "account_access": (
        "log in", "login", "sign in", "sign-in", "signed", "password", "locked", "two-factor",
        "verification", "authenticator", "account", "credentials", "reset",
    ),
    "shipping": (
        "order", "deliver", "package", "parcel", "tracking", "courier", "shipping", "ship",
        "customs", "arrived", "carrier", "sender", "return label",
    ),
    "product_feedback": (
        "love", "would be great", "suggestion", "feature", "wish", "feedback", "design",
        "thanks", "great job", "would be nice", "i'd love", "happy", "colours", "consider",
    ),
}  # fmt: skip


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _bad_kind(row: dict[str, Any]) -> str | None:
    """Which deliberate defect a first-day row carries, if any."""
    if "ticket_id" not in row:
        return "missing_id"
    if "created_at" not in row:
        return "missing_date"
    if not row["body"].strip():
        return "empty_body"
    if len(row["body"]) > 10_000:
        return "oversized_body"
    return None


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> GeneratedDemo:
    return generate_demo_data(tmp_path_factory.mktemp("demo"), START, DAYS, PER_DAY, seed=7)


@pytest.fixture(scope="module")
def truth(demo: GeneratedDemo) -> dict[str, str]:
    rows = _rows(demo.truth_path)
    mapping = {row["ticket_id"]: row["category"] for row in rows}
    assert len(mapping) == len(rows), "truth has repeated ticket ids"
    return mapping


@pytest.fixture(scope="module")
def good(demo: GeneratedDemo, truth: dict[str, str]) -> list[tuple[dt.date, dict[str, Any]]]:
    """Good tickets in file order; the duplicate row is the later of two rows sharing an id."""
    out: list[tuple[dt.date, dict[str, Any]]] = []
    seen: set[str] = set()
    for index, (day, path) in enumerate(zip(demo.days, demo.files, strict=True)):
        for row in _rows(path):
            if index == 0 and _bad_kind(row) is not None:
                continue
            if row["ticket_id"] in seen:
                continue
            seen.add(row["ticket_id"])
            if row["ticket_id"] in truth:
                out.append((day, row))
    return out


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_layout_and_summary(demo: GeneratedDemo, tmp_path: Path) -> None:
    assert demo.days == [START + dt.timedelta(days=i) for i in range(DAYS)]
    assert [p.name for p in demo.files] == [
        "tickets-2026-11-01.jsonl",
        "tickets-2026-11-02.jsonl",
        "tickets-2026-11-03.jsonl",
    ]
    assert all(p.parent == demo.inbox_dir and p.is_file() for p in demo.files)
    assert demo.inbox_dir.name == "inbox"
    assert demo.truth_path == demo.inbox_dir.parent / "truth.jsonl"
    assert sorted(p.name for p in demo.inbox_dir.iterdir()) == [p.name for p in demo.files]
    assert demo.rows_written == sum(len(_rows(p)) for p in demo.files)
    assert demo.rows_written == DAYS * PER_DAY + len(BAD_ROW_REASONS)


def test_same_inputs_give_identical_bytes(tmp_path: Path) -> None:
    first = generate_demo_data(tmp_path / "a", START, days=2, tickets_per_day=40, seed=11)
    second = generate_demo_data(tmp_path / "b", START, days=2, tickets_per_day=40, seed=11)
    a, b = _tree_bytes(tmp_path / "a"), _tree_bytes(tmp_path / "b")
    assert len(a) == 3
    assert a == b
    assert first.bad_rows == second.bad_rows
    assert first.rows_written == second.rows_written


def test_different_seed_gives_different_content(tmp_path: Path) -> None:
    generate_demo_data(tmp_path / "a", START, days=1, tickets_per_day=40, seed=1)
    generate_demo_data(tmp_path / "b", START, days=1, tickets_per_day=40, seed=2)
    name = "inbox/tickets-2026-11-01.jsonl"
    bodies_a = {row["body"] for row in _rows(tmp_path / "a" / name)}
    bodies_b = {row["body"] for row in _rows(tmp_path / "b" / name)}
    assert bodies_a != bodies_b
    assert len(bodies_a & bodies_b) < 10


def test_rerun_overwrites_atomically(tmp_path: Path) -> None:
    generate_demo_data(tmp_path, START, days=1, tickets_per_day=30, seed=3)
    before = _tree_bytes(tmp_path)
    result = generate_demo_data(tmp_path, START, days=1, tickets_per_day=10, seed=4)
    after = _tree_bytes(tmp_path)
    assert set(after) == set(before), "re-run should replace files, not add new ones"
    assert after != before
    assert len(_rows(result.files[0])) == 10 + len(BAD_ROW_REASONS)
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_every_line_is_json_with_known_fields(demo: GeneratedDemo) -> None:
    for path in [*demo.files, demo.truth_path]:
        text = path.read_text(encoding="utf-8")
        assert text.endswith("\n")
        for line in text.splitlines():
            row = json.loads(line)
            assert isinstance(row, dict)
            if path != demo.truth_path:
                assert set(row) <= TICKET_KEYS
                assert TICKET_KEYS - set(row) <= {"ticket_id", "created_at", "agent_category"}
                assert row["channel"] in CHANNELS
                assert row["customer"].strip() and row["subject"].strip()


def test_counts_per_day(demo: GeneratedDemo, truth: dict[str, str]) -> None:
    for index, (day, path) in enumerate(zip(demo.days, demo.files, strict=True)):
        rows = _rows(path)
        expected = PER_DAY + (len(BAD_ROW_REASONS) if index == 0 else 0)
        assert len(rows) == expected
        prefix = f"T-{day:%Y%m%d}-"
        day_truth = [tid for tid in truth if tid.startswith(prefix)]
        assert len(day_truth) == PER_DAY
    assert len(truth) == DAYS * PER_DAY


def test_every_good_ticket_has_truth_in_a_known_category(
    good: list[tuple[dt.date, dict[str, Any]]], truth: dict[str, str]
) -> None:
    assert len(good) == DAYS * PER_DAY
    assert {row["ticket_id"] for _, row in good} == set(truth)
    assert set(truth.values()) == set(CATEGORIES)


def test_each_good_ticket_is_filed_under_its_true_category_and_bad_rows_under_none(
    demo: GeneratedDemo, good: list[tuple[dt.date, dict[str, Any]]], truth: dict[str, str]
) -> None:
    assert all(row["agent_category"] == truth[row["ticket_id"]] for _, row in good)
    filed = [row for path in demo.files for row in _rows(path) if "agent_category" in row]
    assert len(filed) == len(truth) == demo.rows_written - len(BAD_ROW_REASONS)


def test_categories_balanced_each_day(
    good: list[tuple[dt.date, dict[str, Any]]], truth: dict[str, str]
) -> None:
    for day in {d for d, _ in good}:
        counts = Counter(truth[row["ticket_id"]] for d, row in good if d == day)
        assert set(counts) == set(CATEGORIES)
        for category in CATEGORIES:
            share = counts[category] / PER_DAY
            assert 0.10 <= share <= 0.35, (day, category, share)


def test_small_days_still_cover_every_category(tmp_path: Path) -> None:
    result = generate_demo_data(tmp_path, START, days=2, tickets_per_day=5, seed=5)
    categories = Counter(row["category"] for row in _rows(result.truth_path))
    assert categories == dict.fromkeys(CATEGORIES, 2)


def test_good_ids_unique_and_well_formed(demo: GeneratedDemo) -> None:
    ids: list[str] = []
    for day, path in zip(demo.days, demo.files, strict=True):
        for row in _rows(path):
            if "ticket_id" not in row:
                continue
            assert re.fullmatch(rf"T-{day:%Y%m%d}-\d{{4}}", row["ticket_id"])
            ids.append(row["ticket_id"])
    repeated = [tid for tid, n in Counter(ids).items() if n > 1]
    assert repeated == demo.bad_rows["duplicate_id"]


def test_created_at_inside_its_day_and_ordered(demo: GeneratedDemo) -> None:
    for day, path in zip(demo.days, demo.files, strict=True):
        stamps = [row["created_at"] for row in _rows(path) if "created_at" in row]
        assert stamps == sorted(stamps)
        for stamp in stamps:
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamp)
            parsed = dt.datetime.fromisoformat(stamp)
            assert parsed.tzinfo == dt.UTC
            assert parsed.date() == day


def test_bad_rows_exactly_as_described(demo: GeneratedDemo, truth: dict[str, str]) -> None:
    assert list(demo.bad_rows) == list(BAD_ROW_REASONS)
    assert all(len(ids) == 1 for ids in demo.bad_rows.values())
    first = _rows(demo.files[0])
    by_id: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for position, row in enumerate(first):
        by_id.setdefault(row.get("ticket_id", MISSING_ID), []).append((position, row))

    (empty_id,) = demo.bad_rows["empty_body"]
    ((_, empty),) = by_id[empty_id]
    assert empty["body"] == "   "

    (dup_id,) = demo.bad_rows["duplicate_id"]
    (pos_a, original), (pos_b, duplicate) = by_id[dup_id]
    assert pos_a < pos_b
    assert original["body"].strip() and duplicate["body"].strip()
    assert original["body"] != duplicate["body"]
    assert dup_id in truth

    (nodate_id,) = demo.bad_rows["missing_date"]
    ((_, nodate),) = by_id[nodate_id]
    assert "created_at" not in nodate and nodate["body"].strip()

    (big_id,) = demo.bad_rows["oversized_body"]
    ((_, big),) = by_id[big_id]
    body = big["body"]
    assert 55_000 <= len(body) <= 65_000
    assert len(body) / 4 > 8_192, "must exceed an 8k-token window even at 4 chars per token"
    assert len(body.splitlines()) > 300
    assert sum("ERROR" in line or "WARN" in line for line in body.splitlines()) > 50

    assert demo.bad_rows["missing_id"] == [MISSING_ID]
    ((_, noid),) = by_id[MISSING_ID]
    assert noid["body"].strip() and "created_at" in noid

    bad_ids = {empty_id, nodate_id, big_id}
    assert not bad_ids & set(truth)
    kinds = Counter(_bad_kind(row) for row in first)
    assert kinds == {None: PER_DAY + 1, **dict.fromkeys(set(BAD_ROW_REASONS) - {"duplicate_id"}, 1)}


def test_later_days_hold_no_bad_rows(demo: GeneratedDemo) -> None:
    for path in demo.files[1:]:
        rows = _rows(path)
        assert all(set(row) == TICKET_KEYS for row in rows)
        assert all(row["body"].strip() and len(row["body"]) < 2_000 for row in rows)
        assert len({row["ticket_id"] for row in rows}) == len(rows)


def test_bodies_varied_and_sized(
    good: list[tuple[dt.date, dict[str, Any]]], truth: dict[str, str]
) -> None:
    bodies = [row["body"] for _, row in good]
    assert len(set(bodies)) == len(good)
    first_sentences: dict[str, set[str]] = {c: set() for c in CATEGORIES}
    subjects: dict[str, set[str]] = {c: set() for c in CATEGORIES}
    for _, row in good:
        sentences = SENTENCE_END.split(row["body"].strip())
        assert 2 <= len(sentences) <= 6, row["body"]
        assert 40 <= len(row["body"]) <= 1_000
        assert len(row["subject"]) <= 80
        category = truth[row["ticket_id"]]
        first_sentences[category].add(sentences[0])
        subjects[category].add(row["subject"].lower())
    for category in CATEGORIES:
        assert len(first_sentences[category]) >= 10, category
        assert len(subjects[category]) >= 10, category
    assert len({row["customer"] for _, row in good}) >= 100
    assert set(Counter(row["channel"] for _, row in good)) == set(CHANNELS)


def test_bodies_carry_realistic_details(good: list[tuple[dt.date, dict[str, Any]]]) -> None:
    text = " ".join(row["body"] for _, row in good)
    assert len(re.findall(r"\bLM-\d{6}\b", text)) > 30
    assert len(re.findall(r"\$\d+\.\d\d\b", text)) > 20
    assert "Lumo" in text and "iOS" in text
    months = "January|February|March|April|May|June|July|August|September|October|November"
    assert re.search(rf"\b({months}|December) \d{{1,2}}\b", text)


def test_category_recognisable_from_text(
    good: list[tuple[dt.date, dict[str, Any]]], truth: dict[str, str]
) -> None:
    hits = 0
    for _, row in good:
        text = f"{row['subject']} {row['body']}".lower()
        scores = {c: sum(text.count(word) for word in KEYWORDS[c]) for c in CATEGORIES}
        best = max(CATEGORIES, key=lambda c: scores[c])
        hits += best == truth[row["ticket_id"]]
    assert hits / len(good) >= 0.75


def test_template_pools_are_wide_and_fill_cleanly() -> None:
    import random

    words = demo_corpus.corpus()
    for category in CATEGORIES:
        problems = words.problems[category]
        assert len({p.text for p in problems}) >= 15, category
        assert all(p.subjects for p in problems)
        slots = demo_corpus.Slots(random.Random(0), START, "Ada", "Lovelace")
        closers = words.feedback_closers if category == "product_feedback" else None
        subject_pools = [[s for p in problems for s in p.subjects], words.subjects[category]]
        for pool in subject_pools:
            for template in pool:
                filled = template.format_map(slots)
                assert "{" not in filled and "}" not in filled and filled.strip()
        body_pools = [
            [p.text for p in problems],
            words.category_openers[category],
            words.details[category],
            words.tried[category],
            words.asides[category],
            *(closers or words.closers).values(),
            *words.tone_openers.values(),
        ]
        for pool in body_pools:
            for template in pool:
                filled = template.format_map(slots)
                assert "{" not in filled and "}" not in filled
                # One sentence each, so body sentence counts stay within 2-6.
                assert len(SENTENCE_END.split(filled)) == 1, filled


@pytest.mark.parametrize(("days", "per_day"), [(0, 10), (1, 0), (-1, 5)])
def test_rejects_empty_requests(tmp_path: Path, days: int, per_day: int) -> None:
    with pytest.raises(ValueError):
        generate_demo_data(tmp_path, START, days=days, tickets_per_day=per_day)
    assert not (tmp_path / "inbox").exists()


def test_corpus_refuses_a_missing_category_and_a_value_yaml_reads_as_a_number() -> None:
    import yaml
    from pydantic import ValidationError

    raw = demo_corpus.corpus().model_dump()
    del raw["details"]["shipping"]
    with pytest.raises(ValidationError, match="details needs a non-empty list for each of"):
        demo_corpus.DemoCorpus.model_validate(raw)
    raw = demo_corpus.corpus().model_dump()
    raw["error_codes"] = yaml.safe_load("[E-102, 0x8004]")
    with pytest.raises(ValidationError, match="error_codes"):
        demo_corpus.DemoCorpus.model_validate(raw)
    raw = demo_corpus.corpus().model_dump()
    raw["personal_data"]["sentences"]["phone"] = ["Call me back, please."]
    with pytest.raises(ValidationError, match="needs {value} once"):
        demo_corpus.DemoCorpus.model_validate(raw)
    raw = demo_corpus.corpus().model_dump()
    del raw["personal_data"]["formats"]["card"]
    with pytest.raises(ValidationError, match="personal_data.formats needs"):
        demo_corpus.DemoCorpus.model_validate(raw)


CONTACT = ("email", "phone", "iban", "ip_address")
BLOCKED = ("card", "credential")


def _kinds(demo: GeneratedDemo, day: dt.date) -> Counter[str]:
    prefix = f"T-{day:%Y%m%d}-"
    return Counter(
        kind
        for ticket_id, found in demo.personal_data.items()
        if ticket_id.startswith(prefix)
        for kind in found
    )


def test_truth_records_the_personal_data_of_each_ticket(demo: GeneratedDemo) -> None:
    recorded = {
        row["ticket_id"]: row["personal_data"]
        for row in _rows(demo.truth_path)
        if "personal_data" in row
    }
    assert recorded == demo.personal_data
    assert all(set(found) <= {*CONTACT, *BLOCKED} for found in recorded.values())


def test_a_modest_share_of_tickets_carries_contact_data_and_a_few_are_blocked(
    demo: GeneratedDemo,
) -> None:
    for index, day in enumerate(demo.days):
        kinds = _kinds(demo, day)
        assert sum(kinds[k] for k in BLOCKED) == PER_DAY // BLOCKED_EVERY == 1
        assert kinds["credential"] == (1 if index == 0 else 0)
        with_contact = sum(kinds[k] for k in CONTACT)
        assert 0.05 * PER_DAY <= with_contact <= 0.15 * PER_DAY, (day, kinds)
    everything = Counter(kind for found in demo.personal_data.values() for kind in found)
    assert everything["credential"] == 1
    assert everything["card"] == DAYS - 1
    # CONTACT_PERCENT of each day, given out in turn: phone, iban, ip_address, email, phone, ...
    assert DAYS * (PER_DAY * CONTACT_PERCENT // 100) == 9
    assert (everything["phone"], everything["iban"], everything["ip_address"]) == (3, 2, 2)
    assert everything["email"] > 2


def test_the_values_are_well_formed_fictional_test_values(demo: GeneratedDemo) -> None:
    values: dict[str, list[str]] = {kind: [] for kind in (*CONTACT, *BLOCKED)}
    for found in demo.personal_data.values():
        for kind, found_values in found.items():
            values[kind] += found_values
    assert all(luhn.is_valid(re.sub(r"\D", "", card)) for card in values["card"])
    assert all(iban.is_valid(number) for number in values["iban"])
    assert all(re.fullmatch(r"AKIA[A-Z2-7]{16}", key) for key in values["credential"])
    documentation = ("192.0.2.", "198.51.100.", "203.0.113.")
    assert all(ip.startswith(documentation) for ip in values["ip_address"])
    assert all(re.fullmatch(r"[a-z0-9.]+@[a-z.]+", email) for email in values["email"])
    assert all(
        email.split("@")[1] in demo_corpus.corpus().email_domains for email in values["email"]
    )


def test_personal_data_sits_in_tickets_where_it_makes_sense(
    demo: GeneratedDemo, truth: dict[str, str]
) -> None:
    homes = {"card": "billing", "iban": "billing", "credential": "technical_issue",
             "ip_address": "technical_issue"}  # fmt: skip
    for ticket_id, found in demo.personal_data.items():
        for kind in found:
            if kind in homes:
                assert truth[ticket_id] == homes[kind], (ticket_id, kind)


def test_the_detector_finds_exactly_the_recorded_values_in_each_prompt(
    demo: GeneratedDemo, good: list[tuple[dt.date, dict[str, Any]]]
) -> None:
    """Every generated value is one the compliance policy acts on, and nothing else in the
    tickets (orders, invoices, prices, tracking numbers, card endings) is taken for one."""
    prompts = [f"Subject: {row['subject']}\n\n{row['body']}" for _, row in good]
    for (_, row), findings in zip(good, scan(prompts), strict=True):
        found: dict[str, set[str]] = {}
        for finding in findings:
            found.setdefault(finding.entity, set()).add(finding.value)
        recorded = demo.personal_data.get(row["ticket_id"], {})
        assert found == {kind: set(values) for kind, values in recorded.items()}, row["body"]


def test_days_under_a_hundred_tickets_block_nothing_and_small_ones_carry_no_planted_data(
    tmp_path: Path,
) -> None:
    result = generate_demo_data(tmp_path / "a", START, days=2, tickets_per_day=99, seed=7)
    kinds = Counter(kind for found in result.personal_data.values() for kind in found)
    assert not set(kinds) & set(BLOCKED)
    assert kinds["phone"] and kinds["iban"]

    small = generate_demo_data(tmp_path / "b", START, days=2, tickets_per_day=33, seed=7)
    assert {kind for found in small.personal_data.values() for kind in found} <= {"email"}
