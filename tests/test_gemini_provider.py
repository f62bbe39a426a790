"""The gemini adapter through the official google-genai SDK against the fake Gemini server."""

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_assets import steps
from llm_assets.resources.ledger import TERMINAL, utcnow
from llm_assets.resources.providers.base import ShardSubmission
from llm_assets.resources.providers.gemini_lines import normalize_line
from llm_assets.resources.providers.registry import provider_spec_problems
from llm_assets.spec.model import PipelineSpec
from tests.fakes.common import ControlFault
from tests.fakes.gemini_model import request_text
from tests.fakes.gemini_server import FakeGemini, LostResponseFault
from tests.harness import POSITIVE, Harness, open_harness, provider_for, review_spec
from tests.harness import first_time as harness_first_time

pytestmark = [pytest.mark.one_database, pytest.mark.fake_server("gemini")]


def truthful(request: dict[str, Any]) -> str:
    """Answers a GenerateContentRequest like a good model: the label the review implies."""
    text = request_text(request)
    label = "positive" if any(word in text.lower() for word in POSITIVE) else "negative"
    return json.dumps({"label": label, "summary": text.split(".")[0][:200]})


def first_time(faults: dict[int, str]) -> Callable[[str, dict[str, Any]], str | None]:
    """The fake's line_fault for review n (`faults[n]`) on its first submission only."""
    return harness_first_time(faults, request_text)


@pytest.fixture
def harness(tmp_path: Path, database_url: str, fake: FakeGemini) -> Iterator[Harness]:
    fake.responder = truthful
    spec = review_spec("gemini", "gemini-2.5-flash")
    with open_harness(tmp_path, database_url, spec, provider_for(fake)) as harness:
        yield harness


def batches_by_shard(fake: FakeGemini) -> Counter[str]:
    """How many batch jobs the fake holds for each display name (shard id)."""
    return Counter(batch["displayName"] for batch in fake.batches.values())


def test_a_day_completes_with_line_faults_judged_line_by_line(
    harness: Harness, fake: FakeGemini
) -> None:
    fake.line_fault = first_time(
        {1: "429", 2: "500", 3: "missing", 4: "duplicate", 5: "safety", 6: "prompt_blocked"}
    )
    invalid = first_time({7: "invalid_argument"})
    faulty = fake.line_fault

    def with_invalid(key: str, request: dict[str, Any]) -> str | None:
        return invalid(key, request) or faulty(key, request)

    fake.line_fault = with_invalid

    outcome = harness.run_day()

    assert outcome.open_items == 0
    rows = harness.rows()
    by_source = {r["source_id"]: r for r in rows.values()}
    assert len(rows) == len(harness.truth)
    assert all(r["status"] in TERMINAL for r in rows.values())
    dead = {n: by_source[f"R-20261102-{n:04d}"] for n in (5, 6, 7)}
    assert {n: (r["status"], r["error_class"], r["error_code"]) for n, r in dead.items()} == {
        5: ("dead_letter", "deterministic", "finish_SAFETY"),
        6: ("dead_letter", "deterministic", "prompt_blocked_SAFETY"),
        7: ("dead_letter", "deterministic", "INVALID_ARGUMENT"),
    }
    assert all(r["attempts"] == 1 for r in dead.values())
    # A refusal's prompt was billed; a request the endpoint refused was not.
    assert dead[5]["input_tokens"] > 0 and dead[5]["cost_usd"] > 0
    assert dead[7]["input_tokens"] == 0 and dead[7]["cost_usd"] == 0
    retried = {f"R-20261102-{n:04d}" for n in (1, 2, 3)}
    assert {s for s, r in by_source.items() if r["attempts"] == 2} == retried
    labels = harness.labels()
    assert len(labels) == len(harness.truth) - 3
    assert all(labels[source] == harness.truth[source] for source in labels)
    # The duplicated line is counted once; nothing that succeeded ran again.
    assert all(n == 1 for key, n in fake.billed.items() if rows[key]["source_id"] not in retried)
    assert all(r["input_tokens"] > 0 for r in rows.values() if r["status"] == "succeeded")
    assert_one_batch_per_shard(harness, fake)


def assert_one_batch_per_shard(harness: Harness, fake: FakeGemini) -> None:
    shards = harness.ledger.shards(harness.job_id())
    assert batches_by_shard(fake) == Counter({s.shard_id: 1 for s in shards})
    assert sorted(fake.batches) == sorted(s.provider_batch_id for s in shards)


