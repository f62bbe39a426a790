"""The fake OpenAI's state on disk: files and batches, written atomically so that a restart, or a
new fake on the same directory, carries on where the last one stopped; and the upload parsing.
"""

import contextlib
import json
import os
import time
import uuid
from email.message import Message
from pathlib import Path
from typing import Any

from tests.fakes.openai_model import ApiError, new_id

JSON = dict[str, Any]


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def public_batch(batch: JSON) -> JSON:
    return {k: v for k, v in batch.items() if not k.startswith("_")}


def lenient_custom_ids(data: bytes) -> list[str]:
    found: list[str] = []
    for raw in data.splitlines():
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            obj = json.loads(raw)
            if isinstance(obj, dict) and isinstance(obj.get("custom_id"), str):
                found.append(obj["custom_id"])
    return found


def _read_meta(folder: Path, ident: str) -> JSON | None:
    """The JSON stored for `ident` in `folder`, or None for an unknown id (or one that would
    reach outside the folder)."""
    path = folder / f"{ident}.json"
    if "/" in ident or not path.exists():
        return None
    return json.loads(path.read_text())


class Store:
    """Files and batches on disk; every write goes through a temp file and an atomic rename."""

    def __init__(self, root: Path) -> None:
        self.files = root / "files"
        self.batches = root / "batches"
        self.files.mkdir(parents=True, exist_ok=True)
        self.batches.mkdir(parents=True, exist_ok=True)

    def content_path(self, file_id: str) -> Path:
        return self.files / f"{file_id}.bin"

    def create_file(
        self, content: bytes, filename: str, purpose: str, expires_at: int | None
    ) -> JSON:
        now = int(time.time())
        meta: JSON = {
            "id": new_id("file-", 24),
            "object": "file",
            "bytes": len(content),
            "created_at": now,
            "expires_at": expires_at,
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "status_details": None,
        }
        atomic_write(self.content_path(meta["id"]), content)
        atomic_write(self.files / f"{meta['id']}.json", json.dumps(meta).encode())
        return meta

    def get_file(self, file_id: str) -> JSON | None:
        return _read_meta(self.files, file_id)

    def all_files(self) -> list[JSON]:
        return [json.loads(p.read_text()) for p in self.files.glob("*.json")]

    def delete_file(self, file_id: str) -> None:
        (self.files / f"{file_id}.json").unlink(missing_ok=True)
        self.content_path(file_id).unlink(missing_ok=True)

    def input_path(self, batch_id: str) -> Path:
        return self.batches / f"{batch_id}.input.jsonl"

    def save_batch(self, batch: JSON) -> None:
        atomic_write(self.batches / f"{batch['id']}.json", json.dumps(batch).encode())

    def get_batch(self, batch_id: str) -> JSON | None:
        return _read_meta(self.batches, batch_id)

    def all_batches(self) -> list[JSON]:
        """Oldest first."""
        found = [json.loads(p.read_text()) for p in self.batches.glob("batch_*.json")]
        return sorted(found, key=lambda b: b["_seq"])


def parse_multipart(content_type: str, body: bytes) -> tuple[dict[str, str], JSON]:
    """Form fields and the uploaded file of a multipart/form-data body, byte-exact."""
    header = Message()
    header["content-type"] = content_type
    boundary = header.get_param("boundary")
    if header.get_content_type() != "multipart/form-data" or not isinstance(boundary, str):
        raise ApiError(400, "Expected a multipart/form-data body.")
    fields: dict[str, str] = {}
    upload: JSON = {}
    delimiter = b"\r\n--" + boundary.encode("latin-1")
    for part in (b"\r\n" + body).split(delimiter)[1:]:
        if part.startswith(b"--"):
            break
        head, _, data = part.partition(b"\r\n\r\n")
        if data.endswith(b"\r\n"):
            data = data[:-2]
        part_headers = Message()
        for line in head.decode("utf-8", "replace").split("\r\n"):
            name, sep, value = line.partition(":")
            if sep:
                part_headers[name.strip()] = value.strip()
        name = part_headers.get_param("name", header="content-disposition")
        filename = part_headers.get_filename()
        if not isinstance(name, str):
            continue
        if filename is not None:
            upload = {"field": name, "filename": filename, "content": data}
        else:
            fields[name] = data.decode("utf-8", "replace")
    return fields, upload


def first_model(data: bytes) -> str | None:
    """The model of the first request line that names one."""
    for raw in data.splitlines():
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            obj = json.loads(raw)
            model = obj.get("body", {}).get("model") if isinstance(obj, dict) else None
            if isinstance(model, str):
                return model
    return None


def list_page(
    items: list[JSON], params: dict[str, str], default_limit: int, max_limit: int
) -> JSON:
    """One page of a list endpoint, OpenAI's cursor pagination (`limit`, `after`)."""
    try:
        limit = int(params.get("limit", default_limit))
    except ValueError:
        limit = -1
    if not 1 <= limit <= max_limit:
        raise ApiError(
            400,
            f"Invalid 'limit': integer must be between 1 and {max_limit}.",
            param="limit",
            code="integer_out_of_range",
        )
    after = params.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }
