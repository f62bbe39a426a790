"""Retention's expiry of finished days, on SQLite and PostgreSQL: the ledger's answers, outputs
and pseudonyms of an expired day go while its ids, states, counts and costs stay; an eval's
data follows its pipeline's retention; a cancelled day stays requeueable until it expires,
and after that a requeue says why it cannot; the report says what went, what stayed and
why; and every text column of the ledger has a rule."""

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from llm_assets import steps
from llm_assets.compliance.expiry import ALL_KINDS
from llm_assets.defs.retention_jobs import apply_retention, build_retention_job
from llm_assets.evaluation.replay import Replay
from llm_assets.evaluation.report import build_report
from llm_assets.evaluation.report_store import EvalRequest, report_key, save_report
from llm_assets.resources.ledger import (
    JobRecord,
    LedgerResource,
    metadata,
    output_table,
    result_table,
    utcnow,
)
from llm_assets.resources.ledger.retention import KEPT_TEXT, PAYLOADS
from llm_assets.resources.ledger.tables import pseudonym_table
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from tests.eval_harness import EvalWorld, eval_settings, write_reviews_with
from tests.fakes.openai_server import FakeOpenAI, user_text
from tests.harness import DAY, Harness, open_harness, provider_for, review_spec, truthful
from tests.test_automation_units import tick as new_data_tick
from tests.test_retention import artifact_kinds, cli

OLD, RECENT = DAY, DAY + dt.timedelta(days=1)
REVIEWS = 12
SLOPPY = "Order 1003 "
"""In the review the fake model answers with a label outside the set: a quality dead letter."""


def sloppy_once(body: dict[str, Any]) -> str:
    if SLOPPY in user_text(body):
        return json.dumps({"label": "mixed", "summary": "the customer at <EMAIL_1> is unsure"})
    return truthful(body)


def write_reviews(home: Path, day: dt.date, count: int = REVIEWS) -> None:
    """The day's reviews, each naming the buyer's e-mail address (pseudonymized)."""

    def naming_the_buyer(n: int, row: dict[str, Any], _: str) -> dict[str, Any]:
        return {"text": f"{row['text']} Write to buyer{n}@example.com."}

    write_reviews_with(home, day, count, naming_the_buyer)


def job_of(harness: Harness, day: dt.date) -> JobRecord:
    return steps.existing_job(harness.spec, day, harness.ledger)


def age_jobs(ledger: LedgerResource, job_ids: list[str], days: int) -> None:
    """Make the jobs' items look as if they became terminal `days` ago."""
    with ledger.begin() as conn:
        conn.execute(
            sa.update(result_table)
            .where(result_table.c.job_id.in_(job_ids))
            .values(updated_at=utcnow() - dt.timedelta(days=days))
        )


def count(ledger: LedgerResource, table: sa.Table, job_id: str, *where: Any) -> int:
    with ledger.engine.connect() as conn:
        query = sa.select(sa.func.count()).select_from(table).where(table.c.job_id == job_id)
        return int(conn.execute(query.where(*where)).scalar_one())


def items(ledger: LedgerResource, job_id: str) -> dict[str, dict[str, Any]]:
    with ledger.engine.connect() as conn:
        query = sa.select(result_table).where(result_table.c.job_id == job_id)
        return {r.custom_id: dict(r._mapping) for r in conn.execute(query)}


def payloads(ledger: LedgerResource, job_id: str) -> dict[str, int]:
    """How much of a job's answers, outputs and pseudonyms the ledger holds."""
    results = result_table.c
    return {
        "answers": count(ledger, result_table, job_id, results.result_json.is_not(None)),
        "quality_messages": count(
            ledger,
            result_table,
            job_id,
            results.error_class == "quality",
            results.error_message.is_not(None),
        ),
        "outputs": count(ledger, output_table, job_id),
        "pseudonyms": count(ledger, pseudonym_table, job_id),
    }


# The ledger's payloads and the artifacts of a day


