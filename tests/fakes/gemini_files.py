"""The fake Gemini's Files API: the resumable upload protocol, file metadata, and the
download of generated files; a mixin of FakeGemini, which routes to it.

Wire details follow google-genai's files.py and _api_client.py (`upload_file`, `_upload_fd`,
`download_file`); see gemini_server for the list. File names are `files/` plus lowercase
letters, digits and dashes; a batch's responses file is `files/batch-<batch id>`, as the
live API names them. Content lives on disk in `state_dir/files`, metadata in memory.

The SDK sends the start request's File in snake_case (`{"file": {"display_name",
"mime_type", "size_bytes"}}`); protobuf's JSON parsing accepts either spelling, so this
fake does too.
"""

import base64
import hashlib
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.fakes.base import Reply, Request
from tests.fakes.gemini_model import ApiError, new_id, rfc3339

JSON = dict[str, Any]
FILE_NAME_RE = re.compile(r"files/[a-z0-9]([a-z0-9-]*[a-z0-9])?")


class FilesApi:
    """Files, upload sessions and their content; `base_url` and `state_dir` come from the
    server."""

    state_dir: Path
    files: dict[str, JSON]
    _uploads: dict[str, JSON]
    base_url: str

    def _content_path(self, name: str) -> Path:
        return self.state_dir / "files" / name.removeprefix("files/")

    def _file_or_404(self, ident: str) -> JSON:
        found = self.files.get(f"files/{ident}")
        if found is None:
            raise ApiError(
                403,
                f"You do not have permission to access the File {ident} or it may not exist.",
            )
        return found

    def _public_file(self, file: JSON) -> JSON:
        ident = file["name"].removeprefix("files/")
        public = {k: v for k, v in file.items() if not k.startswith("_")}
        public["uri"] = f"{self.base_url}/v1beta/files/{ident}"
        if file["source"] == "GENERATED":
            public["downloadUri"] = (
                f"{self.base_url}/download/v1beta/files/{ident}:download?alt=media"
            )
        return public

    def _new_file(
        self, name: str, content: bytes, mime: str, display: str | None, source: str
    ) -> JSON:
        now = datetime.now(UTC)
        file: JSON = {"name": name}
        if display:
            file["displayName"] = display
        file.update(
            mimeType=mime,
            sizeBytes=str(len(content)),
            createTime=rfc3339(now),
            updateTime=rfc3339(now),
            expirationTime=rfc3339(now + timedelta(hours=48)),
            sha256Hash=base64.b64encode(hashlib.sha256(content).hexdigest().encode()).decode(),
            state="ACTIVE",
            source=source,
        )
        self._content_path(name).write_bytes(content)
        self.files[name] = file
        return file

    def _start_upload(self, request: Request, version: str, log: JSON) -> Reply:
        headers = request.headers
        if (headers.get("X-Goog-Upload-Protocol") or "").lower() != "resumable":
            raise ApiError(400, "The fake implements only the resumable upload protocol.")
        if (headers.get("X-Goog-Upload-Command") or "").lower() != "start":
            raise ApiError(400, "A resumable upload starts with X-Goog-Upload-Command: start.")
        try:
            size = int(headers.get("X-Goog-Upload-Header-Content-Length") or "")
        except ValueError:
            raise ApiError(400, "X-Goog-Upload-Header-Content-Length is required.") from None
        try:
            meta = (json.loads(request.body or b"{}") or {}).get("file") or {}
        except (ValueError, AttributeError):
            raise ApiError(400, "Invalid JSON payload received.") from None
        name = meta.get("name")
        if name is not None and not FILE_NAME_RE.fullmatch(name):
            raise ApiError(
                400,
                "CreateFileRequest.file.name: File name may only contain lowercase alphanumeric "
                "characters or dashes (-) and cannot begin or end with a dash.",
            )
        name = name or f"files/{new_id(12)}"
        if name in self.files:
            raise ApiError(409, f"File {name} already exists.")
        upload_id = new_id(32)
        self._uploads[upload_id] = {
            "name": name,
            "size": size,
            "mime": headers.get("X-Goog-Upload-Header-Content-Type")
            or meta.get("mimeType")
            or meta.get("mime_type"),
            "display": meta.get("displayName") or meta.get("display_name"),
            "data": bytearray(),
        }
        log["file"] = name
        url = (
            f"{self.base_url}/upload/{version}/files?upload_id={upload_id}"
            "&upload_protocol=resumable"
        )
        return Reply(
            raw=b"",
            headers={"x-goog-upload-url": url, "x-goog-upload-status": "active"},
            content_type="text/plain; charset=utf-8",
        )

    def _upload_chunk(self, request: Request, upload_id: str, log: JSON) -> Reply:
        session = self._uploads.get(upload_id)
        if session is None:
            raise ApiError(404, "No upload session with that id.")
        commands = {
            c.strip() for c in (request.headers.get("X-Goog-Upload-Command") or "").split(",")
        }
        offset = int(request.headers.get("X-Goog-Upload-Offset") or "-1")
        if "upload" not in commands or offset != len(session["data"]):
            raise ApiError(400, f"Upload offset {offset} does not match {len(session['data'])}.")
        session["data"] += request.body
        log["file"] = session["name"]
        if "finalize" not in commands:
            return Reply(raw=b"", headers={"x-goog-upload-status": "active"})
        del self._uploads[upload_id]
        if len(session["data"]) != session["size"]:
            raise ApiError(
                400,
                f"Uploaded {len(session['data'])} bytes; the upload declared {session['size']}.",
            )
        file = self._new_file(
            session["name"], bytes(session["data"]), session["mime"], session["display"], "UPLOADED"
        )
        return Reply(
            body={"file": self._public_file(file)}, headers={"x-goog-upload-status": "final"}
        )

    def _download(self, ident: str, params: dict[str, str], log: JSON) -> Reply:
        file = self._file_or_404(ident)
        log["file"] = file["name"]
        if params.get("alt") != "media":
            raise ApiError(400, "Download requires alt=media.")
        if file["source"] != "GENERATED":
            raise ApiError(400, "Only generated files can be downloaded.")
        return Reply(stream_path=self._content_path(file["name"]), content_type="application/jsonl")

    def read_input(self, file_name: str) -> bytes:
        path = self._content_path(file_name)
        return path.read_bytes() if path.exists() else b""

    def write_output(self, batch: JSON, content: bytes) -> str:
        name = "files/batch-" + batch["name"].removeprefix("batches/")
        self._new_file(name, content, "application/jsonl", None, "GENERATED")
        return name
