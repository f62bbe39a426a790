"""The bedrock adapter through boto3 against the fake Bedrock control plane, with artifacts
and job data in S3 (a moto server): a day end to end, and a kill right after the job was
created that does not create a second job."""

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from llm_assets.resources.ledger import TERMINAL
from llm_assets.resources.providers.bedrock import BedrockBatchProvider, job_name, request_token
from llm_assets.resources.storage import ArtifactStorage
from tests.conftest import MotoS3
from tests.fakes.bedrock_server import FakeBedrock
from tests.harness import DAY, POSITIVE, Harness, review_spec, write_reviews

ROLE = "arn:aws:iam::123456789012:role/BedrockBatchInference"
MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"


@pytest.fixture
def database_url(one_database_url: str) -> str:
    return one_database_url


def truthful(model_input: dict[str, Any]) -> str:
    text = json.dumps(model_input["messages"])
    label = "positive" if any(word in text.lower() for word in POSITIVE) else "negative"
    return json.dumps({"label": label, "summary": "A customer review."})


@pytest.fixture
def fake(moto_s3: MotoS3) -> Iterator[FakeBedrock]:
    with FakeBedrock(moto_s3.endpoint_url) as server:
        server.min_records = 50
        server.responder = truthful
        yield server
        assert server.server_errors == []


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
    provider = BedrockBatchProvider(
        role_arn=ROLE, endpoint_url=fake.endpoint_url, retry_base_seconds=0.01
    )
    (tmp_path / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        harness = Harness(tmp_path, database_url, instance, bedrock_spec(), provider, reviews=120)
        prefix = f"s3://{moto_s3.bucket}/run-{uuid.uuid4().hex[:8]}"
        harness.storage = ArtifactStorage(base_url=prefix)

        outcome = harness.run_day()

        assert outcome.done and outcome.total == 120
        rows = harness.rows()
        assert all(r["status"] in TERMINAL for r in rows.values())
        dead = [r for r in rows.values() if r["status"] == "dead_letter"]
        assert [(r["source_id"], r["error_class"]) for r in dead] == [
            ("R-20261102-0007", "deterministic")
        ]
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


CLI = str(Path(sys.executable).parent / "llm-assets")


def test_a_kill_right_after_the_job_is_created_does_not_create_a_second(
    tmp_path: Path, database_url: str, moto_s3: MotoS3, fake: FakeBedrock
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

    killed = subprocess.run(
        args,
        env={**env, "LLM_ASSETS_FAILPOINT": "submit.after_create"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(fake.jobs()) == 1

    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["succeeded"] == 120
    jobs = fake.jobs()
    assert len(jobs) == 2  # one per shard: the first was created once, found again by token
    creates = [c for c in fake.calls.entries() if c.get("operation") == "CreateModelInvocationJob"]
    tokens = [c["client_request_token"] for c in creates]
    assert len(tokens) == 3 and len(set(tokens)) == 2


@pytest.mark.parametrize("outcome", ["Expired", "PartiallyCompleted", "Failed"])
def test_a_job_that_ends_badly_is_resubmitted_only_for_what_has_no_result(
    tmp_path: Path, database_url: str, moto_s3: MotoS3, fake: FakeBedrock, outcome: str
) -> None:
    from tests.fakes.common import ControlFault

    fake.min_records = 30
    decided: list[str] = []

    def first_job_ends_badly(job: dict[str, Any]) -> str:
        decided.append(job["jobArn"])
        return outcome if len(decided) == 1 else "Completed"

    fake.job_outcome = first_job_ends_badly
    # The control plane throttles the first creates: retried by our layer, one job each.
    fake.faults.add(ControlFault("POST", "/model-invocation-job", status=429, times=2))
    provider = BedrockBatchProvider(
        role_arn=ROLE, endpoint_url=fake.endpoint_url, retry_base_seconds=0.01
    )
    spec = bedrock_spec() | {"bedrock": {"min_records_per_job": 30}}
    (tmp_path / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        harness = Harness(tmp_path, database_url, instance, spec, provider, reviews=60)
        harness.storage = ArtifactStorage(base_url=f"s3://{moto_s3.bucket}/{uuid.uuid4().hex}")

        outcome_of_day = harness.run_day()

        assert outcome_of_day.done and outcome_of_day.succeeded == 60
        shards = harness.ledger.shards(harness.job_id())
        first = next(s for s in shards if s.provider_batch_id == decided[0])
        assert first.raw_status == outcome
        retried = [s for s in shards if s.kind == "retry"]
        rows = harness.rows()
        # Only the first job's items without a result went again, each as a second attempt.
        sent_again = {cid for cid, r in rows.items() if r["attempts"] == 2}
        assert sent_again and sum(s.item_count for s in retried) == len(sent_again)
        assert all(rows[cid]["shard_id"] in {s.shard_id for s in retried} for cid in sent_again)
        creates = [
            c for c in fake.calls.entries() if c.get("operation") == "CreateModelInvocationJob"
        ]
        assert len(fake.jobs()) == len(shards)
        assert len({c["client_request_token"] for c in creates}) == len(shards)
