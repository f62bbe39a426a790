"""Artifacts as lines and as hashed writes: byte chunks cut into lines on b"\\n" only (local and
S3 reads agree byte for byte), blocks of whole lines, the lines at given byte offsets, and the
writer that hashes and counts what it writes, so nothing is read back after publishing."""

import hashlib
from collections.abc import Iterable, Iterator
from typing import IO, Protocol

COPY_CHUNK_BYTES = 1024 * 1024


def split_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Split on b"\\n" only, so local and S3 reads agree byte for byte (no CR/CRLF magic).
    A block of whole lines is split at once (bytes.split)."""
    for block in line_blocks(chunks):
        lines = block.split(b"\n")
        if block.endswith(b"\n"):
            lines.pop()  # the empty text after the block's last newline
        yield from lines


def line_blocks(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The same bytes as `chunks`, cut after a newline: each block is whole lines (with their
    newlines), except the text after the file's last newline, which comes last on its own.
    An unfinished line waits, in pieces, for the chunk that ends it (joined once: a line
    longer than many chunks is not copied again for each of them)."""
    pending: list[bytes] = []
    for chunk in chunks:
        end = chunk.rfind(b"\n") + 1
        if not end:
            if chunk:
                pending.append(chunk)
            continue
        if pending:
            pending.append(chunk[:end])
            yield b"".join(pending)
        else:
            yield chunk[:end]
        pending = [chunk[end:]] if end < len(chunk) else []
    if pending:
        yield b"".join(pending)


def lines_at_offsets(blocks: Iterable[bytes], offsets: Iterable[int]) -> Iterator[bytes]:
    """The lines starting at ascending byte offsets of a stream of whole-line blocks."""
    chunks = iter(blocks)
    block: bytes | None = b""
    start = 0  # where `block` starts in the file
    for offset in offsets:
        if offset < start:
            raise ValueError(f"offsets must ascend: {offset} comes after {start}")
        while block is not None and offset >= start + len(block):
            start += len(block)
            block = next(chunks, None)
        if block is None:
            yield b""
            continue
        at = offset - start
        end = block.find(b"\n", at)
        yield block[at:] if end < 0 else block[at:end]


class Sink(Protocol):
    def write(self, data: bytes, /) -> object: ...


class NullSink:
    """Lets write_file hash an S3-bound source without writing a copy of it."""

    def write(self, data: bytes, /) -> int:
        return len(data)


class HashingWriter:
    """Hash and count while writing so nothing has to be read back after publishing."""

    def __init__(self, out: Sink) -> None:
        self._out = out
        self._hash = hashlib.sha256()
        self.size_bytes = 0

    def write(self, data: bytes) -> None:
        self._out.write(data)
        self._hash.update(data)
        self.size_bytes += len(data)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()


def write_block(out: HashingWriter, lines: list[bytes], before: int, key: str) -> int:
    """Lines written as one block: one write and one hash update per block, not per line, so
    a million-line file costs a thousand calls. Returns the count of lines written so far."""
    block = b"\n".join(lines) + b"\n"
    if block.count(b"\n") != len(lines):
        bad = before + next(n for n, line in enumerate(lines) if b"\n" in line)
        raise ValueError(
            f"line {bad} for key {key!r} contains a newline; pass lines without line terminators"
        )
    out.write(block)
    return before + len(lines)


def copy_counting_lines(source: IO[bytes], out: HashingWriter) -> int:
    newlines = 0
    last = b""
    while chunk := source.read(COPY_CHUNK_BYTES):
        out.write(chunk)
        newlines += chunk.count(b"\n")
        last = chunk
    return newlines + (1 if last and not last.endswith(b"\n") else 0)
