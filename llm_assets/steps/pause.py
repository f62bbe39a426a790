"""Pausing a pipeline: an operator's choice that nothing new is submitted for it.

The pause is a row of the ledger (`llm_batch_pipeline_state`), set by `llm-assets pause` or
the `<pipeline>__pause` job and cleared by `llm-assets resume` or `<pipeline>__resume`; it
holds the pipeline's evals too (`PipelineSpec.governing_pipeline`), and the online worker
stops at it between requests (steps/online.py).
provider_batches refuses while it is set, before its budget gates and again before each
shard: every submission (sensors, schedule, backfills, the CLI, the UI) goes through that
step, so its refusal is the guarantee. The sensors, the schedule and `llm-assets run` ask
first, so that they do not even start a submission run. Batches already in flight are still
polled and imported, and their days validated, published and reported.

A shard the refusal held back says so (provider status `paused`); once the pipeline is
resumed the batch-status sensor requests the submission of a day's held first-round shards,
so a submit run that met the pause (a backfill, a run requested just before it) loses no day.
"""

import datetime as dt
from collections.abc import Sequence

from llm_assets import names
from llm_assets.resources.ledger import LedgerResource, PipelinePause, ShardRecord
from llm_assets.resources.providers.base import ShardState
from llm_assets.steps.context import StepContext
from llm_assets.steps.lifecycle import PAUSED
from llm_assets.util.words import plural


def _paused_by(pause: PipelinePause) -> str:
    """ "paused by cli:ana at 2026-11-02 14:03:27 UTC"."""
    when = pause.paused_at.astimezone(dt.UTC)
    return f"paused by {pause.paused_by} at {when:%Y-%m-%d %H:%M:%S} UTC"


def paused_text(pause: PipelinePause) -> str:
    """ "paused by cli:ana at 2026-11-02 14:03:27 UTC: provider incident; resume with ..."."""
    why = f": {pause.reason}" if pause.reason else " (no reason given)"
    return (
        f"{_paused_by(pause)}{why}; resume with "
        f"`llm-assets resume {pause.pipeline}` or the {names.resume_job(pause.pipeline)} job"
    )


class PipelinePaused(Exception):
    """provider_batches refused to submit: the pipeline is paused. Not an error: the step is
    skipped with this message, which says by whom, when, why and how to resume."""

    def __init__(self, pause: PipelinePause, submitted: int = 0) -> None:
        self.pause = pause
        note = f" ({plural(submitted, 'shard')} submitted before the pause)" if submitted else ""
        super().__init__(paused_text(pause) + note)


def pause_reason(ledger: LedgerResource, pipeline: str) -> str | None:
    """Why nothing new is submitted for the pipeline (paused_text), None when it is not paused."""
    pause = ledger.pipeline_pause(pipeline)
    return paused_text(pause) if pause is not None else None


def refuse_if_paused(ctx: StepContext, waiting: Sequence[ShardRecord], submitted: int = 0) -> None:
    """Raise PipelinePaused while the step's pipeline is paused, the `waiting` shards marked
    as held back by it (a shard waiting for quota keeps that word); `submitted` shards of this
    run went out before the pause came."""
    pause = ctx.ledger.pipeline_pause(ctx.spec.governing_pipeline)
    if pause is None:
        return
    for shard in waiting:
        if shard.raw_status is None:
            ctx.ledger.update_shard(
                shard.shard_id,
                expect_status=[ShardState.CREATED, ShardState.UPLOADED],
                raw_status=PAUSED,
                message=f"held back: {paused_text(pause)}"[:2000],
            )
    raise PipelinePaused(pause, submitted)


def pause_words(pause: PipelinePause, made: bool) -> str:
    """What pausing did: the pause now in force, or the one that was already."""
    if not made:
        return f"{pause.pipeline} was already {paused_text(pause)}"
    return (
        f"{pause.pipeline} is {paused_text(pause)}. Nothing new is submitted for it (sensors, "
        "schedule, backfills, `llm-assets run`); batches in flight are still imported and "
        "their days finished."
    )


def resume_words(pipeline: str, ended: PipelinePause | None) -> str:
    """What resuming did: the pause it ended, or that there was none."""
    if ended is None:
        return f"{pipeline} is not paused; nothing changed"
    why = f": {ended.reason}" if ended.reason else ""
    return (
        f"{pipeline} is resumed ({_paused_by(ended)}{why}). The sensors submit what waited: "
        "new files, retry shards and the shards of runs the pause held back."
    )
