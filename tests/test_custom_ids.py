"""custom_ids carry nothing of the row: a source id that is an e-mail address never reaches
the provider, ids are keyed (LLM_ASSETS_ID_KEY, else a key the ledger made once), the same on
every re-run, and an item keeps its id when the key changes or was derived before keys."""

import datetime as dt
import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from llm_assets import steps
from llm_assets.items import ids
from llm_assets.resources.ledger import LedgerResource, result_table
from llm_assets.resources.ledger.tables import id_key_table
from tests.fakes.openai_server import FakeOpenAI, user_text
from tests.harness import DAY, Harness, make_harness, truthful, write_reviews

KEY_A = "the first id key of this ledger, 32+ chars"
KEY_B = "the key that replaced it, also 32 or more chars"
EMAILS = {
    "ann.lee@example.com": "The kettle is great. Order 3000 arrived.",
    "bo+billing@mail.example.org": "The blender is awful. Order 3001 arrived.",
}
KEYED_ID = re.compile(r"\d{8}_[0-9a-f]{8}_[0-9a-f]{32}")

pytestmark = [pytest.mark.fake_server("openai", responder=truthful)]


def add_reviews(harness: Harness, reviews: dict[str, str], day: dt.date = DAY) -> None:
    source = harness.home / "reviews" / f"reviews-{day.isoformat()}.jsonl"
    with source.open("a") as out:
        for review_id, text in reviews.items():
            row = {"review_id": review_id, "created_at": f"{day}T12:00:00Z", "text": text}
            out.write(json.dumps(row) + "\n")


def ids_by_source(harness: Harness, day: dt.date = DAY) -> dict[str, str]:
    """source id → custom_id of the day's items (repeats of an id and rows without one
    left out)."""
    job_id = steps.existing_job(harness.spec, day, harness.ledger).job_id
    r = result_table.c
    with harness.ledger.engine.connect() as conn:
        query = sa.select(r.source_id, r.custom_id).where(
            r.job_id == job_id,
            r.source_id.is_not(None),
            sa.or_(r.error_code.is_(None), r.error_code != ids.DUPLICATE_ID),
        )
        return dict(conn.execute(query).tuples().all())


def derived(key: str | bytes, day: dt.date, source_id: str, cid: str) -> bool:
    """Whether `cid` is the id `key` derives for `source_id` of the review pipeline, at the
    snapshot position the id names."""
    secret = key.encode() if isinstance(key, str) else key
    position = int(cid.split("_")[1], 16)
    return cid == ids.custom_id(secret, "reviews_openai", day, source_id, position)


def everything_sent(harness: Harness, fake: FakeOpenAI, tmp_path: Path) -> str:
    """The request files written, and every file the fake provider kept of what it received."""
    files = [*(harness.home / "artifacts" / "shards").rglob("*.jsonl")]
    files += [p for p in (tmp_path / "fake_openai").rglob("*") if p.is_file()]
    texts = [p.read_bytes().decode("utf-8", "replace") for p in files]
    return "\n".join([*texts, *fake.submitted_custom_ids()])


@pytest.fixture
def harness(tmp_path: Path, database_url: str, fake: FakeOpenAI) -> Iterator[Harness]:
    yield from make_harness(tmp_path, database_url, fake)


@pytest.fixture
def keyless(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ids.ID_KEY_VARIABLE, raising=False)


def test_an_email_source_id_is_in_no_request_line(
    harness: Harness, fake: FakeOpenAI, tmp_path: Path, keyless: None
) -> None:
    add_reviews(harness, EMAILS)

    outcome = harness.run_day()

    assert outcome.open_items == 0
    rows = harness.rows()
    assert {r["source_id"] for r in rows.values() if r["status"] == "succeeded"} >= set(EMAILS)
    sent = everything_sent(harness, fake, tmp_path)
    assert "Order 3000" in sent  # the requests are in there
    for email in EMAILS:
        for form in (email, email.split("@")[0], ids.slug(email, 30), "example"):
            assert form not in sent, f"{form!r} of a source id reached the provider"
    assert all(KEYED_ID.fullmatch(cid) for cid in rows)
    # The ids sort the way the rows stand in the day's source, as they are recorded.
    source = harness.home / "reviews" / f"reviews-{DAY.isoformat()}.jsonl"
    in_file = [json.loads(line)["review_id"] for line in source.read_text().splitlines()]
    by_source = ids_by_source(harness)
    assert [s for s, _ in sorted(by_source.items(), key=lambda p: p[1])] == in_file


