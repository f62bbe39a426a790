"""Split request lines into shards under a request-count and a byte cap."""

from collections.abc import Iterable, Iterator


def split_shards(
    lines: Iterable[tuple[str, bytes]], *, max_requests: int, max_bytes: int
) -> Iterator[list[tuple[str, bytes]]]:
    """Group (custom_id, line) pairs in order; each group respects both caps.

    A single line larger than `max_bytes` cannot be shipped and is the caller's job to
    dead-letter before it gets here.
    """
    shard: list[tuple[str, bytes]] = []
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
