"""The budget gates of a submission: the day's upper bound against its partition budget
(approvable, the approval remembered on the job), and the shards' upper bounds reserved
against the pipeline's daily and monthly caps; and the hold a refusing gate puts on the
day's waiting shards."""

from pydantic import BaseModel

from llm_assets.resources.ledger import JobRecord, ShardRecord, utcnow
from llm_assets.steps import day_model, lifecycle
from llm_assets.steps.context import GateBlocked, StepContext


class BudgetGate(BaseModel):
    """The partition budget gate: what the day has spent or may still spend, against the limit."""

    limit_usd: float | None
    committed_usd: float
    approved_usd: float | None = None
    approved_by: str | None = None
    passed: bool
    reason: str


def budget_gate(ctx: StepContext, *, approve: bool = False, approved_by: str = "") -> BudgetGate:
    """Compare the day's committed cost (billed plus the upper bound of unbilled shards) with
    `budget.max_usd_per_partition`. Approving records the amount approved on the job, so later
    runs of the same day (retries) pass until the bound grows past what was approved."""
    spec, ledger = ctx.spec, ctx.ledger
    job = ctx.job()
    limit = spec.budget.max_usd_per_partition
    committed = ledger.committed_cost(job.job_id)
    approved = job.budget_approved_usd
    gate = BudgetGate(
        limit_usd=limit,
        committed_usd=committed,
        approved_usd=approved,
        approved_by=job.budget_approved_by,
        passed=True,
        reason="",
    )
    if limit is None:
        return gate.model_copy(
            update={"reason": "no budget.max_usd_per_partition in the spec: the day has no limit"}
        )
    if not ledger.shards(job.job_id, list(day_model.WAITING)):
        return gate.model_copy(update={"reason": "nothing is waiting to be submitted"})
    if committed <= limit:
        return gate.model_copy(
            update={"reason": f"upper bound ${committed:.4f} within ${limit:.4f}"}
        )
    if approve:
        who = approved_by or "unknown"
        ledger.update_job(
            job.job_id,
            budget_approved_usd=committed,
            budget_approved_by=who,
            budget_approved_at=utcnow(),
        )
        return gate.model_copy(
            update={
                "approved_usd": committed,
                "approved_by": who,
                "reason": f"upper bound ${committed:.4f} over ${limit:.4f}, approved",
            }
        )
    if approved is not None and committed <= approved * (1 + 1e-9):
        return gate.model_copy(
            update={
                "reason": f"upper bound ${committed:.4f} over ${limit:.4f}, approved up to "
                f"${approved:.4f} by {job.budget_approved_by}"
            }
        )
    return gate.model_copy(update={"passed": False, "reason": _over_budget(ctx, gate)})


def _over_budget(ctx: StepContext, gate: BudgetGate) -> str:
    """Why the partition budget gate refuses, and how to approve the day."""
    approved = gate.approved_usd
    return (
        f"{ctx.spec.name} {ctx.day}: estimated upper bound ${gate.committed_usd:.4f} is over "
        f"budget.max_usd_per_partition ${gate.limit_usd:.4f}"
        + (f" and the ${approved:.4f} approved earlier" if approved is not None else "")
        + "; nothing was submitted. Approve with `llm-assets run ... --approve-budget`, the "
        "run tag llm_assets/approve_budget=true or the request_shards config "
        "approve_budget: true"
    )


def reserve_pipeline_budget(ctx: StepContext, job: JobRecord, to_submit: list[ShardRecord]) -> None:
    """Reserve the shards' upper bounds, all or none, against the daily and monthly caps."""
    budget = ctx.spec.budget
    if (budget.max_usd_per_day is None and budget.max_usd_per_month is None) or not to_submit:
        return
    refused = ctx.ledger.reserve_budget(
        pipeline=ctx.spec.governing_pipeline,
        job_id=job.job_id,
        shards={s.shard_id: s.estimated_cost_upper_usd for s in to_submit},
        max_per_day=budget.max_usd_per_day,
        max_per_month=budget.max_usd_per_month,
    )
    if refused is not None:
        raise GateBlocked(
            "pipeline_budget",
            f"{refused}; nothing was submitted. It can go once settled costs leave room "
            "(or raise budget.max_usd_per_day / max_usd_per_month)",
        )


def hold_for_gate(
    ctx: StepContext, refused: GateBlocked, waiting: list[ShardRecord] | None = None
) -> GateBlocked:
    """Mark the day's waiting shards (or `waiting`) as held by the gate that refused them, so
    that no path submits them again until an operator acts (an approval, a changed spec);
    the refusal is returned to be raised."""
    if waiting is None:
        waiting = ctx.ledger.shards(ctx.job_id, list(day_model.WAITING))
    for shard in waiting:
        ctx.ledger.update_shard(
            shard.shard_id,
            expect_status=list(day_model.WAITING),
            raw_status=lifecycle.GATED,
            message=str(refused)[:2000],
        )
    return refused
