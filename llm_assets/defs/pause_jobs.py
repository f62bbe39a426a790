"""The pause and resume jobs: `<pipeline>__pause` and `<pipeline>__resume`, launched from the
UI's Launchpad, do what `llm-assets pause` and `resume` do (see steps/pause.py)."""

from collections.abc import Mapping
from typing import Any

import dagster as dg

from llm_assets import names, steps
from llm_assets.defs.factory import started_by
from llm_assets.resources.ledger import LedgerResource
from llm_assets.spec.model import PipelineSpec


class PauseConfig(dg.Config):
    """Run config of a pause job."""

    reason: str = ""
    """Why: shown wherever the pause holds a submission back."""
    by: str = ""
    """Who pauses; by default the run's llm_assets/created_by tag, else the run."""


class ResumeConfig(dg.Config):
    """Run config of a resume job."""

    by: str = ""
    """Who resumes; by default the run's llm_assets/created_by tag, else the run."""


def build_pause_jobs(
    spec: PipelineSpec, resources: Mapping[str, Any] | None = None
) -> list[dg.JobDefinition]:
    """The pipeline's pause and resume jobs, each one op over the ledger; both are
    idempotent, so launching one twice changes nothing the second time. Given `resources`
    (the code location's), they bind the ledger alone, so their Launchpad offers only its
    configuration, not every provider's."""
    pipeline = spec.name
    bound = None if resources is None else {"ledger": resources["ledger"]}

    @dg.op(
        name=names.pause_op(pipeline),
        required_resource_keys={"ledger"},
        description=f"Pause {pipeline}: nothing new is submitted until it is resumed.",
    )
    def pause(context: dg.OpExecutionContext, config: PauseConfig) -> dg.Output[None]:
        ledger: LedgerResource = context.resources.ledger
        who = config.by or started_by(context)
        paused, made = ledger.pause_pipeline(pipeline, paused_by=who, reason=config.reason)
        context.log.info(steps.pause_words(paused, made))
        return dg.Output(
            None,
            metadata={
                "paused": True,
                "paused_by": paused.paused_by,
                "reason": paused.reason,
                "already_paused": not made,
            },
        )

    @dg.op(
        name=names.resume_op(pipeline),
        required_resource_keys={"ledger"},
        description=f"Resume {pipeline}: submissions go on.",
    )
    def resume(context: dg.OpExecutionContext, config: ResumeConfig) -> dg.Output[None]:
        ledger: LedgerResource = context.resources.ledger
        ended = ledger.resume_pipeline(pipeline, resumed_by=config.by or started_by(context))
        context.log.info(steps.resume_words(pipeline, ended))
        return dg.Output(None, metadata={"paused": False, "was_paused": ended is not None})

    @dg.job(
        name=names.pause_job(pipeline),
        description=f"Pause {pipeline}: no sensor, schedule, backfill or CLI run submits "
        "anything for it until it is resumed; batches in flight are still imported and their "
        "days finished. Run config: reason (and by).",
        resource_defs=bound,
    )
    def pause_job() -> None:
        pause()

    @dg.job(
        name=names.resume_job(pipeline),
        description=f"Resume {pipeline}: the sensors submit what waited while it was paused.",
        resource_defs=bound,
    )
    def resume_job() -> None:
        resume()

    return [pause_job, resume_job]
