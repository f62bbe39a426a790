"""Amazon Bedrock batch inference through boto3: records in S3, a model invocation job, the
outputs read back from S3.

A shard becomes a JSONL object of `{recordId, modelInput}` records (an Anthropic Messages
body for `anthropic.*` models, else the Converse format) in S3: the shard file itself when
artifacts are on S3, else a copy under `staging_uri`. `CreateModelInvocationJob` carries a
`clientRequestToken` derived from the shard, so creating it again (after a crash between
create and record, or a lost answer) returns the same job instead of paying twice. Results
are `<output>/<job id>/<input file>.out` lines, streamed; `manifest.json.out` has the counts.
Credentials come from the standard AWS chain; `AWS_ENDPOINT_URL` is honoured by boto3.

A shard that merging could not bring to Bedrock's minimum records per job is, when the spec
says `bedrock.below_minimum: online`, sent request by request through `bedrock-runtime`
(InvokeModel for Anthropic bodies, Converse otherwise) by the provider_batches step, with the
online provider's worker (pacing, rate-limit pauses, retries, checkpoints to the ledger).
"""

import asyncio
import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal

import orjson
import pydantic
from pydantic import PrivateAttr

from llm_assets.resources.providers.base import (
    ONLINE_BATCH_PREFIX,
    BatchProvider,
    BatchStatus,
    ItemResult,
    RequestItem,
    ShardState,
    ShardSubmission,
)

if TYPE_CHECKING:
    from llm_assets.resources.providers.online import OnlineSettings, OnlineStats
    from llm_assets.resources.storage import ArtifactStorage
    from llm_assets.spec import PipelineSpec

MAX_RECORDS = 50_000
MAX_NAME = 63
ANTHROPIC_VERSION = "bedrock-2023-05-31"
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
CUSTOM_ID_HEADER = "X-Llm-Assets-Custom-Id"
"""Sent with every bedrock-runtime call, so a call can be traced back to its item."""
_RATE_LIMIT_CODES = {
    "ThrottlingException",
    "ModelNotReadyException",
    "ServiceQuotaExceededException",
}
_TRANSIENT_CODES = {
    "ThrottlingException",
    "ServiceUnavailableException",
    "InternalServerException",
    "ServiceQuotaExceededException",
    "RequestTimeout",
    "RequestTimeoutException",
}


class IncompleteOutput(Exception):
    """A job's output files hold fewer records than its manifest counts."""


def input_format(spec: "PipelineSpec") -> Literal["anthropic", "converse"]:
    chosen = spec.model.options.get("format")
    if chosen in ("anthropic", "converse"):
        return chosen
    return "anthropic" if ".anthropic." in f".{spec.model.name}" else "converse"


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


def is_transient_aws(exc: BaseException) -> bool:
    name = type(exc).__name__
    if name in (
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
    ):
        return True
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    code = response.get("Error", {}).get("Code")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    return code in _TRANSIENT_CODES or status == 429 or status >= 500


def normalize_record(line: dict[str, Any]) -> ItemResult | None:
    """One `.out` line → ItemResult (Anthropic Messages or Converse output, or an error)."""
    record_id = line.get("recordId")
    if not record_id:
        return None
    error = line.get("error")
    if error:
        code = error.get("errorCode") if isinstance(error, dict) else None
        message = error.get("errorMessage") if isinstance(error, dict) else str(error)
        status = int(code) if isinstance(code, int | str) and str(code).isdigit() else None
        transient = status is not None and (status == 429 or status >= 500)
        return ItemResult(
            custom_id=record_id,
            succeeded=False,
            status_code=status,
            error_class="transient" if transient else "deterministic",
            error_code=str(code) if code is not None else "error",
            error_message=str(message or "record failed"),
        )
    output = line.get("modelOutput") or {}
    if "output" in output:  # Converse
        blocks = (output.get("output") or {}).get("message", {}).get("content") or []
        text = "".join(b.get("text", "") for b in blocks if isinstance(b, dict))
        usage = output.get("usage") or {}
        stop = output.get("stopReason")
        input_tokens = int(usage.get("inputTokens") or 0)
        output_tokens = int(usage.get("outputTokens") or 0)
        cached = int(usage.get("cacheReadInputTokens") or 0)
    else:  # Anthropic Messages
        blocks = output.get("content") or []
        text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        usage = output.get("usage") or {}
        stop = output.get("stop_reason")
        cached = int(usage.get("cache_read_input_tokens") or 0)
        input_tokens = int(usage.get("input_tokens") or 0) + cached
        input_tokens += int(usage.get("cache_creation_input_tokens") or 0)
        output_tokens = int(usage.get("output_tokens") or 0)
    return ItemResult(
        custom_id=record_id,
        succeeded=True,
        status_code=200,
        output_text=text,
        finish_reason="length" if stop in ("max_tokens", "length") else "stop",
        input_tokens=input_tokens,
        cached_input_tokens=cached,
        output_tokens=output_tokens,
    )


