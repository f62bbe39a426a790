"""A fake of Amazon Bedrock on loopback: the batch inference control plane (`bedrock`, model
invocation jobs) and the runtime data plane (`bedrock-runtime`, InvokeModel and Converse), both
real REST-JSON HTTP on one port.

moto implements neither, so this fake speaks the wire protocols itself (paths, member names,
status values and error shapes from botocore's service models `bedrock/2023-04-20` and
`bedrock-runtime/2023-09-30`), and unmodified `boto3.client("bedrock", endpoint_url=...)` and
`boto3.client("bedrock-runtime", endpoint_url=...)` drive it through the same `endpoint_url`
(their paths do not overlap: `/model-invocation-job...` against `/model/{modelId}/...`). Batch
jobs read their JSONL input from, and write their output to, a real S3 endpoint (the moto server
of tests/moto_server.py), through boto3 like Bedrock itself. A batch record and a runtime call
with the same body get the same answer (text, stop reason, usage), from one shared function.

Jobs advance on GetModelInvocationJob calls rather than wall time, so tests need no sleeps. State
lives in memory; `restart()` only drops connections.

Readings of the real service worth knowing (each is a choice a test may pin):

* Errors are the REST-JSON shape botocore parses: the status the service model gives the error
  shape, an `x-amzn-ErrorType` header and a JSON body `{"message": ...}`. ConflictException is
  HTTP 400 because the service model says so.
* Create is idempotent on `clientRequestToken` (botocore fills one in and reuses it on its own
  retries): the same token with the same request answers the first job's ARN and creates
  nothing; the same token with a different request is a ConflictException. A job name already
  used by another job is a ValidationException "The provided job name is currently in use.", as
  Bedrock's other job APIs answer.
* Output goes under a folder named after the job id: `<output s3Uri>/<jobId>/<input file>.out`
  for every input file, and `<output s3Uri>/<jobId>/manifest.json.out`, in the line formats of
  "View the results of a batch inference job" in the Bedrock user guide. A record that errored
  has an `error` object in place of `modelOutput`; output lines are not in input order.
* The job's `modelInvocationType` decides the record format, as on AWS: `InvokeModel` (the
  default) takes Anthropic Messages bodies, `Converse` takes Converse bodies. A body of the
  wrong shape is a record error (errorCode 400), not a job failure: validation "doesn't check
  if the modelInput value matches the request body for the model".
* A job whose records all ran ends `Completed` even when some (or all) records errored: only
  the manifest and the counts tell. `PartiallyCompleted` means not every record was processed
  (a "skip" record fault, or a `job_outcome`), which is what the status documentation says.
* `Expired` means scheduled but never started, so an expired job leaves `Scheduled` for
  `Expired` directly and writes no output. For that reason `job_outcome` is asked when the job
  leaves `Scheduled`; every other outcome takes effect when it leaves `InProgress`.
* Stopping an ended job is a ValidationException whose message ends "State was: <status>".
* The runtime client signs with signing name `bedrock` (the `signingName` of the
  bedrock-runtime service model), so both planes require a credential scoped to `bedrock`.
* InvokeModel takes the same body an `InvokeModel` batch record takes (Anthropic Messages,
  whatever the model id, as the batch path does) and answers the Anthropic Messages response
  with `X-Amzn-Bedrock-Input-Token-Count`, `-Output-Token-Count` and `-Invocation-Latency`
  headers; Converse takes the Converse members (modelId is in the path, not the body). A body
  the model rejects is a ValidationException (400) carrying the same message the batch path
  writes into the record's error line.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from collections import deque
from collections.abc import Callable, Collection
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, unquote, urlsplit

from tests.fakes.base import FaultInjectingServer, Reply, Request
from tests.fakes.bedrock_api import (
    ACCOUNT_ID,
    CREDENTIAL_RE,
    CUSTOM_ID_HEADER,
    DEFAULT_TIMEOUT_HOURS,
    IDENTIFIER_RE,
    IN_PROGRESS,
    MAX_RECORDS,
    MIN_RECORDS,
    STOPPABLE,
    TERMINAL,
    AwsError,
    error_reply,
    injected_error,
    job_id_of,
    quota_exceeded,
    runtime_target,
    validate_create,
)
from tests.fakes.bedrock_jobs import JobLifecycle, JobOutcome, RecordFault, ValidationFailure, seq
from tests.fakes.bedrock_model import Responder
from tests.fakes.bedrock_runtime import RuntimeCalls
from tests.fakes.common import CallLog, ControlFault, LostResponseFault, delay_fault

# The fake, the faults tests inject into it, and the helpers tests read its state with.
__all__ = [
    "CUSTOM_ID_HEADER",
    "FakeBedrock",
    "LostResponseFault",
    "delay_fault",
    "job_id_of",
    "runtime_calls",
]

JSON = dict[str, Any]


def runtime_calls(fake: FakeBedrock) -> list[JSON]:
    """The call-log entries of InvokeModel and Converse calls, in order."""
    return [c for c in fake.calls.entries() if c.get("operation") in ("InvokeModel", "Converse")]


class FakeBedrock(JobLifecycle, RuntimeCalls, FaultInjectingServer):
    """Bedrock on 127.0.0.1: the batch inference control plane (`bedrock` service, model
    invocation jobs) and the runtime (`bedrock-runtime` service, InvokeModel and Converse).

    Knobs (plain attributes, read at the moment they matter):

    * `polls_per_state`: how many GetModelInvocationJob calls each status answers before the
      next one moves the job on (Submitted -> Validating -> Scheduled -> InProgress -> end;
      Stopping -> Stopped). 0 takes the job to its end on the first Get.
    * `min_records`, `max_records`: the per-job record quotas (AWS: 100 and 50,000). A job
      outside them fails in Validating with the service's message.
    * `validation_failure`: a message, or `(job) -> message | None`; the job fails in
      Validating with it.
    * `job_outcome(job)`: "Completed", "PartiallyCompleted", "Failed", "Expired" or "Stopped",
      asked once when the job leaves Scheduled (`job` is the description plus "records").
      "Expired" ends the job there with no output; "PartiallyCompleted" and "Stopped" process
      the first half of the records; "Failed" writes nothing. None (no knob, or the knob
      answering None for this job): Completed when every record was processed, else
      PartiallyCompleted.
    * `record_fault(record_id, model_input)`: None, "skip" (never processed: no output line,
      not counted as processed), "error" (a 400 error line), "throttled" (429) or
      "server_error" (500). Also asked on every runtime call that gets past `runtime_rpm` and
      `runtime_models` and has a JSON object body, with `record_id` the call's
      `X-Llm-Assets-Custom-Id` header (None when absent) and `model_input` its parsed body;
      there "error" is a 400 ValidationException, "throttled" a 429 ThrottlingException,
      "server_error" a 500 InternalServerException and "skip" a 408 ModelTimeoutException.
    * `responder(model_input)`: the model's text; a deterministic JSON answer when None. The
      same for batch records and runtime calls, as are maxTokens truncation (stop reason
      "max_tokens" past 4 characters a token) and usage (4 characters a token).
    * `runtime_rpm`: at most this many runtime calls (InvokeModel and Converse together) are
      let in per rolling 60 s of `clock()`; the rest are 429 ThrottlingException "Too many
      requests, please wait before trying again." before anything else is looked at, and do
      not count against the window. None (the default): no limit.
    * `runtime_models`: the model ids the runtime knows (as in the path, unquoted); another is
      a 404 ResourceNotFoundException "Could not resolve the foundation model from the
      provided model identifier.". None (the default): every model id.
    * `max_active_jobs`: Bedrock's quota of batch inference jobs in progress per model
      (Submitted, Validating, Scheduled, InProgress and Stopping jobs of the same `modelId`
      count). A CreateModelInvocationJob that would go over it is a 400
      ServiceQuotaExceededException "You have exceeded the number of batch inference jobs
      that can be submitted or in progress at once for model <modelId> (quota: <n>). Please
      try again later." and creates nothing; an idempotent replay (a `clientRequestToken` of an
      existing job) answers that job and is never refused. None (the default): no quota.
    * `shuffle_output`: output lines not in input order (deterministic per job).
    * `clock()`: the current time (UTC datetime), replaceable so tests can place jobs in time.

    `faults` (a FaultPlan of ControlFault) are matched by HTTP method and a substring of the raw
    path (query included; job ARNs in paths are percent-encoded) before anything else, in this
    order: `delay_seconds`; `reset_connection` (a TCP RST, nothing handled); a `status` >= 400
    answered with the REST-JSON error of that status (429 ThrottlingException, 500
    InternalServerException, 503 ServiceUnavailableException, ...). `LostResponseFault` handles
    the call, then resets instead of answering. Note "/model-invocation-job" is also a
    substring of the list path "/model-invocation-jobs".

    `calls`: one entry per HTTP call (ts, method, path, query, status, request_id, operation,
    attempt from botocore's amz-sdk-request header, job_id, client_request_token, replay for an
    idempotent create answered from an earlier job, record_id from the X-Llm-Assets-Custom-Id
    header or None, fault, error_code). Runtime calls have operation "InvokeModel" or
    "Converse" and model_id (the unquoted path segment) even when a `faults` entry answered
    them, and input_tokens / output_tokens when answered 200. `runtime_successes()` counts the
    200 answers per record id. `server_errors`:
    tracebacks of the fake's own crashes, answered as 500; tests assert it stays empty.
    """

    server_name: ClassVar[str] = "fake-bedrock/1"

    def __init__(
        self,
        s3_endpoint_url: str,
        *,
        state_dir: Path | None = None,
        port: int | None = None,
        account_id: str = ACCOUNT_ID,
    ) -> None:
        calls = CallLog()
        if state_dir is not None:
            Path(state_dir).mkdir(parents=True, exist_ok=True)
            calls = CallLog(Path(state_dir) / "calls.jsonl")
        super().__init__(calls, port=port, poll_interval=0.01)
        self.s3_endpoint_url = s3_endpoint_url
        self.account_id = account_id
        self.polls_per_state: int = 1
        self.min_records: int = MIN_RECORDS
        self.max_records: int = MAX_RECORDS
        self.validation_failure: ValidationFailure = None
        self.job_outcome: JobOutcome | None = None
        self.record_fault: RecordFault | None = None
        self.responder: Responder | None = None
        self.shuffle_output: bool = True
        self.runtime_rpm: int | None = None
        self.runtime_models: Collection[str] | None = None
        self.max_active_jobs: int | None = None
        self.clock: Callable[[], datetime] = lambda: datetime.now(UTC)
        self._runtime_window: deque[float] = deque()
        self._jobs: dict[str, JSON] = {}
        self._tokens: dict[str, str] = {}
        self._lock = threading.RLock()
        self._s3_client: Any = None

    @property
    def endpoint_url(self) -> str:
        """The `endpoint_url` boto3 clients of both services take."""
        return self.base_url

    def jobs(self) -> list[JSON]:
        """Every job created, as GetModelInvocationJob describes it, in creation order; reading
        them does not advance them."""
        with self._lock:
            return [self._describe(job) for job in sorted(self._jobs.values(), key=seq)]

    def submitted_custom_ids(self) -> list[str]:
        """The recordId of every record of every job that got past validation, in creation
        order: what Bedrock took in to run."""
        with self._lock:
            jobs = sorted(self._jobs.values(), key=seq)
            return [record["recordId"] for job in jobs for record in job["records"] or []]

    def job(self, job_identifier: str) -> JSON | None:
        """One job's description (by ARN or id) without advancing it, or None."""
        with self._lock:
            found = self._jobs.get(job_id_of(job_identifier))
            return None if found is None else self._describe(found)

    def output_uri(self, job_identifier: str) -> str:
        """The S3 folder a job writes into: `<output s3Uri>/<jobId>/`."""
        with self._lock:
            job = self._jobs[job_id_of(job_identifier)]
            bucket, prefix = self._output_location(job)
            return f"s3://{bucket}/{prefix}"

    def _find(self, identifier: str) -> JSON:
        if not IDENTIFIER_RE.fullmatch(identifier):
            raise AwsError(
                "ValidationException",
                f"1 validation error detected: Value '{identifier}' at 'jobIdentifier' failed to "
                f"satisfy constraint: Member must satisfy regular expression pattern: "
                f"{IDENTIFIER_RE.pattern}",
            )
        job = self._jobs.get(job_id_of(identifier))
        if job is None or (identifier.startswith("arn:") and identifier != job["arn"]):
            raise AwsError(
                "ResourceNotFoundException",
                f"The specified model invocation job {identifier} could not be found.",
                404,
            )
        return job

    def _create(self, body: Any, region: str, log: JSON) -> JSON:
        validate_create(body)
        token = body.get("clientRequestToken")
        log["client_request_token"] = token
        fingerprint = json.dumps(
            {k: v for k, v in body.items() if k != "clientRequestToken"}, sort_keys=True
        )
        with self._lock:
            if token is not None and token in self._tokens:
                earlier = self._jobs[self._tokens[token]]
                if earlier["fingerprint"] != fingerprint:
                    raise AwsError(
                        "ConflictException",
                        f"The request with client token {token} does not match the request "
                        "originally made with that token.",
                    )
                log.update(job_id=earlier["id"], replay=True)
                return {"jobArn": earlier["arn"]}
            if any(job["name"] == body["jobName"] for job in self._jobs.values()):
                raise AwsError("ValidationException", "The provided job name is currently in use.")
            limit = self.max_active_jobs
            if limit is not None and self._in_progress(body["modelId"]) >= limit:
                raise quota_exceeded(body["modelId"], limit)
            job_id = self._new_job_id()
            now = self.clock()
            timeout = body.get("timeoutDurationInHours") or DEFAULT_TIMEOUT_HOURS
            job: JSON = {
                "id": job_id,
                "arn": f"arn:aws:bedrock:{region}:{self.account_id}:model-invocation-job/{job_id}",
                "seq": len(self._jobs),
                "name": body["jobName"],
                "token": token,
                "fingerprint": fingerprint,
                "body": json.loads(fingerprint),
                "status": "Submitted",
                "message": None,
                "submit_time": now,
                "last_modified": now,
                "end_time": None,
                "expiration": now + timedelta(hours=timeout),
                "timeout": timeout,
                "polls": 0,
                "outcome": None,
                "stopped_from": None,
                "records": None,
                "counts": None,
            }
            self._jobs[job_id] = job
            if token is not None:
                self._tokens[token] = job_id
            log["job_id"] = job_id
            return {"jobArn": job["arn"]}

    def _in_progress(self, model_id: str) -> int:
        """Jobs of `model_id` that count against the in-progress quota."""
        return sum(
            1
            for job in self._jobs.values()
            if job["body"]["modelId"] == model_id and job["status"] in IN_PROGRESS
        )

    def _new_job_id(self) -> str:
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
        while True:
            job_id = "".join(secrets.choice(alphabet) for _ in range(12))
            if job_id not in self._jobs:
                return job_id

    def _get(self, identifier: str, log: JSON) -> JSON:
        with self._lock:
            job = self._find(identifier)
            log["job_id"] = job["id"]
            if job["status"] not in TERMINAL:
                if self.polls_per_state <= 0:
                    while job["status"] not in TERMINAL:
                        self._advance(job)
                elif job["polls"] >= self.polls_per_state:
                    self._advance(job)
                job["polls"] += 1
            log["job_status"] = job["status"]
            return self._describe(job)

    def _stop(self, identifier: str, log: JSON) -> JSON:
        with self._lock:
            job = self._find(identifier)
            log["job_id"] = job["id"]
            if job["status"] in TERMINAL:
                raise AwsError(
                    "ValidationException",
                    f"Job {job['arn']} cannot be stopped because it is no longer running. "
                    f"State was: {job['status']}",
                )
            if job["status"] in STOPPABLE:
                job["stopped_from"] = job["status"]
                self._set_status(job, "Stopping")
            log["job_status"] = job["status"]
            return {}

    def new_request_id(self) -> str:
        return secrets.token_hex(16)

    def response_headers(self, request: Request) -> dict[str, str]:
        return {"x-amzn-RequestId": request.request_id}

    def call_entry(self, request: Request) -> JSON:
        """The common entry, the path unquoted, plus what each operation fills in."""
        entry = super().call_entry(request)
        entry.update(
            path=unquote(request.path),
            operation=None,
            job_id=None,
            client_request_token=None,
            record_id=request.headers.get(CUSTOM_ID_HEADER),
        )
        runtime = runtime_target(request.method, request.target)
        if runtime is not None:
            entry["operation"], entry["model_id"] = runtime
        attempt = re.search(r"attempt=(\d+)", request.headers.get("amz-sdk-request") or "")
        if attempt:
            entry["attempt"] = int(attempt.group(1))
        return entry

    def fault_reply(self, fault: ControlFault, request: Request) -> Reply:
        return injected_error(fault)

    def crash_reply(self, request: Request) -> Reply:
        return error_reply(500, "InternalServerException", "The fake crashed; see server_errors.")

    def answer(self, request: Request, log: JSON) -> Reply:
        method, raw_path, body = request.method, request.target, request.body
        try:
            authorization = request.headers.get("Authorization") or ""
            credential = CREDENTIAL_RE.search(authorization)
            if not authorization.startswith("AWS4-HMAC-SHA256 ") or credential is None:
                raise AwsError(
                    "MissingAuthenticationTokenException", "Missing Authentication Token", 403
                )
            region, service = credential.group(1), credential.group(2)
            # Both planes: botocore signs bedrock-runtime calls with signing name "bedrock" too.
            if service != "bedrock":
                raise AwsError(
                    "InvalidSignatureException",
                    f"Credential should be scoped to correct service: 'bedrock', not '{service}'.",
                    403,
                )
            runtime = runtime_target(method, raw_path)
            if runtime is not None:
                operation, model_id = runtime
                return self._runtime(operation, model_id, body, request.request_id, log)
            return Reply(200, self._route(method, raw_path, region, body, log))
        except AwsError as err:
            return error_reply(err.status, err.code, err.message)

    def _route(self, method: str, raw_path: str, region: str, body: bytes, log: JSON) -> JSON:
        split = urlsplit(raw_path)
        parts = [unquote(part) for part in split.path.strip("/").split("/")]
        if parts == ["model-invocation-job"] and method == "POST":
            log["operation"] = "CreateModelInvocationJob"
            try:
                parsed = json.loads(body or b"{}")
            except ValueError:
                raise AwsError(
                    "SerializationException", "The request body is not valid JSON."
                ) from None
            if isinstance(parsed, dict):
                log["client_request_token"] = parsed.get("clientRequestToken")
            return self._create(parsed, region, log)
        if parts == ["model-invocation-jobs"] and method == "GET":
            log["operation"] = "ListModelInvocationJobs"
            query = {key: values[-1] for key, values in parse_qs(split.query).items()}
            return self._list(query)
        if len(parts) == 2 and parts[0] == "model-invocation-job" and method == "GET":
            log["operation"] = "GetModelInvocationJob"
            return self._get(parts[1], log)
        stop = len(parts) == 3 and parts[0] == "model-invocation-job" and parts[2] == "stop"
        if stop and method == "POST":
            log["operation"] = "StopModelInvocationJob"
            return self._stop(parts[1], log)
        raise AwsError(
            "UnknownOperationException", f"No operation matches {method} {split.path}", 404
        )
