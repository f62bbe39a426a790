"""request_shards: the day's snapshot rows into shards, in one step or in slices.

In slices: the snapshot's rows split into `sharding.slices` parts, each built by a step of
its own on any worker, joined before submission.

A row falls into a slice by its slice key (items.snapshot_rows.slice_key: its source id's,
so every row of an id is in the same slice and the first of them is kept, the others
repeats, as in a build in one step). A slice reads the snapshot's lines but parses and
renders only its own rows, numbered by their place in the whole snapshot, so its items get
the custom_ids a build in one step gives them. It records its shards, items and dead letters
as that build does, under a lock of its own: the slices of a day are built at once, each by
one run at a time (a second run waits, then finds its rows known). Its shards are recorded
held (raw status `unjoined`): nothing submits them until the join has run.

The join holds the day: it releases the slices' shards and sums their results, and the
budget and personal-data gates follow it. A build that stopped before its join leaves its
shards held; the lifecycle builds the day again after `lifecycle.SLICE_JOIN_GRACE`, and that
build's join (or a build in one step) releases them.
"""

import json
from collections import defaultdict

from llm_assets.resources.ledger import JobRecord
from llm_assets.steps import day_model, lifecycle
from llm_assets.steps.context import MissingPrerequisite, StepContext, artifact_key
from llm_assets.steps.estimate import Estimate
from llm_assets.steps.residency import refuse_outside_regions
from llm_assets.steps.shards import BuildPart, ShardsResult, build_rows
from llm_assets.steps.snapshot import slice_keys
from llm_assets.util import parallel
from llm_assets.util.failpoints import failpoint

UNJOINED = lifecycle.UNJOINED


def build_shards(ctx: StepContext) -> ShardsResult:
    """Turn snapshot rows the ledger has not seen into request shards and input dead letters.

    Holds the day: a second run waits, then finds the snapshot rows known and adds nothing.
    Nothing is written while a place the day would go or rest is outside
    compliance.allowed_regions (the residency gate). A spec with `sharding.slices` above 1
    builds its slices one after another here (each with the step's worker processes), then
    joins them (below); Dagster runs them as steps of their own.
    """
    if ctx.spec.sharding.slices > 1:
        for number in range(ctx.spec.sharding.slices):
            build_slice(ctx, number, workers=parallel.worker_count())
        return join_slices(ctx)
    refuse_outside_regions(ctx)
    with ctx.day_lock():
        return _build_shards(ctx)


def _build_shards(ctx: StepContext) -> ShardsResult:
    ledger = ctx.ledger
    snapshot_uri = ctx.snapshot_uri()
    job = ctx.job_or_create()
    result, found = build_rows(ctx, job, snapshot_uri, BuildPart())
    if result.shards_created:
        ledger.analyze()
    # Shards a sliced build of the day left held (its spec had more slices then).
    release_slices(ctx, job)
    personal = dict(job.personal_data)
    for key, count in found.items():
        personal[key] = personal.get(key, 0) + count
    ledger.update_job(
        job.job_id,
        snapshot_uri=snapshot_uri,
        personal_data_json=json.dumps(dict(sorted(personal.items()))) if personal else None,
    )
    ledger.refresh_job(job.job_id)
    return result


def slice_name(number: int, count: int) -> str:
    """How logs, locks and results name slice `number` (from 0): "2/8" for the second of 8."""
    return f"{number + 1}/{count}"


def _result_key(ctx: StepContext, job: JobRecord, snapshot_uri: str, number: int) -> str:
    """Where a slice's result is kept for the join: by the snapshot it was built from."""
    snapshot = snapshot_uri.rsplit("/", 1)[-1].removesuffix(".jsonl")
    count = ctx.spec.sharding.slices
    return artifact_key(
        "shards",
        ctx.spec.name,
        ctx.day.isoformat(),
        job.job_id,
        "slices",
        f"{snapshot}-{number + 1:03d}-of-{count:03d}.json",
    )


def build_slice(ctx: StepContext, number: int, *, workers: int | None = None) -> ShardsResult:
    """Build slice `number` (from 0) of the day: its rows the ledger has not seen into
    shards held for the join, and input dead letters. Holds the slice, not the day.

    Its rows are rendered and counted on `workers` processes of its own; by default
    parallel.slice_worker_count's, none unless configured: as a step of its own it runs
    beside the day's other slices, which take the other cores."""
    refuse_outside_regions(ctx)
    snapshot_uri = ctx.snapshot_uri()
    count = ctx.spec.sharding.slices
    job = ctx.job_or_create()
    name = slice_name(number, count)
    with ctx.ledger.slice_lock(job.job_id, name, holder=ctx.holder(), log=ctx.log):
        round_no, first_k, others = _round_of(ctx, job, number)
        part = BuildPart(
            number=number,
            count=count,
            keys=slice_keys(ctx.storage, ctx.spec, snapshot_uri),
            held_as=UNJOINED,
            round_no=round_no,
            first_k=first_k,
            beside_shards=others,
            workers=parallel.slice_worker_count() if workers is None else workers,
        )
        result, found = build_rows(ctx, job, snapshot_uri, part)
        ctx.ledger.add_personal_data(job.job_id, found)
        failpoint("slices.after_build")
        key = _result_key(ctx, job, snapshot_uri, number)
        ctx.storage.write_bytes(key, result.model_dump_json().encode())
    return result


