"""The fake Bedrock (batch control plane and runtime), exercised only through boto3.

The bedrock and bedrock-runtime clients talk to the fake, the s3 client to the moto server the
fake reads input from and writes output to. If botocore parses what the fake says and raises what
it should, a provider tested against the fake meets the wire protocol it will meet in production.
"""

import json
import math
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError

from tests.conftest import MotoS3
from tests.fakes.bedrock_server import (
    CUSTOM_ID_HEADER,
    FakeBedrock,
    LostResponseFault,
    job_id_of,
    runtime_calls,
)
from tests.fakes.common import ControlFault

ROLE_ARN = "arn:aws:iam::123456789012:role/bedrock-batch"
ANTHROPIC_MODEL = "us.anthropic.claude-3-5-haiku-20241022-v1:0"
NOVA_MODEL = "amazon.nova-lite-v1:0"
SYSTEM = "Answer in JSON."
# botocore reads retries["max_attempts"] as retries *after* the first call (1 means two
# attempts); total_max_attempts is the number of calls.
NO_RETRIES = Config(retries={"total_max_attempts": 1, "mode": "standard"})
TERMINAL = {"Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired"}
CREATE = "/model-invocation-job"
JOB_ARN_PATTERN = r"arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/[a-z0-9]{12}"

pytestmark = pytest.mark.fake_server("bedrock")


def review(i: int) -> str:
    return f"Review {i} is great. Would buy again."


def anthropic_records(n: int) -> list[dict[str, Any]]:
    return [
        {
            "recordId": f"REC{i:08d}",
            "modelInput": {
                "anthropic_version": "bedrock-2023-05-31",
                "max_tokens": 256,
                "system": SYSTEM,
                "messages": [{"role": "user", "content": [{"type": "text", "text": review(i)}]}],
            },
        }
        for i in range(n)
    ]


def converse_records(n: int) -> list[dict[str, Any]]:
    return [
        {
            "recordId": f"CNV{i:08d}",
            "modelInput": {
                "system": [{"text": SYSTEM}],
                "messages": [{"role": "user", "content": [{"text": review(i)}]}],
                "inferenceConfig": {"maxTokens": 256, "temperature": 0.0},
            },
        }
        for i in range(n)
    ]


class Workspace:
    """One test's corner of the session bucket, and the two boto3 clients a provider uses."""

    def __init__(self, moto_s3: MotoS3, fake: FakeBedrock, bedrock: Any) -> None:
        self.s3 = moto_s3.client()
        self.bucket = moto_s3.bucket
        self.root = uuid.uuid4().hex[:12]
        self.fake = fake
        self.bedrock = bedrock

    def upload(self, name: str, lines: list[Any]) -> str:
        text = "".join(
            (line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines
        )
        key = f"{self.root}/in/{name}"
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=text.encode())
        return f"s3://{self.bucket}/{key}"

    @property
    def output_uri(self) -> str:
        return f"s3://{self.bucket}/{self.root}/out/"

    def create(self, name: str, input_uri: str, **extra: Any) -> str:
        response = self.bedrock.create_model_invocation_job(
            jobName=name,
            roleArn=ROLE_ARN,
            modelId=extra.pop("modelId", ANTHROPIC_MODEL),
            inputDataConfig={"s3InputDataConfig": {"s3Uri": input_uri, "s3InputFormat": "JSONL"}},
            outputDataConfig={"s3OutputDataConfig": {"s3Uri": self.output_uri}},
            **extra,
        )
        job_arn: str = response["jobArn"]
        return job_arn

    def statuses_to_end(self, job_arn: str) -> list[str]:
        seen: list[str] = []
        for _ in range(20):
            status = self.bedrock.get_model_invocation_job(jobIdentifier=job_arn)["status"]
            seen.append(status)
            if status in TERMINAL:
                return seen
        raise AssertionError(f"{job_arn} never ended: {seen}")

    def output_keys(self, job_arn: str) -> set[str]:
        prefix = f"{self.root}/out/{job_id_of(job_arn)}/"
        listed = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        return {obj["Key"][len(prefix) :] for obj in listed.get("Contents", [])}

    def read(self, job_arn: str, name: str) -> Any:
        key = f"{self.root}/out/{job_id_of(job_arn)}/{name}"
        text = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read().decode()
        if name == "manifest.json.out":
            return json.loads(text)
        return [json.loads(line) for line in text.splitlines()]


def error_of(excinfo: pytest.ExceptionInfo[ClientError]) -> tuple[str, int, str]:
    response: Any = excinfo.value.response
    return (
        response["Error"]["Code"],
        response["ResponseMetadata"]["HTTPStatusCode"],
        response["Error"]["Message"],
    )


def bedrock_client(fake: FakeBedrock, config: Config = NO_RETRIES, service: str = "bedrock") -> Any:
    """A boto3 client of `service` (the control plane, or bedrock-runtime) on the fake."""
    return boto3.client(
        service,
        endpoint_url=fake.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=config,
    )


@pytest.fixture
def ws(moto_s3: MotoS3, fake: FakeBedrock) -> Workspace:
    return Workspace(moto_s3, fake, bedrock_client(fake))


