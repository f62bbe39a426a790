"""Scores of one variant's outputs against a reference, and confidence intervals on them.

Every function takes two aligned sequences, one value per sampled item: the reference (the
item's historical output, or the baseline variant's) and the variant's prediction. Missing
values are `None`, and they count differently on each side:

- a missing reference (`None` in `gold`, or in `a` for kappa) leaves nothing to score the
  item against: it is left out and counted as `unscored`;
- a missing prediction is a dead letter or a result the quality gate refused. For labels it
  counts as wrong: it lowers accuracy and the recall of the item's true label, sits in the
  confusion matrix's `None` column, and is a false positive for no label. For numbers and
  text there is no value to measure, so it is left out and counted as `missing`. The failure
  rate reports how many there were either way.

Intervals are Wilson's for a proportion (accuracy, a failure rate) and the percentile
bootstrap for anything else (macro-F1, MAE, kappa), seeded so a report computes the same
interval twice. Overlapping intervals mean the sample cannot tell the two scores apart.
"""

import math
import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, field_serializer, field_validator

Label = str | int
"""A categorical value: the spec's `isin` lists strings or integers."""

T = TypeVar("T")


class Interval(NamedTuple):
    """A closed confidence interval `[low, high]`."""

    low: float
    high: float


class LabelScores(BaseModel):
    """One label's scores. Precision is None when nothing was predicted as the label, recall
    when the reference never holds it; F1 is 2·TP / (2·TP + FP + FN), 0 when TP is 0."""

    model_config = ConfigDict(frozen=True)

    label: Label
    precision: float | None
    recall: float | None
    f1: float
    support: int
    """Scored items whose reference is this label."""
    predicted: int
    """Scored items predicted as this label."""


class CategoricalScores(BaseModel):
    """A categorical field's scores over the items that have a reference."""

    model_config = ConfigDict(frozen=True)

    n: int
    """Scored items: those with a reference."""
    unscored: int
    """Items left out because the reference is missing."""
    missing: int
    """Scored items without a prediction (counted as wrong)."""
    accuracy: float | None
    """Correct predictions / n; None when n is 0."""
    macro_f1: float | None
    """Unweighted mean F1 over the labels that occur in the references or predictions; None
    when no label occurs."""
    labels: tuple[LabelScores, ...]
    confusion: dict[Label, dict[Label | None, int]]
    """Reference label → predicted label (None: no prediction) → items; every label has a
    row and every label and None a column, zeros included. In JSON a list of
    [reference, [[prediction, items], ...]] rows: object keys would turn None and integer
    labels into strings."""

    @field_serializer("confusion", when_used="json")
    def _confusion_rows(
        self, confusion: dict[Label, dict[Label | None, int]]
    ) -> list[tuple[Label, list[tuple[Label | None, int]]]]:
        return [(gold, list(row.items())) for gold, row in confusion.items()]

    @field_validator("confusion", mode="before")
    @classmethod
    def _confusion_from_rows(cls, value: Any) -> Any:
        if isinstance(value, list):
            return {gold: dict(map(tuple, row)) for gold, row in value}
        return value


class MeanAbsoluteError(BaseModel):
    """A numeric field's mean absolute error over the items with both values."""

    model_config = ConfigDict(frozen=True)

    n: int
    """Items with a reference and a prediction."""
    unscored: int
    missing: int
    """Items with a reference but no prediction (left out)."""
    mae: float | None
    """None when n is 0."""


class Kappa(BaseModel):
    """Cohen's kappa between two raters' labels on the same items."""

    model_config = ConfigDict(frozen=True)

    n: int
    unscored: int
    """Items left out because the first rater (the reference) gave no label."""
    observed_agreement: float | None
    expected_agreement: float | None
    """Agreement expected by chance from each rater's label frequencies."""
    kappa: float | None
    """(observed − expected) / (1 − expected); None when n is 0."""


class TextLengths(BaseModel):
    """Lengths in characters of a free-text field's values."""

    model_config = ConfigDict(frozen=True)

    n: int
    missing: int
    mean_chars: float | None
    median_chars: float | None


def _pairs(gold: Sequence[T | None], predicted: Sequence[T | None]) -> list[tuple[T, T | None]]:
    if len(gold) != len(predicted):
        raise ValueError(
            f"reference and prediction differ in length ({len(gold)} and {len(predicted)}); "
            "pass one value per sampled item on both sides, None where one is missing"
        )
    return [(g, p) for g, p in zip(gold, predicted, strict=True) if g is not None]


def _ordered_labels(labels: Sequence[Label] | None, *seen: Sequence[Label | None]) -> list[Label]:
    ordered: list[Label] = list(dict.fromkeys(labels or ()))
    known = set(ordered)
    for values in seen:
        for value in values:
            if value is not None and value not in known:
                ordered.append(value)
                known.add(value)
    return ordered


