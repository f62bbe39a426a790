"""The recommendation: the cheapest variant that meets the bar, never a cheaper failing one,
and the variants a sample of this size cannot tell apart."""

from typing import Any

import pytest
from pydantic import ValidationError

from llm_assets.evaluation.recommend import Recommendation, VariantScore, recommend

BAR = {"min_score": 0.85, "max_failure_rate": 0.05}


def variant(
    name: str, score: float, interval: tuple[float, float], cost: float, **fields: Any
) -> VariantScore:
    """A variant scored over 400 items costing `cost` per 1,000 at batch prices (twice that
    realtime); 1% of its items failed unless `fields` say otherwise."""
    return VariantScore(
        **{"failure_rate": 0.01, "n": 400, **fields},
        name=name,
        score=score,
        interval=interval,
        cost_per_1k_items_usd=cost,
        realtime_cost_per_1k_items_usd=cost * 2,
    )


BASELINE = variant("baseline", 0.91, (0.88, 0.94), 10.0, is_baseline=True)
MID = variant("mid", 0.89, (0.86, 0.92), 4.0)
"""Cheaper than the baseline, passing, and its interval overlaps the baseline's."""
LARGE = variant("large", 0.95, (0.93, 0.97), 25.0)
"""The best score, the dearest, and its interval lies wholly above mid's."""


def recommend_at_bar(*variants: VariantScore) -> Recommendation:
    return recommend(list(variants), **BAR)


def verdicts(result: Recommendation) -> dict[str, str]:
    return {v.name: v.verdict for v in result.verdicts}


def test_cheapest_passing_variant_is_chosen() -> None:
    result = recommend_at_bar(BASELINE, MID, LARGE)

    assert result.chosen is not None
    assert result.chosen.name == "mid"
    assert verdicts(result) == {"baseline": "passes", "mid": "passes", "large": "passes"}
    assert result.reason.startswith("mid is the cheapest variant that meets the bar")
    assert "$4.00 per 1,000 items" in result.reason


def test_a_cheaper_variant_failing_on_score_is_not_chosen() -> None:
    tiny = variant("tiny", 0.80, (0.76, 0.84), 0.5)  # cheapest by far, but 0.80 < 0.85

    result = recommend_at_bar(BASELINE, tiny)

    assert result.chosen is not None and result.chosen.name == "baseline"
    assert verdicts(result) == {"baseline": "passes", "tiny": "fails score"}
    assert "Cheaper but failing the bar: tiny." in result.reason
    verdict = next(v for v in result.verdicts if v.name == "tiny")
    assert verdict.reason == "score 0.8 < 0.85, failure rate 1.0% ≤ 5.0%"


def test_a_cheaper_variant_failing_on_failure_rate_is_not_chosen() -> None:
    # best score and cheapest, but 8% of its items failed (bar: 5%)
    flaky = variant("flaky", 0.96, (0.94, 0.98), 1.0, failure_rate=0.08)
    worst = variant("worst", 0.70, (0.65, 0.75), 0.1, failure_rate=0.30)  # fails both

    result = recommend_at_bar(BASELINE, flaky, worst)

    assert result.chosen is not None and result.chosen.name == "baseline"
    assert verdicts(result) == {
        "baseline": "passes",
        "flaky": "fails failure rate",
        "worst": "fails score and failure rate",
    }
    verdict = next(v for v in result.verdicts if v.name == "flaky")
    assert verdict.reason == "score 0.96 ≥ 0.85, failure rate 8.0% > 5.0%"
    assert "Cheaper but failing the bar: worst, flaky." in result.reason


def test_overlapping_intervals_are_reported_as_indistinguishable() -> None:
    # The baseline's [0.88, 0.94] overlaps mid's [0.86, 0.92]; large's [0.93, 0.97] does not.
    # Tiny's overlaps mid's interval but fails the bar: not listed.
    tiny = variant("tiny", 0.84, (0.80, 0.88), 0.5)

    result = recommend_at_bar(BASELINE, MID, LARGE, tiny)

    assert result.chosen is not None and result.chosen.name == "mid"
    assert result.indistinguishable_from == ("baseline",)
    assert "Not distinguishable at this sample size from: baseline" in result.reason


