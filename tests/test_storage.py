"""ArtifactStorage behaves the same on a local folder and on S3 (a moto server on loopback)."""

import hashlib
import os
import random
import re
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llm_assets.resources.storage import ArtifactStorage, WrittenArtifact, validate_key
from llm_assets.resources.storage_lines import line_blocks, split_lines
from tests.conftest import MotoS3

READ_CHUNK = 64


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStorage:
    if request.param == "local":
        return ArtifactStorage(base_url=str(tmp_path / "artifacts"), read_chunk_bytes=READ_CHUNK)
    s3: MotoS3 = request.getfixturevalue("moto_s3")
    return ArtifactStorage(
        base_url=f"s3://{s3.bucket}/{uuid.uuid4().hex}/", read_chunk_bytes=READ_CHUNK
    )


def assert_matches_stored(storage: ArtifactStorage, written: WrittenArtifact) -> bytes:
    stored = storage.read_bytes(written.uri)
    assert written.size_bytes == len(stored)
    assert written.sha256 == hashlib.sha256(stored).hexdigest()
    return stored


def test_uri_joins_base_and_key(storage: ArtifactStorage, tmp_path: Path) -> None:
    uri = storage.uri("snapshots/tickets/2026-11-01/abc.jsonl")
    if storage.is_s3:
        assert re.fullmatch(r"s3://llm-assets-test/[0-9a-f]{32}/snapshots/tickets/.*", uri)
    else:
        assert uri == str(tmp_path / "artifacts/snapshots/tickets/2026-11-01/abc.jsonl")


def test_uri_without_prefix_and_relative_local_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ArtifactStorage(base_url="s3://bucket").uri("a/b.txt") == "s3://bucket/a/b.txt"
    assert ArtifactStorage(base_url="s3://bucket/p/q/").uri("a.txt") == "s3://bucket/p/q/a.txt"
    relative = ArtifactStorage(base_url="rel/artifacts")
    monkeypatch.chdir(tmp_path)
    assert relative.uri("k.txt") == str(tmp_path / "rel/artifacts/k.txt")


def test_write_lines_round_trip(storage: ArtifactStorage) -> None:
    rng = random.Random(7)
    lines = [
        bytes(rng.choice(b'abc{}":, ') for _ in range(rng.randrange(0, 3 * READ_CHUNK)))
        for _ in range(2000)
    ]
    lines += [b"", b"x" * (READ_CHUNK - 1), b"y" * READ_CHUNK, b"z" * (READ_CHUNK + 1)]
    lines.append(b"L" * (READ_CHUNK * 500 + 17))
    lines.append("unicode ✓ line".encode())

    written = storage.write_lines("runs/2026-11-01/out.jsonl", iter(lines))

    assert written.uri == storage.uri("runs/2026-11-01/out.jsonl")
    assert written.line_count == len(lines)
    stored = assert_matches_stored(storage, written)
    assert stored == b"\n".join(lines) + b"\n"
    assert list(storage.open_lines(written.uri)) == lines


def test_staged_lines_are_published_or_discarded_whole(storage: ArtifactStorage) -> None:
    """Staged lines are written and hashed but nowhere to be read until published; a discarded
    stage leaves nothing, and publishing twice is refused."""
    lines = [b"a", b"bb", b"ccc"]
    staged = storage.stage_lines("x/staged.jsonl", iter(lines))
    assert not storage.exists(staged.written.uri)
    assert staged.publish() == staged.written
    assert_matches_stored(storage, staged.written)
    assert list(storage.open_lines(staged.written.uri)) == lines
    staged.discard()  # published: nothing to do
    with pytest.raises(AssertionError):
        staged.publish()

    dropped = storage.stage_lines("x/dropped.jsonl", iter(lines))
    dropped.discard()
    assert not storage.exists(dropped.written.uri)
    assert storage.list_uris("x") == [staged.written.uri]


def test_staged_lines_are_published_under_the_key_their_content_names(
    storage: ArtifactStorage,
) -> None:
    """A file named by its content's hash is staged under a name of its own and published
    under the one its hash gives; the staged name is never there to be read."""
    lines = [b"one", b"two"]
    staged = storage.stage_lines("snap/pending.jsonl", iter(lines))
    key = f"snap/{staged.written.sha256[:12]}.jsonl"
    published = staged.publish(key)
    assert published.uri == storage.uri(key) != staged.written.uri
    assert published.model_copy(update={"uri": staged.written.uri}) == staged.written
    assert_matches_stored(storage, published)
    assert list(storage.open_lines(published.uri)) == lines
    assert storage.list_uris("snap") == [published.uri]


