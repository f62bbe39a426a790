"""Admitting a day's shards under the provider's quota for their model: the spec's declared
quota, what the ledger learned of the provider's (steps/quota.py, the rules), older days'
shards first; what a refusal, at a create or at a poll, teaches; and the wait of a shard
the quota has no room for."""

import datetime as dt

from llm_assets.resources.ledger import LedgerResource, QuotaKey, ShardRecord, utcnow
from llm_assets.resources.providers.base import WAITING_FOR_QUOTA, BatchProvider, BatchStatus
from llm_assets.resources.providers.retrying import QuotaRefused
from llm_assets.steps import day_model, quota
from llm_assets.steps.context import StepContext
from llm_assets.util.words import plural

OLDER_WAITER_SECONDS = 300.0
"""How recently a shard of an older day must have been looked at to go first."""


def quota_key(ctx: StepContext) -> QuotaKey:
    """The provider quota the day's batches count against."""
    provider = ctx.batch_provider
    return QuotaKey(
        provider=ctx.spec.model.provider,
        account=provider.quota_account(),
        model_name=ctx.spec.model.name,
        kind=provider.quota_kind,
    )


def quota_freed_at(ctx: StepContext, shards: list[ShardRecord]) -> dt.datetime | None:
    """When room last freed under the model's quota, if one of `shards` waits for it. Where
    the provider admits batches after creating them, a start frees room too: submission goes
    by what was seen started until the limit is known."""
    if not any(s.raw_status == WAITING_FOR_QUOTA and s.status in day_model.WAITING for s in shards):
        return None
    spec = ctx.spec
    starts = ctx.provider is not None and ctx.provider.refuses_after_create
    return ctx.ledger.model_freed_at(spec.model.provider, spec.model.name, starts=starts)


def room_for(ctx: StepContext, shard: ShardRecord, key: QuotaKey) -> tuple[int, int]:
    """The load in flight and the shard's amount, when the quota has room for it; raises
    QuotaRefused, saying why, when it has not."""
    spec = ctx.spec
    batches, tokens = ctx.ledger.in_flight_load(spec.model.provider, spec.model.name)
    keep_declared(ctx, shard, batches, tokens)
    record = ctx.ledger.quota_record(key)
    declared = (
        spec.quota.max_enqueued_tokens
        if key.kind == quota.TOKENS
        else spec.quota.max_active_batches
    )
    slow_start = ctx.batch_provider.refuses_after_create and declared is None
    if slow_start and record.learned_limit is None:
        # Until a refusal shows the limit, go by what was seen started.
        started = ctx.ledger.in_flight_load(spec.model.provider, spec.model.name, started_only=True)
        peak = max(record.admitted_peak, quota.amount_of(key.kind, *started))
        record = record.model_copy(update={"admitted_peak": peak})
    load = quota.amount_of(key.kind, batches, tokens)
    amount = quota.amount_of(key.kind, 1, shard.estimated_input_tokens)
    gate = quota.admission(
        record,
        load=load,
        amount=amount,
        model=spec.model.name,
        slow_start=slow_start,
        now=utcnow(),
        batches=batches,
    )
    if not gate.admit:
        raise QuotaRefused(gate.reason)
    after_older_days(ctx, load)
    return load, amount


def after_older_days(ctx: StepContext, load: int) -> None:
    """Raise QuotaRefused while shards of older days of the model wait for the same room
    (a backfill's runs take it oldest day first); a waiting shard nobody looked at for
    OLDER_WAITER_SECONDS belongs to no live run and holds nothing back."""
    if load == 0:
        return
    spec = ctx.spec
    live = max(OLDER_WAITER_SECONDS, 2 * ctx.batch_provider.quota_wait_seconds)
    older = ctx.ledger.older_waiting(
        spec.model.provider,
        spec.model.name,
        before=ctx.day,
        since=utcnow() - dt.timedelta(seconds=live),
    )
    if older:
        raise QuotaRefused(
            f"waiting for quota: {plural(older, 'shard')} of older days of "
            f"{spec.model.name} wait for the same room and go first"
        )


