"""The checks of a spec's `variants:` and `eval:` sections: the `eval` rules, and every problem
of a variant's merged spec that the baseline does not have, as `variants.<name>.<field>`; a
variant that changes nothing is a problem too. spec/load.py runs them with the other checks.
"""

from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from llm_assets.evaluation.variants import scored_field, variant_spec
from llm_assets.spec.checks import SpecCheck
from llm_assets.spec.model import PipelineSpec


def _loc(loc: Iterable[Any]) -> str:
    return ".".join(str(p) for p in loc if not str(p).startswith("function-")) or "-"


def _eval_problems(spec: PipelineSpec) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    source, reference = spec.source, spec.eval.reference_field
    if reference is not None:
        for role in ("id_field", "date_field"):
            if reference == getattr(source, role):
                problems.append(
                    (
                        "eval.reference_field",
                        f"{reference!r} is source.{role}; name the column holding the gold answer",
                    )
                )
        if reference in spec.prompt.placeholders:
            problems.append(
                (
                    "prompt.template",
                    f"placeholder {{{reference}}} is eval.reference_field: the gold answer is "
                    "never sent to the model; take it out of the template",
                )
            )
        if reference in source.fields and reference in source.non_blank_fields:
            problems.append(
                (
                    "eval.reference_field",
                    f"{reference!r} is a required source field (source.required_fields, by "
                    "default every field): rows without a reference would be input dead "
                    "letters; leave it out of source.fields (a replay reads it from the source "
                    "rows) or list source.required_fields without it",
                )
            )
    field = spec.eval.field
    names = ["text"] if spec.output.format == "text" else list(spec.output.output_schema)
    if field is not None and field not in names:
        problems.append(("eval.field", f"{field!r} is not an output field; one of {names}"))
    if field is None and (spec.variants or reference is not None) and scored_field(spec) is None:
        problems.append(
            (
                "eval.field",
                f"the output has several fields ({', '.join(names)}) and none lists isin: name "
                "the one a replay scores",
            )
        )
    if spec.eval.price_as:
        from llm_assets.resources.pricing import load_price_table

        table, seen = load_price_table(), set()
        for index, entry in enumerate(spec.eval.price_as):
            provider, _, model = entry.partition("/")
            if entry in seen:
                problems.append((f"eval.price_as.{index}", f"{entry!r} is listed twice"))
            elif table.find(provider, model) is None:
                why = table.missing(provider, model)
                problems.append((f"eval.price_as.{index}", f"{entry!r} has no price: {why}"))
            seen.add(entry)
    return problems


def evaluation_problems(spec: PipelineSpec, checked: SpecCheck) -> list[tuple[str, str]]:
    """The `eval` rules, and each variant's problems as `variants.<name>.<field>`: what its
    merged spec fails `checked` that the baseline does not, or that it changes nothing."""
    problems = _eval_problems(spec)
    if not spec.variants:
        return problems
    known = set(_all_problems(spec.model_copy(update={"variants": {}}), checked))
    for name in spec.variants:
        prefix = f"variants.{name}"
        try:
            merged = variant_spec(spec, name)
        except ValidationError as exc:
            problems.extend((f"{prefix}.{_loc(e['loc'])}", e["msg"]) for e in exc.errors())
            continue
        if merged.model == spec.model and merged.prompt == spec.prompt:
            problems.append(
                (
                    prefix,
                    "changes nothing: its model and prompt are the baseline's; change a "
                    "model.* or prompt.* field, or remove the variant",
                )
            )
            continue
        problems.extend(
            (f"{prefix}.{field}", reason)
            for field, reason in _all_problems(merged, checked)
            if (field, reason) not in known
        )
    return problems


def _all_problems(spec: PipelineSpec, checked: SpecCheck) -> list[tuple[str, str]]:
    """What a spec without variants fails: `checked` and the `eval` rules."""
    return checked(spec) + _eval_problems(spec)
