"""The variant specs an evaluation runs, by name: the one place that turns names into specs.

"baseline" is the pipeline's own spec and is always run first: the other variants are judged
against it. A name the pipeline does not define is an error that lists the names it does.
"""

from llm_assets.evaluation.spec import variant_spec
from llm_assets.spec import PipelineSpec

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