def test_anthropic_job_walks_every_status_and_writes_output_under_the_job_id(
    ws: Workspace,
) -> None:
    records = anthropic_records(100)
    job_arn = ws.create("reviews-2024-06-01", ws.upload("reviews.jsonl", records))

    assert job_arn.startswith("arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/")
    assert ws.statuses_to_end(job_arn) == [
        "Submitted",
        "Validating",
        "Scheduled",
        "InProgress",
        "Completed",
    ]
    job = ws.bedrock.get_model_invocation_job(jobIdentifier=job_id_of(job_arn))
    assert job["jobArn"] == job_arn and job["jobName"] == "reviews-2024-06-01"
    assert (job["modelId"], job["roleArn"]) == (ANTHROPIC_MODEL, ROLE_ARN)
    assert isinstance(job["submitTime"], datetime) and job["endTime"] >= job["submitTime"]
    assert job["jobExpirationTime"] - job["submitTime"] == timedelta(hours=168)
    assert job["inputDataConfig"]["s3InputDataConfig"]["s3Uri"].endswith("/in/reviews.jsonl")
    assert job["outputDataConfig"] == {"s3OutputDataConfig": {"s3Uri": ws.output_uri}}
    assert len(job["clientRequestToken"]) == 36  # botocore's generated uuid4
    assert "message" not in job
    counts = {k: job[k] for k in job if k.endswith("RecordCount")}
    assert counts == {
        "totalRecordCount": 100,
        "processedRecordCount": 100,
        "successRecordCount": 100,
        "errorRecordCount": 0,
    }

    assert ws.output_keys(job_arn) == {"reviews.jsonl.out", "manifest.json.out"}
    lines = ws.read(job_arn, "reviews.jsonl.out")
    assert [line["recordId"] for line in lines] != [r["recordId"] for r in records]
    by_id = {line["recordId"]: line for line in lines}
    assert set(by_id) == {r["recordId"] for r in records}
    line = by_id["REC00000003"]
    assert line["modelInput"] == records[3]["modelInput"]
    output = line["modelOutput"]
    assert output["id"].startswith("msg_bdrk_")
    assert (output["type"], output["role"], output["stop_reason"]) == (
        "message",
        "assistant",
        "end_turn",
    )
    assert output["model"] == "claude-3-5-haiku-20241022"
    assert json.loads(output["content"][0]["text"]) == {
        "label": "positive",
        "summary": "Review 3 is great.",
    }
    assert output["usage"] == {
        "input_tokens": math.ceil(len(SYSTEM + review(3)) / 4),
        "output_tokens": math.ceil(len(output["content"][0]["text"]) / 4),
    }
    manifest = ws.read(job_arn, "manifest.json.out")
    assert manifest == {
        "totalRecordCount": 100,
        "processedRecordCount": 100,
        "successRecordCount": 100,
        "errorRecordCount": 0,
        "inputTokenCount": sum(li["modelOutput"]["usage"]["input_tokens"] for li in lines),
        "outputTokenCount": sum(li["modelOutput"]["usage"]["output_tokens"] for li in lines),
    }

    calls = ws.fake.calls.entries()
    assert [c["operation"] for c in calls] == ["CreateModelInvocationJob"] + [
        "GetModelInvocationJob"
    ] * 6
    assert {c["job_id"] for c in calls} == {job_id_of(job_arn)}
    assert calls[0]["client_request_token"] == job["clientRequestToken"]
    assert all(c["status"] == 200 and c["attempt"] == 1 for c in calls)


def test_converse_job_answers_in_converse_shape(ws: Workspace) -> None:
    ws.fake.polls_per_state = 0
    records = converse_records(100)
    records[7]["modelInput"]["inferenceConfig"]["maxTokens"] = 2
    input_uri = ws.upload("converse.jsonl", records)
    job_arn = ws.create(
        "converse-job", input_uri, modelId=NOVA_MODEL, modelInvocationType="Converse"
    )

    assert ws.statuses_to_end(job_arn) == ["Completed"]
    job = ws.bedrock.get_model_invocation_job(jobIdentifier=job_arn)
    assert job["modelInvocationType"] == "Converse"
    by_id = {line["recordId"]: line for line in ws.read(job_arn, "converse.jsonl.out")}
    output = by_id["CNV00000001"]["modelOutput"]
    assert output["output"]["message"]["role"] == "assistant"
    text = output["output"]["message"]["content"][0]["text"]
    assert json.loads(text)["label"] == "positive"
    assert output["stopReason"] == "end_turn"
    usage = output["usage"]
    assert usage["inputTokens"] == math.ceil(len(SYSTEM + review(1)) / 4)
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"]
    cut = by_id["CNV00000007"]["modelOutput"]
    assert cut["stopReason"] == "max_tokens"
    assert len(cut["output"]["message"]["content"][0]["text"]) == 8


def test_the_job_type_decides_the_record_format(ws: Workspace) -> None:
    """A Converse body in an InvokeModel job (the default type) is a record error, not a job
    failure: validation does not check modelInput against the model."""
    ws.fake.polls_per_state = 0
    records = anthropic_records(99) + converse_records(1)
    records[0]["modelInput"].pop("anthropic_version")
    records[1]["modelInput"]["model"] = ANTHROPIC_MODEL
    job_arn = ws.create("mixed", ws.upload("mixed.jsonl", records))

    assert ws.statuses_to_end(job_arn) == ["Completed"]
    errors = {
        line["recordId"]: line["error"]
        for line in ws.read(job_arn, "mixed.jsonl.out")
        if "error" in line
    }
    assert errors == {
        "REC00000000": {"errorCode": 400, "errorMessage": "anthropic_version: Field required"},
        "REC00000001": {"errorCode": 400, "errorMessage": "model: Extra inputs are not permitted"},
        "CNV00000000": {
            "errorCode": 400,
            "errorMessage": "inferenceConfig: Extra inputs are not permitted",
        },
    }
    assert ws.read(job_arn, "manifest.json.out")["errorRecordCount"] == 3