CONTROL_CALLS = [
    ("POST", "/upload/v1beta/files"),
    ("POST", ":batchGenerateContent"),
    ("GET", "/v1beta/batches/"),
    ("GET", ":download"),
]
"""Upload, create, get and download: each call of a day's control plane."""


def test_control_plane_429_and_5xx_are_retried_without_a_second_batch(
    harness: Harness, fake: FakeGemini
) -> None:
    for method, path in CONTROL_CALLS:
        fake.faults.add(ControlFault(method, path, status=429, times=2, retry_after=0))
        fake.faults.add(ControlFault(method, path, status=503, times=1))

    outcome = harness.run_day()

    assert outcome.succeeded == len(harness.truth)
    for method, path in CONTROL_CALLS:
        faulted = [
            c["fault"]
            for c in fake.calls.entries()
            if c["method"] == method and path in c["path"] and c.get("fault")
        ]
        assert sorted(faulted) == ["429", "429", "503"], path
    assert_one_batch_per_shard(harness, fake)
    assert set(fake.billed.values()) == {1}


@pytest.mark.parametrize(
    "fault",
    [
        LostResponseFault("POST", ":batchGenerateContent", times=1),
        ControlFault("POST", ":batchGenerateContent", status=500, after_handling=True),
    ],
    ids=["reset", "500"],
)
def test_a_create_that_took_effect_without_an_answer_is_found_not_made_again(
    harness: Harness, fake: FakeGemini, fault: ControlFault
) -> None:
    fake.faults.add(fault)

    outcome = harness.run_day()

    assert outcome.succeeded == len(harness.truth)
    assert any(
        c.get("fault") in ("lost_response", "500_after_handling") for c in fake.calls.entries()
    )
    assert_one_batch_per_shard(harness, fake)
    assert set(fake.billed.values()) == {1}
    listed = [
        c for c in fake.calls.entries() if c["method"] == "GET" and c["path"].endswith("/batches")
    ]
    assert listed, "the lost create was looked for by listing the batch jobs"


def submission(harness: Harness, shard_id: str) -> ShardSubmission:
    shard = harness.ledger.get_shard(shard_id)
    assert shard is not None
    return ShardSubmission(
        shard_id=shard.shard_id,
        job_id=harness.job_id(),
        pipeline=harness.spec.name,
        input_uri=shard.input_uri,
        item_count=shard.item_count,
        model=harness.spec.model.name,
        format=harness.provider.request_format(harness.spec),
    )


def test_a_crash_between_create_and_record_is_reconciled_by_display_name(
    harness: Harness, fake: FakeGemini
) -> None:
    assert harness.materialize("input_snapshot", "request_shards").success
    first = harness.ledger.shards(harness.job_id())[0]
    # What a crash leaves behind: the intent is recorded, the batch exists, its name is not.
    harness.ledger.update_shard(first.shard_id, submit_intent_at=utcnow())
    created = harness.provider.submit(submission(harness, first.shard_id), harness.storage)

    outcome = harness.run_day()

    assert outcome.succeeded == len(harness.truth)
    assert harness.ledger.get_shard(first.shard_id).provider_batch_id == created
    assert_one_batch_per_shard(harness, fake)
    assert set(fake.billed.values()) == {1}


def test_two_candidate_batches_stop_the_run_until_an_operator_cancels_one(
    harness: Harness, fake: FakeGemini
) -> None:
    assert harness.materialize("input_snapshot", "request_shards").success
    first = harness.ledger.shards(harness.job_id())[0]
    harness.ledger.update_shard(first.shard_id, submit_intent_at=utcnow())
    shard = submission(harness, first.shard_id)
    created = [harness.provider.create_batch(shard, harness.storage) for _ in range(2)]
    before = sorted(fake.batches)

    result = harness.materialize("provider_batches")

    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    description = failure.step_failure_data.user_failure_data.description
    assert first.shard_id in description and "2 Gemini batch jobs" in description
    assert sorted(fake.batches) == before
    assert harness.ledger.get_shard(first.shard_id).provider_batch_id is None

    harness.provider.cancel(created[0])
    assert harness.materialize("provider_batches").success
    assert harness.ledger.get_shard(first.shard_id).provider_batch_id == created[1]


