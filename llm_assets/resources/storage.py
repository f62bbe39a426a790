"""Artifact storage: one API over a local folder or an S3 prefix (`storage_s3`, imported on
first use of S3).

Every write is staged in a temp file and published in one step (``os.replace`` locally,
``upload_file`` on S3), so readers never see a partial artifact, even after a crash. A local
artifact's mode follows the umask (0o666 less it), like any file a program makes.
"""

import os
import re
import secrets
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any

import dagster as dg
import pydantic

from llm_assets.resources.s3_uri import S3Location, parse_s3
from llm_assets.resources.storage_lines import (
    HashingWriter,
    NullSink,
    copy_counting_lines,
    line_blocks,
    lines_at_offsets,
    split_lines,
    write_block,
)
from llm_assets.util.secrecy import mask_url

if TYPE_CHECKING:
    from llm_assets.resources.storage_s3 import S3Objects

_STAGING_SUFFIX = ".partial"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class WrittenArtifact(pydantic.BaseModel):
    """What was published, so callers can record provenance without re-reading it."""

    model_config = pydantic.ConfigDict(frozen=True)

    uri: str
    size_bytes: int
    line_count: int
    sha256: str


def validate_key(key: str) -> str:
    """Keys come from partition names and item ids; refuse anything that could escape the base."""
    if not key:
        raise ValueError("artifact key must not be empty")
    if "\\" in key or "\x00" in key:
        raise ValueError(f"artifact key {key!r} must not contain backslashes or NUL bytes")
    if key.startswith("/"):
        raise ValueError(f"artifact key {key!r} must be relative, not absolute")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(
                f"artifact key {key!r} must not contain empty, '.' or '..' path segments"
            )
    return key


def _parse_uri(uri: str) -> S3Location | Path:
    """Any absolute path or s3 uri is accepted: source data often lives outside base_url."""
    if uri.startswith("s3://"):
        location = parse_s3(uri)
        if not location.key:
            raise ValueError(f"S3 uri {uri!r} names a bucket, not an object")
        return location
    if _SCHEME.match(uri):
        raise ValueError(f"unsupported uri {uri!r}: expected a local path or s3://bucket/key")
    if not uri:
        raise ValueError("uri must not be empty")
    return Path(os.path.abspath(uri))


def _open_local(path: Path, uri: str) -> IO[bytes]:
    """A local artifact opened for reading; a missing one is named by its uri."""
    try:
        return path.open("rb")
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"no such artifact: {uri}") from exc


def _is_staging_file(name: str) -> bool:
    return name.startswith(".") and name.endswith(_STAGING_SUFFIX)


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable; without this a power loss can undo the publish."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_staging(target: S3Location | Path) -> tuple[IO[bytes], Path]:
    """A new file to stage a write in: beside a local target, so publishing is a rename, or
    in the temp folder for an upload. A local one is made with mode 0o666 less the umask,
    as any file a program makes, so the group that reads published outputs can read them
    (tempfile makes 0o600 files: readable by this user alone)."""
    if isinstance(target, Path):
        target.parent.mkdir(parents=True, exist_ok=True)
        path = target.parent / f".{target.name}.{secrets.token_hex(8)}{_STAGING_SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    else:
        fd, name = tempfile.mkstemp(prefix="llm-assets-upload-", suffix=_STAGING_SUFFIX)
        path = Path(name)
    return os.fdopen(fd, "wb"), path


class StagedArtifact:
    """Bytes written to a staging file and hashed, not yet published (ArtifactStorage's
    `stage_lines`): `publish` makes them durable and puts them in place, once; `discard`
    removes them. Until one of them ends it, the staged file stays open."""

    def __init__(
        self,
        written: WrittenArtifact,
        staged: IO[bytes],
        path: Path,
        target: S3Location | Path,
        storage: "ArtifactStorage",
    ) -> None:
        self.written = written
        self._staged = staged
        self._path: Path | None = path
        self._target = target
        self._storage = storage

    def publish(self, key: str | None = None) -> WrittenArtifact:
        """fsync, then a rename beside a local target (and the folder's fsync) or an upload;
        an exception leaves nothing published and the staged file removed.

        `key`: published under this key instead of the one it was staged for (a file named by
        its content's hash, known once it is written). Locally it should be in the same
        folder, so that publishing stays a rename."""
        assert self._path is not None, "published or discarded already"
        path, self._path = self._path, None
        target, written = self._target, self.written
        if key is not None:
            written = written.model_copy(update={"uri": self._storage.uri(key)})
            target = _parse_uri(written.uri)
        try:
            with self._staged:
                os.fsync(self._staged.fileno())
            if isinstance(target, Path):
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
                _fsync_dir(target.parent)
            else:
                self._storage._s3().upload(path, target)
                path.unlink(missing_ok=True)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return written

    def discard(self) -> None:
        """Remove the staged file, unless it was published or removed already."""
        if self._path is None:
            return
        path, self._path = self._path, None
        self._staged.close()
        path.unlink(missing_ok=True)


