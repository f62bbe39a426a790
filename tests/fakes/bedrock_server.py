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

import base64
import contextlib
import hashlib
import json
import random
import re
import secrets
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar
from urllib.parse import parse_qs, unquote, urlsplit

import boto3
from botocore.exceptions import ClientError

from tests.fakes.anthropic_server import (
    LostResponseFault,
    approx_tokens,
    default_responder,
    delay_fault,
)
from tests.fakes.common import CallLog, ControlFault, FaultPlan, ServerThread

__all__ = ["FakeBedrock", "LostResponseFault", "delay_fault", "job_id_of"]

JSON = dict[str, Any]
ACCOUNT_ID = "123456789012"
DEFAULT_REGION = "us-east-1"
MIN_RECORDS = 100
MAX_RECORDS = 50_000
DEFAULT_TIMEOUT_HOURS = 168
ANTHROPIC_VERSION = "bedrock-2023-05-31"

STATUSES = (
    "Submitted",
    "Validating",
    "Scheduled",
    "InProgress",
    "Completed",
    "PartiallyCompleted",
    "Failed",
    "Stopping",
    "Stopped",
    "Expired",
)
TERMINAL = frozenset({"Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired"})
STOPPABLE = frozenset({"Submitted", "Validating", "Scheduled", "InProgress"})
OUTCOMES = frozenset({"Completed", "PartiallyCompleted", "Failed", "Expired", "Stopped"})
RECORD_ERRORS = {
    "error": (400, "Malformed input request, please reformat your input and try again."),
    "throttled": (429, "Too many requests, please wait before trying again."),
    "server_error": (500, "Internal server error"),
}
# The header our provider adds to every runtime call (through botocore's event system) so the
# fake knows which item a call is for; runtime calls have no recordId of their own.
CUSTOM_ID_HEADER = "X-Llm-Assets-Custom-Id"
RUNTIME_OPERATIONS = {"invoke": "InvokeModel", "converse": "Converse"}
# What a record fault is on the runtime: (status, error code, message).
RUNTIME_RECORD_ERRORS = {
    "error": (400, "ValidationException", RECORD_ERRORS["error"][1]),
    "throttled": (429, "ThrottlingException", RECORD_ERRORS["throttled"][1]),
    "server_error": (500, "InternalServerException", RECORD_ERRORS["server_error"][1]),
    "skip": (
        408,
        "ModelTimeoutException",
        "Model has timed out in processing the request. Try your request again.",
    ),
}

# Patterns and limits exactly as botocore's service model declares them.
JOB_NAME_PATTERN = r"[a-zA-Z0-9]{1,63}(-*[a-zA-Z0-9\+\-\.]){0,63}"
TOKEN_PATTERN = r"[a-zA-Z0-9]{1,256}(-*[a-zA-Z0-9]){0,256}"
ROLE_ARN_PATTERN = r"arn:aws(-[^:]+)?:iam::([0-9]{12})?:role/.+"
MODEL_ID_PATTERN = (
    r"(arn:aws(-[^:]+)?:bedrock:[a-z0-9-]{1,20}:(([0-9]{12}:custom-model/[a-z0-9-]{1,63}[.]{1}"
    r"[a-z0-9-:]{1,63}/[a-z0-9]{12}$)|(:foundation-model/([a-z0-9-]{1,63}[.]{1}[a-z0-9-]{1,63}"
    r"([.]?[a-z0-9-]{1,63})([:][a-z0-9-]{1,63}){0,2})|(([0-9a-zA-Z][_-]?)+)$)|([0-9]{12}:"
    r"(inference-profile|application-inference-profile)/[a-zA-Z0-9-:.]+$)))|([a-z0-9-]{1,63}"
    r"[.]{1}[a-z0-9-]{1,63}([.]?[a-z0-9-]{1,63})([:][a-z0-9-]{1,63}){0,2})|"
    r"(([0-9a-zA-Z][_-]?)+)"
)
S3_URI_PATTERN = (
    r"s3://[a-z0-9][-.a-z0-9]{1,61}[a-z0-9](?:/[-!_*'().a-z0-9A-Z]+(?:/[-!_*'().a-z0-9A-Z]+)*)?/?"
)
TAG_PATTERN = r"[a-zA-Z0-9\s._:/=+@-]*"
KMS_KEY_PATTERN = (
    r"(arn:aws(-[^:]+)?:kms:[a-zA-Z0-9-]*:[0-9]{12}:((key/[a-zA-Z0-9-]{36})|"
    r"(alias/[a-zA-Z0-9-_/]+)))|([a-zA-Z0-9-]{36})|(alias/[a-zA-Z0-9-_/]+)"
)
ACCOUNT_PATTERN = r"[0-9]{12}"
IDENTIFIER_RE = re.compile(
    r"((arn:aws(-[^:]+)?:bedrock:[a-z0-9-]{1,20}:[0-9]{12}:model-invocation-job/)?[a-z0-9]{12})"
)
CREDENTIAL_RE = re.compile(r"Credential=[^/]+/\d{8}/([^/]+)/([^/]+)/aws4_request")