def categorical_scores(
    gold: Sequence[Label | None],
    predicted: Sequence[Label | None],
    labels: Sequence[Label] | None = None,
) -> CategoricalScores:
    """Accuracy, macro-F1, per-label precision/recall/F1 and the confusion matrix.

    `labels` (the field's `isin`) fixes the order of the per-label rows and adds rows for
    labels that never occur; labels that occur but are not listed follow in order of first
    appearance. A listed label that occurs nowhere has no F1 and does not lower macro-F1.
    """
    pairs: list[tuple[Label, Label | None]] = _pairs(gold, predicted)
    ordered = _ordered_labels(labels, [g for g, _ in pairs], [p for _, p in pairs])
    confusion: dict[Label, dict[Label | None, int]] = {
        g: dict.fromkeys([*ordered, None], 0) for g in ordered
    }
    for g, p in pairs:
        confusion[g][p] += 1

    rows: list[LabelScores] = []
    f1_of_occurring: list[float] = []
    for label in ordered:
        tp = confusion[label][label]
        support = sum(confusion[label].values())
        predicted_as = sum(confusion[g][label] for g in ordered)
        fp, fn = predicted_as - tp, support - tp
        rows.append(
            LabelScores(
                label=label,
                precision=tp / predicted_as if predicted_as else None,
                recall=tp / support if support else None,
                f1=2 * tp / (2 * tp + fp + fn) if tp else 0.0,
                support=support,
                predicted=predicted_as,
            )
        )
        if support or predicted_as:
            f1_of_occurring.append(rows[-1].f1)

    n = len(pairs)
    correct = sum(1 for g, p in pairs if g == p)
    return CategoricalScores(
        n=n,
        unscored=len(gold) - n,
        missing=sum(1 for _, p in pairs if p is None),
        accuracy=correct / n if n else None,
        macro_f1=statistics.fmean(f1_of_occurring) if f1_of_occurring else None,
        labels=tuple(rows),
        confusion=confusion,
    )


def mean_absolute_error(
    gold: Sequence[float | None], predicted: Sequence[float | None]
) -> MeanAbsoluteError:
    """Mean |reference − prediction| over the items with both; the others are counted."""
    pairs = _pairs(gold, predicted)
    errors = [abs(g - p) for g, p in pairs if p is not None]
    return MeanAbsoluteError(
        n=len(errors),
        unscored=len(gold) - len(pairs),
        missing=len(pairs) - len(errors),
        mae=statistics.fmean(errors) if errors else None,
    )


def cohens_kappa(a: Sequence[Label | None], b: Sequence[Label | None]) -> Kappa:
    """Cohen's kappa: agreement of `b` with `a` beyond what chance would give.

    `a` is the reference (the baseline variant when there is no historical output): items it
    has no label for are left out. A missing label in `b` is kept as a category of its own,
    so it disagrees with every label, just as a missing prediction counts as wrong in
    accuracy.

    When both raters put every item in the same single category, expected agreement is 1
    and the formula is 0/0; agreement is perfect, so kappa is reported as 1.0. Kappa is 0
    for agreement at chance level and negative below it.
    """
    pairs: list[tuple[Label, Label | None]] = _pairs(a, b)
    n = len(pairs)
    if not n:
        return Kappa(
            n=0,
            unscored=len(a),
            observed_agreement=None,
            expected_agreement=None,
            kappa=None,
        )
    observed = sum(1 for x, y in pairs if x == y) / n
    count_a: dict[Label | None, int] = {}
    count_b: dict[Label | None, int] = {}
    for x, y in pairs:
        count_a[x] = count_a.get(x, 0) + 1
        count_b[y] = count_b.get(y, 0) + 1
    expected = sum(count_a[k] * count_b.get(k, 0) for k in count_a) / (n * n)
    kappa = 1.0 if expected == 1 else (observed - expected) / (1 - expected)
    return Kappa(
        n=n,
        unscored=len(a) - n,
        observed_agreement=observed,
        expected_agreement=expected,
        kappa=kappa,
    )


def text_lengths(values: Sequence[str | None]) -> TextLengths:
    """Mean and median length in characters of the values present."""
    lengths = [len(v) for v in values if v is not None]
    return TextLengths(
        n=len(lengths),
        missing=len(values) - len(lengths),
        mean_chars=statistics.fmean(lengths) if lengths else None,
        median_chars=float(statistics.median(lengths)) if lengths else None,
    )


def _z(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, not {confidence}")
    return statistics.NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> Interval:
    """Wilson's score interval for the proportion successes / n.

    Unlike the normal approximation it stays within [0, 1] and is not empty at 0 or n
    successes, so it suits small samples and near-perfect accuracies. With n = 0 nothing is
    known and the interval is [0, 1].
    """
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie between 0 and n ({n}), not {successes}")
    z = _z(confidence)
    if n == 0:
        return Interval(0.0, 1.0)
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # At 0 or n successes the bound is exactly 0 or 1; the formula gives it up to rounding.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(low, high)


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, linear between neighbours (numpy's default)."""
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def bootstrap_interval(
    values: Sequence[T],
    statistic: Callable[[Sequence[T]], float],
    *,
    seed: int,
    resamples: int = 1000,
    confidence: float = 0.95,
) -> Interval:
    """The percentile bootstrap interval of `statistic` over `values`.

    `values` are the sampled items (for macro-F1, the (reference, prediction) pairs);
    each of `resamples` resamples draws len(values) of them with replacement and computes
    the statistic, which must return a number for any non-empty resample. The interval is
    the statistics' (1 − confidence)/2 and (1 + confidence)/2 quantiles. The same seed and
    values give the same interval.
    """
    if not values:
        raise ValueError("no values to resample: a bootstrap interval needs at least one item")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, not {resamples}")
    _z(confidence)
    rng = random.Random(seed)
    k = len(values)
    estimates = sorted(float(statistic(rng.choices(values, k=k))) for _ in range(resamples))
    tail = (1 - confidence) / 2
    return Interval(_quantile(estimates, tail), _quantile(estimates, 1 - tail))


def intervals_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two closed intervals share a point (touching counts: no difference shown)."""
    return a[0] <= b[1] and b[0] <= a[1]