def test_a_folder_input_gives_one_output_per_file_and_ids_to_records_without_one(
    ws: Workspace,
) -> None:
    ws.fake.polls_per_state = 0
    ws.upload("part-a.jsonl", anthropic_records(60))
    anonymous = [{"modelInput": r["modelInput"]} for r in anthropic_records(50)]
    ws.upload("part-b.jsonl", anonymous)
    folder = f"s3://{ws.bucket}/{ws.root}/in/"
    job_arn = ws.create("folder-job", folder)

    assert ws.statuses_to_end(job_arn) == ["Completed"]
    assert ws.output_keys(job_arn) == {"part-a.jsonl.out", "part-b.jsonl.out", "manifest.json.out"}
    generated = [line["recordId"] for line in ws.read(job_arn, "part-b.jsonl.out")]
    assert len(set(generated)) == 50
    assert all(len(rid) == 11 and rid.isalnum() for rid in generated)
    assert ws.read(job_arn, "manifest.json.out")["totalRecordCount"] == 110


def test_create_is_idempotent_on_the_client_request_token(ws: Workspace) -> None:
    input_uri = ws.upload("reviews.jsonl", anthropic_records(100))
    first = ws.create("nightly-1", input_uri, clientRequestToken="run-2024-06-01-a")
    again = ws.create("nightly-1", input_uri, clientRequestToken="run-2024-06-01-a")

    assert again == first
    assert [job["jobArn"] for job in ws.fake.jobs()] == [first]
    assert [c.get("replay", False) for c in ws.fake.calls.entries()] == [False, True]

    with pytest.raises(ClientError) as conflict:
        ws.create("nightly-2", input_uri, clientRequestToken="run-2024-06-01-a")
    code, status, _ = error_of(conflict)
    assert (code, status) == ("ConflictException", 400)

    with pytest.raises(ClientError) as in_use:
        ws.create("nightly-1", input_uri, clientRequestToken="run-2024-06-01-b")
    assert error_of(in_use) == (
        "ValidationException",
        400,
        "The provided job name is currently in use.",
    )
    assert len(ws.fake.jobs()) == 1


def test_the_quota_of_jobs_in_progress_per_model_refuses_creates_until_one_ends(
    moto_s3: MotoS3, ws: Workspace
) -> None:
    ws.fake.max_active_jobs = 2
    input_uri = ws.upload("reviews.jsonl", anthropic_records(100))
    running = ws.create("quota-1", input_uri)
    assert [
        ws.bedrock.get_model_invocation_job(jobIdentifier=running)["status"] for _ in range(4)
    ] == ["Submitted", "Validating", "Scheduled", "InProgress"]
    queued = ws.create("quota-2", input_uri, clientRequestToken="quota-2-token")

    with pytest.raises(ClientError) as refused:
        ws.create("quota-3", input_uri, clientRequestToken="quota-3-token")
    assert error_of(refused) == (
        "ServiceQuotaExceededException",
        400,
        "You have exceeded the number of batch inference jobs that can be submitted or in "
        f"progress at once for model {ANTHROPIC_MODEL} (quota: 2). Please try again later.",
    )
    assert ws.fake.calls.entries()[-1]["error_code"] == "ServiceQuotaExceededException"
    assert ws.create("quota-2", input_uri, clientRequestToken="quota-2-token") == queued
    nova_uri = ws.upload("nova.jsonl", converse_records(100))
    ws.create("quota-nova", nova_uri, modelId=NOVA_MODEL, modelInvocationType="Converse")
    retries = Config(retries={"total_max_attempts": 3, "mode": "standard"})
    retrying = Workspace(moto_s3, ws.fake, bedrock_client(ws.fake, retries))
    calls_before = len(ws.fake.calls.entries())
    with pytest.raises(ClientError) as not_retried:
        retrying.create("quota-3", input_uri)
    assert error_of(not_retried)[0] == "ServiceQuotaExceededException"
    assert len(ws.fake.calls.entries()) == calls_before + 1  # botocore does not retry it
    assert [job["jobName"] for job in ws.fake.jobs()] == ["quota-1", "quota-2", "quota-nova"]

    ws.bedrock.stop_model_invocation_job(jobIdentifier=queued)
    with pytest.raises(ClientError) as stopping:
        ws.create("quota-3", input_uri, clientRequestToken="quota-3-token")
    assert error_of(stopping)[0] == "ServiceQuotaExceededException"
    assert ws.statuses_to_end(queued) == ["Stopping", "Stopped"]
    third = ws.create("quota-3", input_uri, clientRequestToken="quota-3-token")
    assert ws.bedrock.get_model_invocation_job(jobIdentifier=third)["status"] == "Submitted"
    with pytest.raises(ClientError):
        ws.create("quota-4", input_uri)
    assert ws.statuses_to_end(running) == ["Completed"]
    ws.create("quota-4", input_uri)
    assert len(ws.fake.jobs()) == 5


