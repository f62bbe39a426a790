"""The S3 half of artifact storage: objects at s3://bucket/key, read and written through
boto3, with botocore's generic errors turned into ones that name the uri asked for."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from llm_assets.resources.s3_uri import S3Location, parse_s3

NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
DENIED_CODES = frozenset({"403", "AccessDenied", "Forbidden"})


class S3Objects:
    """The object operations artifact storage needs, over one client made on first use (so
    local-only runs never resolve AWS credentials or config). `uri` arguments are what the
    caller asked for, named in errors."""

    def __init__(self, multipart_threshold_bytes: int) -> None:
        self._client: Any = None
        self._transfer = TransferConfig(multipart_threshold=multipart_threshold_bytes)

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = boto3.client("s3")
        return self._client

    def upload(self, path: Path, target: S3Location) -> None:
        try:
            self.client.upload_file(str(path), target.bucket, target.key, Config=self._transfer)
        except ClientError as exc:
            raise s3_error(exc, target.uri, "upload") from exc
        except S3UploadFailedError as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, ClientError):
                raise s3_error(cause, target.uri, "upload") from exc
            raise OSError(f"cannot upload {target.uri}: {exc}") from exc

    def download(self, target: S3Location, uri: str, local: Path) -> None:
        try:
            self.client.download_file(target.bucket, target.key, str(local), Config=self._transfer)
        except ClientError as exc:
            raise s3_error(exc, uri, "download") from exc

    def body(self, target: S3Location, uri: str) -> Any:
        """The object's streaming body; the caller closes it."""
        try:
            return self.client.get_object(Bucket=target.bucket, Key=target.key)["Body"]
        except ClientError as exc:
            raise s3_error(exc, uri, "read") from exc

    def chunks(self, target: S3Location, uri: str, chunk_size: int) -> Iterator[bytes]:
        """The object in chunks; opened at once so a bad uri fails at the call site."""
        return _iter_chunks(self.body(target, uri), chunk_size)

    def read(self, target: S3Location, uri: str) -> bytes:
        body = self.body(target, uri)
        try:
            return bytes(body.read())
        finally:
            body.close()

    def etag(self, target: S3Location, uri: str) -> str | None:
        """The object's ETag, None when there is no such object."""
        try:
            head = self.client.head_object(Bucket=target.bucket, Key=target.key)
        except ClientError as exc:
            if error_code(exc) in NOT_FOUND_CODES:
                return None
            raise s3_error(exc, uri, "check") from exc
        return str(head["ETag"]).strip('"')

    def delete(self, target: S3Location, uri: str) -> None:
        try:
            self.client.delete_object(Bucket=target.bucket, Key=target.key)
        except ClientError as exc:
            raise s3_error(exc, uri, "delete") from exc

    def list_uris(self, bucket: str, prefix: str) -> list[str]:
        """Sorted uris of the objects whose key starts with `prefix`."""
        found: list[str] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix
            )
            for page in pages:
                found.extend(
                    S3Location(bucket, item["Key"]).uri for item in page.get("Contents", [])
                )
        except ClientError as exc:
            raise s3_error(exc, f"s3://{bucket}/{prefix}", "list") from exc
        return sorted(found)


def _iter_chunks(body: Any, chunk_size: int) -> Iterator[bytes]:
    try:
        yield from body.iter_chunks(chunk_size)
    finally:
        body.close()


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def s3_error(exc: ClientError, uri: str, action: str) -> OSError:
    """Turn botocore's generic error into one that names the uri the user asked for."""
    code = error_code(exc)
    if code == "NoSuchBucket":
        return FileNotFoundError(
            f"cannot {action} {uri}: bucket {parse_s3(uri).bucket!r} does not exist"
        )
    if code in NOT_FOUND_CODES:
        return FileNotFoundError(f"cannot {action} {uri}: no such object")
    if code in DENIED_CODES:
        return PermissionError(f"cannot {action} {uri}: access denied ({exc})")
    return OSError(f"cannot {action} {uri}: {exc}")
