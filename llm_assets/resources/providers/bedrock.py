"""Amazon Bedrock batch inference through boto3: records in S3, a model invocation job, the
outputs read back from S3.

A shard becomes a JSONL object of `{recordId, modelInput}` records (an Anthropic Messages
body for `anthropic.*` models, else the Converse format) in S3: the shard file itself when
artifacts are on S3, else a copy under `staging_uri`. `CreateModelInvocationJob` carries a
`clientRequestToken` derived from the shard, so creating it again (after a crash between
create and record, or a lost answer) returns the same job instead of paying twice. Results
are `<output>/<job id>/<input file>.out` lines, streamed; `manifest.json.out` has the counts.
Credentials come from the standard AWS chain; `AWS_ENDPOINT_URL` is honoured by boto3.

A shard that merging could not bring to Bedrock's minimum records per job is sent request by
request at on-demand prices (`bedrock.below_minimum: online`, see bedrock_runtime.py), or
never sent and its items dead-lettered (`merge`). The record formats are in
bedrock_records.py.
"""

import asyncio
import hashlib
import json
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import orjson
import pydantic
import tenacity
from pydantic import PrivateAttr

from llm_assets.resources.providers.base import (
    ONLINE_BATCH_PREFIX,
    BatchProvider,
    BatchStatus,
    ItemResult,
    RequestItem,
    ShardFiles,
    ShardState,
    ShardSubmission,
)
from llm_assets.resources.providers.bedrock_records import (
    input_format,
    model_input,
    normalize_record,
)
from llm_assets.resources.providers.bedrock_runtime import OnDemandRuntime, is_transient_aws
from llm_assets.resources.providers.online import (
    OnlineStats,
    OnlineWork,
    run_requests,
    settings_of,
)
from llm_assets.resources.providers.realtime import Send
from llm_assets.resources.providers.retrying import (
    MAX_RETRY_AFTER_SECONDS,
    QuotaRefused,
    pause,
)
from llm_assets.resources.providers.shared_window import open_pacer
from llm_assets.util.settings import rate_limit_redis_url

if TYPE_CHECKING:
    from llm_assets.resources.storage import ArtifactStorage
    from llm_assets.spec.model import PipelineSpec

MAX_RECORDS = 50_000
MAX_NAME = 63
STATUS_MAP = {
    "Submitted": ShardState.SUBMITTED,
    "Validating": ShardState.SUBMITTED,
    "Scheduled": ShardState.SUBMITTED,
    "InProgress": ShardState.RUNNING,
    "Stopping": ShardState.RUNNING,
    "Completed": ShardState.COMPLETED,
    "PartiallyCompleted": ShardState.COMPLETED,
    "Failed": ShardState.FAILED,
    "Stopped": ShardState.CANCELLED,
    "Expired": ShardState.EXPIRED,
}


class IncompleteOutput(Exception):
    """A job's output files hold fewer records than its manifest counts."""


def bedrock_spec_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    unknown = set(spec.model.options) - {"format"}
    if unknown:
        problems.append(("model.options", f"unknown option(s) for bedrock: {sorted(unknown)}"))
    if spec.model.options.get("format") not in (None, "anthropic", "converse"):
        problems.append(("model.options.format", "one of 'anthropic', 'converse'"))
    if spec.sharding.max_requests_per_shard > MAX_RECORDS:
        problems.append(
            ("sharding.max_requests_per_shard", f"Bedrock takes at most {MAX_RECORDS} per job")
        )
    if spec.sharding.max_requests_per_shard < spec.bedrock.min_records_per_job:
        problems.append(
            (
                "sharding.max_requests_per_shard",
                f"below bedrock.min_records_per_job ({spec.bedrock.min_records_per_job}): "
                "no shard could be a job",
            )
        )
    return problems


def job_name(shard_id: str) -> str:
    """A readable, unique job name within Bedrock's 63 characters and pattern."""
    digest = hashlib.sha256(shard_id.encode()).hexdigest()[:12]
    readable = re.sub(r"[^a-zA-Z0-9]+", "-", shard_id).strip("-")
    return f"{readable[: MAX_NAME - len(digest) - 1].rstrip('-')}-{digest}"


def request_token(shard_id: str) -> str:
    """The idempotency token of a shard's job: the same shard, the same job."""
    return hashlib.sha256(f"llm-assets/{shard_id}".encode()).hexdigest()[:64]