def test_a_lost_create_response_retried_by_botocore_creates_one_job(ws: Workspace) -> None:
    retrying = bedrock_client(
        ws.fake, Config(retries={"total_max_attempts": 3, "mode": "standard"})
    )
    ws.bedrock = retrying
    ws.fake.faults.add(LostResponseFault("POST", CREATE))

    job_arn = ws.create("lost-response", ws.upload("reviews.jsonl", anthropic_records(100)))

    assert [job["jobArn"] for job in ws.fake.jobs()] == [job_arn]
    calls = ws.fake.calls.entries()
    assert [(c["attempt"], c.get("fault"), c.get("replay", False)) for c in calls] == [
        (1, "lost_response", False),
        (2, None, True),
    ]
    assert calls[0]["client_request_token"] == calls[1]["client_request_token"]


@pytest.mark.parametrize(
    ("field", "value", "constraint"),
    [
        ("jobName", "nightly run", "satisfy regular expression pattern"),
        ("jobName", "-starts-with-dash", "satisfy regular expression pattern"),
        ("jobName", "a" * 64, "have length less than or equal to 63"),
        ("clientRequestToken", "token_with_underscore", "satisfy regular expression pattern"),
        ("clientRequestToken", "t" * 257, "have length less than or equal to 256"),
        ("roleArn", "arn:aws:iam::123456789012:user/someone", "satisfy regular expression"),
        ("timeoutDurationInHours", 12, "have value greater than or equal to 24"),
        ("roleArn", None, "not be null"),
    ],
)
def test_request_constraints_are_validation_exceptions(
    ws: Workspace, field: str, value: Any, constraint: str
) -> None:
    unchecked = bedrock_client(ws.fake, NO_RETRIES.merge(Config(parameter_validation=False)))
    request: dict[str, Any] = {
        "jobName": "valid-name",
        "roleArn": ROLE_ARN,
        "modelId": ANTHROPIC_MODEL,
        "inputDataConfig": {"s3InputDataConfig": {"s3Uri": f"s3://{ws.bucket}/in.jsonl"}},
        "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": ws.output_uri}},
        field: value,
    }
    if value is None:
        del request[field]

    with pytest.raises(ClientError) as excinfo:
        unchecked.create_model_invocation_job(**request)

    code, status, message = error_of(excinfo)
    assert (code, status) == ("ValidationException", 400)
    assert message.startswith("1 validation error detected: Value ")
    assert f"at '{field}' failed to satisfy constraint: Member must {constraint}" in message
    assert ws.fake.jobs() == []
    assert ws.fake.calls.entries()[0]["error_code"] == "ValidationException"


def test_unknown_and_malformed_job_identifiers(ws: Workspace) -> None:
    with pytest.raises(ClientError) as missing:
        ws.bedrock.get_model_invocation_job(jobIdentifier="abcdefabcdef")
    assert error_of(missing)[:2] == ("ResourceNotFoundException", 404)

    with pytest.raises(ClientError) as malformed:
        ws.bedrock.get_model_invocation_job(jobIdentifier="not-a-job-id")
    assert error_of(malformed)[:2] == ("ValidationException", 400)

    with pytest.raises(ClientError) as stop_missing:
        ws.bedrock.stop_model_invocation_job(jobIdentifier="abcdefabcdef")
    assert error_of(stop_missing)[:2] == ("ResourceNotFoundException", 404)


def test_record_faults_write_error_lines_and_a_skipped_record_makes_it_partial(
    ws: Workspace,
) -> None:
    faults = {"REC00000003": "error", "REC00000007": "throttled", "REC00000005": "skip"}
    ws.fake.record_fault = lambda record_id, model_input: faults.get(record_id)
    ws.fake.polls_per_state = 0
    job_arn = ws.create("with-faults", ws.upload("reviews.jsonl", anthropic_records(100)))

    assert ws.statuses_to_end(job_arn) == ["PartiallyCompleted"]
    lines = ws.read(job_arn, "reviews.jsonl.out")
    by_id = {line["recordId"]: line for line in lines}
    assert len(lines) == 99 and "REC00000005" not in by_id
    assert by_id["REC00000003"]["error"]["errorCode"] == 400
    assert by_id["REC00000007"]["error"]["errorCode"] == 429
    assert "modelOutput" not in by_id["REC00000003"]
    assert by_id["REC00000003"]["modelInput"]["max_tokens"] == 256
    expected = {
        "totalRecordCount": 100,
        "processedRecordCount": 99,
        "successRecordCount": 97,
        "errorRecordCount": 2,
    }
    manifest = ws.read(job_arn, "manifest.json.out")
    assert {k: manifest[k] for k in expected} == expected
    job = ws.bedrock.get_model_invocation_job(jobIdentifier=job_arn)
    assert {k: job[k] for k in expected} == expected


def test_errored_records_alone_still_end_completed(ws: Workspace) -> None:
    ws.fake.record_fault = lambda record_id, model_input: "server_error"
    ws.fake.polls_per_state = 0
    job_arn = ws.create("all-errors", ws.upload("reviews.jsonl", anthropic_records(100)))

    assert ws.statuses_to_end(job_arn) == ["Completed"]
    manifest = ws.read(job_arn, "manifest.json.out")
    assert (manifest["successRecordCount"], manifest["errorRecordCount"]) == (0, 100)
    assert (manifest["inputTokenCount"], manifest["outputTokenCount"]) == (0, 0)