def test_a_failed_batch_is_retried_whole(harness: Harness, fake: FakeGemini) -> None:
    failed: list[str] = []

    def outcome_of(operation: dict[str, Any]) -> str:
        if not failed:
            failed.append(operation["name"])
            return "failed"
        return "succeeded"

    fake.batch_outcome = outcome_of

    outcome = harness.run_day()

    assert outcome.succeeded == len(harness.truth)
    shards = harness.ledger.shards(harness.job_id())
    [lost] = [s for s in shards if s.provider_batch_id == failed[0]]
    assert (lost.raw_status, lost.status) == ("failed", "imported")
    rows = harness.rows()
    again = {cid for cid, r in rows.items() if r["attempts"] == 2}
    assert len(again) == lost.item_count
    assert all(fake.billed[cid] == 1 for cid in rows)


@pytest.mark.parametrize("ending", ["expired", "cancelled_after_partial"])
def test_a_batch_that_ends_part_way_keeps_its_lines_and_resends_only_the_rest(
    harness: Harness, fake: FakeGemini, ending: str
) -> None:
    ended: list[str] = []

    def outcome_of(operation: dict[str, Any]) -> str:
        if not ended:
            ended.append(operation["name"])
            return ending
        return "succeeded"

    fake.batch_outcome = outcome_of

    outcome = harness.run_day()

    assert outcome.succeeded == len(harness.truth)
    [partial] = [
        s for s in harness.ledger.shards(harness.job_id()) if s.provider_batch_id == ended[0]
    ]
    rows = harness.rows()
    again = {cid for cid, r in rows.items() if r["attempts"] == 2}
    assert len(again) == partial.item_count - partial.item_count // 2
    assert all(fake.billed[cid] == 1 for cid in rows)
    if ending == "expired":
        assert {rows[cid]["error_class"] for cid in again} == {None}


def test_cancel_ends_a_running_batch_and_its_answered_lines_are_kept(
    harness: Harness, fake: FakeGemini
) -> None:
    fake.polls_per_state = 2
    assert harness.materialize("input_snapshot", "request_shards", "provider_batches").success
    first = harness.ledger.shards(harness.job_id())[0]
    assert first.provider_batch_id is not None
    while harness.provider.poll(first.provider_batch_id).raw_status == "pending":
        pass  # each poll is one get; the fake's state moves on every second one

    status = harness.provider.cancel(first.provider_batch_id)

    assert (status.state, status.raw_status) == ("cancelled", "cancelled")
    outcome = harness.run_day()
    assert outcome.succeeded == len(harness.truth)
    rows = harness.rows()
    assert sorted(r["attempts"] for r in rows.values()).count(2) == (
        first.item_count - first.item_count // 2
    )
    assert all(fake.billed[cid] == 1 for cid in rows)


def test_a_server_restart_mid_batch_loses_nothing(harness: Harness, fake: FakeGemini) -> None:
    fake.polls_per_state = 3
    assert harness.materialize("input_snapshot", "request_shards", "provider_batches").success
    job_id = harness.job_id()
    steps.poll_shards(harness.ledger, harness.provider, harness.ledger.shards(job_id))
    fake.restart()

    outcome = harness.run_day()

    assert outcome.succeeded == len(harness.truth)
    assert_one_batch_per_shard(harness, fake)


def test_request_lines_carry_the_prompt_and_the_output_schema(
    harness: Harness, fake: FakeGemini
) -> None:
    assert harness.materialize("input_snapshot", "request_shards").success
    shard = harness.ledger.shards(harness.job_id())[0]
    line = json.loads(next(iter(harness.storage.open_lines(shard.input_uri))))
    assert set(line) == {"key", "request"}
    request = line["request"]
    assert request["systemInstruction"] == {"parts": [{"text": harness.spec.prompt.system}]}
    assert request["contents"][0]["role"] == "user"
    config = request["generationConfig"]
    assert config["maxOutputTokens"] == 100
    assert config["responseMimeType"] == "application/json"
    schema = config["responseSchema"]
    assert schema["type"] == "OBJECT"
    assert schema["propertyOrdering"] == ["label", "summary"]
    assert schema["properties"]["label"] == {"type": "STRING", "enum": ["positive", "negative"]}
    assert schema["properties"]["summary"] == {"type": "STRING", "minLength": 1, "maxLength": 200}
    assert "additionalProperties" not in schema