def test_separated_intervals_are_not_indistinguishable() -> None:
    result = recommend_at_bar(variant("baseline", 0.95, (0.93, 0.97), 10.0, is_baseline=True), MID)

    assert result.chosen is not None and result.chosen.name == "mid"
    assert result.indistinguishable_from == ()
    assert "distinguishable" not in result.reason


def test_the_point_estimate_decides_and_a_low_lower_bound_is_reported() -> None:
    # 0.87 >= 0.85 passes although its interval reaches down to 0.82
    baseline = variant("baseline", 0.93, (0.91, 0.95), 10.0, is_baseline=True)

    result = recommend_at_bar(baseline, variant("mid", 0.87, (0.82, 0.92), 4.0))

    assert result.chosen is not None and result.chosen.name == "mid"
    assert result.lower_bound_below_bar
    assert "lower bound 0.82 is below 0.85" in result.reason

    sure = recommend_at_bar(baseline)
    assert not sure.lower_bound_below_bar


def test_nothing_passing_gives_none_with_the_best_score_and_the_bar() -> None:
    result = recommend_at_bar(
        variant("baseline", 0.82, (0.78, 0.86), 10.0, is_baseline=True),
        variant("large", 0.84, (0.80, 0.88), 25.0),
        variant("flaky", 0.90, (0.87, 0.93), 1.0, failure_rate=0.2),
    )

    assert result.chosen is None
    assert result.indistinguishable_from == ()
    assert result.reason == (
        "No variant meets the bar (score ≥ 0.85, failure rate ≤ 5.0%); "
        "the best score is 0.9 (flaky, failure rate 20.0%)."
    )
    assert set(verdicts(result).values()) == {"fails score", "fails failure rate"}


def test_ties_on_cost_go_to_the_higher_score_then_the_baseline_then_the_name() -> None:
    higher = recommend_at_bar(
        variant("a", 0.88, (0.85, 0.91), 4.0), variant("b", 0.90, (0.87, 0.93), 4.0)
    )
    assert higher.chosen is not None and higher.chosen.name == "b"
    assert higher.indistinguishable_from == ("a",)

    baseline_first = recommend_at_bar(
        variant("a", 0.90, (0.87, 0.93), 4.0),
        variant("z-baseline", 0.90, (0.87, 0.93), 4.0, is_baseline=True),
    )
    assert baseline_first.chosen is not None and baseline_first.chosen.name == "z-baseline"

    by_name = recommend_at_bar(
        variant("b", 0.90, (0.87, 0.93), 4.0), variant("a", 0.90, (0.87, 0.93), 4.0)
    )
    assert by_name.chosen is not None and by_name.chosen.name == "a"


def test_a_score_equal_to_the_bar_passes_despite_float_rounding() -> None:
    # 1 - 0.9 is 0.09999999999999998 in binary floating point
    result = recommend(
        [variant("baseline", 1 - 0.9, (0.05, 0.15), 1.0, is_baseline=True)],
        min_score=0.1,
        max_failure_rate=0.01,
    )
    assert result.chosen is not None
    assert verdicts(result) == {"baseline": "passes"}


def test_verdicts_keep_the_order_given() -> None:
    names = ["c", "a", "b"]
    result = recommend_at_bar(*(variant(n, 0.9, (0.87, 0.93), 4.0) for n in names))
    assert [v.name for v in result.verdicts] == names


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="no variants"):
        recommend_at_bar()
    with pytest.raises(ValueError, match="unique.*'a'"):
        recommend_at_bar(variant("a", 0.9, (0.8, 0.95), 1.0), variant("a", 0.9, (0.8, 0.95), 2.0))
    with pytest.raises(ValueError, match="max_failure_rate"):
        recommend([variant("a", 0.9, (0.8, 0.95), 1.0)], min_score=0.8, max_failure_rate=5)
    with pytest.raises(ValidationError, match="interval low 0.95 is above high 0.8"):
        variant("a", 0.9, (0.95, 0.8), 1.0)
    with pytest.raises(ValidationError):
        variant("a", 0.9, (0.8, 0.95), 1.0, failure_rate=1.5)