class ArtifactStorage(dg.ConfigurableResource):
    """Where artifacts live: a local folder or s3://bucket/prefix.

    Assets only ever pass keys, so moving from a laptop to S3 is a config change.
    """

    base_url: str = pydantic.Field(
        description=(
            "Local folder (relative paths resolve against the cwd at use time) "
            "or s3://bucket[/prefix]."
        )
    )
    multipart_threshold_bytes: int = pydantic.Field(
        default=8 * 1024 * 1024,
        description="S3 uploads at least this large use multipart transfer.",
    )
    read_chunk_bytes: int = pydantic.Field(
        default=1024 * 1024,
        description="Bytes read per chunk when streaming lines; memory stays bounded by this.",
    )

    _s3_objects: Any = pydantic.PrivateAttr(default=None)
    """The S3 client's operations (storage_s3.S3Objects), made on first use."""

    @property
    def is_s3(self) -> bool:
        return self.base_url.startswith("s3://")

    def _s3(self) -> "S3Objects":
        if self._s3_objects is None:
            from llm_assets.resources.storage_s3 import S3Objects

            self._s3_objects = S3Objects(self.multipart_threshold_bytes)
        return self._s3_objects

    def _base(self) -> S3Location | Path:
        if self.is_s3:
            location = parse_s3(self.base_url)
            return S3Location(location.bucket, location.key.strip("/"))
        if not self.base_url or _SCHEME.match(self.base_url):
            raise ValueError(
                f"storage base_url {mask_url(self.base_url)!r} must be a local folder or "
                "s3://bucket[/prefix]"
            )
        return Path(os.path.abspath(os.path.expanduser(self.base_url)))

    def uri(self, key: str) -> str:
        """The stable address recorded in the ledger for an artifact key."""
        validate_key(key)
        base = self._base()
        if isinstance(base, Path):
            return str(base.joinpath(*PurePosixPath(key).parts))
        return S3Location(base.bucket, f"{base.key}/{key}" if base.key else key).uri

    def write_bytes(self, key: str, data: bytes) -> WrittenArtifact:
        """Publish a blob; line_count is 0 because the bytes are opaque here."""

        def fill(out: HashingWriter) -> int:
            out.write(data)
            return 0

        return self._write(key, fill)

    def write_lines(self, key: str, lines: Iterable[bytes]) -> WrittenArtifact:
        """Stream lines (without newlines) to storage; an exception leaves nothing published."""
        return self.stage_lines(key, lines).publish()

    def stage_lines(self, key: str, lines: Iterable[bytes]) -> "StagedArtifact":
        """`write_lines` up to its publishing: the lines are written and hashed now, into a
        staged file that `publish` makes durable and puts in place (or `discard` removes).
        Publishing waits for the disk (fsync) where writing does not, so another thread may
        do it while this one goes on."""

        def fill(out: HashingWriter) -> int:
            count = 0
            batch: list[bytes] = []
            for line in lines:
                batch.append(line)
                if len(batch) >= 1000:
                    count = write_block(out, batch, count, key)
                    batch = []
            return write_block(out, batch, count, key) if batch else count

        return self._stage(key, fill)

    def stage_blocks(self, key: str, blocks: Iterable[bytes]) -> "StagedArtifact":
        """`stage_lines` of lines that come in blocks, each of whole lines with their
        newlines: written as they are, one write and one hash update a block."""

        def fill(out: HashingWriter) -> int:
            count = 0
            for block in blocks:
                if block and not block.endswith(b"\n"):
                    raise ValueError(f"a block for key {key!r} does not end with a newline")
                out.write(block)
                count += block.count(b"\n")
            return count

        return self._stage(key, fill)

    def write_file(self, key: str, path: Path) -> WrittenArtifact:
        """Publish a file built elsewhere; line_count counts lines as open_lines would yield."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"cannot publish {str(path)!r}: no such file")
        uri = self.uri(key)
        target = _parse_uri(uri)
        if isinstance(target, Path):
            with path.open("rb") as source:
                return self._write(key, lambda out: copy_counting_lines(source, out))

        digest = HashingWriter(NullSink())
        with path.open("rb") as source:
            line_count = copy_counting_lines(source, digest)
        self._s3().upload(path, target)
        return WrittenArtifact(
            uri=uri, size_bytes=digest.size_bytes, line_count=line_count, sha256=digest.sha256
        )

    def _write(self, key: str, fill: Callable[[HashingWriter], int]) -> WrittenArtifact:
        return self._stage(key, fill).publish()

    def _stage(self, key: str, fill: Callable[[HashingWriter], int]) -> "StagedArtifact":
        uri = self.uri(key)
        target = _parse_uri(uri)
        staged, staged_path = _open_staging(target)
        try:
            out = HashingWriter(staged)
            line_count = fill(out)
            staged.flush()
        except BaseException:
            staged.close()
            staged_path.unlink(missing_ok=True)
            raise
        written = WrittenArtifact(
            uri=uri, size_bytes=out.size_bytes, line_count=line_count, sha256=out.sha256
        )
        return StagedArtifact(written, staged, staged_path, target, self)

    def open_lines(self, uri: str) -> Iterator[bytes]:
        """Stream lines without newlines; opens eagerly so a bad uri fails at the call site."""
        return split_lines(self.open_chunks(uri))

    def open_line_blocks(self, uri: str) -> Iterator[bytes]:
        """Stream the file in blocks of whole lines (see `line_blocks`); opens eagerly."""
        return line_blocks(self.open_chunks(uri))

    def lines_at(self, uri: str, offsets: Iterable[int]) -> Iterator[bytes]:
        """The lines (without newline) that start at these byte offsets, ascending: a few
        lines of a large file without splitting the rest. A local file is read only there;
        an S3 object is streamed once. An offset past the end gives b""."""
        target = _parse_uri(uri)
        if isinstance(target, Path):
            return self._local_lines_at(_open_local(target, uri), offsets)
        return lines_at_offsets(line_blocks(self.open_chunks(uri)), offsets)

    @staticmethod
    def _local_lines_at(handle: IO[bytes], offsets: Iterable[int]) -> Iterator[bytes]:
        with handle:
            for offset in offsets:
                handle.seek(offset)
                yield handle.readline().removesuffix(b"\n")

    def open_chunks(self, uri: str) -> Iterator[bytes]:
        """Stream the file in chunks of `read_chunk_bytes`, cut anywhere; opens eagerly."""
        target = _parse_uri(uri)
        chunk_size = self.read_chunk_bytes
        if isinstance(target, Path):
            return self._iter_local_chunks(_open_local(target, uri), chunk_size)
        return self._s3().chunks(target, uri, chunk_size)

    @staticmethod
    def _iter_local_chunks(handle: IO[bytes], chunk_size: int) -> Iterator[bytes]:
        with handle:
            yield from iter(lambda: handle.read(chunk_size), b"")

    def read_bytes(self, uri: str) -> bytes:
        """Whole-object read, for small artifacts such as manifests."""
        target = _parse_uri(uri)
        if isinstance(target, Path):
            try:
                return target.read_bytes()
            except FileNotFoundError as exc:
                raise FileNotFoundError(f"no such artifact: {uri}") from exc
        return self._s3().read(target, uri)

    def exists(self, uri: str) -> bool:
        """True only for objects/files; a folder or bare prefix is not an artifact."""
        target = _parse_uri(uri)
        if isinstance(target, Path):
            return target.is_file()
        return self._s3().etag(target, uri) is not None

    def version(self, uri: str) -> str | None:
        """What changes when the file does: mtime and size locally, the ETag on S3; None
        when it does not exist."""
        target = _parse_uri(uri)
        if isinstance(target, Path):
            try:
                stat = target.stat()
            except FileNotFoundError:
                return None
            return f"{stat.st_mtime_ns}-{stat.st_size}"
        return self._s3().etag(target, uri)

    def delete(self, uri: str) -> None:
        """Idempotent, so retried cleanup steps never fail on an already-deleted artifact."""
        target = _parse_uri(uri)
        if isinstance(target, Path):
            target.unlink(missing_ok=True)
            return
        self._s3().delete(target, uri)

    def list_uris(self, key_prefix: str) -> list[str]:
        """Sorted uris under base/key_prefix, treated as a folder ("" lists everything)."""
        prefix = key_prefix.strip("/")
        if prefix:
            validate_key(prefix)
        base = self._base()
        if isinstance(base, Path):
            root = base.joinpath(*PurePosixPath(prefix).parts) if prefix else base
            if not root.is_dir():
                return []
            found = [
                str(Path(directory, name))
                for directory, _, names in os.walk(root)
                for name in names
                if not _is_staging_file(name)
            ]
            return sorted(found)

        folder = "/".join(part for part in (base.key, prefix) if part)
        return self._s3().list_uris(base.bucket, f"{folder}/" if folder else "")

    @contextmanager
    def local_copy(self, uri: str) -> Iterator[Path]:
        """A real file path for libraries that cannot read streams (pyarrow, sqlite, ...)."""
        target = _parse_uri(uri)
        if isinstance(target, Path):
            if not target.is_file():
                raise FileNotFoundError(f"no such artifact: {uri}")
            yield target
            return
        with tempfile.TemporaryDirectory(prefix="llm-assets-download-") as tmp:
            local = Path(tmp) / (PurePosixPath(target.key).name or "object")
            self._s3().download(target, uri, local)
            yield local
