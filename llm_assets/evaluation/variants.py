"""The variant specs an evaluation runs, by name: the one place that turns names into specs,
and what a replay scores in them.

"baseline" is the pipeline's own spec and is always run first: the other variants are judged
against it. A name the pipeline does not define is an error that lists the names it does.
"""

from llm_assets.evaluation.spec import merge_patch
from llm_assets.spec.model import PipelineSpec

BASELINE = "baseline"


class UnknownVariant(ValueError):
    """An evaluation named a variant the pipeline does not define."""


def resolve_variants(spec: PipelineSpec, names: list[str] | None) -> dict[str, PipelineSpec]:
    """The baseline, then the full spec of each named variant in the order named (every
    variant of the spec when none is named). Every name must be one the pipeline defines."""
    known = {BASELINE: spec, **{name: variant_spec(spec, name) for name in spec.variants}}
    named = [n.strip() for n in names or [] if n.strip()] or list(spec.variants)
    wanted = list(dict.fromkeys([BASELINE, *named]))
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise UnknownVariant(
            f"{spec.name} has no variant {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(sorted(known))}"
        )
    return {name: known[name] for name in wanted}


def variant_spec(spec: PipelineSpec, name: str) -> PipelineSpec:
    """The pipeline spec with variant `name`'s model and prompt merged over the baseline's,
    and no variants. KeyError for a name the spec does not have; pydantic's ValidationError
    when the merged spec is invalid (`evaluation_problems` reports it in spec validation)."""
    if name not in spec.variants:
        known = ", ".join(sorted(spec.variants)) or "none"
        raise KeyError(f"pipeline {spec.name} has no variant {name!r} (its variants: {known})")
    data = spec.model_dump(by_alias=True, exclude_unset=True)
    for section, patch in spec.variants[name].patch().items():
        data[section] = merge_patch(getattr(spec, section).model_dump(exclude_unset=True), patch)
    data["variants"] = {}
    return type(spec).model_validate({**data, "path": spec.path})


def scored_field(spec: PipelineSpec) -> str | None:
    """The output field a replay scores: `eval.field`, else the first field with `isin` (a
    label), else the output's only field; None when that leaves a choice."""
    if spec.eval.field is not None:
        return spec.eval.field
    if spec.output.format == "text":
        return "text"
    schema = spec.output.output_schema
    labels = [name for name, field in schema.items() if field.isin]
    if labels:
        return labels[0]
    return next(iter(schema)) if len(schema) == 1 else None


def failure_rate_limit(spec: PipelineSpec) -> float:
    """The share of failed items above which a variant is not recommended."""
    rate = spec.eval.max_failure_rate
    return spec.quality.max_failure_rate if rate is None else rate
