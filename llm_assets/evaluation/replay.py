"""Evaluation replay: a seeded sample of a pipeline's past days, run through each variant.

The sample is drawn once from the days' current input snapshots of the pipeline and written
as one JSONL file; every variant reads that same file, so every variant answers the same
items. Each variant runs as its own eval pipeline (`eval_pipeline_spec`): its own jobs in the
ledger, which keep every answer with its prompt and model version, through the normal steps
(snapshot, shards, submission with its gates, import with retries, the quality gate), driven
by the day's lifecycle (steps.drive) with the steps run in this process. Nothing of an eval
is published: the publishing, QA and notification steps are not run, and the eval pipeline
is in no Dagster definitions; the evaluated pipeline's batch-status sensor only polls and
cancels its batches. An eval runs under the evaluated pipeline: its caps, its month, its
pause and cancel (`PipelineSpec.parent`).

Running a replay again sends nothing: the eval pipelines' jobs already hold the items.
"""

import datetime as dt
import hashlib
import re
from collections import Counter
from collections.abc import Mapping

from pydantic import BaseModel

from llm_assets import steps
from llm_assets.evaluation.sample import Sample, draw_sample
from llm_assets.resources.ledger import DEAD_LETTER, SUCCEEDED, LedgerResource
from llm_assets.resources.providers import provider_resource_key
from llm_assets.resources.providers.base import BatchProvider
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PIPELINE_NAME, AutomationSpec, NotifySpec, PipelineSpec
from llm_assets.steps.in_process import InProcessRuns
from llm_assets.util.progress import ProgressFn

EVAL_SEPARATOR = "__"
"""Between the pipeline's name, the variant's and the configuration digest in an eval
pipeline's name; real pipelines' Dagster jobs use it the same way (`<pipeline>__cancel`)."""


class DayRun(BaseModel):
    """One day of one variant: the sample's items in the variant's job for that day."""

    day: dt.date
    job_id: str | None
    items: int = 0
    succeeded: int = 0
    dead_letters_by_class: dict[str, int] = {}
    open_items: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    first_submitted_at: dt.datetime | None = None
    last_result_at: dt.datetime | None = None
    custom_ids: list[str] = []

    @property
    def dead_letters(self) -> int:
        return sum(self.dead_letters_by_class.values())


class VariantRun(BaseModel):
    """What one variant did with the sample, summed over the days."""

    variant: str
    pipeline: str
    """The eval pipeline the variant ran as (its jobs' pipeline in the ledger)."""
    provider: str
    model: str
    prompt_version: str
    code_version: str
    days: list[DayRun]

    def _sum(self, field: str) -> int:
        return sum(getattr(d, field) for d in self.days)

    @property
    def items(self) -> int:
        return self._sum("items")

    @property
    def succeeded(self) -> int:
        return self._sum("succeeded")

    @property
    def open_items(self) -> int:
        return self._sum("open_items")

    @property
    def input_tokens(self) -> int:
        return self._sum("input_tokens")

    @property
    def output_tokens(self) -> int:
        return self._sum("output_tokens")

    @property
    def cost_usd(self) -> float:
        return sum(d.cost_usd for d in self.days)

    @property
    def dead_letters_by_class(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for day in self.days:
            total.update(day.dead_letters_by_class)
        return dict(sorted(total.items()))

    @property
    def quality_failure_rate(self) -> float:
        """Quality dead letters among the items that got an answer to judge (the quality
        gate's own measure: quality_failure_rate)."""
        quality = self.dead_letters_by_class.get("quality", 0)
        judged = self.succeeded + quality
        return quality / judged if judged else 0.0

    @property
    def cost_per_1000_items(self) -> float:
        return self.cost_usd / self.items * 1000 if self.items else 0.0

    @property
    def seconds_to_last_result(self) -> float | None:
        """From the variant's first submission to its last result, over all days."""
        starts = [d.first_submitted_at for d in self.days if d.first_submitted_at]
        ends = [d.last_result_at for d in self.days if d.last_result_at]
        if not starts or not ends:
            return None
        return (max(ends) - min(starts)).total_seconds()


class Replay(BaseModel):
    sample: Sample
    variants: dict[str, VariantRun]
    specs: dict[str, PipelineSpec] = {}
    """Each variant's spec as given, the baseline's included (each ran as its eval pipeline,
    see `eval_pipeline_spec`)."""


_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_]+")


