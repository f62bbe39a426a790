"""The bedrock adapter through boto3 against the fake Bedrock control plane, with artifacts
and job data in S3 (a moto server): a day end to end, and a kill right after the job was
created that does not create a second job."""

import contextlib
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_assets.resources.ledger import LedgerResource
from llm_assets.resources.pricing import load_price_table
from llm_assets.resources.providers.bedrock import (
    BedrockBatchProvider,
    IncompleteOutput,
    job_name,
    request_token,
)
from llm_assets.resources.storage import ArtifactStorage
from tests import cli_process
from tests.conftest import MotoS3
from tests.fakes.bedrock_server import FakeBedrock, runtime_calls
from tests.harness import CLI, DAY, POSITIVE, Harness, open_harness, review_spec, write_reviews
from tests.ledger_helpers import jobs_for_pipeline
from tests.provider_kits import BEDROCK_MODEL, BEDROCK_ROLE, dead_letters

ROLE = BEDROCK_ROLE
MODEL = BEDROCK_MODEL


def truthful(model_input: dict[str, Any]) -> str:
    text = json.dumps(model_input["messages"])
    label = "positive" if any(word in text.lower() for word in POSITIVE) else "negative"
    return json.dumps({"label": label, "summary": "A customer review."})


pytestmark = [
    pytest.mark.slow,
    pytest.mark.one_database,
    pytest.mark.fake_server("bedrock", min_records=50, responder=truthful),
]


@contextlib.contextmanager
def harness_on_s3(
    tmp_path: Path,
    database_url: str,
    moto_s3: MotoS3,
    fake: FakeBedrock,
    spec: dict[str, Any],
    reviews: int,
) -> Iterator[Harness]:
    """A Harness driving the adapter with its control plane and its runtime (on-demand calls)
    on the fake, and its artifacts under a fresh prefix of the moto server's bucket."""
    provider = BedrockBatchProvider(
        role_arn=ROLE,
        endpoint_url=fake.endpoint_url,
        runtime_endpoint_url=fake.endpoint_url,
        retry_base_seconds=0.01,
    )
    with open_harness(tmp_path, database_url, spec, provider, reviews=reviews) as harness:
        harness.storage = ArtifactStorage(base_url=f"s3://{moto_s3.bucket}/{uuid.uuid4().hex}")
        yield harness


def bedrock_spec() -> dict[str, Any]:
    return review_spec(
        "bedrock",
        MODEL,
        sharding={"max_requests_per_shard": 100},
        bedrock={"min_records_per_job": 50},
        quality={"max_failure_rate": 0.05},
    )


def test_a_day_runs_end_to_end_with_artifacts_in_s3(
    tmp_path: Path, database_url: str, moto_s3: MotoS3, fake: FakeBedrock
) -> None:
    fake.record_fault = lambda record_id, body: (
        "error" if "Order 1007 " in json.dumps(body) else None
    )
    # The job's outputs stay at the provider: the end of this test reads them again.
    spec = {**bedrock_spec(), "retention": {"provider_files": "keep"}}
    with harness_on_s3(tmp_path, database_url, moto_s3, fake, spec, reviews=120) as harness:
        prefix, provider = harness.storage.base_url, harness.provider
        outcome = harness.run_day()

        assert outcome.done and outcome.total == 120
        rows = harness.rows()
        assert dead_letters(rows) == [("R-20261102-0007", "deterministic")]
        # A last shard below Bedrock's minimum was topped up from the one before it.
        shards = harness.ledger.shards(harness.job_id())
        assert [s.item_count for s in shards] == [70, 50]
        jobs = fake.jobs()
        assert len(jobs) == 2
        for shard, job in zip(shards, sorted(jobs, key=lambda j: j["jobName"]), strict=True):
            assert job["jobName"] == job_name(shard.shard_id) and len(job["jobName"]) <= 63
            assert job["clientRequestToken"] == request_token(shard.shard_id)
            assert job["modelId"] == MODEL and job["roleArn"] == ROLE
            # The shard file in the artifact store is the job's input, no copy needed.
            assert job["inputDataConfig"]["s3InputDataConfig"]["s3Uri"] == shard.input_uri
            assert shard.input_uri.startswith(prefix)
        # Snapshots, shards, outputs, dead letters and reports all live under the S3 prefix.
        kinds = {uri[len(prefix) + 1 :].split("/")[0] for uri in harness.storage.list_uris("")}
        assert {"snapshots", "shards", "outputs", "dead_letters", "reports"} <= kinds
        assert sum(r["cost_usd"] for r in rows.values()) > 0

        # Output files with fewer records than the manifest counts are never imported as
        # they are: those records ran (and were billed), so they must not be sent again.
        batch_id = shards[0].provider_batch_id
        assert batch_id is not None
        assert len(list(provider.results(batch_id))) == shards[0].item_count
        s3 = moto_s3.client()
        bucket, key = out_key(s3, fake, batch_id)
        lines = s3.get_object(Bucket=bucket, Key=key)["Body"].read().splitlines()
        s3.put_object(Bucket=bucket, Key=key, Body=b"\n".join(lines[1:]) + b"\n")
        with pytest.raises(IncompleteOutput, match="says 70 records .* hold 69"):
            list(provider.results(batch_id))