@pytest.mark.parametrize(
    ("outcome", "statuses", "processed"),
    [
        ("PartiallyCompleted", ["Scheduled", "InProgress", "PartiallyCompleted"], 50),
        ("Stopped", ["Scheduled", "InProgress", "Stopped"], 50),
        ("Failed", ["Scheduled", "InProgress", "Failed"], None),
        ("Expired", ["Scheduled", "Expired"], None),
        (None, ["Scheduled", "InProgress", "Completed"], 100),  # None: the default outcome
    ],
)
def test_job_outcomes(
    ws: Workspace, outcome: str | None, statuses: list[str], processed: int | None
) -> None:
    seen_by_outcome: list[dict[str, Any]] = []

    def decide(job: dict[str, Any]) -> str | None:
        seen_by_outcome.append(job)
        return outcome

    ws.fake.job_outcome = decide
    job_arn = ws.create("outcome", ws.upload("reviews.jsonl", anthropic_records(100)))

    assert ws.statuses_to_end(job_arn) == ["Submitted", "Validating", *statuses]
    assert [(job["jobArn"], len(job["records"])) for job in seen_by_outcome] == [(job_arn, 100)]
    job = ws.bedrock.get_model_invocation_job(jobIdentifier=job_arn)
    if processed is None:
        assert job["message"]
        assert ws.output_keys(job_arn) == set()
    else:
        assert job["processedRecordCount"] == processed
        assert len(ws.read(job_arn, "reviews.jsonl.out")) == processed
        assert ws.read(job_arn, "manifest.json.out")["processedRecordCount"] == processed


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("knob", "The input bucket is not accessible to the service role."),
        ("below_minimum", "contains less records (99) than the required minimum of: 100"),
        ("above_maximum", "contains more records (101) than the allowed maximum of: 100"),
        ("bad_json", "Invalid JSON in"),
        ("no_input", "No .jsonl input files found"),
    ],
)
def test_validation_failures_end_the_job_in_validating(
    ws: Workspace, case: str, message: str
) -> None:
    lines: list[Any] = anthropic_records(100)
    if case == "knob":
        ws.fake.validation_failure = message
    elif case == "below_minimum":
        lines = lines[:99]
    elif case == "above_maximum":
        ws.fake.max_records = 100
        lines = anthropic_records(101)
    elif case == "bad_json":
        lines[40] = '{"recordId": "broken", "modelInput": '
    input_uri = ws.upload("reviews.jsonl", lines)
    if case == "no_input":
        input_uri = f"s3://{ws.bucket}/{ws.root}/absent/"

    job_arn = ws.create("validation", input_uri)

    assert ws.statuses_to_end(job_arn) == ["Submitted", "Validating", "Failed"]
    job = ws.bedrock.get_model_invocation_job(jobIdentifier=job_arn)
    assert message in job["message"]
    assert "totalRecordCount" not in job
    assert ws.output_keys(job_arn) == set()


def test_control_plane_faults_raise_client_errors_when_retries_are_off(ws: Workspace) -> None:
    input_uri = ws.upload("reviews.jsonl", anthropic_records(100))
    ws.fake.faults.add(ControlFault("POST", CREATE, status=429, times=1))
    with pytest.raises(ClientError) as throttled:
        ws.create("throttled", input_uri)
    assert error_of(throttled) == (
        "ThrottlingException",
        429,
        "Too many requests, please wait before trying again.",
    )

    job_arn = ws.create("throttled", input_uri)
    for status, code in [(500, "InternalServerException"), (503, "ServiceUnavailableException")]:
        ws.fake.faults.add(ControlFault("GET", f"{CREATE}/", status=status))
        with pytest.raises(ClientError) as failed:
            ws.bedrock.get_model_invocation_job(jobIdentifier=job_arn)
        assert error_of(failed)[:2] == (code, status)

    ws.fake.faults.add(ControlFault("GET", "/model-invocation-jobs", reset_connection=True))
    with pytest.raises((ConnectionClosedError, EndpointConnectionError)):
        ws.bedrock.list_model_invocation_jobs()

    assert [job["status"] for job in ws.fake.jobs()] == ["Submitted"]
    faulted = [c.get("fault") for c in ws.fake.calls.entries()]
    assert faulted == ["429", None, "500", "503", "reset"]


def test_list_filters_sorts_and_paginates(ws: Workspace) -> None:
    input_uri = ws.upload("reviews.jsonl", anthropic_records(100))
    start = datetime(2024, 6, 1, tzinfo=UTC)
    names = ["nightly-0", "adhoc-0", "nightly-1", "adhoc-1", "nightly-2"]
    arns: list[str] = []
    for hour, name in enumerate(names):
        ws.fake.clock = lambda hour=hour: start + timedelta(hours=hour)
        arns.append(ws.create(name, input_uri))
    ws.fake.polls_per_state = 0
    ws.bedrock.get_model_invocation_job(jobIdentifier=arns[2])

    def listed(**query: Any) -> list[str]:
        pages = ws.bedrock.get_paginator("list_model_invocation_jobs").paginate(**query)
        return [job["jobName"] for page in pages for job in page["invocationJobSummaries"]]

    assert listed() == names[::-1]
    assert listed(sortBy="CreationTime", sortOrder="Ascending") == names
    assert listed(nameContains="nightly") == ["nightly-2", "nightly-1", "nightly-0"]
    assert listed(statusEquals="Completed") == ["nightly-1"]
    assert listed(statusEquals="Submitted", sortOrder="Ascending") == [
        "nightly-0",
        "adhoc-0",
        "adhoc-1",
        "nightly-2",
    ]
    assert listed(submitTimeAfter=start + timedelta(hours=1)) == [
        "nightly-2",
        "adhoc-1",
        "nightly-1",
    ]
    assert listed(submitTimeBefore=start + timedelta(hours=2), sortOrder="Ascending") == [
        "nightly-0",
        "adhoc-0",
    ]

    first = ws.bedrock.list_model_invocation_jobs(maxResults=2, sortOrder="Ascending")
    assert [j["jobName"] for j in first["invocationJobSummaries"]] == names[:2]
    summary = first["invocationJobSummaries"][0]
    assert summary["jobArn"] == arns[0] and summary["submitTime"] == start
    second = ws.bedrock.list_model_invocation_jobs(
        maxResults=2, sortOrder="Ascending", nextToken=first["nextToken"]
    )
    assert [j["jobName"] for j in second["invocationJobSummaries"]] == names[2:4]
    paged = ws.bedrock.get_paginator("list_model_invocation_jobs").paginate(
        sortOrder="Ascending", PaginationConfig={"PageSize": 2}
    )
    assert [len(page["invocationJobSummaries"]) for page in paged] == [2, 2, 1]

    for query in ({"nextToken": "not-a-token"}, {"statusEquals": "Done"}):
        with pytest.raises(ClientError) as bad:
            ws.bedrock.list_model_invocation_jobs(**query)
        assert error_of(bad)[:2] == ("ValidationException", 400)