def eval_pipeline_spec(
    base_name: str, variant_name: str, variant_spec: PipelineSpec
) -> PipelineSpec:
    """The variant's spec as the eval pipeline it runs as.

    Named `<pipeline>__<variant>__<digest>`, at most 63 characters, where the digest covers
    the pipeline, the variant and the variant's prompt code version (prompt, model with its
    options, output schema, fields): a variant whose configuration changes runs as a new
    pipeline with new jobs, never reusing the answers of the old configuration (the ledger's
    job key holds the prompt version and model, not the options). The eval reads its sample
    as JSONL; nothing schedules it and it notifies no one. Its partition budget, retries,
    quotas and compliance are the variant's; the pipeline's daily and monthly caps, spend
    breaker month, pause and cancel are `base_name`'s (its `parent`).
    """
    digest = hashlib.sha256(
        "\x1f".join((base_name, variant_name, variant_spec.prompt_code_version)).encode()
    ).hexdigest()[:8]
    variant = _UNSAFE_NAME.sub("_", variant_name).strip("_")[:20] or "variant"
    suffix = f"{EVAL_SEPARATOR}{variant}{EVAL_SEPARATOR}{digest}"
    name = base_name[: 63 - len(suffix)] + suffix
    assert PIPELINE_NAME.match(name), name
    return variant_spec.model_copy(
        update={
            "name": name,
            "description": f"{base_name} evaluation of variant {variant_name}",
            "source": variant_spec.source.model_copy(update={"kind": "jsonl"}),
            "automation": AutomationSpec(
                new_data_sensor=False,
                schedule=None,
                notify=NotifySpec(max_dead_letter_rate=None, max_cost_usd=None),
            ),
            "path": None,
            "parent": base_name,
        }
    )


def _drive(
    days: list[steps.DayDriver],
    *,
    wait: bool,
    max_rounds: int,
    progress: ProgressFn | None,
) -> None:
    """Drive every day of every variant together (steps.drive): the eval takes as long as
    its slowest batch. A pause or a gate that stops a day stops the eval (GateBlocked)."""

    def show(_day: steps.DayDriver, _decision: steps.Decision) -> None:
        if progress is not None:
            done = sum(1 for d in days if d.last is not None and d.last.done)
            progress("eval", done, len(days))

    last = steps.drive(days, wait=wait, progress=show, max_imports=max_rounds)
    for index, decision in last.items():
        if decision.blocked is not None and not decision.done:
            raise steps.GateBlocked(decision.gate or "paused", decision.blocked)
        ctx = days[index].ctx
        if wait and not decision.done:
            raise RuntimeError(f"{ctx.spec.name} {ctx.day}: the eval stopped before it finished")


def _day_run(drive: steps.DayDriver, custom_ids: list[str]) -> DayRun:
    """The day's counts over the sample's items only: a job may hold items of other samples."""
    ledger, job_id = drive.ledger, drive.ctx.job_id
    if ledger.get_job(job_id) is None:
        return DayRun(day=drive.ctx.day, job_id=None, custom_ids=custom_ids)
    wanted = set(custom_ids)
    statuses: Counter[str] = Counter()
    classes: Counter[str] = Counter()
    tokens_in = tokens_out = 0
    cost = 0.0
    columns = ["custom_id", "status", "error_class", "input_tokens", "output_tokens"]
    columns += ["cost_usd", "prior_cost_usd"]
    for item in ledger.iter_items(job_id, None, columns=columns):
        if item["custom_id"] not in wanted:
            continue
        statuses[item["status"]] += 1
        if item["status"] == DEAD_LETTER:
            classes[item["error_class"] or "unknown"] += 1
        tokens_in += item["input_tokens"] or 0
        tokens_out += item["output_tokens"] or 0
        cost += (item["cost_usd"] or 0.0) + (item["prior_cost_usd"] or 0.0)
    shards = ledger.shards(job_id)
    starts = [s.submitted_at for s in shards if s.submitted_at is not None]
    ends = [s.ended_at for s in shards if s.ended_at is not None]
    items = sum(statuses.values())
    return DayRun(
        day=drive.ctx.day,
        job_id=job_id,
        items=items,
        succeeded=statuses[SUCCEEDED],
        dead_letters_by_class=dict(sorted(classes.items())),
        open_items=items - statuses[SUCCEEDED] - statuses[DEAD_LETTER],
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        cost_usd=cost,
        first_submitted_at=min(starts, default=None),
        last_result_at=max(ends, default=None),
        custom_ids=custom_ids,
    )


def _drives(
    resources: Mapping[str, object],
    eval_spec: PipelineSpec,
    sample: Sample,
    *,
    created_by: str,
    approve_budget: bool,
    poll_interval: float,
) -> list[steps.DayDriver]:
    ledger, storage = resources["ledger"], resources["storage"]
    provider = resources[provider_resource_key(eval_spec.model.provider)]
    assert isinstance(ledger, LedgerResource) and isinstance(storage, ArtifactStorage)
    assert isinstance(provider, BatchProvider)
    runs = InProcessRuns(sample.uri, approve_budget)
    return [
        steps.DayDriver(
            steps.StepContext(eval_spec, day, ledger, storage, provider, created_by=created_by),
            runs=runs,
            poll_every=poll_interval,
        )
        for day in sample.days
    ]


