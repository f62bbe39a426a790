"""The fake Bedrock's model invocation jobs: the status machine, the Validating step's checks of
the input in S3, the output files and manifest a job writes, and the job listing.

`JobLifecycle` is a mixin of FakeBedrock: it reads the fake's knobs (declared below) and
advances one job per call; the caller holds the fake's lock.
"""

import base64
import contextlib
import hashlib
import json
import random
import tempfile
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import boto3
from botocore.exceptions import ClientError

from tests.fakes.bedrock_api import (
    DEFAULT_REGION,
    JOB_NAME_PATTERN,
    OUTCOMES,
    RECORD_ERRORS,
    STATUSES,
    TERMINAL,
    AwsError,
    Violations,
    iso,
    split_s3_uri,
)
from tests.fakes.bedrock_model import Responder, model_answer

JSON = dict[str, Any]
JobOutcome = Callable[[JSON], str | None]
# record_id is None for a runtime call that carries no X-Llm-Assets-Custom-Id header.
RecordFault = Callable[[str | None, JSON], str | None]
ValidationFailure = str | Callable[[JSON], str | None] | None


def seq(job: JSON) -> int:
    """A job's place in creation order."""
    return int(job["seq"])


def record_counts(total: int) -> JSON:
    """The manifest counts of a job of `total` records, none processed yet."""
    return {
        "totalRecordCount": total,
        "processedRecordCount": 0,
        "successRecordCount": 0,
        "errorRecordCount": 0,
        "inputTokenCount": 0,
        "outputTokenCount": 0,
    }


class JobLifecycle:
    """Submitted -> Validating -> Scheduled -> InProgress -> Completed | PartiallyCompleted |
    Failed | Expired, and Stopping -> Stopped; one status a step."""

    s3_endpoint_url: str
    clock: Callable[[], datetime]
    min_records: int
    max_records: int
    validation_failure: ValidationFailure
    job_outcome: JobOutcome | None
    record_fault: RecordFault | None
    responder: Responder | None
    shuffle_output: bool
    _jobs: dict[str, JSON]
    _lock: threading.RLock
    _s3_client: Any

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

    def _list(self, query: dict[str, str]) -> JSON:
        check = Violations()
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
        job["counts"] = record_counts(total=count)
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
        counts = record_counts(total=len(records))
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
            answer = model_answer(
                model_input,
                converse=job["body"].get("modelInvocationType") == "Converse",
                model_id=job["body"]["modelId"],
                message_key=f"{job['id']}/{record_id}",
                responder=self.responder,
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
