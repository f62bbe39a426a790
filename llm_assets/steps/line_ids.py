"""Request lines read back from shard files by custom_id, for retry rounds.

A request line starts with its id under the provider's key (`BatchProvider.line_id_field`:
`custom_id`, Bedrock's `recordId`), so the id is read in place, without parsing the line.
"""

import functools
import json
import logging
import re
from collections.abc import Iterable, Iterator

from llm_assets.resources.storage import ArtifactStorage

log = logging.getLogger("llm_assets")


@functools.cache
def _leading_id(id_field: str) -> re.Pattern[bytes]:
    """A line that starts with a plain id (no escapes) under `id_field`."""
    return re.compile(rb'^\{"' + re.escape(id_field.encode()) + rb'": "([A-Za-z0-9_.:-]+)"')


def line_custom_id(line: bytes, *, id_field: str = "custom_id") -> str:
    """The custom_id of a shard line, which the provider's lines keep under `id_field`.
    Our lines start with it, so it is read without parsing the whole request."""
    leading = _leading_id(id_field).match(line)
    if leading is not None:
        return leading.group(1).decode()
    return str(json.loads(line)[id_field])


def request_lines(
    storage: ArtifactStorage,
    uri: str,
    wanted: dict[str, int | None],
    *,
    id_field: str = "custom_id",
) -> list[tuple[str, bytes]]:
    """(custom_id, line) of wanted items' lines in a shard file, in file order. Each line is
    read where the ledger says it starts (`wanted`: custom_id → request_offset), so a retry
    round reads a few lines of each file, not every line. A file with items of no recorded
    offset (written before ledger version 5), or with a line there that is not the item's,
    is read whole instead."""
    if None not in wanted.values():
        by_offset = sorted((offset, cid) for cid, offset in wanted.items() if offset is not None)
        found: list[tuple[str, bytes]] = []
        for (_, cid), line in zip(
            by_offset, storage.lines_at(uri, [offset for offset, _ in by_offset]), strict=True
        ):
            try:
                if line_custom_id(line, id_field=id_field) != cid:
                    break
            except (ValueError, KeyError, TypeError):
                break
            found.append((cid, line))
        else:
            return found
        log.warning("request lines of %s are not where the ledger says; reading it whole", uri)
    return list(lines_with_ids(storage.open_line_blocks(uri), set(wanted), id_field=id_field))


def lines_with_ids(
    blocks: Iterable[bytes], wanted: set[str], *, id_field: str = "custom_id"
) -> Iterator[tuple[str, bytes]]:
    """(custom_id, line) of the shard lines whose custom_id is wanted, in file order, from
    blocks of whole lines (`ArtifactStorage.open_line_blocks`).

    A retry round wants a few percent of every shard's lines: each line's id is read in
    place from the block, and only wanted lines become objects. A line that does not start
    with a plain id (an escape in it, another layout) is read by `line_custom_id`, so the
    result is that of reading every line with it."""
    wanted_bytes = {cid.encode() for cid in wanted}
    prefix = b'{"' + id_field.encode() + b'": "'
    for block in blocks:
        find, starts, size = block.find, block.startswith, len(block)
        start = 0
        while start < size:
            end = find(b"\n", start)
            if end < 0:
                end = size
            cid: bytes | None = None
            if starts(prefix, start):
                first = start + len(prefix)
                close = find(b'"', first, end)
                candidate = block[first:close]
                if close > first and b"\\" not in candidate:
                    cid = candidate
            if cid is not None:
                if cid in wanted_bytes:
                    yield cid.decode(), block[start:end]
            else:
                line = block[start:end]
                if (text := line_custom_id(line, id_field=id_field)) in wanted:
                    yield text, line
            start = end + 1