def test_write_lines_empty_and_blank(storage: ArtifactStorage) -> None:
    empty = storage.write_lines("empty.jsonl", [])
    assert (empty.line_count, empty.size_bytes) == (0, 0)
    assert empty.sha256 == hashlib.sha256(b"").hexdigest()
    assert list(storage.open_lines(empty.uri)) == []

    blank = storage.write_lines("blank.jsonl", [b""])
    assert (blank.line_count, blank.size_bytes) == (1, 1)
    assert list(storage.open_lines(blank.uri)) == [b""]


def test_write_lines_rejects_embedded_newline(storage: ArtifactStorage) -> None:
    with pytest.raises(ValueError, match="newline"):
        storage.write_lines("bad.jsonl", [b"ok", b"two\nlines"])
    assert not storage.exists(storage.uri("bad.jsonl"))


def test_open_lines_without_final_newline(storage: ArtifactStorage) -> None:
    long_tail = b"t" * (READ_CHUNK * 3 + 5)
    raw = b"first\n\nthird\r\n" + long_tail
    written = storage.write_bytes("raw/no-final-newline.txt", raw)

    assert written.line_count == 0
    assert assert_matches_stored(storage, written) == raw
    assert list(storage.open_lines(written.uri)) == [b"first", b"", b"third\r", long_tail]


def test_open_lines_chunk_boundaries(storage: ArtifactStorage) -> None:
    raw = b"a" * (READ_CHUNK - 1) + b"\n" + b"\n" * 3 + b"b" * READ_CHUNK + b"\nc"
    written = storage.write_bytes("edges.txt", raw)
    assert list(storage.open_lines(written.uri)) == raw.split(b"\n")


def test_lines_at_offsets_are_the_lines_that_start_there(storage: ArtifactStorage) -> None:
    """Lines read by their start offsets are the lines split from the whole file: across
    read chunks, longer than several chunks, empty, and the last one without a newline; an
    offset past the end reads nothing."""
    lines = [b"a" * (READ_CHUNK - 1), b"", b"b" * (3 * READ_CHUNK + 7), b"c", b"d\r", b"tail"]
    raw = b"\n".join(lines)
    written = storage.write_bytes("offsets.txt", raw)
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    assert list(storage.lines_at(written.uri, starts)) == lines
    picked = [1, 2, 5]
    past = len(raw) + 10
    assert list(storage.lines_at(written.uri, [starts[i] for i in picked] + [past, past])) == [
        lines[i] for i in picked
    ] + [b"", b""]
    # A start inside a line reads the rest of it (the caller checks what it got).
    assert list(storage.lines_at(written.uri, [starts[2] + 5])) == [lines[2][5:]]
    assert list(storage.lines_at(written.uri, [])) == []


def test_write_bytes_overwrites(storage: ArtifactStorage) -> None:
    storage.write_bytes("blob.bin", b"old contents")
    written = storage.write_bytes("blob.bin", bytes(range(256)))
    assert assert_matches_stored(storage, written) == bytes(range(256))


def test_write_file(storage: ArtifactStorage, tmp_path: Path) -> None:
    source = tmp_path / "built.jsonl"
    source.write_bytes(b'{"a": 1}\n{"a": 2}\n{"a": 3}')

    written = storage.write_file("published/built.jsonl", source)

    assert written.uri == storage.uri("published/built.jsonl")
    assert written.line_count == 3
    assert assert_matches_stored(storage, written) == source.read_bytes()
    assert source.exists()


