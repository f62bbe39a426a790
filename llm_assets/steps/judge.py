"""The quality gate's judgment of a day's succeeded results (what validate.py runs, in one
step or in slices): parsed with pydantic, checked as frames with pandera, the passing rows
written to Parquet and kept as outputs, every failure a quality dead letter naming the rule
and the offending value; and what a validation reports."""

import json
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from pydantic import BaseModel

from llm_assets.compliance.policy import restore
from llm_assets.resources.ledger import DEAD_LETTER, JobCounts, JobRecord
from llm_assets.results import quality
from llm_assets.results.rows import ledger_text
from llm_assets.results.validation import parse_output
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps.context import StepContext, artifact_key
from llm_assets.util import column_sizes

FRAME_ROWS = 10_000
"""Parsed results checked as one frame by pandera and written as one Parquet row group."""
PREVIEW_ROWS = 10
FAILURE_CASES = 20


class ValidateResult(BaseModel):
    job_id: str
    uri: str
    valid_rows: int
    quality_failures: dict[str, int]
    quality_dead_letters: int
    failure_rate: float
    failure_cases: list[dict[str, Any]]
    open_items: int
    missing_results: list[str]
    preview: list[dict[str, Any]]
    low_confidence_rows: int | None = None
    label_distribution: dict[str, float] = {}
    baseline_distribution: dict[str, float] = {}
    label_shift: float | None = None


def outputs_key(spec: PipelineSpec, job: JobRecord) -> str:
    """Where a job's validated Parquet is written."""
    return artifact_key(
        "outputs", spec.name, job.partition_date.isoformat(), f"{job.job_id}.parquet"
    )


def arrow_schema(spec: PipelineSpec) -> Any:
    import pyarrow as pa

    types = {
        "str": pa.string(),
        "int": pa.int64(),
        "float": pa.float64(),
        "bool": pa.bool_(),
        "list[str]": pa.list_(pa.string()),
        "list[float]": pa.list_(pa.float32()),
    }
    lineage = [pa.field(name, pa.string()) for name in quality.LINEAGE]
    if spec.output.format == "text":
        return pa.schema([*lineage, pa.field("text", pa.string())])
    fields = [pa.field(n, types[f.type]) for n, f in spec.output.output_schema.items()]
    return pa.schema([*lineage, *fields])


class ResultGate:
    """A job's succeeded results on their way through the gate: parsed one by one, checked
    as frames, the passing rows written to Parquet and kept as the job's outputs, the rest
    collected as quality dead letters."""

    def __init__(
        self,
        ctx: StepContext,
        job: JobRecord,
        writer: Any,
        keep: Callable[[list[tuple[Any, ...]]], None],
    ) -> None:
        self.spec = ctx.spec
        self.job = job
        self.writer = writer
        self.keep = keep
        self.names = list(writer.schema.names)
        self.value_names = [k for k in self.names if k not in quality.LINEAGE]
        self.label_name = quality.label_field(ctx.spec)
        self.confidence_name = quality.confidence_field(ctx.spec)
        self.pseudonyms = ctx.ledger.pseudonyms_of(job.job_id)
        """The values of pseudonymized items' placeholders, put back where the model echoes
        them before the output is checked."""
        self.failures: dict[str, int] = defaultdict(int)
        self.failed_rows: list[dict[str, Any]] = []
        self.preview: list[dict[str, Any]] = []
        self.seen_sources: set[str] = set()
        self.labels: dict[str, int] = defaultdict(int)
        self.low_confidence = 0
        self.valid = 0

    def fail(self, custom_id: str, rule: str, message: str) -> None:
        """A quality dead letter; its rule may name a key of the model's answer, so it is
        fitted to the ledger like any provider string."""
        self.failures[rule] += 1
        self.failed_rows.append(
            {
                "custom_id": custom_id,
                "status": DEAD_LETTER,
                "error_class": "quality",
                "error_code": ledger_text(rule, column_sizes.ERROR_CODE),
                "error_message": ledger_text(message),
            }
        )

    def parse(self, items: Iterable[dict[str, Any]]) -> None:
        """Parse results with pydantic, in this process (handing texts to worker processes
        and values back costs more than parsing them), and check them frame by frame."""
        batch: list[dict[str, Any]] = []
        for item in items:
            parsed = parse_output(self.spec, item["result_json"], item["finish_reason"])
            if not parsed.ok:
                self.fail(item["custom_id"], parsed.rule or "unknown", parsed.message or "")
                continue
            value = parsed.value or {}
            if item["custom_id"] in self.pseudonyms:
                value = restore(value, self.pseudonyms[item["custom_id"]])
            batch.append(
                {
                    "job_id": self.job.job_id,
                    "custom_id": item["custom_id"],
                    "source_id": item["source_id"],
                    "prompt_version": self.job.prompt_version,
                    "model": self.job.model_name,
                    **value,
                }
            )
            if len(batch) >= FRAME_ROWS:
                self.check(batch)
                batch = []
        if batch:
            self.check(batch)

    def check(self, batch: list[dict[str, Any]]) -> None:
        """Check a frame with pandera; write and keep the rows that pass."""
        import pandas as pd
        import pyarrow as pa

        frame = pd.DataFrame({name: [row.get(name) for row in batch] for name in self.names})
        passed, broken = quality.validate_frame(self.spec, frame, self.seen_sources)
        for failure in broken:
            self.fail(failure.custom_id, failure.rule, f"{failure.rule}: got {failure.value}")
        if passed.empty:
            return
        # Columns to Python lists in one call each; rows only where rows are needed.
        columns = {name: passed[name].tolist() for name in self.names}
        self.writer.write_table(pa.Table.from_pydict(columns, schema=self.writer.schema))
        self.count(columns)
        outputs = (
            orjson.dumps(dict(zip(self.value_names, values, strict=True))).decode()
            for values in zip(*(columns[k] for k in self.value_names), strict=True)
        )
        self.keep(
            [
                (custom_id, source_id, self.job.prompt_version, self.job.model_name, output)
                for custom_id, source_id, output in zip(
                    columns["custom_id"], columns["source_id"], outputs, strict=True
                )
            ]
        )

    def count(self, columns: dict[str, list[Any]]) -> None:
        """Valid rows, the preview, the label counts and the rows under the confidence floor."""
        self.valid += len(columns["custom_id"])
        for values in zip(*columns.values(), strict=True):
            if len(self.preview) >= PREVIEW_ROWS:
                break
            self.preview.append(dict(zip(self.names, values, strict=True)))
        if self.label_name:
            for label in columns[self.label_name]:
                self.labels[str(label)] += 1
        floor = self.spec.quality.min_confidence
        if self.confidence_name and floor is not None:
            self.low_confidence += sum(1 for c in columns[self.confidence_name] if c < floor)


