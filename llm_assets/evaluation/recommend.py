"""Which variant to run: the cheapest one that meets the quality bar.

A variant meets the bar when its score is at least `eval.min_score` and its failure rate
(items without a usable result: dead letters and quality-gate refusals, over items sent) is
at most the maximum. Scores are higher-is-better (accuracy, macro-F1, kappa, similarity); an
error such as MAE is turned into a score before it gets here.

The point estimate decides, as the bar reads ("accuracy at least 0.85"); requiring the
interval's lower bound instead would make the bar depend on the sample size, and a small
sample would fail every variant, the baseline included. The uncertainty is reported rather
than decided on: the chosen variant's interval, whether its lower bound is below the bar,
and which passing variants it cannot be told apart from at this sample size.

Among the variants that meet the bar the lowest cost per 1,000 items as billed wins; ties
go to the higher score, then the baseline, then the name. A variant that fails the bar is
never chosen, however cheap.
"""

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llm_assets.evaluation.metrics import Interval, intervals_overlap

Verdict = Literal["passes", "fails score", "fails failure rate", "fails score and failure rate"]

_ROUNDING = 1e-9
"""Slack on both comparisons so a score computed as 0.85 by float arithmetic meets 0.85."""


class VariantScore(BaseModel):
    """One variant's result on the replayed sample."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(min_length=1)
    score: float = Field(allow_inf_nan=False)
    interval: Interval
    """The score's confidence interval (Wilson or bootstrap)."""
    failure_rate: float = Field(ge=0, le=1)
    cost_per_1k_items_usd: float = Field(ge=0)
    """As billed: batch prices where the variant ran as a batch."""
    realtime_cost_per_1k_items_usd: float = Field(ge=0)
    """The same tokens at realtime prices, for comparison only."""
    is_baseline: bool = False
    n: int = Field(ge=0)
    """Items the score was computed over."""

    @model_validator(mode="after")
    def _interval_in_order(self) -> "VariantScore":
        if self.interval.low > self.interval.high:
            raise ValueError(
                f"variant {self.name!r}: interval low {self.interval.low} is above "
                f"high {self.interval.high}"
            )
        return self


class VariantVerdict(BaseModel):
    """Whether one variant meets the bar, and the numbers that say so."""

    model_config = ConfigDict(frozen=True)

    name: str
    verdict: Verdict
    reason: str


class Recommendation(BaseModel):
    """The variant to run, or None when no variant meets the bar, and why."""

    model_config = ConfigDict(frozen=True)

    chosen: VariantScore | None
    reason: str
    verdicts: tuple[VariantVerdict, ...]
    """One per variant, in the order given."""
    indistinguishable_from: tuple[str, ...]
    """The other passing variants whose intervals overlap the chosen one's, cheapest first:
    their scores are not distinguishable from the chosen one's at this sample size."""
    lower_bound_below_bar: bool
    """The chosen variant's interval reaches below `min_score`: it meets the bar on its
    point estimate, but the sample does not show it meets it."""
    min_score: float
    max_failure_rate: float


def _usd(amount: float) -> str:
    return f"${amount:,.2f}" if amount >= 1 else f"${amount:.4g}"


def _judge(variant: VariantScore, min_score: float, max_failure_rate: float) -> VariantVerdict:
    score_ok = variant.score >= min_score - _ROUNDING
    rate_ok = variant.failure_rate <= max_failure_rate + _ROUNDING
    score_part = f"score {variant.score:.4g} {'≥' if score_ok else '<'} {min_score:.4g}"
    rate_part = (
        f"failure rate {variant.failure_rate:.1%} {'≤' if rate_ok else '>'} {max_failure_rate:.1%}"
    )
    verdict: Verdict
    if score_ok and rate_ok:
        verdict = "passes"
    elif rate_ok:
        verdict = "fails score"
    elif score_ok:
        verdict = "fails failure rate"
    else:
        verdict = "fails score and failure rate"
    return VariantVerdict(name=variant.name, verdict=verdict, reason=f"{score_part}, {rate_part}")


def recommend(
    variants: Sequence[VariantScore], *, min_score: float, max_failure_rate: float
) -> Recommendation:
    """The cheapest variant that meets the bar, each variant's verdict and the variants the
    sample cannot tell apart from the chosen one (see the module docstring for the rules)."""
    if not variants:
        raise ValueError("no variants to compare: pass at least the baseline's score")
    names = [v.name for v in variants]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"variant names must be unique; given more than once: {twice}")
    if not 0 <= max_failure_rate <= 1:
        raise ValueError(f"max_failure_rate must lie between 0 and 1, not {max_failure_rate}")

    verdicts = tuple(_judge(v, min_score, max_failure_rate) for v in variants)
    passed = {v.name for v in verdicts if v.verdict == "passes"}
    by_cost = sorted(
        variants,
        key=lambda v: (v.cost_per_1k_items_usd, -v.score, not v.is_baseline, v.name),
    )
    bar = f"score ≥ {min_score:.4g}, failure rate ≤ {max_failure_rate:.1%}"

    passing = [v for v in by_cost if v.name in passed]
    if not passing:
        best = max(variants, key=lambda v: (v.score, -v.failure_rate, v.is_baseline))
        return Recommendation(
            chosen=None,
            reason=(
                f"No variant meets the bar ({bar}); the best score is {best.score:.4g} "
                f"({best.name}, failure rate {best.failure_rate:.1%})."
            ),
            verdicts=verdicts,
            indistinguishable_from=(),
            lower_bound_below_bar=False,
            min_score=min_score,
            max_failure_rate=max_failure_rate,
        )

    chosen = passing[0]
    alike = tuple(v.name for v in passing[1:] if intervals_overlap(v.interval, chosen.interval))
    below_bar = chosen.interval.low < min_score - _ROUNDING
    cheaper_failing = [
        v.name
        for v in by_cost
        if v.name not in passed and v.cost_per_1k_items_usd < chosen.cost_per_1k_items_usd
    ]

    reason = (
        f"{chosen.name} is the cheapest variant that meets the bar ({bar}) at "
        f"{_usd(chosen.cost_per_1k_items_usd)} per 1,000 items, with score "
        f"{chosen.score:.4g} (interval {chosen.interval.low:.4g}–{chosen.interval.high:.4g}, "
        f"n={chosen.n}) and failure rate {chosen.failure_rate:.1%}."
    )
    if cheaper_failing:
        reason += f" Cheaper but failing the bar: {', '.join(cheaper_failing)}."
    if alike:
        reason += (
            f" Not distinguishable at this sample size from: {', '.join(alike)} "
            "(overlapping intervals)."
        )
    if below_bar:
        reason += (
            f" Its interval's lower bound {chosen.interval.low:.4g} is below {min_score:.4g}: "
            "the sample does not show that it meets the bar."
        )
    return Recommendation(
        chosen=chosen,
        reason=reason,
        verdicts=verdicts,
        indistinguishable_from=alike,
        lower_bound_below_bar=below_bar,
        min_score=min_score,
        max_failure_rate=max_failure_rate,
    )