@pytest.fixture(params=["default kinds", "every kind"])
def two_days(
    request: pytest.FixtureRequest, tmp_path: Path, database_url: str
) -> Iterator[Harness]:
    """A pipeline keeping 7 days, pseudonymizing e-mail addresses, with a day finished 30
    days ago and one finished 2 days ago; its `retention.artifacts` the default kinds or
    every kind."""
    kinds = {} if request.param == "default kinds" else {"artifacts": list(ALL_KINDS)}
    spec = review_spec(
        "openai",
        "gpt-4o-mini",
        retention={"artifacts_days": 7, **kinds},
        compliance={"pii": {"email": "pseudonymize"}},
        quality={"max_failure_rate": 0.5},  # the sloppy answer is a dead letter, not a block
    )
    with FakeOpenAI(tmp_path / "fake") as fake:
        fake.responder = sloppy_once
        with open_harness(tmp_path, database_url, spec, provider_for(fake), REVIEWS) as harness:
            for day in (OLD, RECENT):
                write_reviews(harness.home, day)
                assert harness.runner().run_day(day, wait=True).done
            age_jobs(harness.ledger, [job_of(harness, OLD).job_id], 30)
            age_jobs(harness.ledger, [job_of(harness, RECENT).job_id], 2)
            yield harness


def run_metadata(result: dg.ExecuteInProcessResult) -> dict[str, Any]:
    [event] = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    return {k: v.value for k, v in event.event_specific_data.metadata.items()}  # type: ignore[union-attr]


def test_an_expired_day_loses_its_answers_and_pseudonyms_and_keeps_its_accounts(
    two_days: Harness,
) -> None:
    harness, ledger, storage, spec = two_days, two_days.ledger, two_days.storage, two_days.spec
    old, recent = job_of(harness, OLD), job_of(harness, RECENT)
    before = payloads(ledger, old.job_id)
    assert before["answers"] == REVIEWS and before["outputs"] == REVIEWS - 1
    assert before["quality_messages"] == 1 and before["pseudonyms"] == REVIEWS
    old_items, recent_items = items(ledger, old.job_id), items(ledger, recent.job_id)
    recent_payloads = payloads(ledger, recent.job_id)
    outputs_uri = storage.uri(f"outputs/{spec.name}/{OLD}/{old.job_id}.parquet")
    kinds_before = artifact_kinds(storage, spec, OLD)

    ran = build_retention_job(spec).execute_in_process(
        resources=harness.resources, instance=harness.instance
    )

    assert ran.success
    assert payloads(ledger, old.job_id) == dict.fromkeys(before, 0)
    # Ids, states, counts, tokens and costs stay, and the day's finish time with them.
    after = items(ledger, old.job_id)
    for custom_id, row in old_items.items():
        expected = {**row, "result_json": None}
        if row["error_class"] == "quality":
            expected["error_message"] = None  # it quoted the answer
        assert after[custom_id] == expected
    expired = job_of(harness, OLD)
    assert expired.retention_expired_at is not None
    assert expired.model_dump(exclude={"retention_expired_at"}) == old.model_dump(
        exclude={"retention_expired_at"}
    )
    # The recent day is untouched.
    assert items(ledger, recent.job_id) == recent_items
    assert payloads(ledger, recent.job_id) == recent_payloads
    assert job_of(harness, RECENT).retention_expired_at is None
    # Artifacts: the kinds named go; the product stays unless named.
    left = artifact_kinds(storage, spec, OLD)
    if spec.retention.artifacts == list(ALL_KINDS):
        assert left == {}
    else:
        assert left == {
            k: n for k, n in kinds_before.items() if k not in {"snapshots", "shards", "qa"}
        }
        assert storage.exists(outputs_uri)
    # The report: what went, what stayed and why, day by day.
    metadata_ = run_metadata(ran)
    assert metadata_["days_expired"] == 1 and metadata_["days_kept"] == 1
    assert (metadata_["answers_deleted"], metadata_["pseudonyms_deleted"]) == (REVIEWS, REVIEWS)
    report = metadata_["report"]
    [old_row] = [line for line in report.splitlines() if f"| {OLD} |" in line]
    [recent_row] = [line for line in report.splitlines() if f"| {RECENT} |" in line]
    assert "| expired |" in old_row and "snapshots (" in old_row
    assert f"ledger: {REVIEWS} answers, {REVIEWS - 1} outputs, {REVIEWS} pseudonym mappings" in (
        old_row
    )
    assert "retention.artifacts_days: 7" in old_row
    assert "| kept |" in recent_row and "within 7 day(s)" in recent_row
    kept = sorted(set(kinds_before) - set(spec.retention.artifacts))
    assert f"| {', '.join(kept) or '-'} |" in old_row


