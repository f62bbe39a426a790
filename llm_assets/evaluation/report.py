"""The eval report: every variant's answers on the sample, scored, costed and compared.

The scored field (`eval.field`, see spec.scored_field) is read from each variant's validated
outputs in the ledger, item by item over the sample, and scored by its type:

- a label (`isin`, or a bool): accuracy with Wilson's interval, macro-F1, per-label
  precision and recall and the confusion matrix;
- a number: mean absolute error, scored as 1 − MAE / span (the field's `ge`..`le`, else the
  references' range) so that higher is better like the other scores;
- free text: length, and the embedding similarity to the reference with the local model.

Against `eval.reference_field` (a gold answer the snapshot keeps and the model never sees)
when the spec names one; otherwise against the baseline's answers, where labels score
Cohen's kappa. An item without a validated answer (a dead letter, a quality-gate refusal)
counts as wrong for labels and as missing for numbers and text; the failure rate counts it
either way. The recommendation (recommend.py) then picks the cheapest variant that meets
the bar.
"""

import datetime as dt
import json
import statistics
import zoneinfo
from collections.abc import Callable, Sequence
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict

from llm_assets.compliance.policy import COMPLIANCE
from llm_assets.evaluation import metrics, similarity
from llm_assets.evaluation.prices import WhatIfPrice, variant_what_if
from llm_assets.evaluation.recommend import Recommendation, VariantScore, recommend
from llm_assets.evaluation.replay import Replay, VariantRun
from llm_assets.evaluation.variants import BASELINE, failure_rate_limit, scored_field
from llm_assets.items.prepare import as_text
from llm_assets.items.source import parse_date
from llm_assets.resources.ledger import LedgerResource
from llm_assets.resources.pricing import load_price_table
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.words import class_words

Kind = Literal["label", "number", "text"]
NEVER_SENT = ("input", COMPLIANCE)
"""Dead-letter classes of items that were never sent to the model."""
ItemKey = tuple[dt.date, str]
"""An item of the sample: its day and source id."""


class Scoring(BaseModel):
    """What the report scores and how."""

    model_config = ConfigDict(frozen=True)

    field: str
    kind: Kind
    against: str
    """`eval.reference_field`, or "baseline" when the spec names no reference."""
    metric: str
    """What a variant's score is: accuracy, kappa, 1 − MAE/span or similarity."""
    span: float | None = None
    """The range MAE is divided by (numbers)."""


class VariantReport(BaseModel):
    """One variant's work and scores on the sample."""

    name: str
    pipeline: str
    provider: str
    model: str
    prompt_version: str
    code_version: str
    items: int
    succeeded: int
    open_items: int
    dead_letters_by_class: dict[str, int]
    failure_rate: float
    """Items sent that got no validated answer (dead letters after sending: quality,
    deterministic, transient, expired, cancelled) over items sent. Items never sent (input
    and compliance dead letters: the row or the policy, not the model) are left out; the
    dead letters by class count them."""
    input_tokens: int
    output_tokens: int
    cost_usd: float
    cost_per_1k_items_usd: float
    """As billed: batch prices where the variant ran as a batch."""
    realtime_cost_per_1k_items_usd: float
    """The same tokens at the model's realtime prices."""
    seconds_to_last_result: float | None
    score: float | None = None
    """None when the field cannot be scored (free text without the local model)."""
    interval: metrics.Interval | None = None
    n: int = 0
    """Items the score was computed over."""
    categorical: metrics.CategoricalScores | None = None
    macro_f1_interval: metrics.Interval | None = None
    kappa: metrics.Kappa | None = None
    mae: metrics.MeanAbsoluteError | None = None
    lengths: metrics.TextLengths | None = None
    what_if: list[WhatIfPrice] = []
    """The variant's work priced as each `eval.price_as` model."""


class EvalReport(BaseModel):
    """An evaluation's comparison of its variants, and which one to run."""

    pipeline: str
    eval_id: str
    days: list[dt.date]
    sample_items: int
    seed: int
    sample_uri: str
    scoring: Scoring
    min_score: float | None
    max_failure_rate: float
    variants: list[VariantReport]
    recommendation: Recommendation | None
    notes: list[str]
    """What limits the comparison: items without a reference, open items, no text scorer."""

    def variant(self, name: str) -> VariantReport:
        return next(v for v in self.variants if v.name == name)