def test_a_rerun_and_another_process_give_the_same_ids(
    harness: Harness, fake: FakeOpenAI, database_url: str, keyless: None
) -> None:
    add_reviews(harness, EMAILS)
    harness.run_day()
    first = ids_by_source(harness)
    sent = Counter(fake.submitted_custom_ids())

    # Another process of the same ledger reads the key the first one made and kept.
    harness.ledger = LedgerResource(database_url=database_url)
    again = harness.run_day()
    ctx = steps.StepContext(harness.spec, DAY, harness.ledger, harness.storage, harness.provider)
    built = steps.build_shards(ctx)

    assert ids_by_source(harness) == first
    assert Counter(fake.submitted_custom_ids()) == sent and set(sent.values()) == {1}
    assert again.open_items == 0 and built.new_items == 0
    assert built.already_known == len(harness.truth) + len(EMAILS)
    key = harness.ledger.item_id_key()
    assert all(derived(key, DAY, s, cid) for s, cid in first.items())


def test_without_a_configured_key_each_ledger_makes_its_own_at_random(
    database_url: str, tmp_path: Path, keyless: None
) -> None:
    ledger = LedgerResource(database_url=database_url)
    other = LedgerResource(database_url=f"sqlite:///{tmp_path / 'other.db'}")

    key = ledger.item_id_key()

    assert re.fullmatch(rb"[0-9a-f]{64}", key)
    assert LedgerResource(database_url=database_url).item_id_key() == key
    assert other.item_id_key() != key
    with ledger.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(id_key_table)).scalar() == 1
    day = dt.date(2026, 11, 2)
    assert ids.custom_id(key, "p", day, "ann@example.com", 0) != ids.custom_id(
        other.item_id_key(), "p", day, "ann@example.com", 0
    )


def test_a_configured_key_wins_and_a_short_one_is_refused(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ids.ID_KEY_VARIABLE, KEY_A)
    assert LedgerResource(database_url=database_url).item_id_key() == KEY_A.encode()

    monkeypatch.setenv(ids.ID_KEY_VARIABLE, "short-key")
    with pytest.raises(ValueError, match="LLM_ASSETS_ID_KEY is 9 characters") as refused:
        LedgerResource(database_url=database_url).item_id_key()
    assert "short-key" not in str(refused.value)