class BedrockBatchProvider(BatchProvider):
    """Model invocation jobs; control-plane calls retried here, boto3's retries off."""

    line_id_field: ClassVar[str] = "recordId"

    role_arn: str | None = pydantic.Field(
        default=None, description="The service role Bedrock assumes to read and write S3."
    )
    staging_uri: str | None = pydantic.Field(
        default=None,
        description="s3://bucket/prefix for job input copies and outputs; default: the "
        "artifact storage when it is on S3.",
    )
    region_name: str | None = None
    endpoint_url: str | None = None
    runtime_endpoint_url: str | None = None
    max_attempts: int = 6
    retry_base_seconds: float = 1.0
    retry_cap_seconds: float = 60.0
    max_retry_after_seconds: float = MAX_RETRY_AFTER_SECONDS
    """On-demand requests: the longest a rate limit pauses the senders at a time."""

    _clients: dict[str, Any] = PrivateAttr(default_factory=dict)

    def quota_account(self) -> str:
        region = (
            self.region_name
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION", "")
        )
        return f"{region} {self.endpoint_url or ''}".strip()[:256] or "default"

    def _client(self, service: str, timeout_seconds: float | None = None) -> Any:
        """A boto3 client of `service`, with botocore's timeouts unless `timeout_seconds`
        bounds connecting and each read."""
        key = f"{service}:{timeout_seconds}"
        if key not in self._clients:
            import boto3
            from botocore.config import Config

            timeouts = (
                {"connect_timeout": timeout_seconds, "read_timeout": timeout_seconds}
                if timeout_seconds is not None
                else {}
            )
            self._clients[key] = boto3.client(
                service,
                region_name=self.region_name,
                endpoint_url=self.endpoint_url if service == "bedrock" else None,
                # Our retry layer only: botocore's own attempts would retry a create twice.
                config=Config(retries={"total_max_attempts": 1, "mode": "standard"}, **timeouts),
            )
        return self._clients[key]

    def call(self, describe: str, fn: Any) -> Any:
        return tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.max_attempts),
            wait=tenacity.wait_random_exponential(
                multiplier=self.retry_base_seconds, max=self.retry_cap_seconds
            ),
            retry=tenacity.retry_if_exception(is_transient_aws),
            reraise=True,
            sleep=pause,
        )(fn)

    def spec_problems(self, spec: "PipelineSpec") -> list[tuple[str, str]]:
        return bedrock_spec_problems(spec)

    def request_line(self, spec: "PipelineSpec", item: RequestItem) -> dict[str, Any]:
        return {"recordId": item.custom_id, "modelInput": model_input(spec, item)}

    def request_format(self, spec: "PipelineSpec") -> str:
        return input_format(spec)

    def min_records_per_shard(self, spec: "PipelineSpec") -> int:
        return spec.bedrock.min_records_per_job

    def below_minimum_reason(
        self, spec: "PipelineSpec", shard_id: str, item_count: int
    ) -> str | None:
        """`bedrock.below_minimum: merge`: a shard Bedrock would refuse is never sent; its
        items become dead letters saying why, to be requeued when there are enough of them.
        (With `online` such a shard is sent request by request: `runs_shard_in_step`.)"""
        minimum = self.min_records_per_shard(spec)
        if item_count >= minimum:
            return None
        return (
            f"{shard_id} has {item_count} item(s), below Bedrock's minimum of {minimum} "
            "records per job, and bedrock.below_minimum is 'merge'; requeue them with more "
            "items, or set bedrock.below_minimum: online to send them at on-demand prices"
        )

    def _staging(self, storage: "ArtifactStorage") -> str:
        if self.staging_uri:
            return self.staging_uri.rstrip("/")
        if storage.is_s3:
            return storage.uri("bedrock")
        raise ValueError(
            "the bedrock provider needs S3: set LLM_ASSETS_STORAGE_URL=s3://… or "
            "LLM_ASSETS_BEDROCK_S3_URI for job input and output"
        )

    def _input_uri(self, shard: ShardSubmission, storage: "ArtifactStorage") -> str:
        """The shard's records in S3: the shard file itself, or a streamed copy."""
        if shard.input_uri.startswith("s3://"):
            return shard.input_uri
        target = f"{self._staging(storage)}/input/{shard.pipeline}/{shard.shard_id}.jsonl"
        bucket, _, key = target[len("s3://") :].partition("/")
        with open(shard.input_uri, "rb") as handle:
            self.call(
                "upload input",
                lambda: self._client("s3").upload_fileobj(handle, bucket, key),
            )
        return target

    def submit(self, shard: ShardSubmission, storage: "ArtifactStorage") -> str:
        if self.role_arn is None:
            raise ValueError(
                "the bedrock provider needs a service role: set LLM_ASSETS_BEDROCK_ROLE_ARN"
            )
        input_uri = self._input_uri(shard, storage)
        output_uri = f"{self._staging(storage)}/output/{shard.pipeline}/{shard.shard_id}/"
        request = {
            "jobName": job_name(shard.shard_id),
            "roleArn": self.role_arn,
            "clientRequestToken": request_token(shard.shard_id),
            "modelId": shard.model,
            "inputDataConfig": {
                "s3InputDataConfig": {"s3Uri": input_uri, "s3InputFormat": "JSONL"}
            },
            "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": output_uri}},
            "modelInvocationType": "Converse" if shard.format == "converse" else "InvokeModel",
            "tags": [
                {"key": "llm_assets_job_id", "value": shard.job_id},
                {"key": "llm_assets_shard_id", "value": shard.shard_id},
            ],
        }
        # Idempotent by clientRequestToken: a create whose answer was lost, retried, and a
        # create after a crash between create and record all return the same job.
        answer = self.call("create job", lambda: self._create_job(request))
        return str(answer["jobArn"])

    def find_submitted(self, shard: ShardSubmission) -> str | None:
        """The shard's job, found by its name (a job's name is made from its shard id)."""
        name = job_name(shard.shard_id)
        answer = self.call(
            "list jobs",
            lambda: self._client("bedrock").list_model_invocation_jobs(nameContains=name),
        )
        found = [
            job["jobArn"]
            for job in answer.get("invocationJobSummaries", [])
            if job.get("jobName") == name
        ]
        return found[0] if found else None

    def _create_job(self, request: dict[str, Any]) -> dict[str, Any]:
        """CreateModelInvocationJob; the quota of jobs in progress per model is not retried
        here (it frees up as jobs end, not in seconds): the shard waits for it."""
        try:
            return self._client("bedrock").create_model_invocation_job(**request)
        except Exception as exc:
            response = getattr(exc, "response", None)
            error = response.get("Error", {}) if isinstance(response, dict) else {}
            if error.get("Code") == "ServiceQuotaExceededException":
                message = error.get("Message") or "ServiceQuotaExceededException"
                raise QuotaRefused(message) from exc
            raise

    def _describe(self, job_arn: str) -> dict[str, Any]:
        return self.call(
            "get job",
            lambda: self._client("bedrock").get_model_invocation_job(jobIdentifier=job_arn),
        )

    def _status(self, job: dict[str, Any]) -> BatchStatus:
        raw = job.get("status", "Submitted")
        return BatchStatus(
            provider_batch_id=job["jobArn"],
            state=STATUS_MAP.get(raw, ShardState.RUNNING),
            raw_status=raw,
            total=int(job.get("totalRecordCount") or 0),
            completed=int(job.get("successRecordCount") or 0),
            failed=int(job.get("errorRecordCount") or 0),
            message=job.get("message"),
        )

    def poll(self, provider_batch_id: str) -> BatchStatus:
        return self._status(self._describe(provider_batch_id))

    def poll_briefly(self, provider_batch_id: str, timeout_seconds: float) -> BatchStatus:
        """One GetModelInvocationJob on a client whose connect and read time out after
        `timeout_seconds`, not retried."""
        client = self._client("bedrock", timeout_seconds)
        return self._status(client.get_model_invocation_job(jobIdentifier=provider_batch_id))

    def cancel(self, provider_batch_id: str) -> BatchStatus:
        self.call(
            "stop job",
            lambda: self._client("bedrock").stop_model_invocation_job(
                jobIdentifier=provider_batch_id
            ),
        )
        return self.poll(provider_batch_id)

    def results(self, provider_batch_id: str) -> Iterator[ItemResult]:
        job = self._describe(provider_batch_id)
        output = job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"].rstrip("/")
        job_id = job["jobArn"].rsplit("/", 1)[-1]
        bucket, _, prefix = f"{output}/{job_id}/"[len("s3://") :].partition("/")
        s3 = self._client("s3")
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        read = 0
        manifest: str | None = None
        for page in pages:
            for item in page.get("Contents", []):
                key = item["Key"]
                if key.endswith("manifest.json.out"):
                    manifest = key
                    continue
                if not key.endswith(".out"):
                    continue
                body = self.call("read output", lambda k=key: s3.get_object(Bucket=bucket, Key=k))
                for raw in body["Body"].iter_lines():
                    if raw.strip():
                        result = normalize_record(orjson.loads(raw))
                        if result is not None:
                            read += 1
                            yield result
        if manifest is not None:
            answer = self.call("read manifest", lambda: s3.get_object(Bucket=bucket, Key=manifest))
            counts = json.loads(answer["Body"].read() or b"{}")
            processed = int(counts.get("processedRecordCount") or 0)
            if read < processed:
                # Records Bedrock ran (and billed) whose lines we did not get: importing now
                # would send them again as missing. Fail the import; a rerun reads again.
                raise IncompleteOutput(
                    f"{provider_batch_id}: manifest.json.out says {processed} records were "
                    f"processed but the output files under s3://{bucket}/{prefix} hold {read}; "
                    "not importing until they are all there"
                )

    def delete_files(self, shard: ShardFiles) -> list[str]:
        """The job's S3 objects: its input, when that is a copy under the staging prefix (the
        shard file itself, read in place when artifacts are on S3, is ours and stays), and
        everything under its output prefix (record outputs and manifest.json.out). The job's
        record at Bedrock holds no data and cannot be deleted. A shard sent request by request
        has nothing there."""
        if shard.provider_batch_id.startswith(ONLINE_BATCH_PREFIX):
            return []
        job = self._describe(shard.provider_batch_id)
        s3 = self._client("s3")
        deleted: list[str] = []
        input_uri = job["inputDataConfig"]["s3InputDataConfig"]["s3Uri"]
        if input_uri != shard.input_uri:
            bucket, _, key = input_uri[len("s3://") :].partition("/")
            self.call("delete input", lambda: s3.delete_object(Bucket=bucket, Key=key))
            deleted.append(input_uri)
        output = job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"].rstrip("/")
        bucket, _, prefix = f"{output}/"[len("s3://") :].partition("/")
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            for item in page.get("Contents", []):
                key = item["Key"]
                self.call("delete output", lambda k=key: s3.delete_object(Bucket=bucket, Key=k))
                deleted.append(f"s3://{bucket}/{key}")
        return deleted

    # The on-demand path for shards below the minimum records per job.

    def runs_shard_in_step(
        self, spec: "PipelineSpec", item_count: int, provider_batch_id: str | None
    ) -> bool:
        if provider_batch_id is not None:  # decided when it was sent
            return provider_batch_id.startswith(ONLINE_BATCH_PREFIX)
        return (
            spec.bedrock.below_minimum == "online" and item_count < spec.bedrock.min_records_per_job
        )

    def realtime_request(self, line: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return str(line["recordId"]), line["modelInput"]

    def run(self, spec: "PipelineSpec", work: OnlineWork) -> OnlineStats:
        """Send the work's `(custom_id, modelInput, tokens)` requests to bedrock-runtime,
        paced and retried as the online provider does (`online.concurrency`, `rpm`, `tpm`,
        `max_tries`, `timeout_seconds`; the limits shared through Redis when one is
        configured)."""
        settings = settings_of(spec)
        runtime = OnDemandRuntime(self.region_name, self.runtime_endpoint_url, settings, spec)
        redis_url = rate_limit_redis_url(os.environ)
        # The quota is the model's in the runtime endpoint's region.
        quota = ("bedrock", runtime.client.meta.endpoint_url, spec.model.name)

        async def paced(send: Send) -> OnlineStats:
            async with open_pacer(settings, quota, redis_url) as pacer:
                return await run_requests(
                    settings,
                    work,
                    send,
                    backoff_base_seconds=self.retry_base_seconds,
                    backoff_cap_seconds=self.retry_cap_seconds,
                    max_retry_after_seconds=self.max_retry_after_seconds,
                    pacer=pacer,
                )

        return asyncio.run(runtime.run(paced))
