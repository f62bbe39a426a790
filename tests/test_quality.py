"""The quality gate: garbage that returns 200 OK never reaches validated or published outputs."""

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest

from llm_assets import steps
from llm_assets.defs.checks import validated_outputs_checks
from llm_assets.defs.factory import asset_key
from llm_assets.defs.run_failures import StepFailed
from llm_assets.results import quality
from llm_assets.results.validation import parse_output
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps.tables import case_table
from tests import cli_process
from tests.fakes.openai_server import FakeOpenAI, user_text
from tests.harness import (
    CLI,
    DAY,
    Harness,
    cli_env,
    make_harness,
    review_spec,
    truthful,
    write_reviews,
)

# One database (PostgreSQL in CI): these tests exercise the provider and the gate; the ledger
# and pipeline tests compare SQLite and PostgreSQL.
pytestmark = [pytest.mark.one_database, pytest.mark.fake_server("openai", polls_per_state=0)]

GARBAGE = {
    1: ("{not json", "invalid_json"),
    2: (json.dumps({"label": "meh", "summary": "fine"}), "label.literal_error"),
    3: (json.dumps({"label": "positive", "summary": ""}), "summary.string_too_short"),
    4: (json.dumps({"label": "positive", "summary": "x " * 300}), "truncated"),  # 300+ tokens
}


def garbage_for(numbers: dict[int, tuple[str, str]]) -> Any:
    def responder(body: dict[str, Any]) -> str:
        for n, (text, _) in numbers.items():
            if f"Order {1000 + n} " in user_text(body):
                return text
        return truthful(body)

    return responder


def quality_harness(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, **quality: Any
) -> Iterator[Harness]:
    yield from make_harness(tmp_path, database_url, fake, quality=quality)


def parquet(harness: Harness, key: str) -> pd.DataFrame:
    with harness.storage.local_copy(harness.storage.uri(key)) as path:
        return pd.read_parquet(path)


def latest_checks(harness: Harness) -> dict[str, Any]:
    """The latest evaluation of each validated_outputs check for the day, from the instance."""
    found = {}
    for name in ("output_schema", "quality_failure_rate", "outputs_complete"):
        key = dg.AssetCheckKey(asset_key(harness.spec, "validated_outputs"), name)
        records = harness.instance.event_log_storage.get_asset_check_execution_history(
            key, limit=10
        )
        evaluated = [r for r in records if r.event and r.event.asset_check_evaluation]
        assert evaluated, name
        found[name] = evaluated[0].event.asset_check_evaluation
        target = evaluated[0].event.asset_check_evaluation.target_materialization_data
        found[f"{name}.partition"] = partition_of(harness, target.storage_id) if target else None
    return found


def partition_of(harness: Harness, storage_id: int) -> str | None:
    """The partition of the materialization a check evaluated, read from the instance."""
    records = harness.instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=asset_key(harness.spec, "validated_outputs"),
            asset_partitions=[DAY.isoformat()],
        ),
        limit=100,
    ).records
    for record in records:
        if record.storage_id == storage_id:
            return record.partition_key
    return None