def test_nothing_works_on_an_expired_day_again(two_days: Harness) -> None:
    harness, storage, spec = two_days, two_days.storage, two_days.spec
    old = job_of(harness, OLD)
    assert apply_retention(spec, harness.ledger, storage, harness.provider).expiry.expired
    outputs = f"outputs/{spec.name}/{OLD}/{old.job_id}.parquet"
    kept = (
        storage.read_bytes(storage.uri(outputs)) if storage.exists(storage.uri(outputs)) else None
    )

    # Validating it again would replace its outputs with none: refused, saying why.
    again = harness.materialize("validated_outputs")

    assert not again.success
    [failure] = [e for e in again.all_events if e.event_type_value == "STEP_FAILURE"]
    message = failure.event_specific_data.error.message  # type: ignore[union-attr]
    assert f"retention expired {spec.name} {OLD} on " in message
    assert "retention.artifacts_days: 7" in message
    if kept is not None:
        assert storage.read_bytes(storage.uri(outputs)) == kept
    assert items(harness.ledger, old.job_id)  # nothing became a quality dead letter
    assert {r["status"] for r in items(harness.ledger, old.job_id).values()} == {
        "succeeded",
        "dead_letter",
    }
    assert payloads(harness.ledger, old.job_id)["outputs"] == 0
    # Its lifecycle is done; a snapshot of it is refused.
    ctx = steps.StepContext(spec, OLD, harness.ledger, storage, harness.provider)
    assert steps.DayDriver(ctx).decide().done
    with pytest.raises(steps.DayExpired, match="nothing more is done with the day"):
        steps.take_snapshot(ctx, harness.settings.resolve_source_uri(spec.source.uri))
    # A changed source file of the day requests no run for it.
    source = harness.home / "reviews" / f"reviews-{OLD.isoformat()}.jsonl"
    source.write_text(source.read_text() + source.read_text().splitlines()[0] + "\n")
    requests = new_data_tick(spec, harness.settings, harness.instance, None).run_requests
    assert OLD.isoformat() not in {r.partition_key for r in requests}
    # A later round does not report it again; the recent day is still kept.
    again_round = apply_retention(spec, harness.ledger, storage, harness.provider)
    assert [(d.day, d.expired) for d in again_round.expiry.days] == [(RECENT, False)]


# A cancelled day and requeue


@pytest.fixture
def cancelled(tmp_path: Path, database_url: str) -> Iterator[Harness]:
    """A pipeline keeping 7 days whose day an operator cancelled before anything was sent."""
    spec = review_spec("openai", "gpt-4o-mini", retention={"artifacts_days": 7})
    with FakeOpenAI(tmp_path / "fake") as fake:
        fake.responder = truthful
        with open_harness(tmp_path, database_url, spec, provider_for(fake), REVIEWS) as harness:
            assert harness.materialize("input_snapshot", "request_shards").success
            ctx = steps.StepContext(
                harness.spec, DAY, harness.ledger, harness.storage, harness.provider
            )
            steps.cancel_day(ctx, reason="wrong source file")
            rows = harness.rows()
            assert {(r["status"], r["error_class"]) for r in rows.values()} == {
                ("dead_letter", "cancelled")
            }
            yield harness