ANTHROPIC_KEYS = frozenset(
    {
        "anthropic_version",
        "anthropic_beta",
        "max_tokens",
        "messages",
        "system",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "metadata",
    }
)
CONVERSE_KEYS = frozenset(
    {
        "messages",
        "system",
        "inferenceConfig",
        "toolConfig",
        "guardrailConfig",
        "additionalModelRequestFields",
        "additionalModelResponseFieldPaths",
        "promptVariables",
        "requestMetadata",
        "performanceConfig",
    }
)

ERROR_CODES = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    409: "ConflictException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}
FAULT_MESSAGES = {
    408: RUNTIME_RECORD_ERRORS["skip"][2],
    429: "Too many requests, please wait before trying again.",
    500: "Internal server error",
    503: "Service unavailable, please try again later.",
}

# record_id is None for a runtime call that carries no X-Llm-Assets-Custom-Id header.
RecordFault = Callable[[str | None, JSON], str | None]
JobOutcome = Callable[[JSON], str | None]
ValidationFailure = str | Callable[[JSON], str | None] | None
Responder = Callable[[JSON], str]


class AwsError(Exception):
    """Raised inside a route to answer with the REST-JSON error shape."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


@dataclass
class Reply:
    status: int
    body: JSON
    headers: dict[str, str] = field(default_factory=dict)
    error_code: str | None = None


def iso(moment: datetime) -> str:
    """ISO 8601 with milliseconds, the service's timestamp format."""
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def job_id_of(job_arn: str) -> str:
    """The 12-character job id at the end of a job ARN (what names the output folder)."""
    return job_arn.rsplit("/", 1)[-1]


def split_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, key prefix) of an s3:// URI; the prefix keeps its trailing slash, if any."""
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


def anthropic_model_name(model_id: str) -> str:
    """The `model` an Anthropic body answers with: `anthropic.claude-x-v1:0` -> `claude-x`."""
    name = model_id.rsplit("/", 1)[-1]
    if "anthropic." in name:
        name = name.split("anthropic.", 1)[1]
    return re.sub(r"-v\d+(:\d+)?$", "", name)


def runtime_target(method: str, raw_path: str) -> tuple[str, str] | None:
    """(operation, model id) of a runtime call, `POST /model/{modelId}/invoke|converse` with
    the model id percent-encoded as botocore sends it; None for any other request."""
    parts = urlsplit(raw_path).path.strip("/").split("/")
    if method != "POST" or len(parts) != 3 or parts[0] != "model" or not parts[1]:
        return None
    operation = RUNTIME_OPERATIONS.get(parts[2])
    return None if operation is None else (operation, unquote(parts[1]))


@dataclass
class ModelAnswer:
    """What the model makes of one body: a rejection message, or its output and usage."""

    error: str | None = None
    output: JSON | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    latency_ms: int = 0