def _round_of(ctx: StepContext, job: JobRecord, number: int) -> tuple[int, int, list[str]]:
    """The round of a slice's shards: the build's, the one after every shard but those
    held for a join (the slices of one build share it, whatever order they run in); the
    shards of this slice held in it already (a slice built again after a crash goes on
    after them); and the other slices' shards held in it."""
    count = ctx.spec.sharding.slices
    shards = ctx.ledger.shards(job.job_id)
    round_no = 1 + max((s.round for s in shards if s.raw_status != UNJOINED), default=-1)
    held = [s for s in shards if s.raw_status == UNJOINED and s.round == round_no]
    mine = [(s.shard_index - number) // count for s in held if s.shard_index % count == number]
    others = [s.shard_id for s in held if s.shard_index % count != number]
    return round_no, max(mine, default=-1) + 1, others


def join_slices(ctx: StepContext) -> ShardsResult:
    """Join the day's slices once each has been built from the current snapshot: release
    their shards and sum their results. Holds the day; MissingPrerequisite names the slices
    not built yet."""
    ledger = ctx.ledger
    snapshot_uri = ctx.snapshot_uri()
    job = ctx.job_or_create()
    count = ctx.spec.sharding.slices
    uris = [ctx.storage.uri(_result_key(ctx, job, snapshot_uri, n)) for n in range(count)]
    missing = [slice_name(n, count) for n, uri in enumerate(uris) if not ctx.storage.exists(uri)]
    if missing:
        raise MissingPrerequisite(
            f"{ctx.spec.name} {ctx.day}: slice {', '.join(missing)} of the day has not been "
            "built from its current snapshot; materialize request_shards (all its slices)"
        )
    with ctx.day_lock():
        results = [ShardsResult.model_validate_json(ctx.storage.read_bytes(u)) for u in uris]
        release_slices(ctx, job)
        ledger.analyze()
        ledger.update_job(job.job_id, snapshot_uri=snapshot_uri)
        ledger.refresh_job(job.job_id)
    return _summed(job, results)


def release_slices(ctx: StepContext, job: JobRecord) -> int:
    """Release the day's shards held for a join (under the day's lock); returns how many."""
    held = [
        s
        for s in ctx.ledger.shards(job.job_id, list(day_model.WAITING))
        if s.raw_status == UNJOINED
    ]
    for shard in held:
        ctx.ledger.update_shard(
            shard.shard_id, expect_status=list(day_model.WAITING), raw_status=None, message=None
        )
    return len(held)


def _summed(job: JobRecord, results: list[ShardsResult]) -> ShardsResult:
    """The slices' results as one build's."""
    estimate = Estimate()
    dead: dict[str, int] = defaultdict(int)
    personal: dict[str, int] = defaultdict(int)
    for result in results:
        part = result.estimate
        estimate.requests += part.requests
        estimate.input_tokens += part.input_tokens
        estimate.cost_usd += part.cost_usd
        estimate.cost_upper_usd += part.cost_upper_usd
        estimate.input_tokens_exact = estimate.input_tokens_exact and part.input_tokens_exact
        estimate.token_counter = estimate.token_counter or part.token_counter
        estimate.expected_output_tokens_per_item = max(
            estimate.expected_output_tokens_per_item, part.expected_output_tokens_per_item
        )
        estimate.output_basis = estimate.output_basis or part.output_basis
        estimate.cache_basis = estimate.cache_basis or part.cache_basis
        for code, count in result.input_dead_letters.items():
            dead[code] += count
        for key, count in result.personal_data.items():
            personal[key] += count
    shards = sorted(
        (shard, uri)
        for result in results
        for shard, uri in zip(result.shards_created, result.shard_uris, strict=True)
    )
    return ShardsResult(
        job_id=job.job_id,
        snapshot_rows=sum(r.snapshot_rows for r in results),
        new_items=sum(r.new_items for r in results),
        already_known=sum(r.already_known for r in results),
        input_dead_letters=dict(dead),
        personal_data=dict(sorted(personal.items())),
        compliance_dead_letters=sum(r.compliance_dead_letters for r in results),
        shards_created=[shard for shard, _ in shards],
        shard_uris=[uri for _, uri in shards],
        estimate=estimate,
    )
