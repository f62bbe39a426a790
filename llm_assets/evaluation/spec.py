"""The evaluation sections of a pipeline spec: `variants`, named alternatives to the pipeline's
own model and prompt, and `eval`, how a replay scores them.

The pipeline's own configuration is the baseline; variants change nothing it runs (its prompt
code version included). A variant is a JSON merge patch (RFC 7396) over the baseline's `model`
and `prompt`: a value replaces the baseline's, a mapping merges into it key by key
(`model.options` too), and `null` removes a key so its default applies. `variant_spec` gives
the merged pipeline spec, validated like any spec.

`evaluation_problems` registers itself with spec validation: the `eval` rules, and every
problem of a variant's merged spec that the baseline does not have, as
`variants.<name>.<field>`; a variant that changes nothing is a problem too. Importing the
spec model imports this module, so the check always runs.
"""

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from llm_assets.spec_checks import register_check, semantic_problems

if TYPE_CHECKING:
    from llm_assets.spec import PipelineSpec

BASELINE = "baseline"
"""What reports call the pipeline's own configuration; no variant may take the name."""
VARIANT_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
PRICE_AS = re.compile(r"^[^/\s]+/\S+$")
VARIANT_SECTIONS = ("model", "prompt")


def _variant_name(name: str) -> str:
    if not VARIANT_NAME.match(name):
        raise ValueError(
            f"variant name {name!r} must match {VARIANT_NAME.pattern} (lower case letters, "
            "digits and _, at most 32)"
        )
    if name == BASELINE:
        raise ValueError(
            f"{BASELINE!r} is the pipeline's own model and prompt; give the variant another name"
        )
    return name


VariantName = Annotated[str, AfterValidator(_variant_name)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelPatch(_Strict):
    """The `model` fields a variant replaces; the ones it leaves out are the baseline's. The
    merged `model` is checked like the baseline's (known provider, priced model, ...)."""

    provider: str | None = None
    name: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    options: dict[str, Any] | None = Field(
        default=None, description="Merged into the baseline's options key by key; null removes one."
    )


class PromptPatch(_Strict):
    """The `prompt` fields a variant replaces; the ones it leaves out are the baseline's."""

    version: str | None = None
    system: str | None = None
    template: str | None = None
    truncate_to_context: bool | None = None


class VariantSpec(_Strict):
    description: str = ""
    model: ModelPatch = ModelPatch()
    prompt: PromptPatch = PromptPatch()

    def patch(self) -> dict[str, dict[str, Any]]:
        """What the variant writes, section by section, as merge patches (explicit nulls kept)."""
        return {
            section: getattr(self, section).model_dump(exclude_unset=True)
            for section in VARIANT_SECTIONS
        }


def _price_as(entry: str) -> str:
    if not PRICE_AS.match(entry):
        raise ValueError(f"{entry!r} is not provider/model, e.g. openai/gpt-4.1-mini")
    return entry


class EvalSpec(_Strict):
    reference_field: str | None = Field(
        default=None,
        description="A column of the source rows holding a gold answer (e.g. a human label). "
        "It is never sent to the model: it may not be a prompt placeholder, and it need not be "
        "in source.fields.",
    )
    field: str | None = Field(
        default=None,
        description="The output field a replay scores; default the first field with isin, else "
        "the output's only field (needed when there are several and none has isin).",
    )
    min_score: float | None = Field(
        default=None, ge=0.0, le=1.0, description="A variant scoring below this is not recommended."
    )
    sample: int = Field(default=200, ge=1, description="Items replayed per variant.")
    seed: int = Field(default=0, description="Picks the sample, so a replay can be repeated.")
    price_as: list[Annotated[str, AfterValidator(_price_as)]] = Field(
        default_factory=list,
        description="provider/model entries of the price table the replay's token counts are "
        "also priced as.",
    )
    max_failure_rate: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="A variant failing more items than this is not recommended; default the "
        "quality gate's quality.max_failure_rate.",
    )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396: `patch` applied to `target` (neither is changed)."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def diff_patch(source: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that turns `source` into `target` (a None value in `target` cannot be
    written as a merge patch: it reads as "remove")."""
    patch: dict[str, Any] = {key: None for key in source if key not in target}
    for key, value in target.items():
        if key not in source:
            patch[key] = value
        elif source[key] != value:
            both = isinstance(source[key], dict) and isinstance(value, dict)
            patch[key] = diff_patch(source[key], value) if both else value
    return patch


def variant_spec(spec: "PipelineSpec", name: str) -> "PipelineSpec":
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


def scored_field(spec: "PipelineSpec") -> str | None:
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


def failure_rate_limit(spec: "PipelineSpec") -> float:
    """The share of failed items above which a variant is not recommended."""
    rate = spec.eval.max_failure_rate
    return spec.quality.max_failure_rate if rate is None else rate


def _loc(loc: Iterable[Any]) -> str:
    return ".".join(str(p) for p in loc if not str(p).startswith("function-")) or "-"


def _eval_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
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
                problems.append(
                    (
                        f"eval.price_as.{index}",
                        f"{entry!r} has no entry in the price table; add it there (or to the "
                        "file LLM_ASSETS_PRICES names) or drop it",
                    )
                )
            seen.add(entry)
    return problems


def evaluation_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    """The `eval` rules, and each variant's problems as `variants.<name>.<field>`: what its
    merged spec fails that the baseline does not, or that it changes nothing."""
    problems = _eval_problems(spec)
    if not spec.variants:
        return problems
    known = set(semantic_problems(spec.model_copy(update={"variants": {}})))
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
            for field, reason in semantic_problems(merged)
            if (field, reason) not in known
        )
    return problems


register_check(evaluation_problems)
