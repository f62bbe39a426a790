"""The publication gate: what the day's latest validation said about publishing it.

validated_outputs records, after each validation, which of its gate checks failed and by
how much ("quality_failure_rate (25.8% > 5.0%)"). published_outputs and qa_sample read the
record and skip the day, with that reason, instead of failing the run; `llm-assets status`,
`run` and the day's summary print the same sentence. The record is per pipeline and day (the
published file is), and every validation replaces it, so a day that passes again is
published again. A validation first records itself as unfinished, so a run that dies
before its checks are recorded leaves the day blocked, never published on an old verdict.
A run that validates holds the day from its first record to its last, so a reader that
finds the record unfinished by another run waits for that run's verdict (`settled_block`).
"""

import datetime as dt
import json

from pydantic import BaseModel

from llm_assets.resources.ledger import utcnow
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps.context import StepContext, artifact_key, refuse_expired


class GateRecord(BaseModel):
    job_id: str
    validated_at: dt.datetime
    blocked_by: list[str]
    """One phrase per failed gate check, e.g. "quality_failure_rate (25.8% > 5.0%)"."""


UNFINISHED = "validation (started, not finished)"
"""The gate record while a validation runs."""


def gate_key(spec: PipelineSpec, day: dt.date) -> str:
    return artifact_key("gate", spec.name, f"{day.isoformat()}.json")


def record_gate(ctx: StepContext, job_id: str, blocked_by: list[str]) -> GateRecord:
    """Write what the validation just said; an empty `blocked_by` opens the gate. Nothing is
    written for a day retention expired (DayExpired): it is not validated again."""
    refuse_expired(ctx.spec, ctx.ledger.get_job(job_id))
    record = GateRecord(job_id=job_id, validated_at=utcnow(), blocked_by=blocked_by)
    ctx.storage.write_bytes(gate_key(ctx.spec, ctx.day), record.model_dump_json().encode())
    return record


def gate_record(spec: PipelineSpec, day: dt.date, storage: ArtifactStorage) -> GateRecord | None:
    """The day's latest gate record; None before the day was first validated."""
    uri = storage.uri(gate_key(spec, day))
    if not storage.exists(uri):
        return None
    return GateRecord.model_validate(json.loads(storage.read_bytes(uri)))


def publication_block(spec: PipelineSpec, day: dt.date, storage: ArtifactStorage) -> str | None:
    """ "blocked by quality_failure_rate (25.8% > 5.0%)" when the day's latest validation
    failed a gate check, else None."""
    record = gate_record(spec, day, storage)
    if record is None or not record.blocked_by:
        return None
    return "blocked by " + "; ".join(record.blocked_by)


def settled_block(ctx: StepContext) -> str | None:
    """`publication_block` of the context's day once no other run is validating it: a record
    left unfinished is read again after the run that holds the day lets it go. A validation
    that died leaves it unfinished, and the day blocked."""
    record = gate_record(ctx.spec, ctx.day, ctx.storage)
    if record is not None and record.blocked_by == [UNFINISHED]:
        with ctx.day_lock():
            pass
    return publication_block(ctx.spec, ctx.day, ctx.storage)
