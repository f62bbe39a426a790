"""What shards are expected to cost, and at most, before they are sent: input tokens as
counted, output as learned from the pipeline's earlier partitions, cache reads and writes at
the share measured on them; the day's first build, its retry and requeue rounds share it."""

import statistics
from collections.abc import Sequence

from pydantic import BaseModel

from llm_assets.items.tokens import counter_for
from llm_assets.resources.ledger import JobRecord
from llm_assets.steps.context import StepContext


class ShardEstimate(BaseModel):
    """What a shard is expected to cost, and at most, before it is sent."""

    estimated_input_tokens: int
    estimated_output_tokens: int
    estimated_cost_usd: float
    estimated_cost_upper_usd: float


class Estimate(BaseModel):
    """A day's estimate as `request_shards` shows it."""

    requests: int = 0
    input_tokens: int = 0
    input_tokens_exact: bool = True
    token_counter: str = ""
    expected_output_tokens_per_item: float = 0.0
    output_basis: str = ""
    cache_basis: str = ""
    """What share of input the estimate takes as read from (and written to) the prompt cache,
    and why; empty when the spec caches nothing."""
    cost_usd: float = 0.0
    cost_upper_usd: float = 0.0

    def add(self, shard: ShardEstimate, requests: int) -> None:
        self.requests += requests
        self.input_tokens += shard.estimated_input_tokens
        self.cost_usd += shard.estimated_cost_usd
        self.cost_upper_usd += shard.estimated_cost_upper_usd


class Estimator:
    """Prices shards before submission: input tokens as counted, output as learned from the
    pipeline's earlier partitions (median output tokens per item, at most max_output_tokens);
    the upper bound takes every item at max_output_tokens and approximated input counts plus
    their margin."""

    def __init__(self, ctx: StepContext) -> None:
        spec, ledger = ctx.spec, ctx.ledger
        self.spec = spec
        self.provider = ctx.batch_provider
        self.price = ctx.price()
        self.counter = counter_for(spec)
        self.max_output = spec.model.max_output_tokens
        history = ledger.earlier_jobs(spec.name, ctx.day, spec.budget.history_window)
        per_item = list(ledger.output_tokens_per_billed_item([j.job_id for j in history]).values())
        if per_item:
            self.expected_output = min(statistics.median(per_item), float(self.max_output))
            self.basis = f"median of {len(per_item)} earlier partition(s)"
        else:
            self.expected_output = float(self.max_output)
            self.basis = "max_output_tokens (no earlier partitions)"
        self.read_share, self.write_share, self.cache_basis = _cache_shares(ctx, history)
        cache = spec.prompt.cache is not None
        self.prefix_tokens = self.counter.text(spec.prompt.system) if cache else 0

    def empty(self) -> Estimate:
        return Estimate(
            input_tokens_exact=self.counter.exact,
            token_counter=self.counter.method,
            expected_output_tokens_per_item=self.expected_output,
            output_basis=self.basis,
            cache_basis=self.cache_basis,
        )

    def shard(self, input_tokens: int, requests: int) -> ShardEstimate:
        output = round(self.expected_output * requests)
        # A shard the step sends request by request pays realtime prices.
        batch = self.provider.priced_as_batch and not self.provider.runs_shard_in_step(
            self.spec, requests, None
        )
        upper_input = self.counter.upper(input_tokens)
        return ShardEstimate(
            estimated_input_tokens=input_tokens,
            estimated_output_tokens=output,
            estimated_cost_usd=self.price.cost_usd(
                input_tokens,
                output,
                batch=batch,
                cached_input_tokens=round(input_tokens * self.read_share),
                cache_write_input_tokens=round(input_tokens * self.write_share),
            ),
            # At most: no cache hit, and every item writes the cached prefix.
            estimated_cost_upper_usd=self.price.cost_usd(
                upper_input,
                self.max_output * requests,
                batch=batch,
                cache_write_input_tokens=self.counter.upper(self.prefix_tokens) * requests,
            ),
        )


def _cache_shares(ctx: StepContext, history: Sequence[JobRecord]) -> tuple[float, float, str]:
    """The shares of input read from and written to the prompt cache on the pipeline's
    earlier partitions, and the basis as the estimate states it; no hits without them."""
    if ctx.spec.prompt.cache is None:
        return 0.0, 0.0, ""
    tokens, read, written = ctx.ledger.cache_usage([j.job_id for j in history])
    if tokens <= 0:
        return 0.0, 0.0, "no cache hits (no earlier partitions to measure them on)"
    basis = (
        f"cache hit rate of {len(history)} earlier partition(s): {read / tokens:.1%} of input "
        f"read from the cache, {written / tokens:.1%} written to it"
    )
    return read / tokens, written / tokens, basis