def test_stop_before_and_during_processing(ws: Workspace) -> None:
    input_uri = ws.upload("reviews.jsonl", anthropic_records(100))

    def status(job_arn: str) -> str:
        return str(ws.bedrock.get_model_invocation_job(jobIdentifier=job_arn)["status"])

    queued = ws.create("stop-queued", input_uri)
    assert [status(queued), status(queued)] == ["Submitted", "Validating"]
    stopped = ws.bedrock.stop_model_invocation_job(jobIdentifier=queued)
    assert stopped["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert [status(queued), status(queued)] == ["Stopping", "Stopped"]
    assert ws.output_keys(queued) == set()

    running = ws.create("stop-running", input_uri)
    assert [status(running) for _ in range(4)] == [
        "Submitted",
        "Validating",
        "Scheduled",
        "InProgress",
    ]
    ws.bedrock.stop_model_invocation_job(jobIdentifier=running)
    ws.bedrock.stop_model_invocation_job(jobIdentifier=running)  # again, while Stopping
    assert ws.statuses_to_end(running) == ["Stopping", "Stopped"]
    job = ws.bedrock.get_model_invocation_job(jobIdentifier=running)
    assert (job["totalRecordCount"], job["processedRecordCount"]) == (100, 50)
    assert len(ws.read(running, "reviews.jsonl.out")) == 50

    with pytest.raises(ClientError) as ended:
        ws.bedrock.stop_model_invocation_job(jobIdentifier=running)
    code, status_code, message = error_of(ended)
    assert (code, status_code) == ("ValidationException", 400)
    assert message.endswith("State was: Stopped")


def test_unsigned_requests_are_refused(ws: Workspace) -> None:
    unsigned = bedrock_client(ws.fake, NO_RETRIES.merge(Config(signature_version=UNSIGNED)))
    with pytest.raises(ClientError) as refused:
        unsigned.list_model_invocation_jobs()
    assert error_of(refused) == (
        "MissingAuthenticationTokenException",
        403,
        "Missing Authentication Token",
    )


# The runtime (bedrock-runtime: InvokeModel, Converse) on the same endpoint.


class CustomIds:
    """Adds the X-Llm-Assets-Custom-Id header to a runtime client's calls, as the provider does
    through botocore's event system; `current` is the id the next call carries (None: no
    header)."""

    def __init__(self, client: Any) -> None:
        self.current: str | None = None
        client.meta.events.register("before-sign.bedrock-runtime", self._add)

    def _add(self, request: Any, **_: Any) -> None:
        if self.current is not None:
            request.headers[CUSTOM_ID_HEADER] = self.current


def runtime_client(fake: FakeBedrock, config: Config = NO_RETRIES) -> Any:
    return bedrock_client(fake, config, service="bedrock-runtime")


def anthropic_body(text: str, max_tokens: int = 256) -> dict[str, Any]:
    return {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": max_tokens,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
    }


def converse_kwargs(text: str, max_tokens: int = 50) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": [{"text": text}]}],
        "system": [{"text": SYSTEM}],
        "inferenceConfig": {"maxTokens": max_tokens, "temperature": 0.0},
    }


def invoke(client: Any, body: dict[str, Any], model_id: str = ANTHROPIC_MODEL) -> Any:
    """InvokeModel, reading the answer off its stream as a client must: an unread body keeps
    the connection from going back to the pool, and closing it later resets it."""
    response = client.invoke_model(modelId=model_id, body=json.dumps(body))
    return json.loads(response["body"].read())


def converse_refusal(client: Any, model_id: str = NOVA_MODEL) -> tuple[str, int, str]:
    """(code, status, message) of the error a Converse call on `model_id` is refused with."""
    with pytest.raises(ClientError) as refused:
        client.converse(modelId=model_id, **converse_kwargs(review(1)))
    return error_of(refused)


def without_id(output: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in output.items() if key != "id"}