def test_a_new_key_keeps_the_ids_of_items_in_the_ledger_and_keys_new_ones(
    harness: Harness, fake: FakeOpenAI, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Items first seen under key A keep their ids under key B: a re-run adds none of them
    again, and a requeue sends one again under its id; items first seen after the change,
    on the same day or a new one, get B's."""
    monkeypatch.setenv(ids.ID_KEY_VARIABLE, KEY_A)
    add_reviews(harness, EMAILS)

    def answer(body: dict[str, Any]) -> str:
        # Ann's first answer is no JSON: a quality dead letter, requeued under key B.
        if "Order 3000" in user_text(body) and not answered:
            answered.append(body)
            return "not json"
        return truthful(body)

    answered: list[Any] = []
    fake.responder = answer
    harness.run_day()
    under_a = ids_by_source(harness)
    assert all(derived(KEY_A, DAY, s, cid) for s, cid in under_a.items())
    ann = next(c for c, r in harness.rows().items() if r["source_id"] == "ann.lee@example.com")
    assert harness.rows()[ann]["error_class"] == "quality"

    monkeypatch.setenv(ids.ID_KEY_VARIABLE, KEY_B)
    harness.ledger = LedgerResource(database_url=database_url)
    ctx = steps.StepContext(harness.spec, DAY, harness.ledger, harness.storage, harness.provider)
    assert steps.requeue_dead_letters(ctx, classes={"quality"}).requeued == 1
    add_reviews(harness, {"cy@example.net": "The toaster is good. Order 3002 arrived."})
    harness.run_day()
    day_two = DAY + dt.timedelta(days=1)
    write_reviews(harness.home, day_two, 3)
    harness.runner().run_day(day_two, wait=True)

    rows = harness.rows()
    under_b = ids_by_source(harness)
    assert {s: under_b[s] for s in under_a} == under_a
    assert derived(KEY_B, DAY, "cy@example.net", under_b["cy@example.net"])
    assert rows[ann]["status"] == "succeeded" and rows[ann]["attempts"] == 2
    assert len(rows) == len(under_a) + 1 == len(harness.truth) + len(EMAILS) + 1
    sent = Counter(fake.submitted_custom_ids())
    assert sent[ann] == 2 and set(sent.values()) == {1, 2}
    new_day = ids_by_source(harness, day_two)
    assert new_day and all(derived(KEY_B, day_two, s, cid) for s, cid in new_day.items())
    assert not any(derived(KEY_A, day_two, s, cid) for s, cid in new_day.items())


def test_a_day_built_before_keyed_ids_keeps_its_legacy_ids(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, keyless: None
) -> None:
    """A day whose rows have the ids of earlier versions (readable part and hash), with a
    repeated id, a row without an id and one without a date among them: building it again
    adds only its new row, and a requeue sends a legacy item again under its id."""
    source = harness.home / "reviews" / f"reviews-{DAY.isoformat()}.jsonl"
    undated = {"review_id": "R-NODATE", "text": "Fine. Order 3012 arrived."}
    add_reviews(harness, {"R-DUP": "Fine. Order 3010 arrived."})
    with source.open("a") as out:
        for row in (
            {"review_id": "R-DUP", "created_at": f"{DAY}T13:00:00Z", "text": "again"},
            {"created_at": f"{DAY}T13:00:00Z", "text": "no id"},
            undated,
        ):
            out.write(json.dumps(row) + "\n")
    ctx = steps.StepContext(harness.spec, DAY, harness.ledger, harness.storage, harness.provider)
    uri = harness.settings.resolve_source_uri(harness.spec.source.uri)
    steps.take_snapshot(ctx, uri)
    with monkeypatch.context() as legacy:
        legacy.setattr(ids, "custom_id", lambda _k, p, d, s, _n: ids.legacy_custom_id(p, d, s))
        legacy.setattr(ids, "unsent_id", ids.legacy_custom_id)
        first = steps.build_shards(ctx)
    before = harness.rows()
    codes = {"duplicate_id": 1, "missing_id": 1, "missing_date": 1}
    assert first.input_dead_letters == codes
    assert not any(KEYED_ID.fullmatch(cid) for cid in before)

    add_reviews(harness, {"R-NEW": "Good. Order 3011 arrived."})
    steps.take_snapshot(ctx, uri)
    again = steps.build_shards(ctx)

    after = harness.rows()
    assert again.new_items == 1 and again.input_dead_letters == {}
    (new,) = set(after) - set(before)
    assert after[new]["source_id"] == "R-NEW" and KEYED_ID.fullmatch(new)

    # The undated row is fixed; the requeue sends it under its legacy id.
    text = source.read_text().replace(
        json.dumps(undated), json.dumps({**undated, "created_at": f"{DAY}T14:00:00Z"})
    )
    source.write_text(text)
    steps.take_snapshot(ctx, uri)
    requeued = steps.requeue_dead_letters(ctx, chosen_ids={"R-NODATE"})

    legacy_id = ids.legacy_custom_id(harness.spec.name, DAY, "R-NODATE")
    assert requeued.requeued == 1 and requeued.still_invalid == {}
    assert harness.rows().keys() == after.keys()
    assert harness.rows()[legacy_id]["status"] == "pending"
    (shard,) = [s for s in harness.ledger.shards(harness.job_id()) if s.shard_id in requeued.shards]
    (line,) = harness.storage.read_bytes(shard.input_uri).splitlines()
    assert json.loads(line)["custom_id"] == legacy_id