def learn_refusal(
    ctx: StepContext, key: QuotaKey, load: int, amount: int, refused: QuotaRefused
) -> QuotaRefused:
    """Teach the ledger what a provider's refusal says; the refusal in the learner's
    words, for the shard's wait."""
    stated = quota.stated_limit(str(refused))
    learned = ctx.ledger.learn_quota(
        key,
        lambda r: quota.after_refusal(r, load=load, amount=amount, stated=stated, now=utcnow()),
    )
    spec = ctx.spec
    return QuotaRefused(
        f"{quota.words(learned, load, spec.model.name)}; {spec.model.provider} refused a "
        f"batch: {refused}",
        refused.retry_after_seconds,
    )


def keep_declared(ctx: StepContext, shard: ShardRecord, batches: int, tokens: int) -> None:
    """Raise QuotaRefused when submitting the shard would go past the spec's declared
    quota for its provider and model, counting every pipeline's batches in flight."""
    declared, spec = ctx.spec.quota, ctx.spec
    model = f"{spec.model.provider}/{spec.model.name}"
    if declared.max_active_batches is not None and batches >= declared.max_active_batches:
        raise QuotaRefused(
            f"waiting for quota: {batches} of {declared.max_active_batches} batches of "
            f"{spec.model.name} in flight (quota.max_active_batches in the spec)"
        )
    limit = declared.max_enqueued_tokens
    if limit is None or tokens + shard.estimated_input_tokens <= limit:
        return
    if batches == 0:
        raise ValueError(
            f"shard {shard.shard_id} alone holds about {shard.estimated_input_tokens:,} "
            f"prompt tokens, over quota.max_enqueued_tokens {limit:,} for {model}: it "
            "could never be admitted; lower sharding.max_requests_per_shard"
        )
    raise QuotaRefused(
        f"waiting for quota: {quota.short(tokens)} of {quota.short(limit)} enqueued tokens "
        f"of {spec.model.name} in flight and {shard.estimated_input_tokens:,} in this "
        "shard (quota.max_enqueued_tokens in the spec)"
    )


def wait_for_quota(ctx: StepContext, shard: ShardRecord, refused: QuotaRefused) -> None:
    """Leave a shard waiting, not sent, until the provider's quota has room: its items
    spend no attempt. It is sent again as soon as a batch of its model ends (whoever
    sees the end), or else after the provider's hint or `quota_wait_seconds`."""
    provider = ctx.batch_provider
    hint = refused.retry_after_seconds
    wait = provider.quota_wait_seconds if hint is None else min(hint, 3600.0)
    ctx.ledger.update_shard(
        shard.shard_id,
        expect_status=list(day_model.WAITING),
        raw_status=WAITING_FOR_QUOTA,
        message=str(refused)[:2000],
        not_before=utcnow() + dt.timedelta(seconds=wait),
    )


def learn_from_poll(
    ledger: LedgerResource,
    provider: BatchProvider,
    shard: ShardRecord,
    *,
    refused: bool,
    status: BatchStatus,
) -> None:
    """A provider that refuses batches after creating them (OpenAI) tells at a poll whether
    one was admitted under its quota: what the quota's learner hears (steps/quota.py)."""
    job = ledger.get_job(shard.job_id)
    if job is None:
        return
    key = QuotaKey(
        provider=shard.provider,
        account=provider.quota_account(),
        model_name=job.model_name,
        kind=provider.quota_kind,
    )
    load = quota.amount_of(
        key.kind, *ledger.in_flight_load(shard.provider, job.model_name, started_only=True)
    )
    amount = quota.amount_of(key.kind, 1, shard.estimated_input_tokens)
    now = utcnow()
    if refused:
        stated = quota.stated_limit(status.message or "")
        ledger.learn_quota(
            key,
            lambda r: quota.after_refusal(r, load=load, amount=amount, stated=stated, now=now),
        )
    else:
        ledger.learn_quota(key, lambda r: quota.after_admission(r, load=load, now=now))