class _Violations:
    """Collects constraint violations and raises them as one AWS-style ValidationException."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, value: Any, where: str, constraint: str) -> None:
        shown = "null" if value is None else f"'{value}'"
        self.items.append(
            f"Value {shown} at '{where}' failed to satisfy constraint: Member must {constraint}"
        )

    def required(self, body: JSON, key: str, where: str) -> bool:
        if body.get(key) is None:
            self.add(None, where, "not be null")
            return False
        return True

    def string(
        self,
        value: Any,
        where: str,
        *,
        pattern: str | None = None,
        min_len: int = 0,
        max_len: int | None = None,
    ) -> None:
        if value is None:
            return
        if not isinstance(value, str):
            self.add(value, where, "be a string")
            return
        if len(value) < min_len:
            self.add(value, where, f"have length greater than or equal to {min_len}")
        if max_len is not None and len(value) > max_len:
            self.add(value, where, f"have length less than or equal to {max_len}")
        if pattern is not None and not re.fullmatch(pattern, value):
            self.add(value, where, f"satisfy regular expression pattern: {pattern}")

    def enum(self, value: Any, where: str, allowed: tuple[str, ...]) -> None:
        if value is not None and value not in allowed:
            self.add(value, where, f"satisfy enum value set: [{', '.join(allowed)}]")

    def integer(self, value: Any, where: str, low: int, high: int) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(value, where, "be an integer")
        elif value < low:
            self.add(value, where, f"have value greater than or equal to {low}")
        elif value > high:
            self.add(value, where, f"have value less than or equal to {high}")

    def union(self, value: Any, where: str, member: str) -> JSON | None:
        """A union structure: exactly one member set; this fake knows only `member`."""
        if value is None:
            return None
        if not isinstance(value, dict) or set(value) != {member}:
            self.add(value, where, f"have exactly one member set, and it must be {member}")
            return None
        inner = value[member]
        if not isinstance(inner, dict):
            self.add(inner, f"{where}.{member}", "be a structure")
            return None
        return inner

    def raise_if_any(self) -> None:
        if self.items:
            count = len(self.items)
            noun = "error" if count == 1 else "errors"
            raise AwsError(
                "ValidationException",
                f"{count} validation {noun} detected: " + "; ".join(self.items),
            )


def validate_create(body: Any) -> None:
    """CreateModelInvocationJob's request constraints, every violation reported at once."""
    if not isinstance(body, dict):
        raise AwsError(
            "SerializationException", "Start of structure or map found where not expected."
        )
    check = _Violations()
    for key in ("jobName", "roleArn", "modelId", "inputDataConfig", "outputDataConfig"):
        check.required(body, key, key)
    check.string(body.get("jobName"), "jobName", pattern=JOB_NAME_PATTERN, min_len=1, max_len=63)
    check.string(body.get("roleArn"), "roleArn", pattern=ROLE_ARN_PATTERN, max_len=2048)
    check.string(
        body.get("clientRequestToken"),
        "clientRequestToken",
        pattern=TOKEN_PATTERN,
        min_len=1,
        max_len=256,
    )
    check.string(body.get("modelId"), "modelId", pattern=MODEL_ID_PATTERN, min_len=1, max_len=2048)
    check.integer(body.get("timeoutDurationInHours"), "timeoutDurationInHours", 24, 168)
    check.enum(body.get("modelInvocationType"), "modelInvocationType", ("InvokeModel", "Converse"))
    s3_in = check.union(body.get("inputDataConfig"), "inputDataConfig", "s3InputDataConfig")
    if s3_in is not None:
        where = "inputDataConfig.s3InputDataConfig"
        if check.required(s3_in, "s3Uri", f"{where}.s3Uri"):
            uri = s3_in["s3Uri"]
            check.string(uri, f"{where}.s3Uri", pattern=S3_URI_PATTERN, min_len=1, max_len=1024)
        check.enum(s3_in.get("s3InputFormat"), f"{where}.s3InputFormat", ("JSONL",))
        check.string(s3_in.get("s3BucketOwner"), f"{where}.s3BucketOwner", pattern=ACCOUNT_PATTERN)
    s3_out = check.union(body.get("outputDataConfig"), "outputDataConfig", "s3OutputDataConfig")
    if s3_out is not None:
        where = "outputDataConfig.s3OutputDataConfig"
        if check.required(s3_out, "s3Uri", f"{where}.s3Uri"):
            uri = s3_out["s3Uri"]
            check.string(uri, f"{where}.s3Uri", pattern=S3_URI_PATTERN, min_len=1, max_len=1024)
        check.string(
            s3_out.get("s3EncryptionKeyId"),
            f"{where}.s3EncryptionKeyId",
            pattern=KMS_KEY_PATTERN,
            min_len=1,
            max_len=2048,
        )
        check.string(s3_out.get("s3BucketOwner"), f"{where}.s3BucketOwner", pattern=ACCOUNT_PATTERN)
    tags = body.get("tags")
    if tags is not None:
        if not isinstance(tags, list) or len(tags) > 200:
            check.add(tags, "tags", "have length less than or equal to 200")
        else:
            for index, tag in enumerate(tags, start=1):
                where = f"tags.{index}.member"
                if not isinstance(tag, dict):
                    check.add(tag, where, "be a structure")
                    continue
                if check.required(tag, "key", f"{where}.key"):
                    key = tag["key"]
                    check.string(key, f"{where}.key", pattern=TAG_PATTERN, min_len=1, max_len=128)
                if check.required(tag, "value", f"{where}.value"):
                    value = tag["value"]
                    check.string(value, f"{where}.value", pattern=TAG_PATTERN, max_len=256)
    vpc = body.get("vpcConfig")
    if vpc is not None:
        for key in ("subnetIds", "securityGroupIds"):
            if not isinstance(vpc, dict) or not isinstance(vpc.get(key), list) or not vpc[key]:
                check.add(None, f"vpcConfig.{key}", "have length greater than or equal to 1")
    check.raise_if_any()


