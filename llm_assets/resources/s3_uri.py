"""An S3 object's address: s3://bucket/key as a (bucket, key) pair. Apart from the boto3 half
(storage_s3.py), so that storage on a local folder never imports boto3."""

from typing import NamedTuple


class S3Location(NamedTuple):
    bucket: str
    key: str

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def parse_s3(uri: str) -> S3Location:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise ValueError(f"S3 uri {uri!r} has no bucket")
    return S3Location(bucket, key)
