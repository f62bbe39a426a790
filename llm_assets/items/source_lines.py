"""A source file's physical lines, each at most `source.max_line_bytes` long.

A line of hundreds of MB (a dump gone wrong, a file without newlines) must not be held in
memory to find out it is too long: its bytes are counted and dropped as they are read, and
the line comes out as its length alone, to become an input dead letter with its line number.
JSONL rows are these lines; CSV rows are read from them (`CsvText`), so a CSV line is bounded
too and its invalid UTF-8 is found line by line.
"""

from collections.abc import Iterable, Iterator
from typing import NamedTuple


class LineTooLong(NamedTuple):
    """A line over the limit, in place of its bytes: how long it was."""

    size: int

    def reason(self, limit: int) -> str:
        return (
            f"the line is {self.size} bytes, longer than source.max_line_bytes ({limit}): "
            "split the row or raise the limit"
        )


def bounded_lines(chunks: Iterable[bytes], limit: int) -> Iterator[bytes | LineTooLong]:
    """The lines of a stream of chunks, split on b"\\n" only (as storage_lines.split_lines splits
    them); a line over `limit` bytes comes as LineTooLong. Memory stays within a chunk plus
    `limit`: the pieces of an unfinished line are kept only while it is within the limit.
    Blocks of whole lines are split at once; only a block longer than the limit has its
    lines measured one by one."""
    pending: list[bytes] = []  # the unfinished line's pieces, while it is within the limit
    size = 0  # the unfinished line's length so far
    for chunk in chunks:
        start = 0
        if size:
            end = chunk.find(b"\n")
            if end < 0:
                size += len(chunk)
                if size <= limit:
                    pending.append(chunk)
                else:
                    pending.clear()
                continue
            size += end
            if size > limit:
                yield LineTooLong(size)
            else:
                pending.append(chunk[:end])
                yield b"".join(pending)
            pending, size, start = [], 0, end + 1
        last = chunk.rfind(b"\n") + 1
        if last > start:
            lines = chunk[start : last - 1].split(b"\n")
            if last - start > limit:
                yield from (LineTooLong(len(x)) if len(x) > limit else x for x in lines)
            else:
                yield from lines
            start = last
        if start < len(chunk):
            size = len(chunk) - start
            if size <= limit:
                pending.append(chunk[start:] if start else chunk)
    if size:
        yield LineTooLong(size) if size > limit else b"".join(pending)


class CsvText:
    """A CSV file's lines as text for csv.reader, numbered as it reads them, with what was
    wrong with the lines it could not have: a line that is not UTF-8 is given decoded with
    surrogate escapes and a line over the limit as an empty line, so a row's fields still
    line up, and the row that took such a line is reported (`problem`)."""

    def __init__(self, lines: Iterable[bytes | LineTooLong], limit: int) -> None:
        self._lines = iter(lines)
        self._limit = limit
        self.number = 0
        """The number of the last line given to the reader."""
        self._problems: list[tuple[int, str]] = []

    def __iter__(self) -> "CsvText":
        return self

    def __next__(self) -> str:
        raw = next(self._lines)
        self.number += 1
        if isinstance(raw, LineTooLong):
            self._problems.append((self.number, raw.reason(self._limit)))
            return "\n"
        try:
            return raw.decode() + "\n"
        except UnicodeDecodeError as exc:
            self._problems.append((self.number, f"invalid UTF-8 at byte {exc.start}"))
            return raw.decode(errors="surrogateescape") + "\n"

    def problem(self, first_line: int) -> str | None:
        """What was wrong with the lines from `first_line` to the last one read (the lines of
        the row just read), if anything; earlier problems are forgotten."""
        found = None
        while self._problems and self._problems[0][0] <= self.number:
            line, reason = self._problems.pop(0)
            if found is None and line >= first_line:
                found = reason if line == first_line else f"line {line}: {reason}"
        return found
