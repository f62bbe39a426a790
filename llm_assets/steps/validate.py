"""validated_outputs: the day's succeeded results through the quality gate (judge.py) into
Parquet and the job's outputs, in one step or in slices joined into the day's one Parquet.

In slices: a day's succeeded results judged by `sharding.slices` steps of their own on any
worker, joined into the day's outputs.

A slice is a range of the day's custom_ids, cut where the row positions they begin with
(items/ids.py) split the day's items evenly, and read along the ledger's (job, custom_id)
index; the ranges cover every string, so every result falls in exactly one slice whatever its
id. The cuts depend on the job's item count: the join takes the slices only if they all cut
at the same places. A day's items have one source id each (repeats are dead letters from the
build on), so the frame check that a source id comes once holds across slices as within one.
A slice writes nothing to the ledger: it parses and checks its results, writes the passing
rows to a Parquet part, reads that part back against the frame schema, and leaves the part,
the output rows and the failures beside it. The join holds the day: it checks that the
slices judged every result the ledger holds as succeeded now (else the day is validated
again), then writes the parts into the day's one Parquet, replaces the job's outputs and
records the quality dead letters in one go, as a validation in one step does.
"""

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel

from llm_assets.items import ids
from llm_assets.resources.ledger import SUCCEEDED, JobRecord, utcnow
from llm_assets.steps.context import MissingPrerequisite, StepContext, artifact_key, refuse_expired
from llm_assets.steps.judge import (
    GateTally,
    ResultGate,
    ValidateResult,
    arrow_schema,
    outputs_key,
    validation_result,
)
from llm_assets.steps.reports import published_frame_failures
from llm_assets.util.failpoints import failpoint

__all__ = [
    "ValidateResult",
    "forget_slice",
    "join_validation",
    "slice_cuts",
    "validate_outputs",
    "validate_slice",
]


def validate_outputs(ctx: StepContext) -> ValidateResult:
    """Parse succeeded results with pydantic, then check them as a frame with pandera; every
    failure becomes a quality dead letter naming the rule and the offending value.

    Holds the day: validating it again replaces its outputs, never collides with another run.
    A spec with `sharding.slices` above 1 validates its slices one after another here, then
    joins them (below); Dagster runs them as steps of their own.
    """
    if ctx.spec.sharding.slices > 1:
        for number in range(ctx.spec.sharding.slices):
            validate_slice(ctx, number)
        return join_validation(ctx).result
    with ctx.day_lock():
        return _validate_outputs(ctx)


def _validate_outputs(ctx: StepContext) -> ValidateResult:
    import pyarrow.parquet as pq

    ledger = ctx.ledger
    job = ctx.job()
    refuse_expired(ctx.spec, job)  # its answers are gone: the outputs would be replaced by none
    # The outputs replace the job's earlier ones once the day's failures are recorded.
    with tempfile.TemporaryDirectory() as tmp, ledger.replacing_outputs(job.job_id) as keep:
        path = Path(tmp) / "outputs.parquet"
        with pq.ParquetWriter(path, arrow_schema(ctx.spec)) as writer:
            gate = ResultGate(ctx, job, writer, keep)
            wanted = ["custom_id", "source_id", "result_json", "finish_reason"]
            gate.parse(ledger.iter_items(job.job_id, [SUCCEEDED], columns=wanted))
        uri = ctx.storage.write_file(outputs_key(ctx.spec, job), path).uri
        failpoint("validate.after_write")
        ledger.set_item_errors(job.job_id, gate.failed_rows, from_status=[SUCCEEDED])
    counts = ledger.refresh_job(job.job_id)
    ledger.update_job(job.job_id, validated_at=utcnow())
    return validation_result(ctx, job.job_id, GateTally.of(gate), uri, counts)


_WANTED = ["custom_id", "source_id", "result_json", "finish_reason"]


class SliceValidation(BaseModel):
    """What a slice of the validation leaves for the join."""

    judged: int
    """Succeeded results it judged."""
    tally: GateTally
    failed_rows: list[dict[str, Any]]
    read_back_failures: list[dict[str, Any]]
    cuts: list[str] = []
    """Where the day's custom_ids were cut into slices (slice_cuts)."""


class JoinedValidation(BaseModel):
    result: ValidateResult
    read_back_failures: list[dict[str, Any]]
    """The parts read back against the frame schema (published_frame_failures)."""


def _part_key(ctx: StepContext, job: JobRecord, number: int, suffix: str) -> str:
    count = ctx.spec.sharding.slices
    return artifact_key(
        "outputs",
        ctx.spec.name,
        job.partition_date.isoformat(),
        f"{job.job_id}.parts",
        f"{number + 1:03d}-of-{count:03d}{suffix}",
    )