def _text_of(content: Any) -> str:
    """The text of an Anthropic or Converse `content` / `system` value."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(block["text"])
            for block in content
            if isinstance(block, dict) and isinstance(block.get("text"), str)
        )
    return ""


def _input_chars(model_input: JSON) -> int:
    chars = len(_text_of(model_input.get("system")))
    for message in model_input.get("messages", []):
        if isinstance(message, dict):
            chars += len(_text_of(message.get("content")))
    return chars


def anthropic_input_error(model_input: Any) -> str | None:
    """Why an Anthropic Messages body would be rejected by the model, or None."""
    if not isinstance(model_input, dict):
        return "Malformed input request: #: expected type: JSONObject, please reformat your input"
    for key in model_input:
        if key not in ANTHROPIC_KEYS:
            return f"{key}: Extra inputs are not permitted"
    version = model_input.get("anthropic_version")
    if version is None:
        return "anthropic_version: Field required"
    if version != ANTHROPIC_VERSION:
        return f"anthropic_version: Input should be '{ANTHROPIC_VERSION}'"
    max_tokens = model_input.get("max_tokens")
    if max_tokens is None:
        return "max_tokens: Field required"
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens: Input should be greater than or equal to 1"
    messages = model_input.get("messages")
    if messages is None:
        return "messages: Field required"
    if not isinstance(messages, list) or not messages:
        return "messages: List should have at least 1 item after validation, not 0"
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            return f"messages.{index}.role: Input should be 'user' or 'assistant'"
        if not isinstance(message.get("content"), str | list):
            return f"messages.{index}.content: Field required"
    system = model_input.get("system")
    if system is not None and not isinstance(system, str | list):
        return "system: Input should be a valid string or a list of text blocks"
    return None


def converse_input_error(model_input: Any) -> str | None:
    """Why a Converse body would be rejected, or None (Converse's own message style)."""
    if not isinstance(model_input, dict):
        return "Malformed input request: the record's modelInput is not a JSON object"
    for key in model_input:
        if key not in CONVERSE_KEYS:
            return f"Malformed input request: extraneous key [{key}] is not permitted"
    check = _Violations()
    messages = model_input.get("messages")
    if messages is None:
        check.add(None, "messages", "not be null")
    elif not isinstance(messages, list) or not messages:
        check.add(messages, "messages", "have length greater than or equal to 1")
    else:
        for index, message in enumerate(messages, start=1):
            where = f"messages.{index}.member"
            if not isinstance(message, dict):
                check.add(message, where, "be a structure")
                continue
            check.enum(message.get("role"), f"{where}.role", ("user", "assistant"))
            if message.get("role") is None:
                check.add(None, f"{where}.role", "not be null")
            content = message.get("content")
            if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
                check.add(None, f"{where}.content", "be a list of content blocks")
    system = model_input.get("system")
    if system is not None and (
        not isinstance(system, list) or not all(isinstance(b, dict) for b in system)
    ):
        check.add(None, "system", "be a list of system content blocks")
    config = model_input.get("inferenceConfig")
    if config is not None:
        if not isinstance(config, dict):
            check.add(None, "inferenceConfig", "be a structure")
        else:
            check.integer(config.get("maxTokens"), "inferenceConfig.maxTokens", 1, 1_000_000)
    try:
        check.raise_if_any()
    except AwsError as err:
        return err.message
    return None


def _as_anthropic_params(model_input: JSON) -> JSON:
    """A Converse body in the shape `default_responder` reads (content blocks with a type)."""
    messages = [
        {
            "role": message.get("role"),
            "content": [{"type": "text", "text": _text_of(message.get("content"))}],
        }
        for message in model_input.get("messages", [])
        if isinstance(message, dict)
    ]
    return {"messages": messages}


class _QuickServerThread(ServerThread):
    """A ServerThread whose stop() takes milliseconds, not the default 0.5 s poll interval."""

    def start(self) -> None:
        ThreadingHTTPServer.allow_reuse_address = True
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler_factory())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self.thread.start()


