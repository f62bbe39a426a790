"""Evaluation scores against values computed by hand on small fixed sets.

The arithmetic is in the comments; every expected number can be checked with pen and paper.
"""

import random
import statistics
from collections.abc import Callable

import pytest

from llm_assets.evaluation.metrics import (
    CategoricalScores,
    Interval,
    bootstrap_interval,
    categorical_scores,
    cohens_kappa,
    intervals_overlap,
    mean_absolute_error,
    text_lengths,
    wilson_interval,
)

# Eight items; "promo" is never predicted and item 6 is a dead letter (no prediction).
#   item  gold   predicted
#   1     spam   spam      right
#   2     spam   spam      right
#   3     spam   ham
#   4     ham    ham       right
#   5     ham    ham       right
#   6     ham    None      (dead letter: wrong)
#   7     promo  spam
#   8     promo  ham
GOLD = ["spam", "spam", "spam", "ham", "ham", "ham", "promo", "promo"]
PREDICTED = ["spam", "spam", "ham", "ham", "ham", None, "spam", "ham"]


def test_accuracy_counts_a_missing_prediction_as_wrong() -> None:
    scores = categorical_scores(GOLD, PREDICTED)
    # right: items 1, 2, 4, 5 -> 4 of 8; the dead letter (item 6) stays in the denominator.
    assert scores.n == 8
    assert scores.missing == 1
    assert scores.unscored == 0
    assert scores.accuracy == pytest.approx(4 / 8)


def test_per_label_precision_recall_f1_and_support() -> None:
    rows = {row.label: row for row in categorical_scores(GOLD, PREDICTED).labels}
    assert list(rows) == ["spam", "ham", "promo"]  # first appearance in the references

    # spam: TP 2 (items 1, 2), FP 1 (item 7), FN 1 (item 3)
    #   P = 2/3, R = 2/3, F1 = 2*2 / (2*2 + 1 + 1) = 4/6
    assert rows["spam"].precision == pytest.approx(2 / 3)
    assert rows["spam"].recall == pytest.approx(2 / 3)
    assert rows["spam"].f1 == pytest.approx(4 / 6)
    assert (rows["spam"].support, rows["spam"].predicted) == (3, 3)

    # ham: TP 2 (items 4, 5), FP 2 (items 3, 8), FN 1 (item 6, the dead letter)
    #   P = 2/4, R = 2/3, F1 = 4 / (4 + 2 + 1) = 4/7
    assert rows["ham"].precision == pytest.approx(2 / 4)
    assert rows["ham"].recall == pytest.approx(2 / 3)
    assert rows["ham"].f1 == pytest.approx(4 / 7)
    assert (rows["ham"].support, rows["ham"].predicted) == (3, 4)

    # promo: never predicted -> precision undefined (0/0); TP 0, FN 2 -> R = 0, F1 = 0
    assert rows["promo"].precision is None
    assert rows["promo"].recall == 0.0
    assert rows["promo"].f1 == 0.0
    assert (rows["promo"].support, rows["promo"].predicted) == (2, 0)


def test_macro_f1_includes_a_label_never_predicted() -> None:
    # (4/6 + 4/7 + 0) / 3 = (14/21 + 12/21) / 3 = 26/63 = 0.41270
    assert categorical_scores(GOLD, PREDICTED).macro_f1 == pytest.approx(26 / 63)


def test_confusion_matrix_has_a_none_column_for_missing_predictions() -> None:
    assert categorical_scores(GOLD, PREDICTED).confusion == {
        "spam": {"spam": 2, "ham": 1, "promo": 0, None: 0},
        "ham": {"spam": 0, "ham": 2, "promo": 0, None: 1},
        "promo": {"spam": 1, "ham": 1, "promo": 0, None: 0},
    }


def test_listed_labels_order_rows_and_an_absent_label_does_not_lower_macro_f1() -> None:
    scores = categorical_scores(GOLD, PREDICTED, labels=["promo", "refund", "ham", "spam"])
    assert [row.label for row in scores.labels] == ["promo", "refund", "ham", "spam"]
    refund = scores.labels[1]
    assert (refund.support, refund.predicted, refund.precision, refund.recall) == (0, 0, None, None)
    # "refund" occurs nowhere: macro-F1 stays over spam, ham, promo = 26/63.
    assert scores.macro_f1 == pytest.approx(26 / 63)
    assert scores.confusion["refund"] == {"promo": 0, "refund": 0, "ham": 0, "spam": 0, None: 0}


def test_a_label_predicted_but_never_in_the_references_has_no_recall() -> None:
    # gold a a b, predicted a c b: c has TP 0, FP 1 -> P = 0, R undefined, F1 = 0
    # a: TP 1, FN 1 -> F1 = 2/(2+0+1) = 2/3; b: TP 1 -> F1 = 1
    # macro-F1 = (2/3 + 1 + 0) / 3 = 5/9
    scores = categorical_scores(["a", "a", "b"], ["a", "c", "b"])
    c = scores.labels[2]
    assert (c.label, c.precision, c.recall, c.f1) == ("c", 0.0, None, 0.0)
    assert scores.macro_f1 == pytest.approx(5 / 9)


