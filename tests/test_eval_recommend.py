"""The recommendation: the cheapest variant that meets the bar, never a cheaper failing one,
and the variants a sample of this size cannot tell apart."""

import pytest
from pydantic import ValidationError

from llm_assets.evaluation.recommend import Recommendation, VariantScore, recommend

BAR = {"min_score": 0.85, "max_failure_rate": 0.05}


def variant(
    name: str,
    score: float,
    interval: tuple[float, float],
    cost: float,
    *,
    failure_rate: float = 0.01,
    baseline: bool = False,
) -> VariantScore:
    return VariantScore(
        name=name,
        score=score,
        interval=interval,
        failure_rate=failure_rate,
        cost_per_1k_items_usd=cost,
        realtime_cost_per_1k_items_usd=cost * 2,
        is_baseline=baseline,
        n=400,
    )


def verdicts(result: Recommendation) -> dict[str, str]:
    return {v.name: v.verdict for v in result.verdicts}


def test_cheapest_passing_variant_is_chosen() -> None:
    result = recommend(
        [
            variant("baseline", 0.91, (0.88, 0.94), 10.0, baseline=True),
            variant("mid", 0.89, (0.86, 0.92), 4.0),
            variant("large", 0.95, (0.93, 0.97), 25.0),
        ],
        **BAR,
    )
    assert result.chosen is not None
    assert result.chosen.name == "mid"
    assert verdicts(result) == {"baseline": "passes", "mid": "passes", "large": "passes"}
    assert result.reason.startswith("mid is the cheapest variant that meets the bar")
    assert "$4.00 per 1,000 items" in result.reason


def test_a_cheaper_variant_failing_on_score_is_not_chosen() -> None:
    result = recommend(
        [
            variant("baseline", 0.91, (0.88, 0.94), 10.0, baseline=True),
            # cheapest by far, but 0.80 < 0.85
            variant("tiny", 0.80, (0.76, 0.84), 0.5),
        ],
        **BAR,
    )
    assert result.chosen is not None and result.chosen.name == "baseline"
    assert verdicts(result) == {"baseline": "passes", "tiny": "fails score"}
    assert "Cheaper but failing the bar: tiny." in result.reason
    tiny = next(v for v in result.verdicts if v.name == "tiny")
    assert tiny.reason == "score 0.8 < 0.85, failure rate 1.0% ≤ 5.0%"


def test_a_cheaper_variant_failing_on_failure_rate_is_not_chosen() -> None:
    result = recommend(
        [
            variant("baseline", 0.91, (0.88, 0.94), 10.0, baseline=True),
            # best score and cheapest, but 8% of its items failed (bar: 5%)
            variant("flaky", 0.96, (0.94, 0.98), 1.0, failure_rate=0.08),
            # fails both
            variant("worst", 0.70, (0.65, 0.75), 0.1, failure_rate=0.30),
        ],
        **BAR,
    )
    assert result.chosen is not None and result.chosen.name == "baseline"
    assert verdicts(result) == {
        "baseline": "passes",
        "flaky": "fails failure rate",
        "worst": "fails score and failure rate",
    }
    flaky = next(v for v in result.verdicts if v.name == "flaky")
    assert flaky.reason == "score 0.96 ≥ 0.85, failure rate 8.0% > 5.0%"
    assert "Cheaper but failing the bar: worst, flaky." in result.reason


def test_overlapping_intervals_are_reported_as_indistinguishable() -> None:
    result = recommend(
        [
            # [0.88, 0.94] overlaps mid's [0.86, 0.92]
            variant("baseline", 0.91, (0.88, 0.94), 10.0, baseline=True),
            variant("mid", 0.89, (0.86, 0.92), 4.0),
            # [0.93, 0.97] lies wholly above mid's: distinguishable
            variant("large", 0.95, (0.93, 0.97), 25.0),
            # overlaps mid's interval but fails the bar: not listed
            variant("tiny", 0.84, (0.80, 0.88), 0.5),
        ],
        **BAR,
    )
    assert result.chosen is not None and result.chosen.name == "mid"
    assert result.indistinguishable_from == ("baseline",)
    assert "Not distinguishable at this sample size from: baseline" in result.reason


