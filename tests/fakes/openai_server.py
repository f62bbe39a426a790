"""A fake of the OpenAI Files + Batches API: real HTTP on loopback, spoken to by the official SDK.

The adapter under test only ever meets this fake, so it copies the wire protocol rather than the
happy path: JSON shapes the SDK's types parse, the `{"error": {...}}` envelope, `x-request-id` and
`retry-after` headers, the batch status machine with its timestamps, output/error JSONL files
whose lines come back shuffled, and the nasty cases the real service produces (4xx lines with a
null top-level `error`, missing and duplicated lines, expiry with partial output).

State lives on disk in `state_dir` (files, batches, the call log), written atomically, so a
`restart()` -- or a new instance on the same directory -- carries on where the last one stopped.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs

from tests.fakes.base import FaultInjectingServer, Reply, Request
from tests.fakes.common import CallLog, ControlFault, PrefixCache, format_seconds
from tests.fakes.openai_batches import DAY, BatchLifecycle, CleanErrorFile
from tests.fakes.openai_model import (
    ApiError,
    Responder,
    count_tokens,
    error_body,
    new_id,
    prompt_tokens_of,
    stable_pick,
    usage,
    user_text,
)
from tests.fakes.openai_store import (
    Store,
    atomic_write,
    first_model,
    lenient_custom_ids,
    list_page,
    parse_multipart,
    public_batch,
)

# The fake and the helpers tests use to predict its answers.
__all__ = ["FakeOpenAI", "count_tokens", "prompt_tokens_of", "stable_pick", "user_text"]

JSON = dict[str, Any]
FILE_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
SDK_ENDPOINTS = (
    "/v1/responses",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/completions",
    "/v1/moderations",
    "/v1/images/generations",
    "/v1/images/edits",
    "/v1/videos",
)
FAKE_ENDPOINTS = ("/v1/chat/completions", "/v1/responses", "/v1/embeddings")
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")


class FakeOpenAI(BatchLifecycle, FaultInjectingServer):
    """The fake server; behaviour knobs are plain attributes tests may change between calls.

    polls_per_state: how many GET /v1/batches/{id} each status lasts (0: done on the first).
    seconds_per_state: when set, each status lasts this long instead (a batch whose four
        statuses take 2 s each runs in about 8 s, however often it is polled): for benchmarks
        that measure waiting, never for tests, which must not wait on a clock.
    line_fault: (custom_id, body) -> None | "4xx" | "429" | "5xx" | "missing" | "duplicate" |
        "expire".
    batch_outcome: (batch) -> "completed" | "expired" | "expired_after_partial" | "failed" |
        "cancelled_after_partial"; asked once, when the batch leaves `validating`. An expired
        batch runs its lines (those a line_fault expires aside); expired_after_partial runs the
        first half and expires the rest.
    shuffle_output: output and error lines not in input order (deterministic per batch).
    null_output_file: no output file (output_file_id null) when no line succeeded; otherwise an
        empty one is written.
    error_file_when_clean: error_file_id when no line failed: "null" (the API's usual answer),
        "empty_string" (""), or "empty_file" (an empty file).
    count_unrun_as_failed: expired and cancelled lines count in request_counts.failed.
    responder: body -> assistant content, instead of `default_responder`.
    edit_line: result line -> the line written instead (output and error files alike): the
        odd answers of a real provider (overlong codes, NUL characters).
    cached_tokens: prompt tokens reported as read from the prompt cache (at most the prompt).
        Token counts are OpenAI's: the model's BPE plus the chat framing. When 0,
        `prefix_cache` decides: OpenAI's automatic cache of a system prompt of 1024 tokens or
        more, read in 128-token steps by the batches after the one that first sent it.
    enqueued_token_limit: OpenAI's per-model limit of enqueued prompt tokens (None: no limit).
        A batch leaving `validating` whose prompt tokens (the input tokens its usage would
        report, summed over its lines), added to those of the same model's batches in flight
        (in_progress, finalizing, or cancelling after they started), exceed it ends `failed`
        with a `token_limit_exceeded` error naming the limit; its lines never run and nothing is
        billed. An admitted batch counts until it ends.
    token_limit_stated: whether that error names the limit (OpenAI's messages have come both
        ways: "Limit: 1,200 enqueued tokens", or only "try again once some in_progress
        batches have been completed").
    peak_enqueued_tokens: model -> the most prompt tokens in flight at once, counting each
        admission while `enqueued_token_limit` is set.
    billed: custom_id -> how many times a batch ran its request to an answer (what OpenAI
        bills); dropped: how many of those answers the fake then left out of the output
        ("missing").

    faults: control-plane faults matched by method and path substring (query included). A
        fault answers with its `status` (and `retry-after` when `retry_after` is set), or resets
        the connection; `delay_seconds` sleeps first, and with a `status` below 400 the request
        is then served normally -- the "processed, but the client had already given up" case.
    calls: one entry per HTTP call, written before the answer is sent: ts, method, path, query,
        status (0 for a reset), request_id, retry_count (the SDK's x-stainless-retry-count),
        fault; plus file_id/purpose/custom_ids for accepted uploads, batch_id/input_file_id/
        metadata/endpoint for created batches, batch_id/batch_status for retrieve and cancel.
    """

    server_name: ClassVar[str] = "fake-openai/1"
    url_path: ClassVar[str] = "/v1"

    def __init__(self, state_dir: Path, *, port: int | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(CallLog(self.state_dir / "calls.jsonl"), port=port, poll_interval=0.02)
        self.store = Store(self.state_dir)
        self.polls_per_state: int = 1
        self.seconds_per_state: float | None = None
        self.line_fault: Callable[[str, JSON], str | None] | None = None
        self.batch_outcome: Callable[[JSON], str] | None = None
        self.shuffle_output: bool = True
        self.null_output_file: bool = False
        self.error_file_when_clean: CleanErrorFile = "null"
        self.count_unrun_as_failed: bool = True
        self.responder: Responder | None = None
        self.edit_line: Callable[[JSON], JSON] | None = None
        self.cached_tokens: int = 0
        self.prefix_cache = PrefixCache(minimum=1024, increment=128)
        self.enqueued_token_limit: int | None = None
        self.token_limit_stated: bool = True
        self.peak_enqueued_tokens: dict[str, int] = {}
        self.billed: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self._lock = threading.RLock()

    def submitted_custom_ids(self) -> list[str]:
        """custom_ids of every input file a batch was created from, in creation order."""
        with self._lock:
            found: list[str] = []
            for batch in self.store.all_batches():
                found += lenient_custom_ids(self.store.input_path(batch["id"]).read_bytes())
            return found

    def batch(self, batch_id: str) -> JSON | None:
        """A batch as stored, without advancing it (for assertions)."""
        with self._lock:
            stored = self.store.get_batch(batch_id)
            return None if stored is None else public_batch(stored)

    def new_request_id(self) -> str:
        return new_id("req_")

    def call_entry(self, request: Request) -> JSON:
        entry = super().call_entry(request)
        if request.headers.get("x-stainless-retry-count") is not None:
            entry["retry_count"] = int(request.headers["x-stainless-retry-count"])
        return entry

    def response_headers(self, request: Request) -> dict[str, str]:
        return {
            "x-request-id": request.request_id,
            "openai-version": "2020-10-01",
            "openai-processing-ms": "3",
        }

    def crash_reply(self, request: Request) -> Reply:
        return Reply(500, error_body("The fake server crashed; see server_errors.", "server_error"))

    def fault_reply(self, fault: ControlFault, request: Request) -> Reply:
        status = fault.status
        if status == 429:
            body = error_body(
                "Rate limit reached for requests. Please try again later.",
                "requests",
                code="rate_limit_exceeded",
            )
        elif status == 503:
            body = error_body("The server is overloaded or not ready yet.", "server_error")
        elif status >= 500:
            body = error_body(
                "The server had an error while processing your request. Sorry about that!",
                "server_error",
            )
        else:
            body = error_body(f"Injected fault ({status}).", "invalid_request_error")
        headers: dict[str, str] = {}
        if fault.retry_after is not None:
            headers["retry-after"] = format_seconds(fault.retry_after)
        return Reply(status, body, headers=headers)

    def answer(self, request: Request, log: JSON) -> Reply:
        auth = request.headers.get("Authorization") or ""
        if not auth.startswith("Bearer ") or not auth[len("Bearer ") :].strip():
            return Reply(
                401,
                error_body(
                    "You didn't provide an API key. You need to provide your API key in an "
                    "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                    "invalid_request_error",
                ),
            )
        params = {k: v[-1] for k, v in parse_qs(request.query).items()}
        try:
            with self._lock:
                return self._route(request, params, log)
        except ApiError as err:
            return Reply(err.status, err.body)

    def _route(self, request: Request, params: dict[str, str], log: JSON) -> Reply:
        method, path, body = request.method, request.path, request.body
        parts = path.rstrip("/").split("/")[1:]
        if parts[:2] == ["v1", "files"]:
            rest = parts[2:]
            if method == "POST" and not rest:
                return self._create_file(request.headers.get("Content-Type", ""), body, log)
            if method == "GET" and not rest:
                return self._list_files(params)
            if method == "GET" and len(rest) == 1:
                return Reply(body=self._file_or_404(rest[0]))
            if method == "DELETE" and len(rest) == 1:
                self._file_or_404(rest[0])
                self.store.delete_file(rest[0])
                return Reply(body={"id": rest[0], "object": "file", "deleted": True})
            if method == "GET" and len(rest) == 2 and rest[1] == "content":
                self._file_or_404(rest[0])
                return Reply(
                    stream_path=self.store.content_path(rest[0]),
                    content_type="application/octet-stream",
                )
        if parts[:2] == ["v1", "batches"]:
            rest = parts[2:]
            if method == "POST" and not rest:
                return self._create_batch(body, log)
            if method == "GET" and not rest:
                return self._list_batches(params)
            if method == "GET" and len(rest) == 1:
                return self._retrieve_batch(rest[0], log)
            if method == "POST" and len(rest) == 2 and rest[1] == "cancel":
                return self._cancel_batch(rest[0], log)
        raise ApiError(404, f"Invalid URL ({method} {path})")

    def _file_or_404(self, file_id: str) -> JSON:
        found = self.store.get_file(file_id)
        if found is None:
            raise ApiError(404, f"No such File object: {file_id}", param="id")
        return found

    def _create_file(self, content_type: str, body: bytes, log: JSON) -> Reply:
        fields, upload = parse_multipart(content_type, body)
        purpose = fields.get("purpose")
        if not purpose:
            raise ApiError(
                400,
                "Missing required parameter: 'purpose'.",
                param="purpose",
                code="missing_required_parameter",
            )
        if purpose not in FILE_PURPOSES:
            raise ApiError(
                400,
                f"'{purpose}' is not one of {list(FILE_PURPOSES)} - 'purpose'",
                param="purpose",
                code="invalid_value",
            )
        if upload.get("field") != "file":
            raise ApiError(
                400,
                "Missing required parameter: 'file'.",
                param="file",
                code="missing_required_parameter",
            )
        filename = str(upload["filename"])
        if purpose == "batch" and not filename.endswith(".jsonl"):
            raise ApiError(400, "Invalid file format for Batch API. Must be .jsonl", param="file")
        now = int(time.time())
        expires_at: int | None = now + 30 * DAY if purpose == "batch" else None
        seconds = fields.get("expires_after[seconds]")
        if seconds is not None:
            expires_at = now + int(seconds)
        meta = self.store.create_file(upload["content"], filename, purpose, expires_at)
        log.update(file_id=meta["id"], purpose=purpose)
        if purpose == "batch":
            log["custom_ids"] = lenient_custom_ids(upload["content"])
        return Reply(body=meta)

    def _list_files(self, params: dict[str, str]) -> Reply:
        found = self.store.all_files()
        if "purpose" in params:
            found = [f for f in found if f["purpose"] == params["purpose"]]
        found.sort(key=lambda f: (f["created_at"], f["id"]), reverse=params.get("order") != "asc")
        return Reply(body=list_page(found, params, default_limit=10_000, max_limit=10_000))

    def _create_batch(self, raw: bytes, log: JSON) -> Reply:
        body, input_file = self._checked_create(raw)
        data, input_errors = self.batch_input(
            self.store.content_path(input_file["id"]).read_bytes()
        )
        now = int(time.time())
        existing = self.store.all_batches()
        batch: JSON = {
            "id": new_id("batch_"),
            "object": "batch",
            "endpoint": body["endpoint"],
            "model": first_model(data),
            "errors": None,
            "input_file_id": input_file["id"],
            "completion_window": "24h",
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": None,
            "expires_at": now + DAY,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "usage": usage(0, 0),
            "metadata": body.get("metadata"),
            "_seq": (existing[-1]["_seq"] + 1) if existing else 1,
            "_served": 0,
            "_stepped_at": time.time(),
            "_outcome": None,
            "_ran": False,
            "_input_errors": input_errors,
        }
        atomic_write(self.store.input_path(batch["id"]), data)
        self.store.save_batch(batch)
        log.update(
            batch_id=batch["id"],
            input_file_id=input_file["id"],
            metadata=body.get("metadata"),
            endpoint=body["endpoint"],
        )
        return Reply(body=public_batch(batch))

    def batch_input(self, data: bytes) -> tuple[bytes, list[JSON]]:
        """A batch's input file as the lifecycle runs it, and the errors `validating` finds
        in it besides its own checks; a fake of another wire format translates here."""
        return data, []

    def _checked_create(self, raw: bytes) -> tuple[JSON, JSON]:
        """(request body, input file) of a valid create-batch request; ApiError if not."""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise ApiError(
                400,
                "We could not parse the JSON body of your request. (HINT: This likely means you "
                "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)",
            )
        for name in ("input_file_id", "endpoint", "completion_window"):
            if not body.get(name):
                raise ApiError(
                    400,
                    f"Missing required parameter: '{name}'.",
                    param=name,
                    code="missing_required_parameter",
                )
        endpoint = body["endpoint"]
        if endpoint not in SDK_ENDPOINTS:
            raise ApiError(
                400,
                f"Invalid value: '{endpoint}'. Supported values are: {', '.join(SDK_ENDPOINTS)}.",
                param="endpoint",
                code="invalid_value",
            )
        if endpoint not in FAKE_ENDPOINTS:
            raise ApiError(
                400,
                f"The fake only implements {', '.join(FAKE_ENDPOINTS)}.",
                param="endpoint",
                code="invalid_value",
            )
        if body["completion_window"] != "24h":
            raise ApiError(
                400,
                f"Invalid value: '{body['completion_window']}'. Supported values are: '24h'.",
                param="completion_window",
                code="invalid_value",
            )
        self._check_metadata(body.get("metadata"))
        input_file = self.store.get_file(body["input_file_id"])
        if input_file is None:
            raise ApiError(
                404, f"No such File object: {body['input_file_id']}", param="input_file_id"
            )
        if input_file["purpose"] != "batch":
            raise ApiError(
                400,
                f"File {input_file['id']} has purpose '{input_file['purpose']}'; a batch input "
                "file must have purpose 'batch'.",
                param="input_file_id",
            )
        return body, input_file

    @staticmethod
    def _check_metadata(metadata: Any) -> None:
        if metadata is None:
            return
        problem = None
        if not isinstance(metadata, dict):
            problem = "Invalid type for 'metadata': expected an object."
        elif len(metadata) > 16:
            problem = "Invalid 'metadata': too many properties. Expected at most 16."
        else:
            for key, value in metadata.items():
                if len(key) > 64:
                    problem = f"Invalid 'metadata': key '{key}' is longer than 64 characters."
                elif not isinstance(value, str):
                    problem = f"Invalid type for 'metadata.{key}': expected a string."
                elif len(value) > 512:
                    problem = f"Invalid 'metadata.{key}': string longer than 512 characters."
        if problem:
            raise ApiError(400, problem, param="metadata", code="invalid_value")

    def _batch_or_404(self, batch_id: str) -> JSON:
        found = self.store.get_batch(batch_id)
        if found is None:
            raise ApiError(404, f"No batch found with id '{batch_id}'.", param="batch_id")
        return found

    def _list_batches(self, params: dict[str, str]) -> Reply:
        newest_first = [public_batch(b) for b in reversed(self.store.all_batches())]
        return Reply(body=list_page(newest_first, params, default_limit=20, max_limit=100))

    def _retrieve_batch(self, batch_id: str, log: JSON) -> Reply:
        batch = self._batch_or_404(batch_id)
        if self.seconds_per_state is not None:
            self._step_by_clock(batch)
        while (
            self.seconds_per_state is None
            and batch["status"] in ACTIVE
            and batch["_served"] >= self.polls_per_state
        ):
            self._step(batch)
            batch["_served"] = 0
            self.store.save_batch(batch)
        batch["_served"] += 1
        self.store.save_batch(batch)
        log.update(batch_id=batch_id, batch_status=batch["status"])
        return Reply(body=public_batch(batch))

    def _step_by_clock(self, batch: JSON) -> None:
        """Move a batch on by the time that passed: one status per `seconds_per_state`."""
        assert self.seconds_per_state is not None
        stepped = float(batch["_stepped_at"])
        while batch["status"] in ACTIVE and time.time() - stepped >= self.seconds_per_state:
            self._step(batch)
            stepped += self.seconds_per_state
            batch["_stepped_at"] = stepped
            self.store.save_batch(batch)

    def _cancel_batch(self, batch_id: str, log: JSON) -> Reply:
        batch = self._batch_or_404(batch_id)
        status = batch["status"]
        if status in ("validating", "in_progress", "finalizing"):
            batch["status"] = "cancelling"
            batch["cancelling_at"] = int(time.time())
            batch["_served"] = self.polls_per_state
            self.store.save_batch(batch)
        elif status != "cancelling":
            raise ApiError(409, f"Cannot cancel a batch with status '{status}'.")
        log.update(batch_id=batch_id, batch_status=batch["status"])
        return Reply(body=public_batch(batch))