def test_invoke_model_answers_as_the_batch_path_does_for_the_same_body(ws: Workspace) -> None:
    ws.fake.polls_per_state = 0
    records = anthropic_records(100)
    job_arn = ws.create("same-answers", ws.upload("reviews.jsonl", records))
    assert ws.statuses_to_end(job_arn) == ["Completed"]
    batch = {line["recordId"]: line for line in ws.read(job_arn, "reviews.jsonl.out")}
    client = runtime_client(ws.fake)
    ids = CustomIds(client)
    ids.current = "REC00000003"

    response = client.invoke_model(
        modelId=ANTHROPIC_MODEL,
        body=json.dumps(records[3]["modelInput"]),
        contentType="application/json",
        accept="application/json",
    )

    assert response["contentType"] == "application/json"
    answer = json.loads(response["body"].read())
    expected = batch["REC00000003"]["modelOutput"]
    assert without_id(answer) == without_id(expected)
    assert answer["id"].startswith("msg_bdrk_") and answer["id"] != expected["id"]
    assert answer["usage"] == {
        "input_tokens": math.ceil(len(SYSTEM + review(3)) / 4),
        "output_tokens": math.ceil(len(answer["content"][0]["text"]) / 4),
    }
    headers = response["ResponseMetadata"]["HTTPHeaders"]
    assert int(headers["x-amzn-bedrock-input-token-count"]) == answer["usage"]["input_tokens"]
    assert int(headers["x-amzn-bedrock-output-token-count"]) == answer["usage"]["output_tokens"]
    assert int(headers["x-amzn-bedrock-invocation-latency"]) > 0
    [call] = runtime_calls(ws.fake)
    assert call["path"] == f"/model/{ANTHROPIC_MODEL}/invoke"
    assert (call["operation"], call["model_id"], call["record_id"]) == (
        "InvokeModel",
        ANTHROPIC_MODEL,
        "REC00000003",
    )
    assert (call["status"], call["attempt"], call.get("error_code")) == (200, 1, None)
    assert ws.fake.runtime_successes() == {"REC00000003": 1}


def test_converse_answers_as_the_batch_path_does_for_the_same_body(ws: Workspace) -> None:
    ws.fake.polls_per_state = 0
    records = converse_records(100)
    input_uri = ws.upload("converse.jsonl", records)
    job_arn = ws.create(
        "converse-same", input_uri, modelId=NOVA_MODEL, modelInvocationType="Converse"
    )
    assert ws.statuses_to_end(job_arn) == ["Completed"]
    batch = {line["recordId"]: line for line in ws.read(job_arn, "converse.jsonl.out")}
    client = runtime_client(ws.fake)

    response = client.converse(
        modelId=NOVA_MODEL,
        messages=[{"role": "user", "content": [{"text": review(1)}]}],
        system=[{"text": SYSTEM}],
        inferenceConfig={"maxTokens": 256, "temperature": 0.0},
    )

    metadata = response.pop("ResponseMetadata")
    assert metadata["HTTPStatusCode"] == 200
    assert response == batch["CNV00000001"]["modelOutput"]
    text = response["output"]["message"]["content"][0]["text"]
    assert response["output"]["message"]["role"] == "assistant"
    assert json.loads(text) == {"label": "positive", "summary": "Review 1 is great."}
    assert response["stopReason"] == "end_turn"
    assert response["usage"] == {
        "inputTokens": math.ceil(len(SYSTEM + review(1)) / 4),
        "outputTokens": math.ceil(len(text) / 4),
        "totalTokens": math.ceil(len(SYSTEM + review(1)) / 4) + math.ceil(len(text) / 4),
    }
    assert response["metrics"]["latencyMs"] > 0
    [call] = runtime_calls(ws.fake)
    assert (call["operation"], call["model_id"], call["record_id"]) == (
        "Converse",
        NOVA_MODEL,
        None,
    )
    assert ws.fake.runtime_successes() == {}  # no custom id header, nothing to count under


def test_max_tokens_cuts_the_answer_on_both_runtime_operations(fake: FakeBedrock) -> None:
    client = runtime_client(fake)
    arn = "arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-3-haiku-20240307-v1:0"

    conversed = client.converse(modelId=NOVA_MODEL, **converse_kwargs(review(1), max_tokens=2))
    answer = invoke(client, anthropic_body(review(1), 2), model_id=arn)

    assert conversed["stopReason"] == "max_tokens"
    assert len(conversed["output"]["message"]["content"][0]["text"]) == 8
    assert conversed["usage"]["outputTokens"] == 2
    assert (answer["stop_reason"], answer["usage"]["output_tokens"]) == ("max_tokens", 2)
    assert answer["model"] == "claude-3-haiku-20240307"
    assert [c["model_id"] for c in runtime_calls(fake)] == [NOVA_MODEL, arn]


def test_bodies_the_model_rejects_are_validation_exceptions(fake: FakeBedrock) -> None:
    client = runtime_client(fake)
    unchecked = runtime_client(fake, NO_RETRIES.merge(Config(parameter_validation=False)))
    no_version = anthropic_body(review(1))
    del no_version["anthropic_version"]

    with pytest.raises(client.exceptions.ValidationException) as missing:
        client.invoke_model(modelId=ANTHROPIC_MODEL, body=json.dumps(no_version))
    assert error_of(missing) == ("ValidationException", 400, "anthropic_version: Field required")

    with pytest.raises(ClientError) as not_json:
        client.invoke_model(modelId=ANTHROPIC_MODEL, body=b"{not json")
    assert error_of(not_json)[:2] == ("ValidationException", 400)

    with pytest.raises(ClientError) as zero:
        unchecked.converse(modelId=NOVA_MODEL, **converse_kwargs(review(1), max_tokens=0))
    code, status, message = error_of(zero)
    assert (code, status) == ("ValidationException", 400)
    assert "at 'inferenceConfig.maxTokens' failed to satisfy constraint" in message

    assert [c["error_code"] for c in runtime_calls(fake)] == ["ValidationException"] * 3
    assert fake.runtime_successes() == {}


