"""Split request lines into shards under a request-count and a byte cap."""

from collections.abc import Iterable, Iterator

Shard = list[tuple[str, bytes]]


def split_shards(
    lines: Iterable[tuple[str, bytes]],
    *,
    max_requests: int,
    max_bytes: int,
    min_requests: int = 1,
) -> Iterator[Shard]:
    """Group (custom_id, line) pairs in order; each group respects both caps.

    A single line larger than `max_bytes` cannot be shipped and is the caller's job to
    dead-letter before it gets here. With `min_requests` (Bedrock's minimum records per job),
    a last shard below it is merged into the one before, or topped up from it when both
    would not fit in one; a day smaller than the minimum stays one small shard.
    """
    held: Shard | None = None
    for shard in _fill(lines, max_requests, max_bytes):
        if held is not None and len(shard) < min_requests:
            merged = held + shard
            if len(merged) <= max_requests and _size(merged) <= max_bytes:
                held, shard = None, merged
            else:
                need = min_requests - len(shard)
                moved = held[len(held) - need :]
                if len(held) - need >= min_requests and _size(moved + shard) <= max_bytes:
                    held, shard = held[: len(held) - need], moved + shard
        if held is not None:
            yield held
        held = shard
    if held is not None:
        yield held


def _fill(lines: Iterable[tuple[str, bytes]], max_requests: int, max_bytes: int) -> Iterator[Shard]:
    shard: Shard = []
    size = 0
    for custom_id, line in lines:
        line_size = len(line) + 1
        if shard and (len(shard) >= max_requests or size + line_size > max_bytes):
            yield shard
            shard, size = [], 0
        shard.append((custom_id, line))
        size += line_size
    if shard:
        yield shard


def _size(shard: Shard) -> int:
    return sum(len(line) + 1 for _, line in shard)
