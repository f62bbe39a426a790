"""The quality gate's frame rules: a pandera schema built from the spec's output schema.

Each result is first parsed with the spec's pydantic model (types and per-field constraints,
see validation.py); the parsed rows are then validated as a frame with pandera, lazily, so
every failing row and rule is found at once: the same constraints, non-null columns, unique
source ids, and any rules a spec adds with its own `DataFrameModel`.

pandas and pandera are imported by the functions that use them, on the first validation: a
code location, a sensor tick or a command that validates nothing does not pay for them.
"""

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from llm_assets.results.validation import describe_value
from llm_assets.spec.checks import load_pandera_model
from llm_assets.spec.model import FieldSpec, PipelineSpec

if TYPE_CHECKING:
    import pandas as pd
    import pandera.pandas as pa

LINEAGE = ("job_id", "custom_id", "source_id", "prompt_version", "model")
_DTYPES: dict[str, Any] = {"str": str, "int": "int64", "float": float, "bool": bool}


class FrameFailure(BaseModel):
    """One row that broke one frame rule."""

    custom_id: str
    rule: str
    column: str
    value: str
    """The offending value as messages show it: its length for a length rule."""


def _checks(field: FieldSpec) -> "list[pa.Check]":
    import pandera.pandas as pa

    checks: list[pa.Check] = []
    if field.isin is not None:
        checks.append(pa.Check.isin(list(field.isin)))
    if field.type == "str" and (field.min_length is not None or field.max_length is not None):
        checks.append(pa.Check.str_length(field.min_length, field.max_length))
    if field.ge is not None:
        checks.append(pa.Check.ge(field.ge))
    if field.le is not None:
        checks.append(pa.Check.le(field.le))
    if field.gt is not None:
        checks.append(pa.Check.gt(field.gt))
    if field.lt is not None:
        checks.append(pa.Check.lt(field.lt))
    return checks


def frame_schema(spec: PipelineSpec) -> "pa.DataFrameSchema":
    """The frame rules of the spec's output schema."""
    import pandera.pandas as pa

    columns: dict[str, pa.Column] = {
        name: pa.Column(str, nullable=name != "source_id", unique=name == "source_id")
        for name in LINEAGE
    }
    fields = spec.output.output_schema
    if spec.output.format == "text":
        text = fields.get("text") or FieldSpec(type="str")
        columns["text"] = pa.Column(str, checks=[pa.Check.str_length(1, text.max_length)])
    else:
        for name, field in fields.items():
            dtype = _DTYPES.get(field.type)  # lists are checked per row by pydantic
            columns[name] = pa.Column(dtype, checks=_checks(field), nullable=field.nullable)
    return pa.DataFrameSchema(columns, strict=False, coerce=False, name=f"{spec.name}_outputs")


def custom_model(spec: PipelineSpec) -> "type[pa.DataFrameModel] | None":
    """The spec's own DataFrameModel (`output.pandera_model: package.module:Class`)."""
    if not spec.output.pandera_model:
        return None
    return load_pandera_model(spec.output.pandera_model)


def validate_frame(
    spec: PipelineSpec, frame: "pd.DataFrame", seen_source_ids: set[str] | None = None
) -> "tuple[pd.DataFrame, list[FrameFailure]]":
    """Rows that pass every frame rule, and one failure per failing row (its first rule).

    `seen_source_ids` carries uniqueness across the chunks of one partition.
    """
    import pandas as pd
    import pandera.pandas as pa

    if frame.empty:
        return frame, []
    failures: dict[int, FrameFailure] = {}

    def collect(cases: "pd.DataFrame") -> None:
        for case in cases.itertuples(index=False):
            index = getattr(case, "index", None)
            if index is None or pd.isna(index):
                continue
            position = int(index)
            if position in failures:
                continue
            row = frame.iloc[position]
            column = str(case.column or "")
            value = row[column] if column in row.index else case.failure_case
            failures[position] = FrameFailure(
                custom_id=str(row["custom_id"]),
                rule=f"{case.column}.{case.check}" if case.column else str(case.check),
                column=column,
                value=describe_value(value, length_rule="str_length" in str(case.check)),
            )

    schemas: list[Any] = [frame_schema(spec)]
    model = custom_model(spec)
    if model is not None:
        schemas.append(model.to_schema())
    indexed = frame.reset_index(drop=True)
    for schema in schemas:
        try:
            schema.validate(indexed, lazy=True)
        except pa.errors.SchemaErrors as exc:
            collect(exc.failure_cases)
    if seen_source_ids is not None:
        for position, source_id in enumerate(indexed["source_id"]):
            if source_id in seen_source_ids and position not in failures:
                failures[position] = FrameFailure(
                    custom_id=str(indexed.iloc[position]["custom_id"]),
                    rule="source_id.field_uniqueness",
                    column="source_id",
                    value=describe_value(source_id),
                )
            seen_source_ids.add(source_id)
    keep = [p for p in range(len(indexed)) if p not in failures]
    return indexed.iloc[keep], list(failures.values())


def label_field(spec: PipelineSpec) -> str | None:
    for name, field in spec.output.output_schema.items():
        if field.type == "str" and field.isin is not None:
            return name
    return None


def confidence_field(spec: PipelineSpec) -> str | None:
    field = spec.output.output_schema.get("confidence")
    return "confidence" if field is not None and field.type == "float" else None


def distribution(labels: Iterable[Any]) -> dict[str, float]:
    """Each label's share, most common first; None and NaN (which is not equal to itself) are
    no label."""
    counts = Counter(label for label in labels if label is not None and label == label)
    total = float(sum(counts.values()))
    return {str(k): v / total for k, v in counts.most_common()} if total else {}


def total_variation(a: dict[str, float], b: dict[str, float]) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))
