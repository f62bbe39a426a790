"""A fake of Anthropic's Message Batches API: real HTTP on loopback, state on disk.

The official SDK talks to it through `base_url`, so an adapter tested against it exercises the
real wire protocol: envelopes, status codes, `request-id` / `retry-after` headers, cursor
pagination and a `results_url` streamed as JSONL. Batch state advances on retrieve calls rather
than wall time, so tests need no sleeps, and every byte of state lives in `state_dir` (written
atomically), so `restart()` mid-batch loses nothing.

Two deliberate readings of the real API worth knowing:

* Authentication accepts `x-api-key` *or* `Authorization: Bearer ...`: anthropic 2.x sends the
  `api_key` as a bearer token, and the real API accepts both.
* A body over `max_body_bytes` (256 MB) is a 413 `request_too_large`, as on the real API; every
  other create violation is a 400 `invalid_request_error` and creates no batch.

The prompt cache (`cache_control` on system blocks) is modelled in `anthropic_cache`; `bill()`
is what every request processed was billed for, by kind of token.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs

from tests.fakes.anthropic_cache import Prefix, PromptCache, check_cache_control, with_cache
from tests.fakes.anthropic_model import (
    ERROR_MESSAGES,
    ITEM_ERRORS,
    MAX_REQUESTS,
    ApiError,
    BatchOutcome,
    ItemFault,
    Responder,
    assistant_message,
    counts,
    error_body,
    rfc3339,
    validate_create,
)
from tests.fakes.base import FaultInjectingServer, Reply, Request
from tests.fakes.common import CallLog, ControlFault, LostResponseFault, delay_fault, format_seconds

# The fake and the faults tests inject into it.
__all__ = ["FakeAnthropic", "LostResponseFault", "delay_fault"]

MAX_BODY_BYTES = 256 * 1024 * 1024
BATCH_PATH_RE = re.compile(r"^/v1/messages/batches/([^/]+)(/cancel|/results)?$")


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class FakeAnthropic(FaultInjectingServer):
    """The Message Batches API on 127.0.0.1.

    Knobs (plain attributes, read at the moment they matter):

    * `polls_per_state`: retrieves a batch answers `in_progress` before the next one ends it.
    * `item_fault(custom_id, params)`: None or one of "invalid_request", "api_error",
      "overloaded" (errored results), "expired", "canceled", "missing" (no result line, yet
      counted as succeeded: a lost line) or "duplicate" (the succeeded line appears twice).
    * `batch_outcome(batch)`: "ended" or "expired"; `batch` is the MessageBatch JSON plus
      "requests". On "expired" the second half of the requests expire.
    * `shuffle_results`: results out of request order, deterministically per batch.
    * `responder(params)`: the assistant text; `default_responder` when None.
    * `max_requests`, `max_body_bytes`: the API's limits, lowerable so tests stay small.
    * `max_processing_batches`: batches allowed to be processing (`in_progress` or
      `canceling`) at once. A valid create while that many are is a 429 `rate_limit_error`
      "Number of Message Batches being processed has exceeded your limit of <n>. Please wait
      for a batch to end before creating another." and creates nothing. None (the default):
      no limit.
    * `quota_retry_after`: the `retry-after` seconds of that 429; None sends no header.

    Results are decided once, when the batch ends, and stored; knobs changed later do not
    rewrite them.

    `faults` are matched by method and a substring of the path (query included) before auth
    or routing, and are applied in this order: `delay_seconds`; then `reset_connection` (a TCP
    RST, nothing handled); then a `status` >= 400 answers with the error envelope (429 always
    carries `retry-after`, 1 s unless `retry_after` is set; other statuses only when it is). A
    status below 400 lets the call through, which is what `delay_fault` builds.
    `LostResponseFault` handles the call, then resets instead of answering.
    """

    server_name: ClassVar[str] = "fake-anthropic"
    reset_status: ClassVar[int | None] = None

    def __init__(self, state_dir: Path, *, port: int | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.batches_dir = self.state_dir / "batches"
        self.batches_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(CallLog(self.state_dir / "calls.jsonl"), port=port, poll_interval=0.01)
        self.polls_per_state: int = 1
        self.item_fault: ItemFault | None = None
        self.batch_outcome: BatchOutcome | None = None
        self.shuffle_results: bool = True
        self.responder: Responder | None = None
        self.max_requests: int = MAX_REQUESTS
        self.max_body_bytes: int | None = MAX_BODY_BYTES
        self.max_processing_batches: int | None = None
        self.quota_retry_after: float | None = 1.0
        self._lock = threading.RLock()
        self.cache = PromptCache(self.state_dir / "prompt_cache.json")

    def bill(self) -> list[dict[str, Any]]:
        """Every succeeded request of every batch as billed (its batch_id, custom_id, model
        and usage), batches in creation order, deleted ones included."""
        with self._lock:
            metas = sorted(self._all_metas(), key=lambda meta: meta["seq"])
            return [
                entry
                for meta in metas
                if (path := self._batch_dir(meta["id"]) / "bill.json").is_file()
                for entry in json.loads(path.read_text())
            ]

    def submitted_custom_ids(self) -> list[str]:
        """Every custom_id of every batch created, deleted ones included, in creation order."""
        with self._lock:
            metas = sorted(self._all_metas(), key=lambda meta: meta["seq"])
            return [
                request["custom_id"] for meta in metas for request in self._requests(meta["id"])
            ]

    def batch_ids(self) -> list[str]:
        """Ids of every batch created, deleted ones included, in creation order."""
        with self._lock:
            return [meta["id"] for meta in sorted(self._all_metas(), key=lambda m: m["seq"])]

    def held_batch_ids(self) -> list[str]:
        """Ids of the batches not deleted, in creation order: what the service still holds."""
        with self._lock:
            metas = sorted(self._all_metas(), key=lambda m: m["seq"])
            return [meta["id"] for meta in metas if not meta.get("deleted")]

    def _batch_dir(self, batch_id: str) -> Path:
        return self.batches_dir / batch_id

    def _all_metas(self) -> list[dict[str, Any]]:
        return [
            json.loads(path.read_text())
            for path in self.batches_dir.glob("*/meta.json")
            if path.is_file()
        ]

    def _load_meta(self, batch_id: str) -> dict[str, Any]:
        path = self._batch_dir(batch_id) / "meta.json"
        if not re.fullmatch(r"msgbatch_[0-9a-f]+", batch_id) or not path.is_file():
            raise ApiError(404, f"Message Batch {batch_id!r} not found.")
        meta: dict[str, Any] = json.loads(path.read_text())
        if meta.get("deleted"):
            raise ApiError(404, f"Message Batch {batch_id!r} not found.")
        return meta

    def _save_meta(self, meta: dict[str, Any]) -> None:
        write_atomic(self._batch_dir(meta["id"]) / "meta.json", json.dumps(meta).encode())

    def _requests(self, batch_id: str) -> list[dict[str, Any]]:
        requests: list[dict[str, Any]] = json.loads(
            (self._batch_dir(batch_id) / "requests.json").read_text()
        )
        return requests

    def _batch_json(self, meta: dict[str, Any]) -> dict[str, Any]:
        ended = meta["processing_status"] == "ended"
        return {
            "id": meta["id"],
            "type": "message_batch",
            "processing_status": meta["processing_status"],
            "request_counts": meta["request_counts"],
            "created_at": meta["created_at"],
            "ended_at": meta["ended_at"],
            "expires_at": meta["expires_at"],
            "cancel_initiated_at": meta["cancel_initiated_at"],
            "archived_at": meta["archived_at"],
            "results_url": (
                f"{self.base_url}/v1/messages/batches/{meta['id']}/results" if ended else None
            ),
        }

    def _create(self, body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        requests = validate_create(body, self.max_requests)
        for index, request in enumerate(requests):
            check_cache_control(request["params"].get("system"), f"requests.{index}.params")
        now = datetime.now(UTC)
        with self._lock:
            self._check_processing_quota()
            batch_id = f"msgbatch_{secrets.token_hex(12)}"
            batch_dir = self._batch_dir(batch_id)
            batch_dir.mkdir()
            write_atomic(batch_dir / "requests.json", json.dumps(requests).encode())
            meta = {
                "id": batch_id,
                "seq": len(list(self.batches_dir.glob("*/meta.json"))),
                "processing_status": "in_progress",
                "request_counts": counts(processing=len(requests)),
                "created_at": rfc3339(now),
                "ended_at": None,
                "expires_at": rfc3339(now + timedelta(hours=24)),
                "cancel_initiated_at": None,
                "archived_at": None,
                "polls": 0,
                "deleted": False,
                # What the batch reads from the prompt cache: the prefixes cached as it starts.
                "cache_at_start": self.cache.live_keys(),
            }
            self._save_meta(meta)
        return self._batch_json(meta), [request["custom_id"] for request in requests]

    def _check_processing_quota(self) -> None:
        limit = self.max_processing_batches
        if limit is None:
            return
        processing = sum(1 for m in self._all_metas() if m["processing_status"] != "ended")
        if processing >= limit:
            headers = {}
            if self.quota_retry_after is not None:
                headers["retry-after"] = format_seconds(self.quota_retry_after)
            raise ApiError(
                429,
                f"Number of Message Batches being processed has exceeded your limit of {limit}. "
                "Please wait for a batch to end before creating another.",
                headers,
            )

    def _retrieve(self, batch_id: str) -> dict[str, Any]:
        with self._lock:
            meta = self._load_meta(batch_id)
            if meta["processing_status"] == "canceling":
                self._end(meta, cutoff_as="canceled")
            elif meta["processing_status"] == "in_progress":
                meta["polls"] += 1
                if meta["polls"] > self.polls_per_state:
                    self._end(meta, cutoff_as=None)
                else:
                    self._save_meta(meta)
            return self._batch_json(meta)

    def _cancel(self, batch_id: str) -> dict[str, Any]:
        with self._lock:
            meta = self._load_meta(batch_id)
            if meta["processing_status"] == "ended":
                raise ApiError(400, f"Message Batch {batch_id!r} has ended and cannot be canceled.")
            if meta["processing_status"] == "in_progress":
                meta["processing_status"] = "canceling"
                meta["cancel_initiated_at"] = rfc3339(datetime.now(UTC))
                self._save_meta(meta)
            return self._batch_json(meta)

    def _delete(self, batch_id: str) -> dict[str, Any]:
        with self._lock:
            meta = self._load_meta(batch_id)
            if meta["processing_status"] != "ended":
                raise ApiError(
                    400,
                    f"Message Batch {batch_id!r} is still processing; cancel it and wait for it "
                    "to end before deleting it.",
                )
            meta["deleted"] = True
            self._save_meta(meta)
            # The results go with the batch; its requests stay for submitted_custom_ids.
            (self._batch_dir(batch_id) / "results.jsonl").unlink(missing_ok=True)
            return {"id": batch_id, "type": "message_batch_deleted"}

    def _results(self, batch_id: str) -> bytes:
        with self._lock:
            meta = self._load_meta(batch_id)
            if meta["processing_status"] != "ended":
                raise ApiError(
                    404, f"Results for Message Batch {batch_id!r} are not available: not ended."
                )
            return (self._batch_dir(batch_id) / "results.jsonl").read_bytes()

    def _list(self, query: dict[str, list[str]]) -> dict[str, Any]:
        after_id = (query.get("after_id") or [None])[0]
        before_id = (query.get("before_id") or [None])[0]
        raw_limit = (query.get("limit") or ["20"])[0]
        try:
            limit = int(raw_limit)
        except ValueError:
            message = f"limit: Input should be a valid integer, got {raw_limit!r}"
            raise ApiError(400, message) from None
        if not 1 <= limit <= 1000:
            raise ApiError(400, "limit: Input should be between 1 and 1000")
        if after_id and before_id:
            raise ApiError(400, "Only one of after_id and before_id may be given.")
        with self._lock:
            metas = [meta for meta in self._all_metas() if not meta.get("deleted")]
        metas.sort(key=lambda meta: meta["seq"], reverse=True)
        ids = [meta["id"] for meta in metas]
        for cursor in (after_id, before_id):
            if cursor and cursor not in ids:
                raise ApiError(400, f"Invalid pagination cursor {cursor!r}: no such Message Batch.")
        if after_id:
            rest = metas[ids.index(after_id) + 1 :]
            page, has_more = rest[:limit], len(rest) > limit
        elif before_id:
            rest = metas[: ids.index(before_id)]
            page, has_more = rest[-limit:], len(rest) > limit
        else:
            page, has_more = metas[:limit], len(metas) > limit
        return {
            "data": [self._batch_json(meta) for meta in page],
            "has_more": has_more,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
        }

    def _end(self, meta: dict[str, Any], cutoff_as: str | None) -> None:
        """Decide every request's result, write results.jsonl, then flip the batch to ended.

        Requests in the second half count as not yet processed: they become `cutoff_as`
        (canceled) or, if `batch_outcome` says so, expired.
        """
        requests = self._requests(meta["id"])
        if cutoff_as is None and self.batch_outcome is not None:
            outcome = self.batch_outcome({**self._batch_json(meta), "requests": requests})
            if outcome not in ("ended", "expired"):
                raise ValueError(f"batch_outcome returned {outcome!r}")
            cutoff_as = "expired" if outcome == "expired" else None
        processed = len(requests) // 2 if cutoff_as else len(requests)
        tally = counts()
        lines: list[dict[str, Any]] = []
        bill: list[dict[str, Any]] = []
        cached: list[Prefix] = []
        for index, request in enumerate(requests):
            custom_id, params = request["custom_id"], request["params"]
            if index >= processed:
                kind = cutoff_as or "expired"
            else:
                kind = (self.item_fault(custom_id, params) if self.item_fault else None) or "ok"
            result: dict[str, Any]
            if kind in ("ok", "missing", "duplicate"):
                answer = assistant_message(meta["id"], request, self.responder)
                answer["usage"], prefix = with_cache(answer["usage"], params, meta)
                cached.extend([prefix] if prefix else [])
                billed = {"batch_id": meta["id"], "custom_id": custom_id, "model": params["model"]}
                bill.append({**billed, **answer["usage"]})
                result = {"type": "succeeded", "message": answer}
                tally["succeeded"] += 1
            elif kind in ITEM_ERRORS:
                error_type, message = ITEM_ERRORS[kind]
                result = {
                    "type": "errored",
                    "error": {"type": "error", "error": {"type": error_type, "message": message}},
                }
                tally["errored"] += 1
            elif kind in ("expired", "canceled"):
                result = {"type": kind}
                tally[kind] += 1
            else:
                raise ValueError(f"item_fault returned {kind!r} for {custom_id!r}")
            line = {"custom_id": custom_id, "result": result}
            if kind != "missing":
                lines.append(line)
            if kind == "duplicate":
                lines.append(line)
        if self.shuffle_results and len(lines) > 1:
            original = list(lines)
            random.Random(meta["id"]).shuffle(lines)
            if lines == original:
                lines = lines[1:] + lines[:1]
        payload = "".join(json.dumps(line) + "\n" for line in lines).encode()
        write_atomic(self._batch_dir(meta["id"]) / "results.jsonl", payload)
        write_atomic(self._batch_dir(meta["id"]) / "bill.json", json.dumps(bill).encode())
        self.cache.keep(cached)
        meta["processing_status"] = "ended"
        meta["ended_at"] = rfc3339(datetime.now(UTC))
        meta["request_counts"] = tally
        self._save_meta(meta)

    def new_request_id(self) -> str:
        return f"req_{secrets.token_hex(12)}"

    def response_headers(self, request: Request) -> dict[str, str]:
        return {"request-id": request.request_id}

    def fault_reply(self, fault: ControlFault, request: Request) -> Reply:
        """The error envelope; a 429 always carries `retry-after` (1 s unless set)."""
        headers: dict[str, str] = {}
        if fault.retry_after is not None or fault.status == 429:
            retry_after = 1.0 if fault.retry_after is None else fault.retry_after
            headers["retry-after"] = format_seconds(retry_after)
        text = ERROR_MESSAGES.get(fault.status, f"Injected fault {fault.status}")
        body = error_body(fault.status, text, request.request_id)
        return Reply(fault.status, body, headers=headers)

    def crash_reply(self, request: Request) -> Reply:
        text = "The fake server crashed; see server_errors."
        return Reply(500, error_body(500, text, request.request_id))

    def answer(self, request: Request, log: dict[str, Any]) -> Reply:
        try:
            auth = request.headers.get("authorization", "")
            has_bearer = auth.lower().startswith("bearer ") and auth[7:].strip()
            if not request.headers.get("x-api-key") and not has_bearer:
                raise ApiError(401, "x-api-key header is required")
            if not request.headers.get("anthropic-version"):
                raise ApiError(400, "anthropic-version: header is required")
            return self._dispatch(request, log)
        except ApiError as err:
            body = error_body(err.status, err.message, request.request_id)
            return Reply(err.status, body, headers=dict(err.headers))

    def _dispatch(self, request: Request, log: dict[str, Any]) -> Reply:
        method, path = request.method, request.path
        if path == "/v1/messages/batches" and method == "POST":
            log.update({"batch_id": None, "custom_ids": []})
            length = int(request.headers.get("content-length") or 0)
            if self.max_body_bytes is not None and length > self.max_body_bytes:
                raise ApiError(
                    413, f"Request exceeds the maximum size of {self.max_body_bytes} bytes"
                )
            try:
                parsed = json.loads(request.body or b"null")
            except ValueError:
                raise ApiError(400, "The request body is not valid JSON.") from None
            if isinstance(parsed, dict) and isinstance(parsed.get("requests"), list):
                log["custom_ids"] = [
                    r.get("custom_id") for r in parsed["requests"] if isinstance(r, dict)
                ]
            batch, custom_ids = self._create(parsed)
            log.update({"batch_id": batch["id"], "custom_ids": custom_ids})
            return Reply(body=batch)
        if path == "/v1/messages/batches" and method == "GET":
            return Reply(body=self._list(parse_qs(request.query)))
        match = BATCH_PATH_RE.match(path)
        if match:
            batch_id, action = match.group(1), match.group(2)
            log["batch_id"] = batch_id
            if action is None and method == "GET":
                return Reply(body=self._retrieve(batch_id))
            if action is None and method == "DELETE":
                return Reply(body=self._delete(batch_id))
            if action == "/cancel" and method == "POST":
                return Reply(body=self._cancel(batch_id))
            if action == "/results" and method == "GET":
                results = self._results(batch_id)
                return Reply(raw=results, content_type="application/x-jsonl")
        raise ApiError(404, f"Not found: {method} {path}")