class _MemoryCallLog:
    """CallLog's interface, in memory, for a fake given no state directory."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._entries: list[JSON] = []

    def record(self, entry: JSON) -> None:
        with self.lock:
            self._entries.append(json.loads(json.dumps(entry)))

    def entries(self) -> list[JSON]:
        with self.lock:
            return [dict(entry) for entry in self._entries]


class FakeBedrock:
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

    def __init__(
        self,
        s3_endpoint_url: str,
        *,
        state_dir: Path | None = None,
        port: int | None = None,
        account_id: str = ACCOUNT_ID,
    ) -> None:
        self.s3_endpoint_url = s3_endpoint_url
        self.account_id = account_id
        self.faults = FaultPlan()
        self.calls: CallLog | _MemoryCallLog
        if state_dir is not None:
            Path(state_dir).mkdir(parents=True, exist_ok=True)
            self.calls = CallLog(Path(state_dir) / "calls.jsonl")
        else:
            self.calls = _MemoryCallLog()
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
        self.clock: Callable[[], datetime] = lambda: datetime.now(UTC)
        self.server_errors: list[str] = []
        self._runtime_window: deque[float] = deque()
        self._jobs: dict[str, JSON] = {}
        self._tokens: dict[str, str] = {}
        self._lock = threading.RLock()
        self._s3_client: Any = None
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._server = _QuickServerThread(self._handler_class, port)

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeBedrock:
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop listening and drop kept-alive connections, so clients really see the outage."""
        self._server.stop()
        with self._connections_lock:
            open_connections = list(self._connections)
            self._connections.clear()
        for conn in open_connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> FakeBedrock:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def jobs(self) -> list[JSON]:
        """Every job created, as GetModelInvocationJob describes it, in creation order; reading
        them does not advance them."""
        with self._lock:
            return [self._describe(job) for job in sorted(self._jobs.values(), key=_seq)]

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

    def runtime_successes(self) -> dict[str, int]:
        """Record id -> how many runtime calls for it were answered 200, from `calls`.

        A call whose response a `LostResponseFault` dropped counts: the model ran (and AWS
        bills it) though the client never saw the answer. Calls without the custom id header
        are not counted. "No item succeeded twice" is `max(counts.values()) == 1`.
        """
        counts: dict[str, int] = {}
        for entry in self.calls.entries():
            record_id = entry.get("record_id")
            if (
                entry.get("operation") in RUNTIME_OPERATIONS.values()
                and entry.get("status") == 200
                and record_id is not None
            ):
                counts[record_id] = counts.get(record_id, 0) + 1
        return counts

    def _s3(self) -> Any:
        if self._s3_client is None:
            self._s3_client = boto3.client(
                "s3",
                endpoint_url=self.s3_endpoint_url,
                region_name=DEFAULT_REGION,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            )
        return self._s3_client

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

    def _list(self, query: dict[str, str]) -> JSON:
        check = _Violations()
        max_results = 1000
        if "maxResults" in query:
            try:
                max_results = int(query["maxResults"])
            except ValueError:
                check.add(query["maxResults"], "maxResults", "be an integer")
            else:
                check.integer(max_results, "maxResults", 1, 1000)
        status = query.get("statusEquals")
        check.enum(status, "statusEquals", STATUSES)
        name_contains = query.get("nameContains")
        check.string(name_contains, "nameContains", pattern=JOB_NAME_PATTERN, max_len=63)
        check.enum(query.get("sortBy"), "sortBy", ("CreationTime",))
        order = query.get("sortOrder", "Descending")
        check.enum(order, "sortOrder", ("Ascending", "Descending"))
        bounds: dict[str, datetime] = {}
        for key in ("submitTimeAfter", "submitTimeBefore"):
            if key in query:
                try:
                    bounds[key] = datetime.fromisoformat(query[key]).astimezone(UTC)
                except ValueError:
                    check.add(query[key], key, "be an ISO 8601 timestamp")
        check.raise_if_any()
        with self._lock:
            ordered = sorted(self._jobs.values(), key=lambda j: (j["submit_time"], j["seq"]))
            if order == "Descending":
                ordered.reverse()
            if "nextToken" in query:
                after = self._decode_token(query["nextToken"], order)
                seqs = [job["seq"] for job in ordered]
                if after not in seqs:
                    raise AwsError("ValidationException", "The provided nextToken is invalid.")
                ordered = ordered[seqs.index(after) + 1 :]

            def wanted(job: JSON) -> bool:
                if status is not None and job["status"] != status:
                    return False
                if name_contains is not None and name_contains not in job["name"]:
                    return False
                after_time = bounds.get("submitTimeAfter")
                if after_time is not None and not job["submit_time"] > after_time:
                    return False
                before_time = bounds.get("submitTimeBefore")
                return before_time is None or job["submit_time"] < before_time

            matching = [job for job in ordered if wanted(job)]
            page = matching[:max_results]
            answer: JSON = {"invocationJobSummaries": [self._describe(job) for job in page]}
            if len(matching) > max_results:
                answer["nextToken"] = self._encode_token(page[-1]["seq"], order)
            return answer

    @staticmethod
    def _encode_token(seq: int, order: str) -> str:
        raw = json.dumps({"after": seq, "order": order}).encode()
        return base64.urlsafe_b64encode(raw).decode()

    @staticmethod
    def _decode_token(token: str, order: str) -> int:
        try:
            decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
            if decoded["order"] != order:
                raise ValueError("sort order changed between pages")
            return int(decoded["after"])
        except (ValueError, KeyError, TypeError):
            raise AwsError("ValidationException", "The provided nextToken is invalid.") from None

    def _describe(self, job: JSON) -> JSON:
        body = job["body"]
        described: JSON = {
            "jobArn": job["arn"],
            "jobName": job["name"],
            "modelId": body["modelId"],
            "roleArn": body["roleArn"],
            "status": job["status"],
            "submitTime": iso(job["submit_time"]),
            "lastModifiedTime": iso(job["last_modified"]),
            "inputDataConfig": body["inputDataConfig"],
            "outputDataConfig": body["outputDataConfig"],
            "timeoutDurationInHours": job["timeout"],
            "jobExpirationTime": iso(job["expiration"]),
        }
        if job["token"] is not None:
            described["clientRequestToken"] = job["token"]
        if job["message"]:
            described["message"] = job["message"]
        if job["end_time"] is not None:
            described["endTime"] = iso(job["end_time"])
        for key in ("vpcConfig", "modelInvocationType"):
            if key in body:
                described[key] = body[key]
        if job["counts"] is not None:
            described.update(
                {
                    name: job["counts"][name]
                    for name in (
                        "totalRecordCount",
                        "processedRecordCount",
                        "successRecordCount",
                        "errorRecordCount",
                    )
                }
            )
        return described

    def _set_status(self, job: JSON, status: str, message: str | None = None) -> None:
        job["status"] = status
        job["polls"] = 0
        job["last_modified"] = self.clock()
        if message is not None:
            job["message"] = message
        if status in TERMINAL:
            job["end_time"] = job["last_modified"]

    def _advance(self, job: JSON) -> None:
        """Move a job one status on."""
        status = job["status"]
        if status == "Submitted":
            self._set_status(job, "Validating")
        elif status == "Validating":
            failure = self._validate(job)
            if failure is not None:
                self._set_status(job, "Failed", failure)
            else:
                self._set_status(job, "Scheduled")
        elif status == "Scheduled":
            outcome = self._decide_outcome(job)
            if outcome == "Expired":
                self._set_status(
                    job,
                    "Expired",
                    f"The job was not started within its timeout of {job['timeout']} hours.",
                )
            else:
                self._set_status(job, "InProgress")
        elif status == "InProgress":
            self._finish(job)
        elif status == "Stopping":
            if job["stopped_from"] == "InProgress":
                self._write_output(job, processed_share=0.5)
            self._set_status(job, "Stopped")

    def _validate(self, job: JSON) -> str | None:
        """The Validating step: input readable, JSONL well formed, record quotas, output bucket."""
        s3 = self._s3()
        in_bucket, in_key = split_s3_uri(
            job["body"]["inputDataConfig"]["s3InputDataConfig"]["s3Uri"]
        )
        out_bucket, _ = self._output_location(job)
        try:
            keys = self._input_keys(in_bucket, in_key)
        except ClientError as err:
            return f"Unable to access the input S3 location s3://{in_bucket}/{in_key}: {err}"
        if not keys:
            return f"No .jsonl input files found at s3://{in_bucket}/{in_key}."
        records: list[JSON] = []
        for key, name in keys:
            obj = s3.get_object(Bucket=in_bucket, Key=key)
            for number, raw in enumerate(obj["Body"].iter_lines(), start=1):
                if not raw.strip():
                    continue
                try:
                    line = json.loads(raw)
                except ValueError:
                    return f"Invalid JSON in s3://{in_bucket}/{key} at line {number}."
                if not isinstance(line, dict) or not isinstance(line.get("modelInput"), dict):
                    return (
                        f"Invalid record in s3://{in_bucket}/{key} at line {number}: each line "
                        "must be a JSON object with a modelInput object."
                    )
                record_id = line.get("recordId")
                if record_id is None:
                    digest = hashlib.sha256(f"{job['id']}/{key}/{number}".encode()).hexdigest()
                    record_id = digest[:11].upper()
                records.append(
                    {"recordId": str(record_id), "modelInput": line["modelInput"], "file": name}
                )
        try:
            s3.head_bucket(Bucket=out_bucket)
        except ClientError:
            return f"Unable to access the output S3 location s3://{out_bucket}."
        count = len(records)
        if count < self.min_records:
            return (
                f"Batch job {job['arn']} contains less records ({count}) than the required "
                f"minimum of: {self.min_records}"
            )
        if count > self.max_records:
            return (
                f"Batch job {job['arn']} contains more records ({count}) than the allowed "
                f"maximum of: {self.max_records}"
            )
        failure = self.validation_failure
        if callable(failure):
            failure = failure(self._describe(job))
        if failure:
            return failure
        job["records"] = records
        job["counts"] = _counts(total=count)
        return None

    def _input_keys(self, bucket: str, key: str) -> list[tuple[str, str]]:
        """(object key, output-relative name) of each input file: the object itself, or every
        .jsonl under the prefix when the URI names a folder."""
        s3 = self._s3()
        if key and not key.endswith("/"):
            with contextlib.suppress(ClientError):
                s3.head_object(Bucket=bucket, Key=key)
                return [(key, key.rsplit("/", 1)[-1])]
            key += "/"
        found: list[tuple[str, str]] = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            for obj in page.get("Contents", []):
                if obj["Key"].endswith(".jsonl"):
                    found.append((obj["Key"], obj["Key"][len(key) :]))
        return sorted(found)

    def _output_location(self, job: JSON) -> tuple[str, str]:
        uri = job["body"]["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"]
        bucket, prefix = split_s3_uri(uri)
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return bucket, f"{prefix}{job['id']}/"

    def _decide_outcome(self, job: JSON) -> str | None:
        if self.job_outcome is None:
            return None
        outcome = self.job_outcome({**self._describe(job), "records": list(job["records"])})
        if outcome is None:
            return None
        if outcome not in OUTCOMES:
            raise ValueError(
                f"job_outcome returned {outcome!r}; expected one of {sorted(OUTCOMES)}"
            )
        job["outcome"] = outcome
        return outcome

    def _finish(self, job: JSON) -> None:
        outcome = job["outcome"]
        if outcome == "Failed":
            self._set_status(
                job, "Failed", "The job failed because of an internal error. Submit it again."
            )
            return
        share = 0.5 if outcome in ("PartiallyCompleted", "Stopped") else 1.0
        counts = self._write_output(job, processed_share=share)
        if outcome is None:
            complete = counts["processedRecordCount"] == counts["totalRecordCount"]
            outcome = "Completed" if complete else "PartiallyCompleted"
        self._set_status(job, outcome)

    def _write_output(self, job: JSON, processed_share: float) -> JSON:
        """Run the first `processed_share` of the records and write the output files."""
        records: list[JSON] = job["records"]
        cutoff = int(len(records) * processed_share)
        counts = _counts(total=len(records))
        by_file: dict[str, list[str]] = {}
        for record in records:
            by_file.setdefault(record["file"], [])
        for index, record in enumerate(records):
            if index >= cutoff:
                continue
            line = self._run_record(job, record, counts)
            if line is not None:
                by_file[record["file"]].append(json.dumps(line))
        bucket, prefix = self._output_location(job)
        shuffler = random.Random(job["id"])
        s3 = self._s3()
        for name, lines in by_file.items():
            if self.shuffle_output:
                shuffler.shuffle(lines)
            with tempfile.TemporaryFile() as fh:
                for line in lines:
                    fh.write(line.encode() + b"\n")
                fh.seek(0)
                s3.upload_fileobj(fh, bucket, f"{prefix}{name}.out")
        manifest = json.dumps(counts).encode()
        s3.put_object(Bucket=bucket, Key=f"{prefix}manifest.json.out", Body=manifest)
        job["counts"] = counts
        return counts

    def _run_record(self, job: JSON, record: JSON, counts: JSON) -> JSON | None:
        record_id, model_input = record["recordId"], record["modelInput"]
        fault = self.record_fault(record_id, model_input) if self.record_fault else None
        if fault == "skip":
            return None
        counts["processedRecordCount"] += 1
        if fault is not None and fault not in RECORD_ERRORS:
            raise ValueError(f"record_fault returned {fault!r} for {record_id!r}")
        answer = None
        if fault is None:
            answer = self._answer(
                model_input,
                converse=job["body"].get("modelInvocationType") == "Converse",
                model_id=job["body"]["modelId"],
                message_key=f"{job['id']}/{record_id}",
            )
        if answer is None or answer.error is not None:
            counts["errorRecordCount"] += 1
            code, message = RECORD_ERRORS[fault] if answer is None else (400, answer.error)
            return {
                "recordId": record_id,
                "modelInput": model_input,
                "error": {"errorCode": code, "errorMessage": message},
            }
        counts["successRecordCount"] += 1
        counts["inputTokenCount"] += answer.input_tokens
        counts["outputTokenCount"] += answer.output_tokens
        return {"recordId": record_id, "modelInput": model_input, "modelOutput": answer.output}

    def _answer(
        self, model_input: Any, *, converse: bool, model_id: str, message_key: str
    ) -> ModelAnswer:
        """The model's answer to one body, shared by batch records and runtime calls: the
        validation message, or the output in the shape of the body (Converse or Anthropic
        Messages) with its usage. `message_key` seeds the Anthropic message id."""
        check = converse_input_error if converse else anthropic_input_error
        problem = check(model_input)
        if problem is not None:
            return ModelAnswer(error=problem)
        if self.responder is not None:
            text = self.responder(model_input)
        else:
            text = default_responder(_as_anthropic_params(model_input) if converse else model_input)
        if converse:
            limit = (model_input.get("inferenceConfig") or {}).get("maxTokens")
        else:
            limit = model_input["max_tokens"]
        stop_reason = "end_turn"
        if limit is not None and len(text) > limit * 4:
            text, stop_reason = text[: limit * 4], "max_tokens"
        input_tokens = max(1, approx_tokens(_input_chars(model_input)))
        output_tokens = approx_tokens(len(text))
        latency_ms = 100 + output_tokens
        if converse:
            output: JSON = {
                "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
                "stopReason": stop_reason,
                "usage": {
                    "inputTokens": input_tokens,
                    "outputTokens": output_tokens,
                    "totalTokens": input_tokens + output_tokens,
                },
                "metrics": {"latencyMs": latency_ms},
            }
        else:
            digest = hashlib.sha256(message_key.encode()).hexdigest()
            output = {
                "id": f"msg_bdrk_{digest[:24]}",
                "type": "message",
                "role": "assistant",
                "model": anthropic_model_name(model_id),
                "content": [{"type": "text", "text": text}],
                "stop_reason": stop_reason,
                "stop_sequence": None,
                "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
            }
        return ModelAnswer(
            output=output,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            latency_ms=latency_ms,
        )

    def _admit_runtime_call(self) -> None:
        """The `runtime_rpm` gate: a ThrottlingException once the rolling minute is full."""
        limit = self.runtime_rpm
        if limit is None:
            return
        now = self.clock().timestamp()
        with self._lock:
            window = self._runtime_window
            while window and window[0] <= now - 60:
                window.popleft()
            if len(window) >= limit:
                raise AwsError("ThrottlingException", FAULT_MESSAGES[429], 429)
            window.append(now)

    def _runtime(
        self, operation: str, model_id: str, body: bytes, request_id: str, log: JSON
    ) -> Reply:
        """InvokeModel or Converse: gate, model check, body, record fault, then the answer."""
        self._admit_runtime_call()
        if self.runtime_models is not None and model_id not in self.runtime_models:
            raise AwsError(
                "ResourceNotFoundException",
                "Could not resolve the foundation model from the provided model identifier.",
                404,
            )
        try:
            model_input = json.loads(body or b"")
        except ValueError:
            model_input = None
        if not isinstance(model_input, dict):
            message = (
                RECORD_ERRORS["error"][1]
                if operation == "InvokeModel"
                else "The request body is not a JSON object."
            )
            raise AwsError("ValidationException", message)
        record_id = log.get("record_id")
        fault = self.record_fault(record_id, model_input) if self.record_fault else None
        if fault is not None:
            if fault not in RUNTIME_RECORD_ERRORS:
                raise ValueError(f"record_fault returned {fault!r} for {record_id!r}")
            status, code, message = RUNTIME_RECORD_ERRORS[fault]
            raise AwsError(code, message, status)
        answer = self._answer(
            model_input,
            converse=operation == "Converse",
            model_id=model_id,
            message_key=request_id,
        )
        if answer.error is not None:
            raise AwsError("ValidationException", answer.error)
        assert answer.output is not None
        log.update(input_tokens=answer.input_tokens, output_tokens=answer.output_tokens)
        headers: dict[str, str] = {}
        if operation == "InvokeModel":
            headers = {
                "X-Amzn-Bedrock-Input-Token-Count": str(answer.input_tokens),
                "X-Amzn-Bedrock-Output-Token-Count": str(answer.output_tokens),
                "X-Amzn-Bedrock-Invocation-Latency": str(answer.latency_ms),
            }
        return Reply(200, answer.output, headers)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        return type("FakeBedrockHandler", (_Handler,), {"owner": self})

    def _track(self, conn: socket.socket, open_: bool) -> None:
        with self._connections_lock:
            if open_:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _handle(self, method: str, raw_path: str, headers: Any, body: bytes, log: JSON) -> Reply:
        try:
            authorization = headers.get("Authorization") or ""
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
                return self._runtime(operation, model_id, body, log["request_id"], log)
            return Reply(200, self._route(method, raw_path, region, body, log))
        except AwsError as err:
            return error_reply(err.status, err.code, err.message)
        except Exception:
            self.server_errors.append(traceback.format_exc())
            print(self.server_errors[-1], file=sys.stderr)
            return error_reply(
                500, "InternalServerException", "The fake crashed; see server_errors."
            )

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