class BedrockBatchProvider(BatchProvider):
    """Model invocation jobs; control-plane calls retried here, boto3's retries off."""

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

    _clients: dict[str, Any] = PrivateAttr(default_factory=dict)
    _calling: threading.local = PrivateAttr(default_factory=threading.local)

    def _client(self, service: str) -> Any:
        if service not in self._clients:
            import boto3
            from botocore.config import Config

            self._clients[service] = boto3.client(
                service,
                region_name=self.region_name,
                endpoint_url=self.endpoint_url if service == "bedrock" else None,
                # Our retry layer only: botocore's own attempts would retry a create twice.
                config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
            )
        return self._clients[service]

    def call(self, describe: str, fn: Any) -> Any:
        import tenacity

        return tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.max_attempts),
            wait=tenacity.wait_random_exponential(
                multiplier=self.retry_base_seconds, max=self.retry_cap_seconds
            ),
            retry=tenacity.retry_if_exception(is_transient_aws),
            reraise=True,
        )(fn)

    def spec_problems(self, spec: "PipelineSpec") -> list[tuple[str, str]]:
        return bedrock_spec_problems(spec)

    def request_line(self, spec: "PipelineSpec", item: RequestItem) -> dict[str, Any]:
        if input_format(spec) == "anthropic":
            body: dict[str, Any] = {
                "anthropic_version": ANTHROPIC_VERSION,
                "max_tokens": spec.model.max_output_tokens,
                "temperature": spec.model.temperature,
                "messages": [{"role": "user", "content": item.user}],
            }
            if item.system:
                body["system"] = item.system
        else:
            body = {
                "messages": [{"role": "user", "content": [{"text": item.user}]}],
                "inferenceConfig": {
                    "maxTokens": spec.model.max_output_tokens,
                    "temperature": spec.model.temperature,
                },
            }
            if item.system:
                body["system"] = [{"text": item.system}]
        return {"recordId": item.custom_id, "modelInput": body}

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
        answer = self.call(
            "create job", lambda: self._client("bedrock").create_model_invocation_job(**request)
        )
        return str(answer["jobArn"])

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

    def _runtime_client(self, settings: "OnlineSettings") -> Any:
        import boto3
        from botocore.config import Config

        client = boto3.client(
            "bedrock-runtime",
            region_name=self.region_name,
            endpoint_url=self.runtime_endpoint_url,
            config=Config(
                retries={"total_max_attempts": 1, "mode": "standard"},
                read_timeout=settings.timeout_seconds,
                max_pool_connections=settings.concurrency,
            ),
        )
        current = self._calling

        def add_custom_id(params: dict[str, Any], **_: Any) -> None:
            custom_id = getattr(current, "custom_id", None)
            if custom_id:
                params.setdefault("headers", {})[CUSTOM_ID_HEADER] = custom_id

        client.meta.events.register("before-call.bedrock-runtime", add_custom_id)
        return client

    def run(
        self,
        spec: "PipelineSpec",
        requests: Iterable[tuple[str, dict[str, Any], int]],
        deliver: Callable[[list[ItemResult]], None],
        *,
        checkpoint_every: int,
        stop: Callable[[], bool] = lambda: False,
        progress: "Callable[[OnlineStats], None] | None" = None,
    ) -> "OnlineStats":
        """Send `(custom_id, modelInput, tokens)` requests to bedrock-runtime, paced and
        retried as the online provider does (`online.concurrency`, `rpm`, `tpm`,
        `max_tries`, `timeout_seconds`)."""
        from llm_assets.resources.providers.online import run_requests, settings_of

        settings = settings_of(spec)
        client = self._runtime_client(settings)
        converse = input_format(spec) == "converse"
        model = spec.model.name

        async def main() -> "OnlineStats":
            # boto3 blocks: each request in flight holds one thread of this pool.
            pool = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="bedrock-runtime")
            loop = asyncio.get_running_loop()

            async def send(custom_id: str, body: dict[str, Any]) -> tuple[ItemResult, None]:
                return await loop.run_in_executor(
                    pool, self._invoke, client, converse, model, custom_id, body
                )

            try:
                return await run_requests(
                    settings,
                    requests,
                    deliver,
                    send,
                    checkpoint_every=checkpoint_every,
                    stop=stop,
                    progress=progress,
                    backoff_base_seconds=self.retry_base_seconds,
                    backoff_cap_seconds=self.retry_cap_seconds,
                )
            finally:
                pool.shutdown(wait=True)

        return asyncio.run(main())

    def _invoke(
        self, client: Any, converse: bool, model: str, custom_id: str, body: dict[str, Any]
    ) -> tuple[ItemResult, None]:
        from botocore.exceptions import BotoCoreError, ClientError

        from llm_assets.resources.providers.online import RateLimited, Transient

        self._calling.custom_id = custom_id
        try:
            if converse:
                output = dict(client.converse(modelId=model, **body))
                output.pop("ResponseMetadata", None)
            else:
                answer = client.invoke_model(
                    modelId=model,
                    body=json.dumps(body).encode(),
                    contentType="application/json",
                    accept="application/json",
                )
                output = json.loads(answer["body"].read())
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code") or "error")
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if code in _RATE_LIMIT_CODES or status == 429:
                raise RateLimited(None) from exc
            message = str(exc.response.get("Error", {}).get("Message") or exc)[:1000]
            transient = is_transient_aws(exc) or status == 408  # ModelTimeoutException
            failure = ItemResult(
                custom_id=custom_id,
                succeeded=False,
                status_code=status or None,
                error_class="transient" if transient else "deterministic",
                error_code=code,
                error_message=message,
            )
            if failure.error_class == "transient":
                raise Transient(failure) from exc
            return failure, None
        except BotoCoreError as exc:  # connection reset, read timeout, endpoint unreachable
            raise Transient(
                ItemResult(
                    custom_id=custom_id,
                    succeeded=False,
                    error_class="transient",
                    error_code=type(exc).__name__,
                    error_message=str(exc)[:1000],
                )
            ) from exc
        finally:
            self._calling.custom_id = None
        result = normalize_record({"recordId": custom_id, "modelOutput": output})
        assert result is not None
        return result, None
