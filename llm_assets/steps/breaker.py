"""The spend circuit breaker: a day whose spend, as it accrues, heads past its caps is
cancelled while its batches run, not reported over budget after.

After each import the day's expected cost is what it was billed plus, for every item still
open, the larger of the estimate per item and the cost per item billed so far: answers five
times longer than estimated show in the first shards imported, and the rest of the day is
priced at what they cost. Past the day's cap × `budget.breaker_factor`, or the month's spend
plus that past `budget.max_usd_per_month × breaker_factor`, the day is cancelled
(steps.cancel) and an ALERT summary is announced. The day's cap is
`budget.max_usd_per_partition`, or what an operator approved for the day when that is more.
An eval's days count in the month of the pipeline they evaluate.
"""

import datetime as dt

from llm_assets.resources.ledger import JobCounts, JobRecord, ShardRecord
from llm_assets.steps import notify
from llm_assets.steps.cancel import cancel_day
from llm_assets.steps.context import StepContext


def expected_cost(shards: list[ShardRecord], counts: JobCounts) -> float:
    """What the day will have cost once its open items are answered, at the worse of the
    shards' estimate per item and what its billed items cost."""
    items = sum(s.item_count for s in shards)
    estimate = sum(s.estimated_cost_usd for s in shards) / items if items else 0.0
    billed_items = counts.succeeded
    observed = counts.cost_usd / billed_items if billed_items else 0.0
    return counts.cost_usd + counts.open * max(estimate, observed)


def breaker_reason(ctx: StepContext, job: JobRecord, counts: JobCounts) -> str | None:
    """Why the day's spend trips the breaker, or None."""
    budget = ctx.spec.budget
    factor = budget.breaker_factor
    if job.cancelled_at is not None or counts.open == 0:
        return None
    expected = expected_cost(ctx.ledger.shards(job.job_id), counts)
    cap, cap_name = budget.max_usd_per_partition, "budget.max_usd_per_partition"
    approved = job.budget_approved_usd
    if cap is not None and approved is not None and approved > cap:
        cap, cap_name = approved, f"the day's approval by {job.budget_approved_by}"
    if cap is not None and expected > cap * factor:
        return (
            f"spend breaker: the day is heading for ${expected:.4f} (${counts.cost_usd:.4f} "
            f"billed, {counts.open:,} items still open at the cost per item billed so far), "
            f"over {cap_name} ${cap:.4f} × breaker_factor {factor}"
        )
    month_cap = budget.max_usd_per_month
    if month_cap is not None:
        first = dt.datetime.now(dt.UTC).date().replace(day=1)
        # The month's spend counts this day at its reservations; count it as expected instead.
        others = ctx.ledger.spent_since(
            ctx.spec.governing_pipeline, first
        ) - ctx.ledger.committed_cost(job.job_id)
        month = others + expected
        if month > month_cap * factor:
            return (
                f"spend breaker: the month is heading for ${month:.4f} with this day, over "
                f"budget.max_usd_per_month ${month_cap:.4f} × breaker_factor {factor}"
            )
    return None


def trip_if_over(ctx: StepContext, counts: JobCounts) -> str | None:
    """Cancel the day and announce an ALERT when its spend trips the breaker; returns why."""
    budget = ctx.spec.budget
    if budget.max_usd_per_partition is None and budget.max_usd_per_month is None:
        return None  # no cap: nothing to read
    job = ctx.job()
    reason = breaker_reason(ctx, job, counts)
    if reason is None:
        return None
    cancel_day(ctx, reason=reason)
    summary = notify.summarize(ctx.spec, ctx.day, ctx.ledger, outcome="in progress")
    summary = summary.model_copy(update={"alerts": [*summary.alerts, reason], "reason": reason})
    notify.announce(ctx.spec, summary, ctx.ledger)
    if ctx.log is not None:
        ctx.log(f"{ctx.spec.name} {ctx.day}: {reason}; the day is cancelled")
    return reason