def test_items_without_a_reference_are_left_out_and_counted() -> None:
    scores = categorical_scores([*GOLD, None], [*PREDICTED, "spam"])
    # the ninth item has no reference: same scores as before, one unscored
    assert (scores.n, scores.unscored) == (8, 1)
    assert scores.accuracy == pytest.approx(4 / 8)
    assert scores.confusion["spam"]["spam"] == 2


def test_integer_labels_and_no_items() -> None:
    scores = categorical_scores([1, 2, 2], [1, 2, 1])
    # 1: TP 1, FP 1 -> F1 = 2/3; 2: TP 1, FN 1 -> F1 = 2/3; accuracy 2/3
    assert scores.accuracy == pytest.approx(2 / 3)
    assert scores.macro_f1 == pytest.approx(2 / 3)
    empty = categorical_scores([], [])
    assert (empty.n, empty.accuracy, empty.macro_f1, empty.labels) == (0, None, None, ())


def test_sequences_of_different_length_are_refused() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        categorical_scores(["a", "b"], ["a"])


def test_mean_absolute_error_skips_missing_and_reports_n() -> None:
    # |3 - 2.5| = 0.5, |5 - 5| = 0, |2.5 - 4| = 1.5; item 4 has no prediction (missing),
    # item 5 no reference (unscored). MAE = (0.5 + 0 + 1.5) / 3 = 2/3
    result = mean_absolute_error([3, 5, 2.5, 7, None], [2.5, 5, 4, None, 1])
    assert (result.n, result.missing, result.unscored) == (3, 1, 1)
    assert result.mae == pytest.approx(2 / 3)
    assert mean_absolute_error([1.0], [None]).mae is None


def test_cohens_kappa_on_the_textbook_50_item_table() -> None:
    #               b: yes   b: no
    #   a: yes        20       5      (a says yes 25 times)
    #   a: no         10      15      (a says no 25 times)
    #   b says yes 30 times, no 20 times
    # observed p_o = (20 + 15) / 50 = 0.7
    # expected p_e = (25/50)(30/50) + (25/50)(20/50) = 0.3 + 0.2 = 0.5
    # kappa = (0.7 - 0.5) / (1 - 0.5) = 0.4
    a = ["yes"] * 25 + ["no"] * 25
    b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    result = cohens_kappa(a, b)
    assert result.n == 50
    assert result.observed_agreement == pytest.approx(0.7)
    assert result.expected_agreement == pytest.approx(0.5)
    assert result.kappa == pytest.approx(0.4)


def test_cohens_kappa_edge_cases() -> None:
    # one category throughout on both sides: p_o = p_e = 1, the formula is 0/0 -> 1.0
    single = cohens_kappa(["x"] * 4, ["x"] * 4)
    assert (single.observed_agreement, single.expected_agreement, single.kappa) == (1, 1, 1)
    # perfect agreement over two categories: p_e = 0.5, kappa = (1 - 0.5) / 0.5 = 1
    assert cohens_kappa(["x", "y"], ["x", "y"]).kappa == pytest.approx(1.0)
    # systematic disagreement: p_o = 0, p_e = 0.5, kappa = -0.5 / 0.5 = -1
    assert cohens_kappa(["x", "y"], ["y", "x"]).kappa == pytest.approx(-1.0)
    assert cohens_kappa([], []).kappa is None


def test_cohens_kappa_drops_missing_references_and_keeps_missing_answers() -> None:
    # item 3 has no reference: left out. Item 4's missing answer is a category of its own.
    #   pairs: (x, x) (y, y) (y, None)   n = 3
    #   p_o = 2/3; a: x 1, y 2; b: x 1, y 1, None 1
    #   p_e = (1*1 + 2*1) / 9 = 1/3; kappa = (2/3 - 1/3) / (1 - 1/3) = 1/2
    result = cohens_kappa(["x", "y", None, "y"], ["x", "y", "x", None])
    assert (result.n, result.unscored) == (3, 1)
    assert result.expected_agreement == pytest.approx(1 / 3)
    assert result.kappa == pytest.approx(0.5)


def test_text_lengths() -> None:
    # lengths 2, 4, 9 (None missing): mean 15/3 = 5, median 4
    result = text_lengths(["ab", "abcd", None, "abcdefghi"])
    assert (result.n, result.missing, result.mean_chars, result.median_chars) == (3, 1, 5.0, 4.0)
    # even count: median between 2 and 4 is 3
    assert text_lengths(["ab", "abcd"]).median_chars == 3.0
    assert text_lengths([None]).mean_chars is None


