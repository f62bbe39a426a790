"""Pseudonyms belong to the request line that carries them: a changed row that is requeued
is rendered with fresh placeholders, and its answer gets the new values back, never the
values of the line it had before; a retry sends the same line and restores the same ones."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from llm_assets import steps
from llm_assets.resources.ledger import output_table
from tests.fakes.openai_server import FakeOpenAI, user_text
from tests.harness import DAY, Harness, first_time, make_harness, truthful

OLD = "old.address@example.org"
NEW = "new.address@example.net"


def review(product: str, order: int, address: str | None) -> str:
    """A review of `product` that gives an e-mail `address` to write to, or none."""
    contact = f"write to {address}" if address else "no address"
    return f"The {product} is great, {contact}. Order {order} arrived."


REVIEWS = {
    # Changed and requeued after its first answer fails validation.
    "R-MOVED": review("blender", 1950, OLD),
    # Changed to hold no e-mail address at all, and requeued the same way.
    "R-DROPPED": review("kettle", 1951, OLD),
    # Unchanged; its first send fails with a 5xx and is retried.
    "R-RETRIED": review("toaster", 1952, OLD),
}
CHANGED = {"R-MOVED": review("blender", 1950, NEW), "R-DROPPED": review("kettle", 1951, None)}

pytestmark = [pytest.mark.fake_server("openai")]


def write_rows(harness: Harness, reviews: dict[str, str]) -> None:
    """The day's source file with `reviews` in place of the rows of the same ids."""
    source = harness.home / "reviews" / f"reviews-{DAY.isoformat()}.jsonl"
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    kept = [r for r in rows if r["review_id"] not in reviews]
    added = [
        {"review_id": review_id, "created_at": f"{DAY}T12:00:00Z", "text": text}
        for review_id, text in reviews.items()
    ]
    source.write_text("".join(json.dumps(r) + "\n" for r in [*kept, *added]))


def outputs_by_source(harness: Harness) -> dict[str, dict[str, Any]]:
    by_cid = {cid: row["source_id"] for cid, row in harness.rows().items()}
    with harness.ledger.engine.connect() as conn:
        query = sa.select(output_table.c.custom_id, output_table.c.output_json)
        return {by_cid[cid]: json.loads(out) for cid, out in conn.execute(query)}


@pytest.fixture
def harness(tmp_path: Path, database_url: str, fake: FakeOpenAI) -> Iterator[Harness]:
    compliance = {"pii": {"email": "pseudonymize"}}
    # Two of the day's items fail validation on purpose: the gate lets the day through.
    quality = {"max_failure_rate": 0.5}
    for harness in make_harness(
        tmp_path, database_url, fake, compliance=compliance, quality=quality
    ):
        write_rows(harness, REVIEWS)
        yield harness


def test_a_changed_row_requeued_gets_its_new_values_back_and_a_retry_its_own(
    harness: Harness, fake: FakeOpenAI
) -> None:
    failed: set[str] = set()
    sent: list[str] = []

    def answer(body: dict[str, Any]) -> str:
        text = user_text(body)
        sent.append(text)
        # The first answers of the rows that change are no JSON: quality dead letters.
        for order in ("Order 1950", "Order 1951"):
            if order in text and order not in failed:
                failed.add(order)
                return "not json"
        if "no address" in text:
            # A model that writes a placeholder the line never had: it is no one's value.
            return json.dumps({"label": "positive", "summary": "Write to <EMAIL_1>"})
        return truthful(body)

    fake.responder = answer
    fake.line_fault = first_time({952: "5xx"})
    first = harness.run_day()

    assert first.open_items == 0 and first.dead_letters_by_class == {"quality": 2}
    assert outputs_by_source(harness)["R-RETRIED"]["summary"] == (
        f"The toaster is great, write to {OLD}"
    )

    write_rows(harness, CHANGED)
    ctx = steps.StepContext(harness.spec, DAY, harness.ledger, harness.storage, harness.provider)
    steps.take_snapshot(ctx, harness.settings.resolve_source_uri(harness.spec.source.uri))
    assert steps.requeue_dead_letters(ctx, classes={"quality"}).requeued == 2
    again = harness.run_day()

    assert again.open_items == 0 and again.dead_letters_by_class == {}
    outputs = outputs_by_source(harness)
    assert outputs["R-MOVED"]["summary"] == f"The blender is great, write to {NEW}"
    assert outputs["R-DROPPED"]["summary"] == "Write to <EMAIL_1>"
    assert outputs["R-RETRIED"]["summary"] == f"The toaster is great, write to {OLD}"
    assert OLD not in json.dumps([outputs["R-MOVED"], outputs["R-DROPPED"]])
    # What the provider saw: placeholders only; the retried line was sent twice.
    assert not any(OLD in text or NEW in text for text in sent)
    by_source = {row["source_id"]: cid for cid, row in harness.rows().items()}
    assert fake.submitted_custom_ids().count(by_source["R-RETRIED"]) == 2
    mappings = harness.ledger.pseudonyms_of(harness.job_id())
    assert mappings[by_source["R-MOVED"]] == {"<EMAIL_1>": NEW}
    assert by_source["R-DROPPED"] not in mappings
    assert mappings[by_source["R-RETRIED"]] == {"<EMAIL_1>": OLD}