def _kind(spec: PipelineSpec, field: str) -> Kind:
    if spec.output.format == "text":
        return "text"
    schema = spec.output.output_schema[field]
    if schema.isin or schema.type == "bool":
        return "label"
    return "number" if schema.type in ("int", "float") else "text"


def _coerce(value: Any, spec: PipelineSpec, field: str, kind: Kind) -> Any:
    """A reference or answer as the field's type, so "3" from a CSV equals 3 from the model;
    None for a blank or unreadable value (left unscored)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if kind == "text":
        return as_text(value)
    schema = None if spec.output.format == "text" else spec.output.output_schema[field]
    try:
        if kind == "number":
            return float(value)
        if schema is not None and schema.type == "int" and not isinstance(value, bool):
            return int(value)
        if schema is not None and schema.type == "bool":
            if isinstance(value, str):
                return {"true": True, "false": False}.get(value.strip().lower())
            return bool(value)
    except (TypeError, ValueError):
        return None
    return as_text(value)


def _sample_order(result: Replay) -> list[ItemKey]:
    return [(day, sid) for day in result.sample.days for sid in result.sample.source_ids[day]]


def _sample_records(result: Replay, storage: ArtifactStorage) -> list[dict[str, Any]]:
    """The sampled rows, as the snapshots kept them (bare records: sample.draw_sample)."""
    return [orjson.loads(line) for line in storage.open_lines(result.sample.uri)]


def _outputs(ledger: LedgerResource, run: VariantRun) -> dict[str, str]:
    """Custom id → the variant's validated output (JSON text), over the sample's items."""
    outputs: dict[str, str] = {}
    for day in run.days:
        if day.job_id is None:
            continue
        wanted = set(day.custom_ids)
        outputs.update((c, o) for c, o in ledger.job_outputs(day.job_id) if c in wanted)
    return outputs


def _predictions(
    outputs: dict[str, str],
    run: VariantRun,
    result: Replay,
    spec: PipelineSpec,
    field: str,
    kind: Kind,
) -> list[Any]:
    """The variant's answers in the sample's order; None where it has no validated answer."""
    # The ids the replay recorded (the ledger's); "" (no answer) for a day it has none of.
    by_day = {day.day: day.custom_ids for day in run.days}
    custom_ids = [
        cid
        for day in result.sample.days
        for cid in by_day.get(day) or [""] * len(result.sample.source_ids[day])
    ]
    answers = [json.loads(outputs[c]).get(field) if c in outputs else None for c in custom_ids]
    return [_coerce(answer, spec, field, kind) for answer in answers]


def _span(spec: PipelineSpec, field: str, gold: Sequence[Any]) -> float:
    """What MAE is divided by: the field's declared range, else the references' own."""
    if spec.output.format != "text":
        schema = spec.output.output_schema[field]
        low = schema.ge if schema.ge is not None else schema.gt
        high = schema.le if schema.le is not None else schema.lt
        if low is not None and high is not None and high > low:
            return float(high - low)
    values = [g for g in gold if g is not None]
    spread = max(values) - min(values) if values else 0.0
    return float(spread) if spread > 0 else 1.0


def _bootstrap(
    pairs: Sequence[tuple[Any, Any]], statistic: Callable[[Sequence[Any]], float], seed: int
) -> metrics.Interval | None:
    return metrics.bootstrap_interval(pairs, statistic, seed=seed) if pairs else None


def _macro_f1(labels: Sequence[Any]) -> Callable[[Sequence[tuple[Any, Any]]], float]:
    def statistic(pairs: Sequence[tuple[Any, Any]]) -> float:
        gold, predicted = zip(*pairs, strict=True)
        return metrics.categorical_scores(gold, predicted, labels).macro_f1 or 0.0

    return statistic


def _kappa(pairs: Sequence[tuple[Any, Any]]) -> float:
    gold, predicted = zip(*pairs, strict=True)
    return metrics.cohens_kappa(gold, predicted).kappa or 0.0


def _score_labels(
    gold: list[Any], predicted: list[Any], labels: list[Any], against_baseline: bool, seed: int
) -> dict[str, Any]:
    pairs = [(g, p) for g, p in zip(gold, predicted, strict=True) if g is not None]
    categorical = metrics.categorical_scores(gold, predicted, labels)
    scores: dict[str, Any] = {
        "categorical": categorical,
        "macro_f1_interval": _bootstrap(pairs, _macro_f1(labels), seed),
        "n": categorical.n,
    }
    if against_baseline:
        kappa = metrics.cohens_kappa(gold, predicted)
        return {
            **scores,
            "kappa": kappa,
            "score": kappa.kappa,
            "interval": _bootstrap(pairs, _kappa, seed),
        }
    correct = sum(1 for g, p in pairs if g == p)
    interval = metrics.wilson_interval(correct, categorical.n)
    return {**scores, "score": categorical.accuracy, "interval": interval}


def _score_numbers(gold: list[Any], predicted: list[Any], span: float, seed: int) -> dict[str, Any]:
    mae = metrics.mean_absolute_error(gold, predicted)
    pairs = [
        (g, p) for g, p in zip(gold, predicted, strict=True) if g is not None and p is not None
    ]

    def score(sample: Sequence[tuple[float, float]]) -> float:
        return 1 - min(1.0, statistics.fmean(abs(g - p) for g, p in sample) / span)

    return {
        "mae": mae,
        "n": mae.n,
        "score": score(pairs) if pairs else None,
        "interval": _bootstrap(pairs, score, seed),
    }


def _score_text(
    gold: list[Any], predicted: list[Any], seed: int, notes: list[str]
) -> dict[str, Any]:
    lengths = metrics.text_lengths(predicted)
    if not similarity.local_model_available():
        if similarity.UNAVAILABLE not in notes:
            notes.append(similarity.UNAVAILABLE)
        return {"lengths": lengths}
    cosines = [c for c in similarity.similarities(gold, predicted) if c is not None]
    return {
        "lengths": lengths,
        "n": len(cosines),
        "score": statistics.fmean(cosines) if cosines else None,
        "interval": _bootstrap(
            [(c, c) for c in cosines], lambda s: statistics.fmean(c for c, _ in s), seed
        ),
    }


def _realtime_cost_per_1k(run: VariantRun) -> float:
    price = load_price_table().find(run.provider, run.model)
    if price is None or not run.items:
        return 0.0
    return price.cost_usd(run.input_tokens, run.output_tokens, batch=False) / run.items * 1000


def _variant_report(
    run: VariantRun,
    gold: list[Any],
    predicted: list[Any],
    spec: PipelineSpec,
    scoring: Scoring,
    notes: list[str],
) -> VariantReport:
    seed = spec.eval.seed
    if scoring.kind == "label":
        schema = spec.output.output_schema[scoring.field]
        labels = list(schema.isin or [True, False])
        against_baseline = scoring.against == BASELINE
        scores = _score_labels(gold, predicted, labels, against_baseline, seed)
    elif scoring.kind == "number":
        scores = _score_numbers(gold, predicted, scoring.span or 1.0, seed)
    else:
        scores = _score_text(gold, predicted, seed, notes)
    never_sent = sum(n for c, n in run.dead_letters_by_class.items() if c in NEVER_SENT)
    sent = run.items - never_sent - run.open_items
    failed = sent - run.succeeded
    return VariantReport(
        name=run.variant,
        pipeline=run.pipeline,
        provider=run.provider,
        model=run.model,
        prompt_version=run.prompt_version,
        code_version=run.code_version,
        items=run.items,
        succeeded=run.succeeded,
        open_items=run.open_items,
        dead_letters_by_class=run.dead_letters_by_class,
        failure_rate=failed / sent if sent > 0 else 0.0,
        input_tokens=run.input_tokens,
        output_tokens=run.output_tokens,
        cost_usd=run.cost_usd,
        cost_per_1k_items_usd=run.cost_per_1000_items,
        realtime_cost_per_1k_items_usd=_realtime_cost_per_1k(run),
        seconds_to_last_result=run.seconds_to_last_result,
        **scores,
    )


def _scored(spec: PipelineSpec) -> tuple[str, Kind]:
    field = scored_field(spec)
    if field is None:
        raise ValueError(
            f"{spec.name}: the output has several fields and none lists isin; name the one to "
            "score in eval.field"
        )
    return field, _kind(spec, field)


def _scoring(spec: PipelineSpec, field: str, kind: Kind, gold: Sequence[Any]) -> Scoring:
    against = spec.eval.reference_field or BASELINE
    if kind == "label":
        metric = "kappa" if against == BASELINE else "accuracy"
    elif kind == "number":
        metric = "1 − MAE/span"
    else:
        metric = "similarity"
    span = _span(spec, field, gold) if kind == "number" else None
    return Scoring(field=field, kind=kind, against=against, metric=metric, span=span)


def _recommendation(spec: PipelineSpec, reports: list[VariantReport]) -> Recommendation | None:
    scored = [r for r in reports if r.score is not None and r.interval is not None]
    if len(scored) < len(reports) or any(r.open_items for r in reports):
        return None
    return recommend(
        [
            VariantScore(
                name=r.name,
                score=r.score,
                interval=r.interval,
                failure_rate=r.failure_rate,
                cost_per_1k_items_usd=r.cost_per_1k_items_usd,
                realtime_cost_per_1k_items_usd=r.realtime_cost_per_1k_items_usd,
                is_baseline=r.name == BASELINE,
                n=r.n,
            )
            for r in scored
            if r.score is not None and r.interval is not None
        ],
        min_score=spec.eval.min_score or 0.0,
        max_failure_rate=failure_rate_limit(spec),
    )


def build_report(
    spec: PipelineSpec, result: Replay, ledger: LedgerResource, storage: ArtifactStorage
) -> EvalReport:
    """Score every variant of a replay (see the module docstring) and recommend one.

    `spec` is the pipeline's own spec (the baseline's scoring rules apply to every variant).
    The recommendation is None while items are still open or a variant has no score."""
    notes: list[str] = []
    field, kind = _scored(spec)
    records = _sample_records(result, storage)
    outputs = {name: _outputs(ledger, run) for name, run in result.variants.items()}
    predictions = {
        name: _predictions(outputs[name], run, result, spec, field, kind)
        for name, run in result.variants.items()
    }
    reference_field = spec.eval.reference_field
    if reference_field is None:
        gold = predictions[BASELINE]
    else:
        tz = zoneinfo.ZoneInfo(spec.partitions.timezone)
        found = {
            (
                parse_date(record.get(spec.source.date_field), tz),
                as_text(record.get(spec.source.id_field)),
            ): record.get(reference_field)
            for record in records
        }
        gold = [_coerce(found.get(key), spec, field, kind) for key in _sample_order(result)]
        missing = gold.count(None)
        if missing:
            notes.append(
                f"{missing} of {len(gold)} sampled items have no {reference_field!r} and are "
                "not scored (their rows lack it, or their day's snapshot was taken before "
                "eval.reference_field was set: materialize input_snapshot again for that day)"
            )
    scoring = _scoring(spec, field, kind, gold)
    reports = [
        _variant_report(run, gold, predictions[name], spec, scoring, notes)
        for name, run in result.variants.items()
    ]
    if spec.eval.price_as:
        for report in reports:
            run = result.variants[report.name]
            variant = result.specs[report.name]
            report.what_if = variant_what_if(
                spec, run, variant, records, outputs[report.name], ledger
            )
    still_open = {r.name: r.open_items for r in reports if r.open_items}
    if still_open:
        notes.append(
            f"items still open ({class_words(still_open)}): no recommendation until every "
            "answer is in; run the eval again to carry on"
        )
    return EvalReport(
        pipeline=spec.name,
        eval_id=result.sample.eval_id,
        days=result.sample.days,
        sample_items=result.sample.items,
        seed=result.sample.seed,
        sample_uri=result.sample.uri,
        scoring=scoring,
        min_score=spec.eval.min_score,
        max_failure_rate=failure_rate_limit(spec),
        variants=reports,
        recommendation=_recommendation(spec, reports),
        notes=notes,
    )