def _sample_ids(drive: steps.DayDriver, source_ids: list[str]) -> list[str]:
    """The sampled items' custom_ids in the variant's job of the day, in the sample's order,
    as the ledger gave them; "" for an item the job does not hold (yet)."""
    given = drive.ledger.custom_ids_by_source(drive.ctx.job_id, source_ids)
    return [given.get(source_id, "") for source_id in source_ids]


def _variant_run(
    variant: str, eval_spec: PipelineSpec, drives: list[steps.DayDriver], sample: Sample
) -> VariantRun:
    custom_ids = {d.ctx.day: _sample_ids(d, sample.source_ids[d.ctx.day]) for d in drives}
    return VariantRun(
        variant=variant,
        pipeline=eval_spec.name,
        provider=eval_spec.model.provider,
        model=eval_spec.model.name,
        prompt_version=eval_spec.prompt.version,
        code_version=eval_spec.prompt_code_version,
        days=[_day_run(d, custom_ids[d.ctx.day]) for d in drives],
    )


def run_variants(
    resources: Mapping[str, object],
    eval_specs: Mapping[str, PipelineSpec],
    sample: Sample,
    *,
    created_by: str,
    approve_budget: bool = False,
    wait: bool = True,
    progress: ProgressFn | None = None,
    poll_interval: float = 30.0,
    max_rounds: int = 50,
) -> dict[str, VariantRun]:
    """Run the sample through each eval pipeline: every day of every variant is submitted
    first, then all are waited on together, so the eval takes as long as its slowest batch
    rather than the sum of them. Without `wait`, what has ended is imported once and the
    rest is left open: running it again carries on, sending nothing twice."""
    drives = {
        variant: _drives(
            resources,
            spec,
            sample,
            created_by=created_by,
            approve_budget=approve_budget,
            poll_interval=poll_interval,
        )
        for variant, spec in eval_specs.items()
    }
    every = [d for day_drives in drives.values() for d in day_drives]
    for drive in every:
        if drive.state().paused is None:
            drive.carry_out(steps.Action(steps.Step.BUILD))
    _drive(every, wait=wait, max_rounds=max_rounds, progress=progress)
    return {
        variant: _variant_run(variant, eval_specs[variant], day_drives, sample)
        for variant, day_drives in drives.items()
    }


def run_variant(
    resources: Mapping[str, object],
    eval_spec: PipelineSpec,
    sample: Sample,
    *,
    variant: str,
    created_by: str,
    approve_budget: bool = False,
    progress: ProgressFn | None = None,
    poll_interval: float = 30.0,
    max_rounds: int = 50,
) -> VariantRun:
    """Run the sample through one eval pipeline (see `eval_pipeline_spec`), day by day through
    the normal steps, until every sampled item has a terminal result and the quality gate
    has judged the answers. Gates raise steps.GateBlocked as they do for a run."""
    return run_variants(
        resources,
        {variant: eval_spec},
        sample,
        created_by=created_by,
        approve_budget=approve_budget,
        progress=progress,
        poll_interval=poll_interval,
        max_rounds=max_rounds,
    )[variant]


def replay(
    resources: Mapping[str, object],
    spec: PipelineSpec,
    variants: Mapping[str, PipelineSpec],
    days: list[dt.date],
    *,
    size: int,
    seed: int,
    created_by: str,
    approve_budget: bool = False,
    wait: bool = True,
    progress: ProgressFn | None = None,
    poll_interval: float = 30.0,
) -> Replay:
    """Draw the sample from the pipeline's snapshots once, then run it through every variant
    (the baseline is the variant named "baseline"). A paused pipeline is not evaluated: its
    evals spend on its behalf. Idempotent: running it again sends nothing."""
    ledger, storage = resources["ledger"], resources["storage"]
    assert isinstance(ledger, LedgerResource) and isinstance(storage, ArtifactStorage)
    paused = steps.pause_reason(ledger, spec.name)
    if paused:
        raise steps.GateBlocked("paused", paused)
    sample = draw_sample(spec, days, storage, size=size, seed=seed)
    eval_specs = {
        name: eval_pipeline_spec(spec.name, name, variant) for name, variant in variants.items()
    }
    runs = run_variants(
        resources,
        eval_specs,
        sample,
        created_by=created_by,
        approve_budget=approve_budget,
        wait=wait,
        progress=progress,
        poll_interval=poll_interval,
    )
    return Replay(sample=sample, variants=runs, specs=dict(variants))
