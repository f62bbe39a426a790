"""A fake of the Gemini Developer API's Files API and Batch Mode: real HTTP on loopback,
spoken to by the official google-genai SDK.

What the SDK (google-genai 3.x: files.py, batches.py, _api_client.py) sends, and so what
this fake serves, under /v1beta or /v1 (the SDK's default version is v1 since 3.0):

* Resumable upload: `POST /upload/{v}/files` with `X-Goog-Upload-Protocol: resumable`,
  `X-Goog-Upload-Command: start`, `X-Goog-Upload-Header-Content-Length/-Content-Type` and a
  `{"file": {...}}` body, answered with an empty body and the `x-goog-upload-url` header;
  then `POST <upload url>` chunks (8 MiB) with `X-Goog-Upload-Command: upload` (the last
  `upload, finalize`) and `X-Goog-Upload-Offset`. Every chunk answer carries
  `x-goog-upload-status` (`active`, or `final` with `{"file": File}`); without it the SDK
  sleeps and resends. The chunks carry no API key: the upload id authorizes them.
* `GET/DELETE /{v}/files/{id}`, `GET /{v}/files`, and `GET /{v}/files/{id}:download?alt=media`
  (the SDK's `files.download`; `/download/{v}/...`, the API's media path, works too). Only
  generated files (batch output) download, as the SDK documents.
* `POST /{v}/models/{m}:batchGenerateContent` (and `:asyncBatchEmbedContent`, whose lines
  are EmbedContentRequests) with `{"batch": {"displayName", "inputConfig": {"fileName"}}}`;
  `GET /{v}/batches/{id}`, `GET /{v}/batches?pageSize&pageToken` (answer `{"operations",
  "nextPageToken"}`), `POST /{v}/batches/{id}:cancel`, `DELETE /{v}/batches/{id}`. See
  gemini_batches for the Operation shape.
* Auth: `x-goog-api-key` (or `?key=`); none is 403 PERMISSION_DENIED, a key outside
  `api_keys` 400 INVALID_ARGUMENT (API_KEY_INVALID), as Google answers.

Files and batches live in memory (content on disk in `state_dir`), so `restart()` keeps them.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs

from tests.fakes.base import FaultInjectingServer, Reply, Request
from tests.fakes.common import (
    CallLog,
    ControlFault,
    LostResponseFault,
    PrefixCache,
    format_seconds,
)
from tests.fakes.gemini_batches import ACTIVE, BatchLifecycle, operation, parse_input
from tests.fakes.gemini_files import FilesApi
from tests.fakes.gemini_model import MESSAGES, ApiError, error_body, new_id, rfc3339

# The fake and the fault tests inject into it.
__all__ = ["FakeGemini", "LostResponseFault"]

JSON = dict[str, Any]
API_VERSIONS = ("v1beta", "v1")
PATH_RE = re.compile(rf"^/(?:(upload|download)/)?({'|'.join(API_VERSIONS)})/(.+)$")
CREATE_VERBS = {":batchGenerateContent": "generate", ":asyncBatchEmbedContent": "embed"}
"""The create methods, by what their batch's requests are."""
NO_KEY = (
    "Method doesn't allow unregistered callers (callers without established identity). "
    "Please use API Key or other form of API consumer identity to call this API."
)


