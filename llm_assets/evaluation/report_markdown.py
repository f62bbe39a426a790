"""The eval report as markdown: the comparison table, the recommendation, what-if prices and
confusion matrices, for the asset's page, the CLI and the saved report."""

from collections.abc import Mapping

from llm_assets.evaluation import metrics
from llm_assets.evaluation.report import EvalReport, VariantReport
from llm_assets.util.words import class_words, duration_words


def _usd(amount: float) -> str:
    return f"${amount:,.2f}" if amount >= 1 else f"${amount:.4f}"


def _number(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _interval(interval: metrics.Interval | None) -> str:
    return "" if interval is None else f" ({interval.low:.3f}–{interval.high:.3f})"


def _verdicts(report: EvalReport) -> Mapping[str, str]:
    if report.recommendation is None:
        return {}
    return {v.name: v.verdict for v in report.recommendation.verdicts}


def _comparison_table(report: EvalReport) -> list[str]:
    verdicts = _verdicts(report)
    chosen = report.recommendation.chosen if report.recommendation else None
    lines = [
        f"| variant | model | {report.scoring.metric} (95% interval) | macro-F1 | failure rate "
        "| dead letters | tokens in/out | per 1,000 items | realtime per 1,000 | to last result "
        "| verdict |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for v in report.variants:
        macro = v.categorical.macro_f1 if v.categorical else None
        mark = " **recommended**" if chosen is not None and chosen.name == v.name else ""
        lines.append(
            f"| {v.name} | {v.provider}/{v.model} ({v.prompt_version}) | "
            f"{_number(v.score)}{_interval(v.interval)} | "
            f"{_number(macro)}{_interval(v.macro_f1_interval)} | {v.failure_rate:.1%} | "
            f"{class_words(v.dead_letters_by_class) or 0} | "
            f"{v.input_tokens:,}/{v.output_tokens:,} | {_usd(v.cost_per_1k_items_usd)} | "
            f"{_usd(v.realtime_cost_per_1k_items_usd)} | "
            f"{duration_words(v.seconds_to_last_result)} | {verdicts.get(v.name, '–')}{mark} |"
        )
    return lines


def _confusion(v: VariantReport) -> list[str]:
    if v.categorical is None or not v.categorical.confusion:
        return []
    labels = list(v.categorical.confusion)
    lines = [
        f"**{v.name}** (rows: reference, columns: answer; – no answer)",
        "",
        "| | " + " | ".join(map(str, labels)) + " | – | recall |",
        "|---|" + "---:|" * (len(labels) + 2),
    ]
    recall = {row.label: row.recall for row in v.categorical.labels}
    for gold, row in v.categorical.confusion.items():
        cells = " | ".join(str(row.get(label, 0)) for label in labels)
        lines.append(f"| {gold} | {cells} | {row.get(None, 0)} | {_number(recall.get(gold))} |")
    precision = " | ".join(_number(r.precision) for r in v.categorical.labels)
    lines += [f"| precision | {precision} | | |", ""]
    return lines


def _what_if_table(report: EvalReport) -> list[str]:
    if not any(v.what_if for v in report.variants):
        return []
    lines = [
        "### What the same work costs as other models",
        "",
        "| variant | priced as | tokens in/out | per 1,000 items | realtime per 1,000 | counted |",
        "|---|---|---:|---:|---:|---|",
    ]
    for v in report.variants:
        for price in v.what_if:
            lines.append(
                f"| {v.name} | {price.price_as} | "
                f"{price.input_tokens:,}/{price.output_tokens:,} | "
                f"{_usd(price.batch_cost_per_1k_items_usd)} | "
                f"{_usd(price.realtime_cost_per_1k_items_usd)} | {price.counted} |"
            )
    return [*lines, ""]


def render_markdown(report: EvalReport) -> str:
    days = report.days
    span = f"{days[0]}..{days[-1]}" if len(days) > 1 else str(days[0])
    scoring = report.scoring
    bar = f"score ≥ {report.min_score}" if report.min_score is not None else "no eval.min_score"
    lines = [
        f"## {report.pipeline} eval {report.eval_id}: {span}",
        "",
        f"{report.sample_items} items sampled (seed {report.seed}), the same for every variant. "
        f"`{scoring.field}` ({scoring.kind}) scored against {scoring.against} as "
        f"{scoring.metric}; the bar: {bar}, failure rate ≤ {report.max_failure_rate:.1%}.",
        "",
        *_comparison_table(report),
        "",
    ]
    if report.recommendation is not None:
        lines += ["**Recommendation:** " + report.recommendation.reason, ""]
    lines += [f"- {note}" for note in report.notes]
    if report.notes:
        lines.append("")
    lines += _what_if_table(report)
    confusions = [line for v in report.variants for line in _confusion(v)]
    if confusions:
        lines += ["### Confusion matrices", "", *confusions]
    return "\n".join(lines).rstrip() + "\n"