def out_key(s3: Any, fake: FakeBedrock, job_arn: str) -> tuple[str, str]:
    """The bucket and key of a job's one `.out` file."""
    bucket, _, prefix = fake.output_uri(job_arn)[len("s3://") :].partition("/")
    listing = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)
    [key] = [
        o["Key"]
        for o in listing["Contents"]
        if o["Key"].endswith(".out") and not o["Key"].endswith("manifest.json.out")
    ]
    return bucket, key


@pytest.mark.parametrize(
    "point", ["submit.after_create", "import.after_upsert", "import.after_shard:2"]
)
def test_a_kill_after_create_or_mid_import_neither_creates_nor_sends_again(
    tmp_path: Path, database_url: str, moto_s3: MotoS3, fake: FakeBedrock, point: str
) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "reviews.yaml").write_text(yaml.safe_dump(bedrock_spec()))
    write_reviews(tmp_path / "home", DAY, 120)
    env = {
        **os.environ,
        "LLM_ASSETS_HOME": str(tmp_path / "home"),
        "LLM_ASSETS_DATABASE_URL": database_url,
        "LLM_ASSETS_PIPELINES": str(specs),
        "LLM_ASSETS_STORAGE_URL": f"s3://{moto_s3.bucket}/kill-{uuid.uuid4().hex[:8]}",
        "LLM_ASSETS_BEDROCK_ROLE_ARN": ROLE,
        "AWS_ENDPOINT_URL_BEDROCK": fake.endpoint_url,
        "DAGSTER_HOME": str(tmp_path / "dagster"),
    }
    args = [CLI, "run", "reviews_bedrock", "--date", DAY.isoformat(), "--wait"]
    args += ["--poll-interval", "0.05", "--json"]

    killed = cli_process.run(
        args,
        env={**env, "LLM_ASSETS_FAILPOINT": point},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    jobs_when_killed = len(fake.jobs())
    assert jobs_when_killed == (1 if point == "submit.after_create" else 2)

    done = cli_process.run(args, env=env, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["succeeded"] == 120
    jobs = fake.jobs()
    assert len(jobs) == 2  # one per shard: a job created before the kill was found by token
    creates = [c for c in fake.calls.entries() if c.get("operation") == "CreateModelInvocationJob"]
    tokens = [c["client_request_token"] for c in creates]
    assert len(set(tokens)) == 2
    assert len(tokens) == (3 if point == "submit.after_create" else 2)
    # Nothing was sent twice: a half-done import is finished, not retried.
    database = LedgerResource(database_url=database_url)
    [job] = jobs_for_pipeline(database, "reviews_bedrock")
    attempts = {r["attempts"] for r in database.iter_items(job.job_id, columns=["attempts"])}
    assert attempts == {1}


def answered_once(calls: list[dict[str, Any]]) -> dict[str, int]:
    """custom_id -> how many runtime calls for it were answered 200."""
    counts: dict[str, int] = {}
    for call in calls:
        if call.get("status") == 200:
            counts[call["record_id"]] = counts.get(call["record_id"], 0) + 1
    return counts


@pytest.mark.parametrize(
    ("model", "operation"),
    [(MODEL, "InvokeModel"), ("amazon.nova-lite-v1:0", "Converse")],
)
def test_a_day_below_the_minimum_goes_on_demand_through_bedrock_runtime(
    tmp_path: Path,
    database_url: str,
    moto_s3: MotoS3,
    fake: FakeBedrock,
    model: str,
    operation: str,
) -> None:
    throttled_once: set[str] = set()

    def faults(record_id: str | None, body: dict[str, Any]) -> str | None:
        text = json.dumps(body)
        if "Order 1003 " in text:
            return "error"  # a 400: a deterministic dead letter
        if "Order 1005 " in text or "Order 1008 " in text:
            if record_id not in throttled_once:  # throttled, then a 500, then fine
                throttled_once.add(str(record_id))
                return "throttled"
            if f"{record_id}/500" not in throttled_once:
                throttled_once.add(f"{record_id}/500")
                return "server_error"
        return None

    fake.record_fault = faults
    spec = review_spec(
        "bedrock",
        model,
        sharding={"max_requests_per_shard": 100},
        bedrock={"min_records_per_job": 50},
        online={"concurrency": 4, "checkpoint_every": 5},
        quality={"max_failure_rate": 0.1},
    )
    with harness_on_s3(tmp_path, database_url, moto_s3, fake, spec, reviews=30) as harness:
        outcome = harness.run_day()

        assert outcome.done and outcome.total == 30 and outcome.succeeded == 29
        assert fake.jobs() == []  # Bedrock would refuse a 30-record job: none was created
        [shard] = harness.ledger.shards(harness.job_id())
        assert shard.provider_batch_id == f"online-{shard.shard_id}"
        rows = harness.rows()
        assert dead_letters(rows, "error_code") == [
            ("R-20261102-0003", "deterministic", "ValidationException")
        ]
        calls = runtime_calls(fake)
        assert {c["operation"] for c in calls} == {operation}
        # Every item answered exactly once; the throttled and failed ones were sent again.
        assert answered_once(calls) == {
            cid: 1 for cid, r in rows.items() if r["status"] == "succeeded"
        }
        assert {c["record_id"] for c in calls if c["status"] == 429} == {
            cid
            for cid, r in rows.items()
            if r["source_id"] in ("R-20261102-0005", "R-20261102-0008")
        }
        # Charged, and estimated, at on-demand prices: no batch discount.
        price = load_price_table().get("bedrock", model)
        for row in rows.values():
            if row["status"] == "succeeded":
                expected = price.cost_usd(row["input_tokens"], row["output_tokens"], batch=False)
                assert row["cost_usd"] == pytest.approx(expected) and expected > 0
        assert shard.estimated_cost_usd == pytest.approx(
            price.cost_usd(shard.estimated_input_tokens, shard.estimated_output_tokens, batch=False)
        )


def test_a_retry_round_below_the_minimum_goes_on_demand(
    tmp_path: Path, database_url: str, moto_s3: MotoS3, fake: FakeBedrock
) -> None:
    decided: list[str] = []

    def first_job_partly(job: dict[str, Any]) -> str | None:
        decided.append(job["jobArn"])
        return "PartiallyCompleted" if len(decided) == 1 else None

    fake.job_outcome = first_job_partly
    spec = bedrock_spec()
    with harness_on_s3(tmp_path, database_url, moto_s3, fake, spec, reviews=120) as harness:
        outcome = harness.run_day()

        assert outcome.done and outcome.succeeded == 120
        shards = harness.ledger.shards(harness.job_id())
        assert len(fake.jobs()) == 2  # the two first-round shards only
        [retry] = [s for s in shards if s.kind == "retry"]
        first = next(s for s in shards if s.provider_batch_id == decided[0])
        # The first job processed half its records; the rest (under 50) went on demand.
        assert retry.item_count == first.item_count - first.item_count // 2 < 50
        assert retry.provider_batch_id == f"online-{retry.shard_id}"
        rows = harness.rows()
        sent_again = {cid for cid, r in rows.items() if r["attempts"] == 2}
        assert len(sent_again) == retry.item_count
        assert answered_once(runtime_calls(fake)) == {cid: 1 for cid in sent_again}


def test_merge_only_leaves_a_shard_below_the_minimum_unsent_as_dead_letters(
    tmp_path: Path, database_url: str, moto_s3: MotoS3, fake: FakeBedrock
) -> None:
    spec = bedrock_spec() | {"bedrock": {"min_records_per_job": 50, "below_minimum": "merge"}}
    with harness_on_s3(tmp_path, database_url, moto_s3, fake, spec, reviews=30) as harness:
        harness.run_day()

        rows = harness.rows()
        assert len(rows) == 30
        assert {(r["status"], r["error_code"]) for r in rows.values()} == {
            ("dead_letter", "below_minimum")
        }
        assert "below Bedrock's minimum of 50" in next(iter(rows.values()))["error_message"]
        assert sum(r["cost_usd"] for r in rows.values()) == 0
        assert fake.jobs() == [] and runtime_calls(fake) == []
        [shard] = harness.ledger.shards(harness.job_id())
        assert shard.provider_batch_id is None and shard.raw_status == "below_minimum"