class FakeGemini(FilesApi, BatchLifecycle, FaultInjectingServer):
    """The fake server; knobs are plain attributes tests may change between calls.

    polls_per_state: batches.get calls each of PENDING and RUNNING lasts (0: done at once).
    line_fault: (key, request) -> None | "invalid_argument" | "429" | "500" (error lines) |
        "safety" (candidate stopped for SAFETY) | "prompt_blocked" (promptFeedback) |
        "missing" (run, but no line) | "duplicate" (two lines).
    batch_outcome: (operation) -> "succeeded" | "failed" | "expired" |
        "cancelled_after_partial"; asked when the batch leaves PENDING. Expired and cancelled
        batches answer the first half of their lines; the rest have no line.
    shuffle_output: result lines not in input order (deterministic per batch).
    responder: GenerateContentRequest -> answer text, instead of `default_responder`.
    prefix_cache: Gemini's implicit cache of a system instruction of 1024 words or more, read
        (`cachedContentTokenCount`) by the batches after the one that first sent it.
    max_active_batches: PENDING/RUNNING batches allowed at once; one more create is a 429.
    api_keys: the keys accepted (None: any non-empty key).
    billed: key -> how many times a batch ran the request to an answer.

    faults: control-plane faults by method and path substring (see FaultInjectingServer);
        e.g. ControlFault("POST", ":batchGenerateContent", status=503) or
        LostResponseFault("POST", ":batchGenerateContent"), a create that takes effect but
        whose answer is lost.
    calls: one entry per HTTP call: ts, method, path, query, status, request_id, fault,
        api_version, keyed (an x-goog-api-key was sent); plus file/batch names and
        display_name where they apply.
    """

    server_name: ClassVar[str] = "ESF"

    def __init__(self, state_dir: Path, *, port: int | None = None) -> None:
        self.state_dir = Path(state_dir)
        (self.state_dir / "files").mkdir(parents=True, exist_ok=True)
        super().__init__(CallLog(), port=port, poll_interval=0.02)
        self.polls_per_state: int = 1
        self.line_fault: Callable[[str, JSON], str | None] | None = None
        self.batch_outcome: Callable[[JSON], str] | None = None
        self.shuffle_output: bool = True
        self.responder: Callable[[JSON], str] | None = None
        self.prefix_cache = PrefixCache(minimum=1024)
        self.max_active_batches: int | None = None
        self.api_keys: set[str] | None = None
        self.billed: Counter[str] = Counter()
        self.files: dict[str, JSON] = {}
        self.batches: dict[str, JSON] = {}
        self._uploads: dict[str, JSON] = {}
        self._lock = threading.RLock()
        self._seq = 0
        self._submitted: list[str] = []

    def submitted_custom_ids(self) -> list[str]:
        """The key of every request line of every batch created, deleted ones included, in
        creation order."""
        with self._lock:
            return list(self._submitted)

    def batch(self, name: str) -> JSON | None:
        """A batch's Operation, without counting a poll (for assertions)."""
        with self._lock:
            found = self.batches.get(name)
            return None if found is None else operation(found)

    def new_request_id(self) -> str:
        return new_id(16)

    def call_entry(self, request: Request) -> JSON:
        entry = super().call_entry(request)
        match = PATH_RE.match(request.path)
        if match:
            entry["api_version"] = match.group(2)
        entry["keyed"] = bool(request.headers.get("x-goog-api-key"))
        return entry

    def crash_reply(self, request: Request) -> Reply:
        return Reply(500, error_body(500, "The fake server crashed; see server_errors."))

    def fault_reply(self, fault: ControlFault, request: Request) -> Reply:
        message = MESSAGES.get(fault.status, f"Injected fault ({fault.status}).")
        headers = {}
        if request.path.startswith("/upload/"):  # else the SDK resends the chunk after a sleep
            headers["x-goog-upload-status"] = "final"
        if fault.retry_after is not None:
            headers["retry-after"] = format_seconds(fault.retry_after)
        return Reply(fault.status, error_body(fault.status, message), headers=headers)

    # Routing

    def answer(self, request: Request, log: JSON) -> Reply:
        params = {k: v[-1] for k, v in parse_qs(request.query).items()}
        match = PATH_RE.match(request.path)
        try:
            if match is None:
                raise ApiError(404, f"The requested URL {request.path} was not found.")
            prefix, version, rest = match.groups()
            if prefix == "upload" and "upload_id" in params:
                with self._lock:
                    return self._upload_chunk(request, params["upload_id"], log)
            self._check_key(request, params)
            with self._lock:
                return self._route(request, prefix, version, rest, params, log)
        except ApiError as err:
            headers = {"x-goog-upload-status": "final"} if prefix_of(match) == "upload" else {}
            return Reply(err.status, err.body, headers=headers)

    def _check_key(self, request: Request, params: dict[str, str]) -> None:
        key = (request.headers.get("x-goog-api-key") or params.get("key") or "").strip()
        if not key:
            raise ApiError(403, NO_KEY)
        if self.api_keys is not None and key not in self.api_keys:
            raise ApiError(400, "API key not valid. Please pass a valid API key.")

    def _route(
        self,
        request: Request,
        prefix: str | None,
        version: str,
        rest: str,
        params: dict[str, str],
        log: JSON,
    ) -> Reply:
        method = request.method
        if prefix == "upload" and rest == "files" and method == "POST":
            return self._start_upload(request, version, log)
        if rest.endswith(":download") and method == "GET" and rest.startswith("files/"):
            return self._download(rest[len("files/") : -len(":download")], params, log)
        if prefix is None and rest == "files" and method == "GET":
            files = [self._public_file(f) for f in self.files.values()]
            return Reply(body=self._page("files", files, params))
        if prefix is None and rest.startswith("files/") and "/" not in rest[6:]:
            file = self._file_or_404(rest[6:])
            log["file"] = file["name"]
            if method == "GET":
                return Reply(body=self._public_file(file))
            if method == "DELETE":
                self.files.pop(file["name"])
                self._content_path(file["name"]).unlink(missing_ok=True)
                return Reply(body={})
        if prefix is None and method == "POST" and rest.startswith("models/"):
            for verb, kind in CREATE_VERBS.items():
                if rest.endswith(verb):
                    return self._create_batch(rest[: -len(verb)], request.body, log, kind)
        if prefix is None and rest == "batches" and method == "GET":
            newest_first = [operation(b) for b in reversed(self.batches.values())]
            return Reply(body=self._page("operations", newest_first, params))
        if prefix is None and rest.startswith("batches/"):
            ident, _, verb = rest[len("batches/") :].partition(":")
            batch = self._batch_or_404(f"batches/{ident}")
            log["batch"] = batch["name"]
            if method == "GET" and not verb:
                self.advance(batch)
                log["state"] = batch["state"]
                return Reply(body=operation(batch))
            if method == "POST" and verb == "cancel":
                return self._cancel(batch, log)
            if method == "DELETE" and not verb:
                del self.batches[batch["name"]]
                return Reply(body={})
        raise ApiError(404, f"The requested URL {request.path} was not found.")

    # Batches

    def _batch_or_404(self, name: str) -> JSON:
        found = self.batches.get(name)
        if found is None:
            raise ApiError(404, f"Batch {name} not found.")
        return found

    def _create_batch(self, model: str, raw: bytes, log: JSON, kind: str) -> Reply:
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise ApiError(400, "Invalid JSON payload received.") from None
        spec = body.get("batch") if isinstance(body, dict) else None
        if not isinstance(spec, dict):
            raise ApiError(400, "batch is required.")
        display = spec.get("displayName")
        if not isinstance(display, str) or not display:
            raise ApiError(400, "batch.display_name is required.")
        source = spec.get("inputConfig") or {}
        # Proto JSON takes either spelling; the SDK sends embeddings' as file_name.
        file_name = source.get("fileName", source.get("file_name"))
        if not isinstance(file_name, str):
            raise ApiError(400, "The fake implements only file input (inputConfig.fileName).")
        if file_name not in self.files:
            raise ApiError(404, f"File {file_name} not found.")
        active = sum(1 for b in self.batches.values() if b["state"] in ACTIVE)
        if self.max_active_batches is not None and active >= self.max_active_batches:
            raise ApiError(
                429,
                f"Too many concurrent batch jobs: {active} are pending or running; the limit "
                f"is {self.max_active_batches}.",
            )
        lines, _ = parse_input(self.read_input(file_name))
        now = rfc3339()
        self._seq += 1
        batch: JSON = {
            "name": f"batches/{new_id(36)}",
            "model": model,
            "kind": kind,
            "displayName": display,
            "inputFile": file_name,
            "createTime": now,
            "updateTime": now,
            "requests": len(lines),
            "counts": {"pendingRequestCount": len(lines)},
            "state": "BATCH_STATE_PENDING",
            "_served": 0,
            "_outcome": None,
            "_seq": self._seq,
        }
        self.batches[batch["name"]] = batch
        self._submitted += [str(line.get("key", "")) for line in lines]
        log.update(batch=batch["name"], display_name=display, file=file_name)
        return Reply(body=operation(batch))

    def _cancel(self, batch: JSON, log: JSON) -> Reply:
        if batch["state"] not in ACTIVE:
            raise ApiError(
                400, f"Batch {batch['name']} is already {batch['state']}.", "FAILED_PRECONDITION"
            )
        if batch["state"] == "BATCH_STATE_RUNNING":
            self.finish(batch, "BATCH_STATE_CANCELLED")
        else:
            now = rfc3339()
            batch.update(state="BATCH_STATE_CANCELLED", endTime=now, updateTime=now)
        log["state"] = batch["state"]
        return Reply(body={})

    @staticmethod
    def _page(field: str, items: list[JSON], params: dict[str, str]) -> JSON:
        """One page of a list method: pageSize (default 10, at most 1000) and an opaque
        pageToken naming where the next page starts."""
        try:
            size = int(params.get("pageSize") or 10)
        except ValueError:
            raise ApiError(400, "pageSize must be an integer.") from None
        if size < 0:
            raise ApiError(400, "pageSize must not be negative.")
        size = min(size or 10, 1000)
        start = 0
        token = params.get("pageToken")
        if token:
            try:
                start = int(base64.urlsafe_b64decode(token.encode()).decode())
            except ValueError:
                raise ApiError(400, "Invalid page token.") from None
        page: JSON = {field: items[start : start + size]}
        if start + size < len(items):
            page["nextPageToken"] = base64.urlsafe_b64encode(str(start + size).encode()).decode()
        return page


def prefix_of(match: re.Match[str] | None) -> str | None:
    return match.group(1) if match else None