def test_a_cancelled_day_stays_requeueable_within_artifacts_days(cancelled: Harness) -> None:
    harness, spec = cancelled, cancelled.spec
    age_jobs(harness.ledger, [harness.job_id()], 3)

    run = apply_retention(spec, harness.ledger, harness.storage, harness.provider)

    day = run.expiry.day(spec.name, DAY)
    assert not day.expired
    assert day.why.startswith("cancelled, finished ")
    assert f"its {REVIEWS} dead letters can be requeued until " in day.why
    assert artifact_kinds(harness.storage, spec, DAY)["snapshots"] >= 1
    requeued = cli(harness, "requeue", spec.name, "--date", str(DAY), "--class", "cancelled")
    assert requeued.exit_code == 0, requeued.output
    assert harness.run_day().succeeded == REVIEWS


def test_a_cancelled_day_expires_after_artifacts_days_and_requeue_says_why(
    cancelled: Harness,
) -> None:
    harness, spec = cancelled, cancelled.spec
    age_jobs(harness.ledger, [harness.job_id()], 30)
    shards = harness.ledger.shards(harness.job_id())

    ran = cli(harness, "retention", spec.name)

    assert ran.exit_code == 0, ran.output
    [line] = [line for line in ran.output.splitlines() if line.startswith(f"{spec.name} {DAY}:")]
    assert line.startswith(f"{spec.name} {DAY}: expired (retention.artifacts_days: 7, ")
    assert f"its {REVIEWS} dead letters can no longer be requeued" in line
    assert line.endswith("; deleted shards (2), snapshots (3)")  # nothing else was written
    assert "snapshots" not in artifact_kinds(harness.storage, spec, DAY)

    requeue = cli(harness, "requeue", spec.name, "--date", str(DAY), "--class", "cancelled")

    assert requeue.exit_code == 1
    said = " ".join(requeue.output.split())
    assert f"retention expired {spec.name} {DAY} on " in said
    assert "retention.artifacts_days: 7 after its last item became terminal" in said
    job = job_of(harness, DAY)
    assert job.cancelled_at is not None  # the day was not taken up again
    assert harness.ledger.shards(harness.job_id()) == shards
    # Asked directly, the requeue stops before it writes a shard.
    ctx = steps.StepContext(spec, DAY, harness.ledger, harness.storage, harness.provider)
    with pytest.raises(steps.DayExpired):
        steps.requeue_dead_letters(ctx, classes={"cancelled"})
    assert harness.ledger.shards(harness.job_id()) == shards


def test_a_dry_run_expires_nothing(cancelled: Harness) -> None:
    harness, spec = cancelled, cancelled.spec
    age_jobs(harness.ledger, [harness.job_id()], 30)
    before = artifact_kinds(harness.storage, spec, DAY)

    dry = cli(harness, "retention", spec.name, "--dry-run")

    assert dry.exit_code == 0, dry.output
    assert f"{spec.name} {DAY}: would expire (" in dry.output
    assert artifact_kinds(harness.storage, spec, DAY) == before
    assert job_of(harness, DAY).retention_expired_at is None


# Evals


def eval_spec() -> PipelineSpec:
    spec = review_spec("openai", "gpt-4o-mini", name="reviews", retention={"artifacts_days": 7})
    spec["source"]["fields"] = ["text"]
    spec["eval"] = {"reference_field": "human_label"}
    return PipelineSpec.model_validate(spec)


@pytest.fixture
def evaluated(tmp_path: Path, database_url: str) -> Iterator[EvalWorld]:
    """Two days of reviews (with reference labels) snapshotted by a pipeline keeping 7 days,
    and the fake OpenAI server answering them truthfully."""
    settings = eval_settings(tmp_path, database_url)
    spec = eval_spec()
    for day in (OLD, RECENT):
        write_reviews_with(
            settings.home, day, REVIEWS, lambda _n, _row, truth: {"human_label": truth}
        )
    with FakeOpenAI(tmp_path / "fake") as fake:
        fake.responder = truthful
        world = EvalWorld(settings=settings, openai=fake)
        for day in (OLD, RECENT):
            world.take_snapshot(spec, day)
        yield world


