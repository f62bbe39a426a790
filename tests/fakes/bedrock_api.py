"""Bedrock's control-plane wire, as botocore's service model `bedrock/2023-04-20` declares it:
job statuses, member patterns and limits, the REST-JSON error shape, and the checks of a
CreateModelInvocationJob request.
"""

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlsplit

from tests.fakes.base import Reply
from tests.fakes.common import ControlFault, format_seconds

JSON = dict[str, Any]
ACCOUNT_ID = "123456789012"
DEFAULT_REGION = "us-east-1"
MIN_RECORDS = 100
MAX_RECORDS = 50_000
DEFAULT_TIMEOUT_HOURS = 168

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
# The statuses that count against the quota of batch inference jobs in progress per model.
IN_PROGRESS = STOPPABLE | {"Stopping"}
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


class AwsError(Exception):
    """Raised inside a route to answer with the REST-JSON error shape."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def quota_exceeded(model_id: str, limit: int) -> AwsError:
    """CreateModelInvocationJob over the quota of jobs in progress for one model."""
    return AwsError(
        "ServiceQuotaExceededException",
        "You have exceeded the number of batch inference jobs that can be submitted or in "
        f"progress at once for model {model_id} (quota: {limit}). Please try again later.",
    )


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


def runtime_target(method: str, raw_path: str) -> tuple[str, str] | None:
    """(operation, model id) of a runtime call, `POST /model/{modelId}/invoke|converse` with
    the model id percent-encoded as botocore sends it; None for any other request."""
    parts = urlsplit(raw_path).path.strip("/").split("/")
    if method != "POST" or len(parts) != 3 or parts[0] != "model" or not parts[1]:
        return None
    operation = RUNTIME_OPERATIONS.get(parts[2])
    return None if operation is None else (operation, unquote(parts[1]))


class Violations:
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

    def required_string(self, body: JSON, key: str, where: str, **constraints: Any) -> None:
        """`body[key]` is set and a string within `constraints` (as `string` takes them)."""
        if self.required(body, key, where):
            self.string(body[key], where, **constraints)

    def structures(self, members: list[Any], where: str) -> Iterator[tuple[str, JSON]]:
        """(where, member) of each member of a list of structures, numbered from 1 as AWS
        names them; a member that is not a structure is a violation and is skipped."""
        for index, member in enumerate(members, start=1):
            at = f"{where}.{index}.member"
            if isinstance(member, dict):
                yield at, member
            else:
                self.add(member, at, "be a structure")

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
    check = Violations()
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
        _check_s3_location(check, s3_in, where)
        check.enum(s3_in.get("s3InputFormat"), f"{where}.s3InputFormat", ("JSONL",))
    s3_out = check.union(body.get("outputDataConfig"), "outputDataConfig", "s3OutputDataConfig")
    if s3_out is not None:
        where = "outputDataConfig.s3OutputDataConfig"
        _check_s3_location(check, s3_out, where)
        check.string(
            s3_out.get("s3EncryptionKeyId"),
            f"{where}.s3EncryptionKeyId",
            pattern=KMS_KEY_PATTERN,
            min_len=1,
            max_len=2048,
        )
    tags = body.get("tags")
    if tags is not None:
        if not isinstance(tags, list) or len(tags) > 200:
            check.add(tags, "tags", "have length less than or equal to 200")
        else:
            for where, tag in check.structures(tags, "tags"):
                check.required_string(
                    tag, "key", f"{where}.key", pattern=TAG_PATTERN, min_len=1, max_len=128
                )
                check.required_string(
                    tag, "value", f"{where}.value", pattern=TAG_PATTERN, max_len=256
                )
    vpc = body.get("vpcConfig")
    if vpc is not None:
        for key in ("subnetIds", "securityGroupIds"):
            if not isinstance(vpc, dict) or not isinstance(vpc.get(key), list) or not vpc[key]:
                check.add(None, f"vpcConfig.{key}", "have length greater than or equal to 1")
    check.raise_if_any()


def _check_s3_location(check: Violations, config: JSON, where: str) -> None:
    """The members an S3 input and output config share: the URI and the bucket's owner."""
    check.required_string(
        config, "s3Uri", f"{where}.s3Uri", pattern=S3_URI_PATTERN, min_len=1, max_len=1024
    )
    check.string(config.get("s3BucketOwner"), f"{where}.s3BucketOwner", pattern=ACCOUNT_PATTERN)


def error_reply(status: int, code: str, message: str) -> Reply:
    """The REST-JSON error botocore parses: status, `x-amzn-ErrorType` and a message."""
    return Reply(
        status, {"message": message}, headers={"x-amzn-ErrorType": code}, log={"error_code": code}
    )


def injected_error(fault: ControlFault) -> Reply:
    """The error of an injected `fault.status`, with `Retry-After` when the fault sets one."""
    code = ERROR_CODES.get(fault.status, "InternalServerException")
    message = FAULT_MESSAGES.get(fault.status, f"Injected fault ({fault.status}).")
    reply = error_reply(fault.status, code, message)
    if fault.retry_after is not None:
        reply.headers["Retry-After"] = format_seconds(fault.retry_after)
    return reply
