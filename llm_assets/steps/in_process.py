"""Running a day's heavy steps in this process, through the step functions: how an eval
replay carries out the lifecycle's actions (steps/lifecycle.py) for its variants' days, with
the sample as their source."""

import contextlib
import dataclasses

from llm_assets.steps.build import build_shards
from llm_assets.steps.context import StepContext
from llm_assets.steps.day_model import Action, Step
from llm_assets.steps.executor import DayDriver
from llm_assets.steps.imports import import_results
from llm_assets.steps.pause import PipelinePaused
from llm_assets.steps.reports import cost_report, export_dead_letters
from llm_assets.steps.snapshot import take_snapshot
from llm_assets.steps.submit import submit_shards
from llm_assets.steps.validate import validate_outputs


@dataclasses.dataclass(frozen=True)
class InProcessRuns:
    """Each heavy action as the step it names: BUILD snapshots `source_uri` and builds and
    submits the day's shards, SUBMIT submits (approving the budget when `approve_budget`),
    IMPORT imports, VALIDATE validates, REPORT writes the dead letters and the cost report.
    A pause a submission meets holds its shards back; the lifecycle then reports the day
    blocked."""

    source_uri: str
    approve_budget: bool = False

    def run(self, day: DayDriver, action: Action) -> None:
        ctx = day.ctx
        if action.step == Step.BUILD:
            if take_snapshot(ctx, self.source_uri).empty:
                return
            build_shards(ctx)
            self.submit(ctx)
        elif action.step == Step.SUBMIT:
            self.submit(ctx)
        elif action.step == Step.IMPORT:
            import_results(ctx)
        elif action.step == Step.VALIDATE:
            validate_outputs(ctx)
        elif action.step == Step.REPORT:
            export_dead_letters(ctx)
            cost_report(ctx)

    def submit(self, ctx: StepContext) -> None:
        with contextlib.suppress(PipelinePaused):
            submit_shards(ctx, approve_budget=self.approve_budget, approved_by=ctx.created_by)
