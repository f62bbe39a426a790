"""Spec files parsed and checked: `check_specs` reports every problem it can find (file,
field, reason) instead of stopping at the first, so `llm-assets validate-spec` can be fixed in
one pass.

`SPEC_CHECKS` is the one list of checks a parsed spec must pass beyond its fields' own
validators: the spec's own rules (spec/checks.py), the personal-data policy's fixed texts and
residency (compliance/), the providers' (which exist, what each can serve, which models are
priced) and the evaluation's (each variant's merged spec passes the same checks).
"""

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from llm_assets.compliance.policy import fixed_text_problems
from llm_assets.compliance.residency import residency_problems
from llm_assets.evaluation.checks import evaluation_problems
from llm_assets.resources.providers.registry import provider_spec_problems
from llm_assets.spec import checks
from llm_assets.spec.checks import SpecCheck
from llm_assets.spec.model import PipelineSpec

SPEC_CHECKS: tuple[SpecCheck, ...] = (
    checks.placeholder_problems,
    checks.required_field_problems,
    checks.webhook_problems,
    fixed_text_problems,
    residency_problems,
    provider_spec_problems,
    checks.pandera_model_problems,
    checks.schedule_problems,
    checks.timezone_problems,
)
"""Every check of a parsed spec but the evaluation's, which runs these on each variant."""


def checked_problems(spec: PipelineSpec) -> list[tuple[str, str]]:
    """What `SPEC_CHECKS` find in one spec, as (field, reason)."""
    return [problem for check in SPEC_CHECKS for problem in check(spec)]


def spec_problems(spec: PipelineSpec) -> list[tuple[str, str]]:
    """Every problem of a parsed spec that no single field's validator can see, as (field,
    reason): the checks above, then each variant's."""
    return checked_problems(spec) + evaluation_problems(spec, checked_problems)


class SpecProblem(BaseModel):
    file: str
    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.reason}"


class SpecError(Exception):
    """One or more specs are invalid; `problems` lists every one of them."""

    def __init__(self, problems: list[SpecProblem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def spec_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.exists():
        raise SpecError([SpecProblem(file=str(path), field="-", reason="no such file or folder")])
    return sorted([*path.glob("*.yaml"), *path.glob("*.yml")])


def _loc(loc: Iterable[Any]) -> str:
    parts = [str(p) for p in loc if not str(p).startswith("function-")]
    return ".".join(parts) or "-"


def parse_spec(path: Path) -> tuple[PipelineSpec | None, list[SpecProblem]]:
    """Parse one file; return the spec (if it parsed) and every problem found."""
    file = str(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return None, [SpecProblem(file=file, field="-", reason=f"not readable YAML: {exc}")]
    if not isinstance(raw, dict):
        return None, [SpecProblem(file=file, field="-", reason="expected a mapping at top level")]
    for derived in ("path", "parent"):
        if derived in raw:
            return None, [
                SpecProblem(file=file, field=derived, reason="Extra inputs are not permitted")
            ]
    try:
        spec = PipelineSpec.model_validate({**raw, "path": path})
    except ValidationError as exc:
        return None, [
            SpecProblem(file=file, field=_loc(err["loc"]), reason=err["msg"])
            for err in exc.errors()
        ]
    return spec, [
        SpecProblem(file=file, field=field, reason=reason) for field, reason in spec_problems(spec)
    ]


def check_specs(path: Path) -> tuple[list[PipelineSpec], list[SpecProblem]]:
    """Parse every spec under `path`; problems include duplicate pipeline names."""
    specs: list[PipelineSpec] = []
    problems: list[SpecProblem] = []
    seen: dict[str, Path] = {}
    files = spec_files(path)
    if not files:
        problems.append(
            SpecProblem(file=str(path), field="-", reason="no pipeline specs (*.yaml, *.yml) here")
        )
    for file in files:
        spec, found = parse_spec(file)
        problems.extend(found)
        if spec is None:
            continue
        if spec.name in seen:
            problems.append(
                SpecProblem(
                    file=str(file),
                    field="name",
                    reason=f"pipeline name {spec.name!r} is already used by {seen[spec.name]}",
                )
            )
            continue
        seen[spec.name] = file
        specs.append(spec)
    return specs, problems


def load_specs(path: Path) -> list[PipelineSpec]:
    """All specs under `path`, or SpecError listing every problem."""
    specs, problems = check_specs(path)
    if problems:
        raise SpecError(problems)
    return specs