@pytest.mark.parametrize(
    ("fault", "code", "status"),
    [
        ("error", "ValidationException", 400),
        ("throttled", "ThrottlingException", 429),
        ("server_error", "InternalServerException", 500),
        ("skip", "ModelTimeoutException", 408),
    ],
)
@pytest.mark.parametrize("operation", ["invoke_model", "converse"])
def test_record_faults_pick_the_runtime_call_by_its_custom_id_header(
    fake: FakeBedrock, operation: str, fault: str, code: str, status: int
) -> None:
    seen: list[tuple[str | None, dict[str, Any]]] = []

    def record_fault(record_id: str | None, model_input: dict[str, Any]) -> str | None:
        seen.append((record_id, model_input))
        return fault if record_id == "item-bad" else None

    fake.record_fault = record_fault
    client = runtime_client(fake)
    ids = CustomIds(client)

    def call(text: str) -> Any:
        if operation == "converse":
            return client.converse(modelId=NOVA_MODEL, **converse_kwargs(text))
        return invoke(client, anthropic_body(text))

    ids.current = "item-bad"
    with pytest.raises(getattr(client.exceptions, code)) as failed:
        call(review(1))
    assert error_of(failed)[:2] == (code, status)
    ids.current = "item-good"
    call(review(2))
    ids.current = None
    call(review(3))

    assert [record_id for record_id, _ in seen] == ["item-bad", "item-good", None]
    assert review(1) in json.dumps(seen[0][1])
    calls = runtime_calls(fake)
    assert [(c["record_id"], c["status"], c.get("error_code")) for c in calls] == [
        ("item-bad", status, code),
        ("item-good", 200, None),
        (None, 200, None),
    ]
    assert fake.runtime_successes() == {"item-good": 1}


def test_runtime_rpm_throttles_beyond_the_limit_in_a_rolling_minute(fake: FakeBedrock) -> None:
    start = datetime(2024, 6, 1, tzinfo=UTC)
    now = [start]
    fake.clock = lambda: now[0]
    fake.runtime_rpm = 2
    asked: list[str | None] = []
    fake.record_fault = lambda record_id, model_input: asked.append(record_id)
    client = runtime_client(fake)
    ids = CustomIds(client)

    for item in ("item-1", "item-2"):
        ids.current = item
        client.converse(modelId=NOVA_MODEL, **converse_kwargs(review(1)))
    ids.current = "item-3"
    assert converse_refusal(client) == (
        "ThrottlingException",
        429,
        "Too many requests, please wait before trying again.",
    )
    now[0] = start + timedelta(seconds=59)
    with pytest.raises(client.exceptions.ThrottlingException):
        client.invoke_model(modelId=ANTHROPIC_MODEL, body=json.dumps(anthropic_body(review(1))))
    now[0] = start + timedelta(seconds=60)
    invoke(client, anthropic_body(review(1)))

    assert asked == ["item-1", "item-2", "item-3"]  # a throttled call never reaches the model
    assert [(c["record_id"], c["status"]) for c in runtime_calls(fake)] == [
        ("item-1", 200),
        ("item-2", 200),
        ("item-3", 429),
        ("item-3", 429),
        ("item-3", 200),
    ]
    assert fake.runtime_successes() == {"item-1": 1, "item-2": 1, "item-3": 1}


def test_fault_plans_apply_to_runtime_paths(fake: FakeBedrock) -> None:
    fake.faults.add(ControlFault("POST", "/converse", status=503))
    fake.faults.add(LostResponseFault("POST", "/invoke"))
    client = runtime_client(fake)
    ids = CustomIds(client)
    ids.current = "item-1"

    assert converse_refusal(client)[:2] == ("ServiceUnavailableException", 503)
    client.converse(modelId=NOVA_MODEL, **converse_kwargs(review(1)))
    with pytest.raises((ConnectionClosedError, EndpointConnectionError)):
        client.invoke_model(modelId=ANTHROPIC_MODEL, body=json.dumps(anthropic_body(review(1))))

    calls = runtime_calls(fake)
    assert [(c["operation"], c["record_id"], c["status"], c.get("fault")) for c in calls] == [
        ("Converse", "item-1", 503, "503"),
        ("Converse", "item-1", 200, None),
        ("InvokeModel", "item-1", 200, "lost_response"),
    ]
    # The lost answer was still produced (and billed): the item succeeded twice on the server.
    assert fake.runtime_successes() == {"item-1": 2}


def test_unknown_models_and_wrong_credential_scopes_are_refused(fake: FakeBedrock) -> None:
    fake.runtime_models = {ANTHROPIC_MODEL}
    client = runtime_client(fake)
    assert converse_refusal(client) == (
        "ResourceNotFoundException",
        404,
        "Could not resolve the foundation model from the provided model identifier.",
    )
    client.converse(modelId=ANTHROPIC_MODEL, **converse_kwargs(review(1)))

    assert client.meta.service_model.signing_name == "bedrock"
    client._request_signer._signing_name = "bedrock-runtime"
    assert converse_refusal(client, ANTHROPIC_MODEL)[:2] == ("InvalidSignatureException", 403)

    unsigned = runtime_client(fake, NO_RETRIES.merge(Config(signature_version=UNSIGNED)))
    with pytest.raises(ClientError) as refused:
        unsigned.invoke_model(modelId=ANTHROPIC_MODEL, body=json.dumps(anthropic_body("hi")))
    assert error_of(refused)[:2] == ("MissingAuthenticationTokenException", 403)
