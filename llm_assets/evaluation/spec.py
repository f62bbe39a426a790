"""The evaluation sections of a pipeline spec: `variants`, named alternatives to the pipeline's
own model and prompt, and `eval`, how a replay scores them.

The pipeline's own configuration is the baseline; variants change nothing it runs (its prompt
code version included). A variant is a JSON merge patch (RFC 7396) over the baseline's `model`
and `prompt`: a value replaces the baseline's, a mapping merges into it key by key
(`model.options` too), and `null` removes a key so its default applies. `variant_spec`
(variants.py) gives the merged pipeline spec, validated like any spec.

The merged spec and the scored field are in variants.py; the checks of these sections
(`evaluation_problems`) in checks.py.
"""

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

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
    cache: dict[str, Any] | None = Field(
        default=None,
        description="Merged into the baseline's prompt cache key by key; null: no cache.",
    )


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