def test_garbage_below_the_threshold_is_dead_lettered_and_the_rest_published(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    fake.responder = garbage_for(GARBAGE)
    for harness in quality_harness(tmp_path, database_url, fake, max_failure_rate=0.2):
        outcome = harness.run_day()

        rows = {r["source_id"]: r for r in harness.rows().values()}
        for n, (_, rule) in GARBAGE.items():
            row = rows[f"R-20261102-{n:04d}"]
            assert (row["status"], row["error_class"], row["error_code"]) == (
                "dead_letter",
                "quality",
                rule,
            ), n
            assert row["error_message"]
        assert "meh" in rows["R-20261102-0002"]["error_message"]
        assert outcome.dead_letters_by_class == {"quality": 4}

        garbage_ids = {f"R-20261102-{n:04d}" for n in GARBAGE}
        validated = parquet(
            harness, f"outputs/{harness.spec.name}/{DAY}/{harness.job_id()}.parquet"
        )
        published = parquet(harness, f"published/{harness.spec.name}/{DAY}.parquet")
        assert len(validated) == len(published) == len(harness.truth) - 4
        assert garbage_ids.isdisjoint(set(published["source_id"]))
        assert set(published["label"]) <= {"positive", "negative"}
        checks = latest_checks(harness)
        assert all(checks[name].passed for name in ("output_schema", "quality_failure_rate"))
        assert checks["quality_failure_rate.partition"] == DAY.isoformat()
        rate = checks["quality_failure_rate"].metadata["failure_rate"].value
        assert rate == round(4 / len(harness.truth), 4)


def test_a_validation_under_way_in_another_run_is_waited_for_not_read_as_a_block(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    """A run that reads the gate while another run of the day validates it (the sensor's
    import run and `run --wait`) waits for that run's verdict instead of reading its
    "started, not finished" as a block; a validation that died still blocks the day."""
    for harness in quality_harness(tmp_path, database_url, fake, max_failure_rate=0.2):
        harness.run_day()
        _read_the_gate_while_another_run_validates(harness)


def _read_the_gate_while_another_run_validates(harness: Harness) -> None:
    validating = harness.context(created_by="sensor", run_id="validating")
    waiting = threading.Event()
    reader = harness.context(created_by="cli", log=lambda line: waiting.set())
    verdict: list[str | None] = []
    thread = threading.Thread(target=lambda: verdict.append(steps.settled_block(reader)))
    with validating.day_lock():
        steps.record_gate(validating, validating.job_id, [steps.UNFINISHED])
        thread.start()
        assert waiting.wait(60), "the reader did not wait for the validating run"
        assert verdict == []
        steps.record_gate(validating, validating.job_id, [])
    thread.join(60)
    assert verdict == [None]

    steps.record_gate(validating, validating.job_id, [steps.UNFINISHED])
    assert steps.settled_block(reader) == f"blocked by {steps.UNFINISHED}"


def test_garbage_above_the_threshold_blocks_publication(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    fake.responder = garbage_for(GARBAGE)
    for harness in quality_harness(tmp_path, database_url, fake, max_failure_rate=0.05):
        with pytest.raises(StepFailed) as blocked:
            harness.run_day()

        assert blocked.value.gate == "quality"
        # 4 of 24 answers are garbage: the gate names the check, the rate and the limit.
        reason = "blocked by quality_failure_rate (16.7% > 5.0%)"
        assert str(blocked.value) == f"quality gate: publication {reason}"
        assert steps.publication_block(harness.spec, DAY, harness.storage) == reason
        # Publication is skipped with that reason, in a run that did not fail.
        assert not harness.instance.get_run_records(
            dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE])
        )
        published_key = asset_key(harness.spec, "published_outputs")
        assert harness.instance.get_latest_materialization_event(published_key) is None
        for step in ("published_outputs", "qa_sample"):
            observed = harness.instance.fetch_observations(
                dg.AssetRecordsFilter(
                    asset_key=asset_key(harness.spec, step), asset_partitions=[DAY.isoformat()]
                ),
                limit=1,
            ).records
            assert observed[0].asset_observation.metadata["skipped"].value == reason, step
        assert not harness.storage.exists(
            harness.storage.uri(f"published/{harness.spec.name}/{DAY}.parquet")
        )
        check = latest_checks(harness)["quality_failure_rate"]
        assert not check.passed
        assert check.severity == dg.AssetCheckSeverity.ERROR
        assert latest_checks(harness)["quality_failure_rate.partition"] == DAY.isoformat()
        assert check.partition == DAY.isoformat()
        assert check.metadata["blocks_publication"].value == reason[len("blocked by ") :]
        cases = check.metadata["failure_cases"].value
        assert cases.startswith("all 4 quality failures\n")
        assert "invalid_json" in cases and "label.literal_error" in cases
        # Dead letters and the cost report are still written when the gate fails.
        for step in ("dead_letter", "cost_report"):
            assert harness.instance.get_latest_materialization_event(asset_key(harness.spec, step))


def test_a_custom_dataframe_model_adds_frame_rules(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    fake.responder = truthful
    output = {"pandera_model": "tests.quality_rules:NoRoutersInSummaries"}
    quality = {"max_failure_rate": 0.5}
    for harness in make_harness(tmp_path, database_url, fake, output=output, quality=quality):
        harness.run_day()

        flagged = [r for r in harness.rows().values() if r["error_class"] == "quality"]
        assert flagged and all(r["error_code"] == "summary.no_router" for r in flagged)
        routers = {s for s in harness.truth if int(s[-4:]) % 5 == 3}
        assert {r["source_id"] for r in flagged} == routers


def test_qa_sample_is_the_same_rows_every_time(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    fake.responder = truthful
    for harness in quality_harness(tmp_path, database_url, fake, qa_sample_size=5):
        harness.run_day()
        uri = harness.storage.uri(f"qa/{harness.spec.name}/{DAY}.jsonl")
        first = [json.loads(line) for line in harness.storage.open_lines(uri)]
        assert harness.materialize("qa_sample").success
        again = [json.loads(line) for line in harness.storage.open_lines(uri)]

        assert len(first) == 5
        assert first == again
        assert {row["source_id"] for row in first} <= set(harness.truth)


def test_the_cli_exits_2_with_the_check_reason(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    fake.responder = garbage_for(GARBAGE)
    spec = review_spec("openai", "gpt-4o-mini", quality={"max_failure_rate": 0.05})
    write_reviews(tmp_path / "home", DAY, 24)
    env = cli_env(tmp_path, database_url, spec, fake)
    result = cli_process.run(
        [CLI, "run", spec["name"], "--date", DAY.isoformat(), "--wait", "--poll-interval", "0"]
        + ["--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    reason = "blocked by quality_failure_rate (16.7% > 5.0%)"
    assert last == f"blocked: quality gate: publication {reason}"
    # --json says the same on stdout: the day, what blocked it, its items and what comes next.
    [held] = json.loads(result.stdout)
    assert (held["pipeline"], held["date"], held["done"]) == (spec["name"], DAY.isoformat(), False)
    assert (held["blocked"], held["reason"]) == ("quality", f"quality gate: publication {reason}")
    assert held["items"] == 24 and held["dead_letters_by_class"] == {"quality": 4}
    assert "llm-assets requeue" in held["next_step"] and held["not_run"] == []

    # `status` names the gate that holds the day, first, and in its JSON.
    status = [CLI, "status", spec["name"], "--date", DAY.isoformat()]
    shown = cli_process.run(status, env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == f"{spec['name']} {DAY}: {reason}"
    report = cli_process.run(
        [*status, "--json"], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(report.stdout)["blocked"] == reason


def check_evaluation(harness: Harness, name: str) -> Any:
    key = dg.AssetCheckKey(asset_key(harness.spec, "validated_outputs"), name)
    records = harness.instance.event_log_storage.get_asset_check_execution_history(key, limit=5)
    return next(r.event.asset_check_evaluation for r in records if r.event)


def test_a_label_shift_against_recent_days_warns_without_blocking(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    import datetime as dt

    fake.responder = truthful
    for harness in make_harness(tmp_path, database_url, fake):
        before = DAY - dt.timedelta(days=1)
        write_reviews(harness.home, before, 24)
        harness.runner().run_day(before, wait=True)
        first = check_evaluation(harness, "label_distribution_shift")
        assert first.passed
        # A new pipeline's first day: nothing to compare with, and the check says so.
        assert isinstance(first.metadata["total_variation"], dg.NullMetadataValue)
        assert first.metadata["not_compared"].value == (
            "no earlier days to compare with: none of the last 7 partition(s) has validated outputs"
        )
        assert "baseline" not in first.metadata

        fake.responder = lambda body: json.dumps({"label": "positive", "summary": "all good"})
        harness.run_day()

        shift = check_evaluation(harness, "label_distribution_shift")
        assert not shift.passed
        assert shift.severity == dg.AssetCheckSeverity.WARN
        assert shift.metadata["total_variation"].value == pytest.approx(0.5)
        assert "not_compared" not in shift.metadata
        published = asset_key(harness.spec, "published_outputs")
        event = harness.instance.get_latest_materialization_event(published)
        assert event is not None and event.dagster_event.partition == DAY.isoformat()


def test_a_day_without_valid_rows_is_not_compared_and_says_why() -> None:
    spec = PipelineSpec.model_validate(review_spec("openai", "gpt-4o-mini"))
    result = steps.ValidateResult(
        job_id="j",
        uri="validated.parquet",
        valid_rows=0,
        quality_failures={},
        quality_dead_letters=0,
        failure_rate=0.0,
        failure_cases=[],
        open_items=0,
        missing_results=[],
        preview=[],
        baseline_distribution={"positive": 0.5, "negative": 0.5},
    )
    (shift,) = [
        c
        for c in validated_outputs_checks(spec, result, [])
        if c.check_name == "label_distribution_shift"
    ]
    assert shift.passed
    assert isinstance(shift.metadata["total_variation"], dg.NullMetadataValue)
    assert shift.metadata["not_compared"].value == (
        "no valid rows on this day to compare with the earlier days"
    )


def test_a_low_confidence_share_warns(tmp_path: Path, database_url: str, fake: FakeOpenAI) -> None:
    fake.responder = lambda body: json.dumps(
        {"label": "positive", "summary": "ok", "confidence": 0.1}
    )
    output = {
        "schema": {
            "label": {"type": "str", "isin": ["positive", "negative"]},
            "summary": {"type": "str", "min_length": 1},
            "confidence": {"type": "float", "ge": 0, "le": 1},
        }
    }
    quality = {"min_confidence": 0.5, "max_low_confidence_share": 0.2}
    for harness in make_harness(tmp_path, database_url, fake, output=output, quality=quality):
        harness.run_day()

        low = check_evaluation(harness, "low_confidence_share")
        assert not low.passed
        assert low.severity == dg.AssetCheckSeverity.WARN
        assert low.metadata["share_below_min_confidence"].value == 1.0


@pytest.mark.parametrize(
    ("answer", "rule"),
    [("", "empty_output"), ("y" * 600, "truncated"), ("z" * 150, "text.max_length")],
)
def test_text_outputs_are_checked_for_empty_truncated_and_too_long(
    tmp_path: Path, database_url: str, fake: FakeOpenAI, answer: str, rule: str
) -> None:
    def responder(body: dict[str, Any]) -> str:
        return answer if "Order 1002 " in user_text(body) else "A short summary."

    fake.responder = responder
    output = {"format": "text", "schema": {"text": {"type": "str", "max_length": 120}}}
    quality = {"max_failure_rate": 0.5}
    for harness in make_harness(tmp_path, database_url, fake, output=output, quality=quality):
        harness.run_day()

        row = next(r for r in harness.rows().values() if r["source_id"] == "R-20261102-0002")
        assert (row["status"], row["error_class"], row["error_code"]) == (
            "dead_letter",
            "quality",
            rule,
        )


def test_a_failure_shows_the_offending_values_measure_not_a_cut_off_string() -> None:
    spec = PipelineSpec.model_validate(review_spec("openai", "gpt-4o-mini"))
    long_summary = "y" * 250

    parsed = parse_output(spec, json.dumps({"label": "positive", "summary": long_summary}), "stop")
    assert (parsed.rule, parsed.message) == (
        "summary.string_too_long",
        "String should have at most 200 characters; got length 250",
    )
    label = "a label far longer than anything the spec allows, " * 3
    parsed = parse_output(spec, json.dumps({"label": label, "summary": "ok"}), "stop")
    assert parsed.message is not None
    assert parsed.message.endswith(f"got {label[:60]!r}… ({len(label)} chars)")

    # The frame rules (pandera) say the same when a row reaches them.
    frame = pd.DataFrame(
        {
            "job_id": ["j", "j"],
            "custom_id": ["c1", "c2"],
            "source_id": ["s1", "s2"],
            "prompt_version": ["v1", "v1"],
            "model": ["m", "m"],
            "label": ["positive", "positive"],
            "summary": [long_summary, "fine"],
        }
    )
    passed, (failure,) = quality.validate_frame(spec, frame)
    assert list(passed["custom_id"]) == ["c2"]
    assert (failure.custom_id, failure.value) == ("c1", "length 250")
    assert failure.rule.startswith("summary.str_length")


def test_failure_case_tables_say_how_many_of_how_many_they_show() -> None:
    cases = [{"custom_id": f"c{n}", "error_code": "invalid_json"} for n in range(31)]
    table = case_table(cases, total=31, what="quality failures")
    assert table.splitlines()[0] == "20 of 31 quality failures"
    assert table.count("| invalid_json |") == 20
    assert case_table(cases[:3], total=3, what="quality failures").startswith(
        "all 3 quality failures\n"
    )