def slice_cuts(job: JobRecord, count: int) -> list[str]:
    """The custom_ids where the day's `count` slices begin, the first excepted: at the row
    positions that split its items evenly (keyed custom_ids sort by their row's position)."""
    day, items = job.partition_date, job.total_items
    return [ids.position_bound(day, number * items // count) for number in range(1, count)]


def slice_range(cuts: list[str], number: int) -> tuple[str | None, str | None]:
    """Slice `number`'s custom_ids: from its cut (the first from none) to the next one's."""
    low = cuts[number - 1] if number > 0 else None
    high = cuts[number] if number < len(cuts) else None
    return low, high


def validate_slice(ctx: StepContext, number: int) -> SliceValidation:
    """Judge slice `number` (from 0) of the day's succeeded results; its part, output rows
    and result are left in storage for the join. Writes nothing to the ledger."""
    import pyarrow.parquet as pq

    job = ctx.job()
    refuse_expired(ctx.spec, job)
    count = ctx.spec.sharding.slices
    cuts = slice_cuts(job, count)
    judged = 0
    with tempfile.TemporaryDirectory() as tmp:
        rows_path = Path(tmp) / "outputs.jsonl"
        part_path = Path(tmp) / "part.parquet"
        with (
            rows_path.open("wb") as rows,
            pq.ParquetWriter(part_path, arrow_schema(ctx.spec)) as writer,
        ):

            def keep(batch: list[tuple[Any, ...]]) -> None:
                rows.write(b"".join(orjson.dumps(row) + b"\n" for row in batch))

            def mine() -> Iterator[dict[str, Any]]:
                nonlocal judged
                for item in ctx.ledger.iter_items(
                    job.job_id, [SUCCEEDED], columns=_WANTED, custom_ids=slice_range(cuts, number)
                ):
                    judged += 1
                    yield item

            gate = ResultGate(ctx, job, writer, keep)
            gate.parse(mine())
        part = ctx.storage.write_file(_part_key(ctx, job, number, ".parquet"), part_path)
        ctx.storage.write_file(_part_key(ctx, job, number, ".outputs.jsonl"), rows_path)
    result = SliceValidation(
        judged=judged,
        tally=GateTally.of(gate),
        failed_rows=gate.failed_rows,
        read_back_failures=published_frame_failures(ctx, part.uri),
        cuts=cuts,
    )
    ctx.storage.write_bytes(_part_key(ctx, job, number, ".json"), result.model_dump_json().encode())
    return result


def join_validation(ctx: StepContext) -> JoinedValidation:
    """Join the slices of the day's validation into its outputs (see the module docstring).
    Holds the day; MissingPrerequisite when a slice is missing or the results changed since
    the slices judged them."""
    import pyarrow.parquet as pq

    ledger, storage = ctx.ledger, ctx.storage
    count = ctx.spec.sharding.slices
    with ctx.day_lock():
        job = ctx.job()
        refuse_expired(ctx.spec, job)
        parts = _slice_results(ctx, job, count)
        if any(part.cuts != parts[0].cuts for part in parts):
            raise MissingPrerequisite(
                f"{ctx.spec.name} {ctx.day}: the slices cut the day's items in different places "
                "(its items changed between them); validate the day again"
            )
        succeeded = ledger.counts(job.job_id).succeeded
        judged = sum(part.judged for part in parts)
        if judged != succeeded:
            raise MissingPrerequisite(
                f"{ctx.spec.name} {ctx.day}: the slices judged {judged} results but the ledger "
                f"holds {succeeded} as succeeded now; validate the day again"
            )
        tally = GateTally()
        failed_rows: list[dict[str, Any]] = []
        for part in parts:
            tally.add(part.tally)
            failed_rows += part.failed_rows
        with (
            tempfile.TemporaryDirectory() as tmp,
            ledger.replacing_outputs(job.job_id) as keep,
        ):
            path = Path(tmp) / "outputs.parquet"
            with pq.ParquetWriter(path, arrow_schema(ctx.spec)) as writer:
                for number in range(count):
                    with storage.local_copy(
                        storage.uri(_part_key(ctx, job, number, ".parquet"))
                    ) as part_path:
                        part_file = pq.ParquetFile(part_path)
                        for group in range(part_file.num_row_groups):
                            writer.write_table(part_file.read_row_group(group))
                    rows = storage.open_lines(
                        storage.uri(_part_key(ctx, job, number, ".outputs.jsonl"))
                    )
                    batch: list[tuple[Any, ...]] = []
                    for line in rows:
                        batch.append(tuple(orjson.loads(line)))
                        if len(batch) >= 10_000:
                            keep(batch)
                            batch = []
                    if batch:
                        keep(batch)
            uri = storage.write_file(outputs_key(ctx.spec, job), path).uri
            failpoint("validate.after_write")
            ledger.set_item_errors(job.job_id, failed_rows, from_status=[SUCCEEDED])
        counts = ledger.refresh_job(job.job_id)
        ledger.update_job(job.job_id, validated_at=utcnow())
    return JoinedValidation(
        result=validation_result(ctx, job.job_id, tally, uri, counts),
        read_back_failures=[f for part in parts for f in part.read_back_failures],
    )


def forget_slice(ctx: StepContext, number: int) -> None:
    """Drop what slice `number` of an earlier validation of the day left: a slice that did
    not judge the day now (its items were in flight) leaves the join nothing to take for
    this validation's."""
    job = ctx.ledger.get_job(ctx.job_id)
    if job is not None:
        ctx.storage.delete(ctx.storage.uri(_part_key(ctx, job, number, ".json")))


def _slice_results(ctx: StepContext, job: JobRecord, count: int) -> list[SliceValidation]:
    uris = [ctx.storage.uri(_part_key(ctx, job, n, ".json")) for n in range(count)]
    missing = [f"{n + 1}/{count}" for n, uri in enumerate(uris) if not ctx.storage.exists(uri)]
    if missing:
        raise MissingPrerequisite(
            f"{ctx.spec.name} {ctx.day}: slice {', '.join(missing)} of the day's validation "
            "has not run; materialize validated_outputs (all its slices)"
        )
    return [SliceValidation.model_validate_json(ctx.storage.read_bytes(uri)) for uri in uris]
