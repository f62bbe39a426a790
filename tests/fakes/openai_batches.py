"""The fake OpenAI's batch lifecycle: the status machine, the input checks of `validating`, and
the output and error files a batch ends with.

`BatchLifecycle` is a mixin of FakeOpenAI: it reads the fake's knobs (declared below) and its
`store`, and advances one stored batch per call.
"""

import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any, Literal

from tests.fakes.common import PrefixCache
from tests.fakes.openai_model import (
    Responder,
    error_body,
    input_tokens_of,
    model_answer,
    new_id,
    usage,
)
from tests.fakes.openai_store import Store, public_batch

JSON = dict[str, Any]
CleanErrorFile = Literal["null", "empty_string", "empty_file"]
LINE_FAULTS = ("4xx", "429", "5xx", "missing", "duplicate", "expire")
OUTCOMES = ("completed", "expired", "expired_after_partial", "failed", "cancelled_after_partial")
MAX_LINES = 50_000
MAX_INPUT_BYTES = 200 * 1024 * 1024
MAX_EMBEDDING_INPUTS = 50_000
DAY = 24 * 60 * 60


class _InputCheck:
    """The Batch API's checks of an input file, one line at a time, errors collected."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.errors: list[JSON] = []
        self.seen: set[str] = set()
        self.model: str | None = None
        self.embedding_inputs = 0
        self.number: int | None = None
        """The line being checked; None between lines (errors of the whole file)."""

    def fail(self, code: str, message: str, param: str | None = None) -> None:
        self.errors.append({"code": code, "message": message, "param": param, "line": self.number})

    def missing(self, param: str) -> None:
        self.fail("missing_required_parameter", f"Missing required parameter: '{param}'.", param)

    def line(self, number: int, raw: bytes) -> None:
        self.number = number
        try:
            self._line(raw)
        finally:
            self.number = None

    def _line(self, raw: bytes) -> None:
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            obj = None
        if not isinstance(obj, dict):
            self.fail("invalid_json_line", "This line is not parseable as valid JSON.")
            return
        custom_id = obj.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            self.missing("custom_id")
        elif custom_id in self.seen:
            self.fail(
                "duplicate_custom_id",
                "The custom_id for this request is a duplicate of another request. The "
                "custom_id parameter must be unique for each request in a batch.",
                "custom_id",
            )
        else:
            self.seen.add(custom_id)
        if obj.get("method") != "POST":
            self.fail("invalid_method", "The method for this request must be 'POST'.", "method")
        if obj.get("url") != self.endpoint:
            self.fail(
                "invalid_url",
                "The URL provided for this request does not match the batch endpoint "
                f"'{self.endpoint}'.",
                "url",
            )
        body = obj.get("body")
        if not isinstance(body, dict):
            self.missing("body")
            return
        self._body(body)

    def _body(self, body: JSON) -> None:
        line_model = body.get("model")
        if not isinstance(line_model, str) or not line_model:
            self.missing("body.model")
        elif self.model is None:
            self.model = line_model
        elif line_model != self.model:
            self.fail(
                "model_mismatch",
                f"All requests in a batch must use the same model; this line uses "
                f"'{line_model}', earlier lines '{self.model}'.",
                "body.model",
            )
        if self.endpoint == "/v1/embeddings":
            given = body.get("input")
            self.embedding_inputs += len(given) if isinstance(given, list) else 1


def validate_input(data: bytes, endpoint: str) -> tuple[int, list[JSON]]:
    """(request lines, errors) of a batch input file, checked as the Batch API checks it."""
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    requests = sum(1 for raw in raw_lines if raw.strip())
    check = _InputCheck(endpoint)
    if len(data) > MAX_INPUT_BYTES:
        check.fail("file_too_large", "The input file is larger than 200 MB.")
    if requests == 0:
        check.fail("empty_file", "The input file is empty.")
    if requests > MAX_LINES:
        check.fail(
            "too_many_tasks",
            f"The input file has {requests} requests; a batch can hold {MAX_LINES}.",
        )
    for number, raw in enumerate(raw_lines, start=1):
        if raw.strip():
            check.line(number, raw)
    if check.embedding_inputs > MAX_EMBEDDING_INPUTS:
        check.fail(
            "too_many_tasks",
            f"An embeddings batch can hold {MAX_EMBEDDING_INPUTS} inputs; this one has "
            f"{check.embedding_inputs}.",
        )
    return requests, check.errors


def unrun_line(custom_id: str, code: str, message: str) -> JSON:
    """An error-file line for a request the batch never ran (expired or cancelled)."""
    return {
        "id": new_id("batch_req_"),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


UNRUN_LINES: dict[str, Callable[[str], JSON]] = {
    "expired": lambda custom_id: unrun_line(
        custom_id,
        "batch_expired",
        "This request could not be executed before the completion window expired.",
    ),
    "cancelled": lambda custom_id: unrun_line(
        custom_id,
        "batch_cancelled",
        "This request was not executed because the batch was cancelled.",
    ),
}


def failed_line(custom_id: str, body: JSON, fault: str) -> JSON:
    """A request the endpoint rejected: the error sits in the response body, `error` is null."""
    if fault == "4xx":
        status = 400
        error = error_body(
            f"Invalid request for model '{body.get('model')}' (injected by the fake).",
            "invalid_request_error",
            param="messages" if "messages" in body else "input",
            code="invalid_value",
        )
    elif fault == "429":
        status = 429
        error = error_body(
            "Rate limit reached for requests (injected by the fake).",
            "requests",
            code="rate_limit_exceeded",
        )
    else:
        status = 500
        error = error_body(
            "The server had an error while processing your request. Sorry about that!",
            "server_error",
        )
    return {
        "id": new_id("batch_req_"),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": uuid.uuid4().hex, "body": error},
        "error": None,
    }


def _token_limit_error(model: str, limit: int | None = None) -> JSON:
    """The `errors.data` entry of a batch failed on the enqueued-token limit; with `limit`, the
    message names it (thousands separated, as OpenAI writes it)."""
    if limit is None:
        message = (
            f"Enqueued token limit reached for {model} in organization org-fake. Please try "
            "again once some in_progress batches have been completed."
        )
    else:
        message = (
            f"Enqueued token limit reached for {model} in organization org-fake. Limit: "
            f"{limit:,} enqueued tokens. Please try submitting your batch again later."
        )
    return {"code": "token_limit_exceeded", "message": message, "param": None, "line": None}


def _in_flight(batch: JSON) -> bool:
    """Admitted (left `validating` to run) and not yet ended: its prompt tokens are enqueued."""
    status = batch["status"]
    return status in ("in_progress", "finalizing") or (status == "cancelling" and batch["_ran"])


def prompt_tokens(endpoint: str, data: bytes) -> int:
    """Prompt tokens of a valid input file: its lines' input tokens, counted as usage counts
    them (what OpenAI's enqueued-token limit weighs)."""
    return sum(
        input_tokens_of(endpoint, json.loads(raw)["body"])
        for raw in data.split(b"\n")
        if raw.strip()
    )


class BatchLifecycle:
    """validating -> in_progress -> finalizing -> completed (or expired, failed, cancelling ->
    cancelled), one status a step; results are decided on reaching a terminal status."""

    store: Store
    line_fault: Callable[[str, JSON], str | None] | None
    batch_outcome: Callable[[JSON], str] | None
    shuffle_output: bool
    null_output_file: bool
    error_file_when_clean: CleanErrorFile
    count_unrun_as_failed: bool
    responder: Responder | None
    edit_line: Callable[[JSON], JSON] | None
    cached_tokens: int
    prefix_cache: PrefixCache
    enqueued_token_limit: int | None
    token_limit_stated: bool
    peak_enqueued_tokens: dict[str, int]
    billed: Counter[str]
    dropped: Counter[str]

    def _step(self, batch: JSON) -> None:
        """Move a batch one status on."""
        now = int(time.time())
        status = batch["status"]
        if status == "validating":
            self._leave_validating(batch, now)
        elif status == "in_progress":
            outcome = batch["_outcome"]
            if outcome in ("expired", "expired_after_partial"):
                self._finish(batch, "expired")
            elif outcome == "cancelled_after_partial":
                batch.update(status="cancelling", cancelling_at=now)
            else:
                batch.update(status="finalizing", finalizing_at=now)
        elif status == "finalizing":
            self._finish(batch, "completed")
        elif status == "cancelling":
            if not batch["_ran"]:
                batch.update(status="cancelled", cancelled_at=now)
                return
            self._finish(batch, "cancelled")

    def _leave_validating(self, batch: JSON, now: int) -> None:
        data = self.store.input_path(batch["id"]).read_bytes()
        lines, errors = validate_input(data, batch["endpoint"])
        errors = [*batch.get("_input_errors", []), *errors]
        if errors:
            batch.update(
                status="failed",
                failed_at=now,
                errors={"object": "list", "data": errors},
                request_counts={"total": lines, "completed": 0, "failed": 0},
            )
            return
        outcome = self.batch_outcome(public_batch(batch)) if self.batch_outcome else "completed"
        if outcome not in OUTCOMES:
            raise ValueError(f"batch_outcome returned {outcome!r}; expected one of {OUTCOMES}")
        batch["_outcome"] = outcome
        batch["request_counts"] = {"total": lines, "completed": 0, "failed": 0}
        model = batch.get("model") or "the model"
        limit = self.enqueued_token_limit
        if outcome == "failed" or (limit is not None and not self._admit(batch, data, limit)):
            stated = limit if outcome != "failed" and self.token_limit_stated else None
            error = _token_limit_error(model, stated)
            batch.update(status="failed", failed_at=now, errors={"object": "list", "data": [error]})
            return
        batch.update(status="in_progress", in_progress_at=now, _ran=True)

    def _admit(self, batch: JSON, data: bytes, limit: int) -> bool:
        """Whether a batch's prompt tokens fit under `limit` beside those of the same model's
        batches in flight; if they do, they count as enqueued and the model's peak is kept."""
        model = batch.get("model") or ""
        tokens = prompt_tokens(batch["endpoint"], data)
        enqueued = sum(
            self._enqueued_tokens(other)
            for other in self.store.all_batches()
            if other["id"] != batch["id"] and other.get("model") == model and _in_flight(other)
        )
        if enqueued + tokens > limit:
            return False
        batch["_enqueued_tokens"] = tokens
        peak = self.peak_enqueued_tokens.get(model, 0)
        self.peak_enqueued_tokens[model] = max(peak, enqueued + tokens)
        return True

    def _enqueued_tokens(self, batch: JSON) -> int:
        found = batch.get("_enqueued_tokens")
        if found is None:  # admitted while no limit was set
            found = prompt_tokens(
                batch["endpoint"], self.store.input_path(batch["id"]).read_bytes()
            )
        return int(found)

    def _finish(self, batch: JSON, status: str) -> None:
        """Run the lines, write output and error files, and settle counts and usage."""
        lines = [
            json.loads(raw)
            for raw in self.store.input_path(batch["id"]).read_bytes().split(b"\n")
            if raw.strip()
        ]
        part_way = status == "cancelled" or batch["_outcome"] == "expired_after_partial"
        done = len(lines) // 2 if part_way else len(lines)
        unrun = "expired" if status == "expired" else "cancelled"
        output, error_lines, counts = self._run_lines(batch, lines, done, unrun)
        if self.shuffle_output:
            rng = random.Random(batch["id"])
            for group in (output, error_lines):
                original = list(group)
                rng.shuffle(group)
                if len(group) > 1 and group == original:
                    group.append(group.pop(0))
        output_file_id: str | None = None
        if output or not self.null_output_file:
            output_file_id = self._write_result_file(batch, "output", output)
        error_file_id: str | None = None
        if error_lines or self.error_file_when_clean == "empty_file":
            error_file_id = self._write_result_file(batch, "error", error_lines)
        elif self.error_file_when_clean == "empty_string":
            error_file_id = ""
        failed = counts["failed"] + (counts["unrun"] if self.count_unrun_as_failed else 0)
        completed = counts["completed"]
        batch.update(
            status=status,
            output_file_id=output_file_id,
            error_file_id=error_file_id,
            request_counts={"total": len(lines), "completed": completed, "failed": failed},
            usage=usage(counts["input_tokens"], counts["output_tokens"]),
        )
        stamp = {"completed": "completed_at", "expired": "expired_at"}.get(status, "cancelled_at")
        batch[stamp] = int(time.time())

    def _run_lines(
        self, batch: JSON, lines: list[JSON], done: int, unrun: str
    ) -> tuple[list[JSON], list[JSON], dict[str, int]]:
        """(output lines, error lines, counts) of running the first `done` request lines; the
        rest are `unrun` ("expired" or "cancelled") error lines."""
        output: list[JSON] = []
        error_lines: list[JSON] = []
        counts = dict.fromkeys(("completed", "failed", "unrun", "input_tokens", "output_tokens"), 0)
        for index, line in enumerate(lines):
            custom_id, body = line["custom_id"], line["body"]
            if index >= done:
                error_lines.append(UNRUN_LINES[unrun](custom_id))
                counts["unrun"] += 1
                continue
            fault = self.line_fault(custom_id, body) if self.line_fault else None
            if fault is not None and fault not in LINE_FAULTS:
                raise ValueError(f"line_fault returned {fault!r}; expected None or {LINE_FAULTS}")
            if fault == "expire":
                error_lines.append(UNRUN_LINES["expired"](custom_id))
                counts["unrun"] += 1
            elif fault in ("4xx", "429", "5xx"):
                error_lines.append(failed_line(custom_id, body, fault))
                counts["failed"] += 1
            elif fault == "missing":
                counts["completed"] += 1
                self.billed[custom_id] += 1  # run and paid for, but its line is lost
                self.dropped[custom_id] += 1
            else:
                success = self._success_line(batch, custom_id, body, counts)
                output += [success, success] if fault == "duplicate" else [success]
                counts["completed"] += 1
                self.billed[custom_id] += 1
        self.prefix_cache.settle()
        return output, error_lines, counts

    def _success_line(
        self, batch: JSON, custom_id: str, body: JSON, counts: dict[str, int]
    ) -> JSON:
        result, used_in, used_out = model_answer(
            batch["endpoint"], body, self.responder, self.cached_tokens, self.prefix_cache
        )
        counts["input_tokens"] += used_in
        counts["output_tokens"] += used_out
        return {
            "id": new_id("batch_req_"),
            "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": uuid.uuid4().hex, "body": result},
            "error": None,
        }

    def _write_result_file(self, batch: JSON, kind: str, lines: list[JSON]) -> str:
        if self.edit_line is not None:
            lines = [self.edit_line(line) for line in lines]
        content = "".join(json.dumps(line) + "\n" for line in lines).encode()
        meta = self.store.create_file(
            content, f"{batch['id']}_{kind}.jsonl", "batch_output", int(time.time()) + 30 * DAY
        )
        return str(meta["id"])