class GateTally(BaseModel):
    """What the gate counted of the results it judged (of a day, or of a slice of it)."""

    valid: int = 0
    failures: dict[str, int] = {}
    preview: list[dict[str, Any]] = []
    labels: dict[str, int] = {}
    low_confidence: int = 0

    @classmethod
    def of(cls, gate: ResultGate) -> "GateTally":
        return cls(
            valid=gate.valid,
            failures=dict(gate.failures),
            preview=gate.preview,
            labels=dict(gate.labels),
            low_confidence=gate.low_confidence,
        )

    def add(self, other: "GateTally") -> None:
        self.valid += other.valid
        for rule, count in other.failures.items():
            self.failures[rule] = self.failures.get(rule, 0) + count
        self.preview = (self.preview + other.preview)[:PREVIEW_ROWS]
        for label, count in other.labels.items():
            self.labels[label] = self.labels.get(label, 0) + count
        self.low_confidence += other.low_confidence


def _label_shift(ctx: StepContext, tally: GateTally) -> tuple[dict[str, float], float | None]:
    """The label distribution of the pipeline's recent outputs, and how far today's is from
    it (total variation distance); empty and None without a label field or history."""
    label_name = quality.label_field(ctx.spec)
    if not label_name:
        return {}, None
    past = (
        json.loads(row["output_json"]).get(label_name)
        for row in ctx.ledger.recent_outputs(ctx.spec.name, ctx.day, ctx.spec.quality.shift_window)
    )
    baseline = quality.distribution(past)
    current = {k: v / tally.valid for k, v in tally.labels.items()} if tally.valid else {}
    shift = quality.total_variation(current, baseline) if baseline and current else None
    return baseline, shift


def validation_result(
    ctx: StepContext, job_id: str, tally: GateTally, uri: str, counts: JobCounts
) -> ValidateResult:
    """The day's validation as validated_outputs reports it."""
    quality_dead = counts.dead_letters_by_class.get("quality", 0)
    judged = counts.succeeded + quality_dead
    cases = [
        {k: row[k] for k in ("custom_id", "source_id", "error_code", "error_message")}
        for row in ctx.ledger.iter_dead_letters(job_id)
        if row["error_class"] == "quality"
    ][:FAILURE_CASES]
    baseline, shift = _label_shift(ctx, tally)
    valid = tally.valid
    confidence_name = quality.confidence_field(ctx.spec)
    return ValidateResult(
        job_id=job_id,
        uri=uri,
        valid_rows=valid,
        quality_failures=dict(tally.failures),
        quality_dead_letters=quality_dead,
        failure_rate=quality_dead / judged if judged else 0.0,
        failure_cases=cases,
        open_items=counts.open,
        missing_results=ctx.ledger.missing_results(job_id) if counts.open == 0 else [],
        preview=tally.preview,
        low_confidence_rows=tally.low_confidence if confidence_name else None,
        label_distribution={k: v / valid for k, v in sorted(tally.labels.items())} if valid else {},
        baseline_distribution=baseline,
        label_shift=shift,
    )