def test_an_embeddings_day_runs_as_embeddings_batches(
    tmp_path: Path, database_url: str, fake: FakeGemini
) -> None:
    spec = review_spec(
        "gemini",
        "gemini-embedding-001",
        output={"format": "json", "schema": {"embedding": {"type": "list[float]"}}},
    )
    spec["output"] = {"format": "json", "schema": {"embedding": {"type": "list[float]"}}}
    with open_harness(tmp_path, database_url, spec, provider_for(fake)) as harness:
        outcome = harness.run_day()

        assert outcome.succeeded == len(harness.truth)
        assert {b["kind"] for b in fake.batches.values()} == {"embed"}
        vectors = [json.loads(r["result_json"])["embedding"] for r in harness.rows().values()]
        assert all(len(v) == 8 and abs(sum(x * x for x in v) - 1) < 1e-9 for v in vectors)


def test_spec_validation_knows_the_limits_of_gemini() -> None:
    spec = review_spec(
        "gemini",
        "gemini-2.5-flash",
        sharding={"max_requests_per_shard": 200_001},
        model={"options": {"temperature_x": 1}},
    )
    problems = dict(provider_spec_problems(PipelineSpec.model_validate(spec)))
    assert "at most 200000 requests" in problems["sharding.max_requests_per_shard"]
    assert "temperature_x" in problems["model.options"]
    fine = review_spec("gemini", "gemini-2.5-pro", sharding={"max_requests_per_shard": 200_000})
    assert provider_spec_problems(PipelineSpec.model_validate(fine)) == []


def test_result_lines_are_read_one_by_one() -> None:
    usage = {"promptTokenCount": 10, "candidatesTokenCount": 4, "thoughtsTokenCount": 6}
    parts = [{"text": "thinking...", "thought": True}, {"text": "an answer"}]
    answered = normalize_line(
        {
            "key": "a",
            "response": {
                "candidates": [{"content": {"parts": parts}, "finishReason": "MAX_TOKENS"}],
                "usageMetadata": {**usage, "cachedContentTokenCount": "3"},
            },
        }
    )
    assert answered is not None
    assert (answered.output_text, answered.finish_reason) == ("an answer", "length")
    assert (answered.input_tokens, answered.cached_input_tokens, answered.output_tokens) == (
        10,
        3,
        10,
    )
    for code, status, expected in [
        (429, "RESOURCE_EXHAUSTED", "transient"),
        (500, "INTERNAL", "transient"),
        (503, "UNAVAILABLE", "transient"),
        (504, "DEADLINE_EXCEEDED", "transient"),
        (400, "INVALID_ARGUMENT", "deterministic"),
        (404, "NOT_FOUND", "deterministic"),
    ]:
        failed = normalize_line(
            {"key": "b", "error": {"code": code, "message": "m", "status": status}}
        )
        assert failed is not None and not failed.succeeded
        assert failed.error_class == expected, code
    assert normalize_line({"response": {}}) is None  # no key: not ours
    recitation = normalize_line(
        {"key": "c", "response": {"candidates": [{"finishReason": "RECITATION"}]}}
    )
    assert recitation is not None
    assert (recitation.error_class, recitation.error_code) == ("deterministic", "finish_RECITATION")


def test_the_readme_example_of_a_gemini_model_section_is_a_valid_spec() -> None:
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```yaml\n")[1:]]
    [example] = [b for b in blocks if "provider: gemini" in b]
    spec = review_spec("gemini", "gemini-2.5-flash", **yaml.safe_load(example))
    assert provider_spec_problems(PipelineSpec.model_validate(spec)) == []


def test_a_concurrent_jobs_quota_is_waited_out_without_spending_attempts(
    harness: Harness, fake: FakeGemini
) -> None:
    fake.max_active_batches = 1

    outcome = harness.run_day()

    assert outcome.succeeded == len(harness.truth)
    refused = [c for c in fake.calls.entries() if c["path"].endswith(":batchGenerateContent")]
    assert any(c["status"] == 429 for c in refused), "the quota was met"
    assert {r["attempts"] for r in harness.rows().values()} == {1}
    assert_one_batch_per_shard(harness, fake)
    assert set(fake.billed.values()) == {1}