def _seq(job: JSON) -> int:
    return int(job["seq"])


def _counts(total: int) -> JSON:
    return {
        "totalRecordCount": total,
        "processedRecordCount": 0,
        "successRecordCount": 0,
        "errorRecordCount": 0,
        "inputTokenCount": 0,
        "outputTokenCount": 0,
    }


def error_reply(status: int, code: str, message: str) -> Reply:
    return Reply(status, {"message": message}, {"x-amzn-ErrorType": code}, error_code=code)


def fault_reply(fault: ControlFault) -> Reply:
    code = ERROR_CODES.get(fault.status, "InternalServerException")
    message = FAULT_MESSAGES.get(fault.status, f"Injected fault ({fault.status}).")
    reply = error_reply(fault.status, code, message)
    if fault.retry_after is not None:
        seconds = fault.retry_after
        reply.headers["Retry-After"] = (
            str(int(seconds)) if seconds == int(seconds) else str(seconds)
        )
    return reply


class _Handler(BaseHTTPRequestHandler):
    """One HTTP/1.1 keep-alive connection; the owning FakeBedrock does the work."""

    protocol_version = "HTTP/1.1"
    server_version = "fake-bedrock/1"
    sys_version = ""
    owner: ClassVar[FakeBedrock]

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.owner._track(self.connection, open_=True)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.owner._track(self.connection, open_=False)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the call log is the record."""

    def handle(self) -> None:
        """A client dropping a kept-alive connection, even with a RST (as closing a socket with
        an unread answer does), is not a server error."""
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            super().handle()

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _serve(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
        except (OSError, ValueError):
            self.close_connection = True
            return
        request_id = secrets.token_hex(16)
        split = urlsplit(self.path)
        entry: JSON = {
            "ts": time.time(),
            "method": self.command,
            "path": unquote(split.path),
            "status": None,
            "request_id": request_id,
            "operation": None,
            "job_id": None,
            "client_request_token": None,
            "record_id": self.headers.get(CUSTOM_ID_HEADER),
        }
        runtime = runtime_target(self.command, self.path)
        if runtime is not None:
            entry["operation"], entry["model_id"] = runtime
        if split.query:
            entry["query"] = split.query
        attempt = re.search(r"attempt=(\d+)", self.headers.get("amz-sdk-request") or "")
        if attempt:
            entry["attempt"] = int(attempt.group(1))
        fault = self.owner.faults.take(self.command, self.path)
        if fault is not None and fault.delay_seconds > 0:
            entry["delayed"] = fault.delay_seconds
            time.sleep(fault.delay_seconds)
        after_handling = fault is not None and getattr(fault, "after_handling", False)
        if fault is not None and fault.reset_connection and not after_handling:
            entry.update(status=0, fault="reset")
            self.owner.calls.record(entry)
            self._reset()
            return
        if fault is not None and not after_handling and fault.status >= 400:
            reply = fault_reply(fault)
            entry["fault"] = str(fault.status)
        else:
            reply = self.owner._handle(self.command, self.path, self.headers, body, entry)
        entry["status"] = reply.status
        if reply.error_code is not None:
            entry["error_code"] = reply.error_code
        if after_handling:
            entry["fault"] = "lost_response"
            self.owner.calls.record(entry)
            self._reset()
            return
        self.owner.calls.record(entry)
        self._send(reply, request_id)

    def _send(self, reply: Reply, request_id: str) -> None:
        """Answer; a client that gave up (a timeout) is gone, which is not a server error."""
        payload = json.dumps(reply.body).encode()
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("x-amzn-RequestId", request_id)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _reset(self) -> None:
        """Abort with a TCP RST, as a proxy dropping the connection mid-request would."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