def test_wilson_interval_against_published_values() -> None:
    # 81/263 at 95% (Newcombe 1998, Table I): 0.2553 to 0.3662
    #   p = 0.307985, z = 1.959964, z^2/n = 0.014606
    #   centre = (p + z^2/2n) / (1 + z^2/n) = 0.315288 / 1.014606 = 0.310749
    #   half = z / (1 + z^2/n) * sqrt(p(1-p)/n + z^2/4n^2)
    #        = 1.931749 * sqrt(0.00081038 + 0.00001388) = 0.055461
    low, high = wilson_interval(81, 263)
    assert low == pytest.approx(0.2553, abs=5e-5)
    assert high == pytest.approx(0.3662, abs=5e-5)
    # 8/10: p = 0.8, z^2/n = 0.384146
    #   centre = (0.8 + 0.192073) / 1.384146 = 0.716740
    #   half = 1.415999 * sqrt(0.016 + 0.009604) = 0.226578 -> 0.4902 to 0.9433
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=5e-5)
    assert high == pytest.approx(0.9433, abs=5e-5)


def test_wilson_interval_bounds() -> None:
    # 0 of 10: the lower bound is exactly 0, the upper z^2/(n + z^2) = 3.8415/13.8415 = 0.2775
    low, high = wilson_interval(0, 10)
    assert low == 0.0
    assert high == pytest.approx(0.2775, abs=5e-5)
    assert wilson_interval(10, 10) == Interval(pytest.approx(0.7225, abs=5e-5), 1.0)
    assert wilson_interval(0, 0) == Interval(0.0, 1.0)
    # a higher confidence gives a wider interval
    low99, high99 = wilson_interval(8, 10, confidence=0.99)
    assert low99 < 0.4902 and high99 > 0.9433
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(11, 10)
    with pytest.raises(ValueError, match="confidence"):
        wilson_interval(1, 10, confidence=95)


def test_bootstrap_percentiles_are_interpolated_quantiles() -> None:
    # A statistic returning 1, 2, 3, 4, 5 in turn, whatever the resample: with confidence 0.5
    # the quantiles 0.25 and 0.75 sit at positions 1 and 3 of the sorted five -> (2, 4);
    # with confidence 0.8, 0.1 and 0.9 sit at positions 0.4 and 3.6 -> (1.4, 4.6).
    def counter() -> Callable[[object], float]:
        values = iter(range(1, 6))
        return lambda _resample: next(values)

    assert bootstrap_interval([0], counter(), seed=0, resamples=5, confidence=0.5) == (2, 4)
    low, high = bootstrap_interval([0], counter(), seed=0, resamples=5, confidence=0.8)
    assert (low, high) == (pytest.approx(1.4), pytest.approx(4.6))


def test_bootstrap_is_deterministic_by_seed() -> None:
    errors = [0.0, 0.5, 1.0, 1.5, 4.0, 0.25, 2.0, 0.0, 3.0, 1.0]
    first = bootstrap_interval(errors, statistics.fmean, seed=7)
    random.seed(12345)  # the global generator plays no part
    assert bootstrap_interval(errors, statistics.fmean, seed=7) == first
    assert bootstrap_interval(errors, statistics.fmean, seed=8) != first
    assert first.low < statistics.fmean(errors) < first.high
    # a sample of one repeated value resamples to that value only
    assert bootstrap_interval([2.0] * 5, statistics.fmean, seed=1) == (2.0, 2.0)


def test_bootstrap_interval_of_macro_f1_over_item_pairs() -> None:
    pairs = list(zip(GOLD * 5, PREDICTED * 5, strict=True))

    def macro_f1(resample: list[tuple[str, str | None]]) -> float:
        gold, predicted = zip(*resample, strict=True)
        return categorical_scores(gold, predicted).macro_f1 or 0.0

    interval = bootstrap_interval(pairs, macro_f1, seed=3, resamples=200)
    assert interval == bootstrap_interval(pairs, macro_f1, seed=3, resamples=200)
    assert 0 <= interval.low < 26 / 63 < interval.high <= 1
    with pytest.raises(ValueError, match="no values"):
        bootstrap_interval([], macro_f1, seed=3)


def test_intervals_overlap() -> None:
    assert intervals_overlap((0.1, 0.5), (0.4, 0.9))
    assert intervals_overlap((0.4, 0.9), (0.1, 0.5))
    assert intervals_overlap((0.1, 0.9), (0.3, 0.4))  # one inside the other
    assert intervals_overlap((0.1, 0.4), (0.4, 0.9))  # touching
    assert not intervals_overlap((0.1, 0.39), (0.4, 0.9))
    assert not intervals_overlap((0.4, 0.9), (0.1, 0.39))


def test_the_confusion_matrix_survives_json_with_int_labels_and_missing_answers() -> None:
    scores = categorical_scores(["a", "b", 1, 1], ["a", None, 1, "a"], labels=["a", "b", 1])

    back = CategoricalScores.model_validate_json(scores.model_dump_json())

    assert back == scores
    assert back.confusion[1] == {"a": 1, "b": 0, 1: 1, None: 0}
    assert back.confusion["b"][None] == 1
