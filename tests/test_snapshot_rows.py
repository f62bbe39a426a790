"""A JSONL day's snapshot made on worker processes, a block of lines at a time, is the snapshot
the rows read one by one make: the same bytes, unreadable rows, files and slice keys, however
the lines fall into blocks and whatever the lines hold."""

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_assets.items.snapshot_rows import SnapshotForm, SnapshotTally, jsonl_day_blocks, row_lines
from llm_assets.items.source import rows_for_partition
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from llm_assets.util import parallel
from tests.harness import DAY, review_spec
from tests.test_bad_input import ready_pool

LIMIT = 1024


def _spec(sliced: bool) -> PipelineSpec:
    return PipelineSpec.model_validate(
        review_spec(
            "openai",
            "gpt-4o-mini",
            source={"max_line_bytes": LIMIT},
            sharding={"slices": 4 if sliced else 1},
        )
    )


def _row(n: int, day: dt.date, review_id: object, extra: bool) -> bytes:
    record: dict[str, object] = {
        "review_id": review_id,
        "created_at": f"{day.isoformat()}T10:00:{n % 60:02d}Z",
        "text": f"review {n} ✓ é",
    }
    if extra:
        record["not_kept"] = "dropped from the snapshot"
    return json.dumps(record, ensure_ascii=n % 2 == 0).encode()


_OTHER_DAY = DAY + dt.timedelta(days=1)

_LINE = st.one_of(
    st.builds(
        _row,
        st.integers(0, 10_000),
        st.sampled_from([DAY, DAY, _OTHER_DAY]),
        st.one_of(st.text(min_size=1, max_size=6), st.integers(), st.sampled_from(["", " ", None])),
        st.booleans(),
    ),
    st.sampled_from(
        [
            b"",  # blank
            b"   ",
            b"{not json",
            b"[1, 2]",  # not an object
            b'{"review_id": "bad-utf8", "text": "\xff"}',
            b'{"review_id": "surrogate", "text": "\\ud800"}',
            b'{"review_id": "undated", "text": "no date"}',
            b"x" * (LIMIT + 5),  # over the line limit
            b"[" * 40 + b"]" * 40,  # nested
        ]
    ),
)


def _reference(spec: PipelineSpec, source: Path, storage: ArtifactStorage) -> tuple:
    """The day's rows read one by one, as CSV and Parquet sources are."""
    tally = SnapshotTally()
    rows = rows_for_partition(spec, str(source), DAY, storage)
    data = b"".join(line + b"\n" for line in row_lines(rows, SnapshotForm.of(spec), tally))
    return data, tally.unreadable, sorted(tally.files), tally.keys.tolist()


def _in_blocks(
    spec: PipelineSpec, source: Path, storage: ArtifactStorage, workers: parallel.Workers
) -> tuple:
    """The day's JSONL files in blocks of lines, as the snapshot step reads them."""
    tally = SnapshotTally()
    data = b"".join(jsonl_day_blocks(workers, spec, str(source), DAY, storage, tally))
    return data, tally.unreadable, sorted(tally.files), tally.keys.tolist()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    files=st.lists(st.lists(_LINE, max_size=40), min_size=1, max_size=3),
    block_rows=st.integers(1, 7),
    chunk_rows=st.integers(1, 12),
    dated_names=st.booleans(),
    sliced=st.booleans(),
    data=st.data(),
)
def test_blocks_of_lines_make_the_snapshot_rows_make(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    files: list[list[bytes]],
    block_rows: int,
    chunk_rows: int,
    dated_names: bool,
    sliced: bool,
    data: st.DataObject,
) -> None:
    base = tmp_path_factory.mktemp("snap")
    source = base / "src"
    source.mkdir()
    for n, lines in enumerate(files):
        name = f"reviews-{DAY.isoformat()}-{n}.jsonl" if dated_names else f"reviews-{n}.jsonl"
        ending = b"\n" if data.draw(st.booleans()) else b""
        (source / name).write_bytes(b"\n".join(lines) + ending)
    spec = _spec(sliced)
    storage = ArtifactStorage(
        base_url=str(base / "artifacts"), read_chunk_bytes=data.draw(st.integers(1, 64))
    )
    monkeypatch.setattr(parallel, "BLOCK_ROWS", block_rows)
    monkeypatch.setattr(parallel, "CHUNK_ROWS", chunk_rows)

    with parallel.Workers(0) as workers:
        assert _in_blocks(spec, source, storage, workers) == _reference(spec, source, storage)


def test_a_day_on_a_worker_process_is_the_same_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the rows worked in the step's process, blocks go to a worker process and come
    back in file order: positions of rows without an id are the snapshot's, not the block's."""
    source = tmp_path / "src"
    source.mkdir()
    lines = [
        _row(n, DAY if n % 5 else _OTHER_DAY, "" if n % 7 == 0 else f"R{n % 50}", n % 3 == 0)
        for n in range(3_000)
    ]
    lines[17] = b"{broken"
    (source / f"reviews-{DAY.isoformat()}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    storage = ArtifactStorage(base_url=str(tmp_path / "artifacts"))
    spec = _spec(sliced=True)
    monkeypatch.setattr(parallel, "INLINE_ROWS", 200)
    monkeypatch.setattr(parallel, "CHUNK_ROWS", 100)
    monkeypatch.setattr(parallel, "BLOCK_ROWS", 30)
    sent: list[tuple[Any, Any]] = []
    monkeypatch.setattr(parallel.concurrent.futures, "ProcessPoolExecutor", ready_pool(sent))

    with parallel.Workers(1) as workers:
        made = _in_blocks(spec, source, storage, workers)
    assert len(sent) > 10  # blocks went to the worker process

    assert made == _reference(spec, source, storage)
    assert made[1] == 1 and len(made[3]) == made[0].count(b"\n") == 2_400