def test_separated_intervals_are_not_indistinguishable() -> None:
    result = recommend(
        [
            variant("baseline", 0.95, (0.93, 0.97), 10.0, baseline=True),
            variant("mid", 0.89, (0.86, 0.92), 4.0),
        ],
        **BAR,
    )
    assert result.chosen is not None and result.chosen.name == "mid"
    assert result.indistinguishable_from == ()
    assert "distinguishable" not in result.reason


def test_the_point_estimate_decides_and_a_low_lower_bound_is_reported() -> None:
    # 0.87 >= 0.85 passes although its interval reaches down to 0.82
    result = recommend(
        [
            variant("baseline", 0.93, (0.91, 0.95), 10.0, baseline=True),
            variant("mid", 0.87, (0.82, 0.92), 4.0),
        ],
        **BAR,
    )
    assert result.chosen is not None and result.chosen.name == "mid"
    assert result.lower_bound_below_bar
    assert "lower bound 0.82 is below 0.85" in result.reason

    sure = recommend([variant("baseline", 0.93, (0.91, 0.95), 10.0, baseline=True)], **BAR)
    assert not sure.lower_bound_below_bar


def test_nothing_passing_gives_none_with_the_best_score_and_the_bar() -> None:
    result = recommend(
        [
            variant("baseline", 0.82, (0.78, 0.86), 10.0, baseline=True),
            variant("large", 0.84, (0.80, 0.88), 25.0),
            variant("flaky", 0.90, (0.87, 0.93), 1.0, failure_rate=0.2),
        ],
        min_score=0.85,
        max_failure_rate=0.05,
    )
    assert result.chosen is None
    assert result.indistinguishable_from == ()
    assert result.reason == (
        "No variant meets the bar (score ≥ 0.85, failure rate ≤ 5.0%); "
        "the best score is 0.9 (flaky, failure rate 20.0%)."
    )
    assert set(verdicts(result).values()) == {"fails score", "fails failure rate"}


def test_ties_on_cost_go_to_the_higher_score_then_the_baseline_then_the_name() -> None:
    higher = recommend(
        [
            variant("a", 0.88, (0.85, 0.91), 4.0),
            variant("b", 0.90, (0.87, 0.93), 4.0),
        ],
        **BAR,
    )
    assert higher.chosen is not None and higher.chosen.name == "b"
    assert higher.indistinguishable_from == ("a",)

    baseline_first = recommend(
        [
            variant("a", 0.90, (0.87, 0.93), 4.0),
            variant("z-baseline", 0.90, (0.87, 0.93), 4.0, baseline=True),
        ],
        **BAR,
    )
    assert baseline_first.chosen is not None and baseline_first.chosen.name == "z-baseline"

    by_name = recommend(
        [variant("b", 0.90, (0.87, 0.93), 4.0), variant("a", 0.90, (0.87, 0.93), 4.0)], **BAR
    )
    assert by_name.chosen is not None and by_name.chosen.name == "a"


def test_a_score_equal_to_the_bar_passes_despite_float_rounding() -> None:
    # 1 - 0.9 is 0.09999999999999998 in binary floating point
    result = recommend(
        [variant("baseline", 1 - 0.9, (0.05, 0.15), 1.0, baseline=True)],
        min_score=0.1,
        max_failure_rate=0.01,
    )
    assert result.chosen is not None
    assert verdicts(result) == {"baseline": "passes"}


def test_verdicts_keep_the_order_given() -> None:
    names = ["c", "a", "b"]
    result = recommend([variant(n, 0.9, (0.87, 0.93), 4.0) for n in names], **BAR)
    assert [v.name for v in result.verdicts] == names


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="no variants"):
        recommend([], **BAR)
    with pytest.raises(ValueError, match="unique.*'a'"):
        recommend([variant("a", 0.9, (0.8, 0.95), 1.0), variant("a", 0.9, (0.8, 0.95), 2.0)], **BAR)
    with pytest.raises(ValueError, match="max_failure_rate"):
        recommend([variant("a", 0.9, (0.8, 0.95), 1.0)], min_score=0.8, max_failure_rate=5)
    with pytest.raises(ValidationError, match="interval low 0.95 is above high 0.8"):
        variant("a", 0.9, (0.95, 0.8), 1.0)
    with pytest.raises(ValidationError):
        variant("a", 0.9, (0.8, 0.95), 1.0, failure_rate=1.5)