def test_write_file_missing_source(storage: ArtifactStorage, tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        storage.write_file("x.jsonl", missing)


def test_exists_delete_list(storage: ArtifactStorage) -> None:
    keys = ["snap/2026-11-02/b.jsonl", "snap/2026-11-01/a.jsonl", "snap/2026-11-01/deep/c.jsonl"]
    for key in keys:
        storage.write_bytes(key, key.encode())
    storage.write_bytes("snapshot-sibling.txt", b"not under snap/")
    storage.write_bytes("snapx/other.txt", b"shares a string prefix only")

    expected = sorted(storage.uri(key) for key in keys)
    assert storage.list_uris("snap") == expected
    assert storage.list_uris("snap/") == expected
    assert storage.list_uris("snap/2026-11-01") == expected[:2]
    assert storage.list_uris("missing") == []
    assert len(storage.list_uris("")) == 5

    target = storage.uri(keys[0])
    assert storage.exists(target)
    assert not storage.exists(storage.uri("snap"))
    storage.delete(target)
    assert not storage.exists(target)
    storage.delete(target)
    assert storage.uri(keys[0]) not in storage.list_uris("snap")


def test_local_copy(storage: ArtifactStorage) -> None:
    written = storage.write_bytes("tables/t.parquet", b"PAR1 not really")
    with storage.local_copy(written.uri) as path:
        assert path.name == "t.parquet"
        assert path.read_bytes() == b"PAR1 not really"
    if storage.is_s3:
        assert not path.exists()
    else:
        assert path == Path(written.uri)


def test_missing_uri_errors_name_the_uri(storage: ArtifactStorage) -> None:
    uri = storage.uri("never/written.jsonl")
    with pytest.raises(FileNotFoundError, match=re.escape(uri)):
        storage.open_lines(uri)
    with pytest.raises(FileNotFoundError, match=re.escape(uri)):
        storage.read_bytes(uri)
    with pytest.raises(FileNotFoundError, match=re.escape(uri)), storage.local_copy(uri):
        pass
    assert not storage.exists(uri)
    storage.delete(uri)


def test_uris_outside_base_are_readable(storage: ArtifactStorage, tmp_path: Path) -> None:
    source = tmp_path / "elsewhere" / "source.jsonl"
    source.parent.mkdir()
    source.write_bytes(b"one\ntwo\n")
    assert list(storage.open_lines(str(source))) == [b"one", b"two"]
    assert storage.exists(str(source))


def test_relative_local_uri_resolves_against_cwd(
    storage: ArtifactStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "in.txt").write_bytes(b"rel\n")
    monkeypatch.chdir(tmp_path)
    assert list(storage.open_lines("in.txt")) == [b"rel"]


@pytest.mark.parametrize("key", ["../x", "/abs", "a/../b", "a\\b", "", "a/./b", "a//b", "a\x00b"])
def test_key_validation(storage: ArtifactStorage, key: str) -> None:
    with pytest.raises(ValueError, match="artifact key") as excinfo:
        storage.write_bytes(key, b"x")
    if key:
        assert repr(key) in str(excinfo.value)
    with pytest.raises(ValueError):
        storage.uri(key)
    with pytest.raises(ValueError):
        validate_key(key)


def test_rejects_unsupported_scheme(storage: ArtifactStorage) -> None:
    with pytest.raises(ValueError, match="gs://bucket/k"):
        storage.read_bytes("gs://bucket/k")


class Boom(RuntimeError):
    pass


def failing_lines(good: int) -> Iterator[bytes]:
    for i in range(good):
        yield b"line %d" % i
    raise Boom("source died mid-stream")


def test_failed_write_publishes_nothing(
    storage: ArtifactStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
    uri = storage.uri("atomic/out.jsonl")
    with pytest.raises(Boom):
        storage.write_lines("atomic/out.jsonl", failing_lines(1000))
    assert not storage.exists(uri)
    assert storage.list_uris("atomic") == []
    assert list(system_tmp.iterdir()) == []


def test_failed_local_write_leaves_no_partial_or_temp(tmp_path: Path) -> None:
    storage = ArtifactStorage(base_url=str(tmp_path))
    final = Path(storage.uri("atomic/out.jsonl"))

    with pytest.raises(Boom):
        storage.write_lines("atomic/out.jsonl", failing_lines(1000))
    assert not final.exists()
    assert list(final.parent.iterdir()) == []

    storage.write_lines("atomic/out.jsonl", [b"committed"])
    with pytest.raises(Boom):
        storage.write_lines("atomic/out.jsonl", failing_lines(1000))
    assert final.read_bytes() == b"committed\n"
    assert list(final.parent.iterdir()) == [final]


def test_failed_local_publish_cleans_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = ArtifactStorage(base_url=str(tmp_path))

    def broken_replace(src: Any, dst: Any) -> None:
        raise OSError("disk went away")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk went away"):
        storage.write_lines("k/out.jsonl", [b"a", b"b"])
    assert list((tmp_path / "k").iterdir()) == []


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_local_artifacts_are_as_readable_as_the_umask_lets_them(
    tmp_path: Path, umask: int, mode: int
) -> None:
    """Published files are read by the group that consumes them: their mode is 0o666 less
    the umask, as for any file a program makes, whichever way they are written."""
    storage = ArtifactStorage(base_url=str(tmp_path / "artifacts"))
    source = tmp_path / "built.parquet"
    source.write_bytes(b"built elsewhere")
    before = os.umask(umask)
    try:
        written = [
            storage.write_lines("published/day.jsonl", [b"a", b"b"]),
            storage.write_bytes("reports/day.cost.md", b"# costs"),
            storage.write_file("published/day.parquet", source),
        ]
    finally:
        os.umask(before)
    for artifact in written:
        assert Path(artifact.uri).stat().st_mode & 0o777 == mode, artifact.uri


def test_in_flight_temp_files_are_not_listed(tmp_path: Path) -> None:
    storage = ArtifactStorage(base_url=str(tmp_path))
    storage.write_bytes("d/real.txt", b"r")
    (tmp_path / "d" / ".real.txt.abc123.partial").write_bytes(b"half")
    assert storage.list_uris("d") == [storage.uri("d/real.txt")]


def test_s3_multipart_upload(moto_s3: MotoS3, tmp_path: Path) -> None:
    mib = 1024 * 1024
    storage = ArtifactStorage(
        base_url=f"s3://{moto_s3.bucket}/{uuid.uuid4().hex}", multipart_threshold_bytes=mib
    )
    line = b"m" * 1023
    count = 9 * 1024 + 3
    written = storage.write_lines("big/out.jsonl", (line for _ in range(count)))

    assert written.size_bytes == count * 1024
    assert written.size_bytes > 8 * mib
    assert written.line_count == count
    location = written.uri.removeprefix(f"s3://{moto_s3.bucket}/")
    head = moto_s3.client().head_object(Bucket=moto_s3.bucket, Key=location)
    assert head["ContentLength"] == written.size_bytes
    assert re.fullmatch(r'"[0-9a-f]{32}-2"', head["ETag"])
    assert_matches_stored(storage, written)
    assert sum(1 for got in storage.open_lines(written.uri) if got == line) == count

    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(2 * mib + 1))
    uploaded = storage.write_file("big/file.bin", source)
    head = moto_s3.client().head_object(
        Bucket=moto_s3.bucket, Key=uploaded.uri.removeprefix(f"s3://{moto_s3.bucket}/")
    )
    assert re.fullmatch(r'"[0-9a-f]{32}-1"', head["ETag"])
    assert assert_matches_stored(storage, uploaded) == source.read_bytes()


def test_s3_missing_bucket_errors_name_the_uri(moto_s3: MotoS3) -> None:
    storage = ArtifactStorage(base_url="s3://no-such-bucket-llm-assets/p")
    uri = storage.uri("a.jsonl")
    with pytest.raises(FileNotFoundError, match=re.escape(uri)):
        storage.write_lines("a.jsonl", [b"x"])
    with pytest.raises(FileNotFoundError, match=re.escape(uri)):
        storage.open_lines(uri)
    with pytest.raises(FileNotFoundError, match="no-such-bucket-llm-assets"):
        storage.list_uris("")


def test_s3_reads_objects_outside_base(moto_s3: MotoS3) -> None:
    key = f"sources/{uuid.uuid4().hex}/tickets.jsonl"
    moto_s3.client().put_object(Bucket=moto_s3.bucket, Key=key, Body=b"t1\nt2")
    storage = ArtifactStorage(base_url=f"s3://{moto_s3.bucket}/elsewhere")
    assert list(storage.open_lines(f"s3://{moto_s3.bucket}/{key}")) == [b"t1", b"t2"]


def test_split_lines_gives_the_same_lines_however_the_bytes_are_chunked() -> None:
    """Lines end at b"\\n" only; a line may span chunks, empty chunks change nothing, and
    the text after the last newline is a line of its own."""
    rng = random.Random(7)
    for _ in range(5000):
        data = bytes(rng.choice(b"ab\r\n") for _ in range(rng.randint(0, 40)))
        cuts = sorted(rng.randint(0, len(data)) for _ in range(rng.randint(0, 6)))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        expected = data.split(b"\n")
        if expected[-1] == b"":
            expected.pop()
        assert list(split_lines(chunks)) == expected, chunks


def test_line_blocks_are_the_same_bytes_cut_after_newlines() -> None:
    """However the bytes are chunked, the blocks join to them, every block but a last one
    without newline ends with one, and splitting the blocks gives split_lines' lines."""
    rng = random.Random(11)
    for _ in range(5000):
        data = bytes(rng.choice(b"ab\r\n") for _ in range(rng.randint(0, 40)))
        cuts = sorted(rng.randint(0, len(data)) for _ in range(rng.randint(0, 6)))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        blocks = list(line_blocks(chunks))
        assert b"".join(blocks) == data
        assert all(block.endswith(b"\n") for block in blocks[:-1])
        assert all(blocks), chunks
        lines = [line for block in blocks for line in split_lines([block])]
        assert lines == list(split_lines(chunks)), chunks