def evaluate(world: EvalWorld) -> Replay:
    """The eval of both days through the baseline alone."""
    spec = eval_spec()
    return world.run_eval(spec, {"baseline": spec}, [OLD, RECENT], size=10, seed=3)


def eval_artifacts(storage: ArtifactStorage, pipeline: str) -> list[str]:
    return [u for kind in ALL_KINDS for u in storage.list_uris(f"{kind}/{pipeline}")]


def test_an_eval_s_data_expires_by_its_pipeline_s_retention(
    evaluated: EvalWorld,
) -> None:
    ledger, storage = evaluated.ledger, evaluated.storage
    spec = eval_spec()
    result = evaluate(evaluated)
    [variant] = result.variants.values()
    job_ids = [d.job_id for d in variant.days if d.job_id]
    assert len(job_ids) == 2
    report = build_report(spec, result, ledger, storage)
    saved = save_report(
        report,
        EvalRequest(days=[OLD, RECENT], sample=10, seed=3, variants=[]),
        report_key(result),
        storage,
    )
    provider = provider_for(evaluated.openai)
    assert eval_artifacts(storage, variant.pipeline)
    assert all(payloads(ledger, j)["answers"] for j in job_ids)

    fresh = apply_retention(spec, ledger, storage, provider)

    eval_days = [d for d in fresh.expiry.days if d.pipeline == variant.pipeline]
    assert [(d.day, d.expired) for d in eval_days] == [(OLD, False), (RECENT, False)]
    assert all("within 7 day(s)" in d.why for d in eval_days)
    [sample] = fresh.expiry.samples
    assert not sample.expired and sample.uri == result.sample.uri
    assert storage.exists(result.sample.uri)

    age_jobs(ledger, job_ids, 30)
    aged = apply_retention(spec, ledger, storage, provider)

    eval_days = [d for d in aged.expiry.days if d.pipeline == variant.pipeline]
    assert [(d.day, d.expired) for d in eval_days] == [(OLD, True), (RECENT, True)]
    assert eval_artifacts(storage, variant.pipeline) == []  # every kind of an eval goes
    assert all(payloads(ledger, j) == dict.fromkeys(payloads(ledger, j), 0) for j in job_ids)
    [sample] = aged.expiry.samples
    assert sample.expired and sample.days == [OLD, RECENT]
    assert not storage.exists(result.sample.uri)
    assert all(storage.exists(uri) for uri in saved.values())  # the report keeps the scores
    # The pipeline's own days have snapshots but no job: kept, and said why.
    own = [d for d in aged.expiry.days if d.pipeline == spec.name]
    assert {d.why for d in own} == {"no job in the ledger for this day"}
    # The eval cannot be run again over what is gone, and says why.
    with pytest.raises(steps.DayExpired, match="evaluate other days or another variant"):
        evaluate(evaluated)


# Every text column of the ledger has a rule


def test_every_text_column_of_the_ledger_has_a_retention_rule() -> None:
    texts = {
        f"{table.name}.{column.name}"
        for table in metadata.sorted_tables
        for column in table.columns
        if isinstance(column.type, sa.Text)
    }
    assert texts - set(PAYLOADS) - set(KEPT_TEXT) == set(), (
        "a ledger text column without a retention rule: name it in "
        "llm_assets/resources/ledger/retention.py (PAYLOADS or KEPT_TEXT)"
    )
    assert not set(PAYLOADS) & set(KEPT_TEXT)
    assert set(PAYLOADS) <= texts
    assert {t.name for t in (pseudonym_table, output_table, result_table)} == {
        name.split(".")[0] for name in PAYLOADS
    }
