"""Asset checks: names are constants; ERROR checks gate, WARN checks advise."""

from collections.abc import Sequence
from typing import Any

import dagster as dg

from llm_assets.defs.metadata import rate, rates, usd
from llm_assets.resources.ledger import JobCounts
from llm_assets.results import quality
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps.budget import BudgetGate
from llm_assets.steps.compliance import ComplianceGate
from llm_assets.steps.reports import Drift
from llm_assets.steps.tables import case_table, shown_of
from llm_assets.steps.validate import ValidateResult

NO_MISSING_RESULTS = "no_missing_results"
NO_DUPLICATE_RESULTS = "no_duplicate_results"
SOURCE_ROWS = "source_rows"


def id_table(custom_ids: Sequence[str], limit: int = 20, what: str = "items") -> str:
    shown = custom_ids[:limit]
    rows = "\n".join(f"| {cid} |" for cid in shown)
    return f"{shown_of(len(shown), len(custom_ids), what)}\n\n| custom_id |\n|---|\n{rows}"


def source_rows_check_spec(key: dg.AssetKey) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(
        SOURCE_ROWS,
        asset=key,
        description="The day has source rows; a day without any is skipped after the snapshot "
        "(WARN).",
    )


def source_rows_check(rows: int, no_rows_reason: str) -> dg.AssetCheckResult:
    """Fails (WARN) on a day with no source rows, so the UI shows the day as empty, not done."""
    return _result(
        SOURCE_ROWS, rows > 0, dg.AssetCheckSeverity.WARN, {"rows": rows}, no_rows_reason
    )


NO_STUCK_BATCHES = "no_stuck_batches"


def stuck_check_spec(key: dg.AssetKey) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(
        NO_STUCK_BATCHES,
        asset=key,
        description="No batch of the day waits to start far longer than the model's recent "
        "batches did (WARN; the batch-status sensor reports one as it finds it).",
    )


def stuck_check(stuck_batches: int, words: str | None) -> dg.AssetCheckResult:
    """Fails (WARN) while batches of the day wait to start far longer than usual."""
    return _result(
        NO_STUCK_BATCHES,
        stuck_batches == 0,
        dg.AssetCheckSeverity.WARN,
        {"stuck_batches": stuck_batches},
        words,
    )


def batch_results_check_specs(key: dg.AssetKey) -> list[dg.AssetCheckSpec]:
    return [
        dg.AssetCheckSpec(
            NO_MISSING_RESULTS,
            asset=key,
            description="Once the job is terminal, every item that was sent has a result.",
        ),
        dg.AssetCheckSpec(
            NO_DUPLICATE_RESULTS,
            asset=key,
            description="The provider sent no custom_id twice in this import.",
        ),
    ]


def _result(
    name: str,
    passed: bool,
    severity: dg.AssetCheckSeverity,
    metadata: dict[str, Any],
    failure: str | None = None,
) -> dg.AssetCheckResult:
    """One check's result; `failure` says what went wrong and is shown only when it failed."""
    return dg.AssetCheckResult(
        check_name=name,
        passed=passed,
        severity=severity,
        metadata=metadata,
        description=None if passed else failure,
    )


def missing_results_check(missing: Sequence[str], counts: JobCounts) -> dg.AssetCheckResult:
    terminal = counts.total > 0 and counts.open == 0
    return _result(
        NO_MISSING_RESULTS,
        not missing,
        dg.AssetCheckSeverity.ERROR,
        {
            "job_terminal": terminal,
            "missing_results": len(missing),
            "open_items": counts.open,
            **({"custom_ids": dg.MetadataValue.md(id_table(missing))} if missing else {}),
        },
        f"{len(missing)} items were sent and never answered",
    )


def duplicate_results_check(duplicates: int, custom_ids: Sequence[str]) -> dg.AssetCheckResult:
    return _result(
        NO_DUPLICATE_RESULTS,
        duplicates == 0,
        dg.AssetCheckSeverity.WARN,
        {
            "duplicate_lines": duplicates,
            **({"custom_ids": dg.MetadataValue.md(id_table(custom_ids))} if custom_ids else {}),
        },
    )


OUTPUT_SCHEMA = "output_schema"
QUALITY_FAILURE_RATE = "quality_failure_rate"
OUTPUTS_COMPLETE = "outputs_complete"
LOW_CONFIDENCE_SHARE = "low_confidence_share"
LABEL_DISTRIBUTION_SHIFT = "label_distribution_shift"
BLOCKING_CHECKS = (OUTPUT_SCHEMA, QUALITY_FAILURE_RATE, OUTPUTS_COMPLETE)
"""The quality gate: when one of these fails (ERROR), the day is not published. Dagster does
not enforce them as `blocking` (which fails the run): published_outputs and qa_sample skip
the day with the reason the validation recorded (steps/gate.py), so a gated day reads
"blocked by quality_failure_rate (25.8% > 5.0%)", not as a crashed run."""
BLOCKS_PUBLICATION = "blocks_publication"
"""Metadata of a failed gate check: the phrase the gate record, the UI and the CLI show."""


def validated_outputs_check_specs(spec: PipelineSpec, key: dg.AssetKey) -> list[dg.AssetCheckSpec]:
    specs = [
        dg.AssetCheckSpec(
            OUTPUT_SCHEMA,
            asset=key,
            description="Gates publication: the published Parquet passes the pandera schema "
            "built from the spec.",
        ),
        dg.AssetCheckSpec(
            QUALITY_FAILURE_RATE,
            asset=key,
            description="Gates publication: quality dead letters stay within "
            "quality.max_failure_rate.",
        ),
        dg.AssetCheckSpec(
            OUTPUTS_COMPLETE,
            asset=key,
            description="Gates publication: every item is terminal and every sent item has a "
            "result.",
        ),
    ]
    if quality.confidence_field(spec) and spec.quality.min_confidence is not None:
        specs.append(
            dg.AssetCheckSpec(
                LOW_CONFIDENCE_SHARE,
                asset=key,
                description="Share of rows below quality.min_confidence (WARN).",
            )
        )
    if quality.label_field(spec):
        specs.append(
            dg.AssetCheckSpec(
                LABEL_DISTRIBUTION_SHIFT,
                asset=key,
                description="Label distribution against recent partitions (WARN).",
            )
        )
    return specs


def validated_outputs_checks(
    spec: PipelineSpec, result: ValidateResult, schema_failures: Sequence[dict[str, Any]]
) -> list[dg.AssetCheckResult]:
    """Check results of one validated_outputs materialization (see validate_outputs)."""
    checks = [
        _output_schema_check(schema_failures),
        _quality_failure_rate_check(spec, result),
        _outputs_complete_check(result),
    ]
    if quality.confidence_field(spec) and spec.quality.min_confidence is not None:
        checks.append(_low_confidence_check(spec, result))
    if quality.label_field(spec):
        checks.append(_label_shift_check(spec, result))
    return checks


def _output_schema_check(schema_failures: Sequence[dict[str, Any]]) -> dg.AssetCheckResult:
    failing = len(schema_failures)
    return _gate_result(
        OUTPUT_SCHEMA,
        not schema_failures,
        {
            "failing_rows": failing,
            "failure_cases": dg.MetadataValue.md(
                case_table(schema_failures, total=failing, what="failing rows")
            ),
        },
        "the published frame breaks the schema",
        f"{failing} rows break the schema",
    )


def _quality_failure_rate_check(spec: PipelineSpec, result: ValidateResult) -> dg.AssetCheckResult:
    limit = spec.quality.max_failure_rate
    cases = case_table(
        result.failure_cases, total=result.quality_dead_letters, what="quality failures"
    )
    return _gate_result(
        QUALITY_FAILURE_RATE,
        result.failure_rate <= limit,
        {
            "failure_rate": rate(result.failure_rate),
            "max_failure_rate": limit,
            "quality_dead_letters": result.quality_dead_letters,
            "valid_rows": result.valid_rows,
            "failures_by_rule": result.quality_failures,
            "failure_cases": dg.MetadataValue.md(cases),
        },
        f"quality failure rate {result.failure_rate:.1%} is over "
        f"quality.max_failure_rate {limit:.1%}",
        f"{result.failure_rate:.1%} > {limit:.1%}",
    )


def _outputs_complete_check(result: ValidateResult) -> dg.AssetCheckResult:
    missing = len(result.missing_results)
    return _gate_result(
        OUTPUTS_COMPLETE,
        result.open_items == 0 and not missing,
        {
            "open_items": result.open_items,
            "missing_results": missing,
            "custom_ids": dg.MetadataValue.md(
                id_table(result.missing_results, what="items never answered")
            ),
        },
        f"{result.open_items} items still open, {missing} never answered",
        ", ".join(
            part
            for part, count in (
                (f"{result.open_items} items open", result.open_items),
                (f"{missing} items never answered", missing),
            )
            if count
        ),
    )


def _gate_result(
    name: str, passed: bool, metadata: dict[str, Any], failure: str, measured: str
) -> dg.AssetCheckResult:
    """A gate check's result (ERROR); when it fails, `blocks_publication` names the check and
    what was measured: "quality_failure_rate (25.8% > 5.0%)"."""
    blocks = {} if passed else {BLOCKS_PUBLICATION: f"{name} ({measured})"}
    return _result(name, passed, dg.AssetCheckSeverity.ERROR, {**metadata, **blocks}, failure)


def publication_blockers(results: Sequence[dg.AssetCheckResult]) -> list[str]:
    """The phrases of the gate checks that failed, in check order."""
    found = []
    for result in results:
        phrase = result.metadata.get(BLOCKS_PUBLICATION)
        if phrase is not None and not result.passed:
            found.append(str(getattr(phrase, "value", phrase)))
    return found


def _low_confidence_check(spec: PipelineSpec, result: ValidateResult) -> dg.AssetCheckResult:
    share = (result.low_confidence_rows or 0) / result.valid_rows if result.valid_rows else 0.0
    return _result(
        LOW_CONFIDENCE_SHARE,
        share <= spec.quality.max_low_confidence_share,
        dg.AssetCheckSeverity.WARN,
        {
            "share_below_min_confidence": rate(share),
            "rows_below_min_confidence": result.low_confidence_rows or 0,
            "min_confidence": spec.quality.min_confidence,
            "max_low_confidence_share": spec.quality.max_low_confidence_share,
        },
    )


def _label_shift_check(spec: PipelineSpec, result: ValidateResult) -> dg.AssetCheckResult:
    """Passes with total_variation null and a `not_compared` sentence when there is nothing
    to compare: no earlier outputs, or no valid rows today."""
    shift = result.label_shift
    window = spec.quality.shift_window
    if shift is not None:
        compared: dict[str, Any] = {
            "total_variation": rate(shift),
            "baseline": rates(result.baseline_distribution),
        }
    elif not result.baseline_distribution:
        compared = {
            "total_variation": None,
            "not_compared": f"no earlier days to compare with: none of the last {window} "
            "partition(s) has validated outputs",
        }
    else:
        compared = {
            "total_variation": None,
            "not_compared": "no valid rows on this day to compare with the earlier days",
            "baseline": rates(result.baseline_distribution),
        }
    return _result(
        LABEL_DISTRIBUTION_SHIFT,
        shift is None or shift <= spec.quality.max_label_shift,
        dg.AssetCheckSeverity.WARN,
        {
            **compared,
            "baseline_partitions": window,
            "distribution": rates(result.label_distribution),
        },
    )


BUDGET = "budget"
COMPLIANCE = "compliance"
COST_DRIFT = "cost_drift"
CHECK_GATES = {BUDGET: "budget", COMPLIANCE: "compliance"}
"""Blocking checks that are not quality checks, by the gate the CLI names (exit code 2)."""


def budget_check_spec(key: dg.AssetKey) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(
        BUDGET,
        asset=key,
        blocking=True,
        description="The day's upper-bound cost is within budget.max_usd_per_partition, or "
        "approved; nothing is submitted otherwise.",
    )


def budget_check(gate: BudgetGate) -> dg.AssetCheckResult:
    """The result of steps.budget_gate as a blocking check; the limit and the approval are
    left out when the spec sets no limit or nobody approved the day (`reason` says which)."""
    limit = {} if gate.limit_usd is None else {"max_usd_per_partition": gate.limit_usd}
    approval = (
        {}
        if gate.approved_usd is None
        else {"approved_usd": gate.approved_usd, "approved_by": gate.approved_by or ""}
    )
    return _result(
        BUDGET,
        gate.passed,
        dg.AssetCheckSeverity.ERROR,
        {"upper_bound_usd": usd(gate.committed_usd), **limit, **approval, "reason": gate.reason},
        gate.reason,
    )


def compliance_check_spec(key: dg.AssetKey) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(
        COMPLIANCE,
        asset=key,
        blocking=True,
        description="Items blocked by the personal-data policy (compliance.pii) are within "
        "compliance.max_blocked_rate; nothing is submitted otherwise.",
    )


def compliance_check(gate: ComplianceGate, personal_data: dict[str, int]) -> dg.AssetCheckResult:
    """steps.compliance_gate as a blocking check, with what this run found by entity type
    and action (counts only, never values)."""
    return _result(
        COMPLIANCE,
        gate.passed,
        dg.AssetCheckSeverity.ERROR,
        {
            "blocked_items": gate.blocked,
            "items": gate.items,
            "blocked_rate": rate(gate.rate),
            "max_blocked_rate": gate.max_blocked_rate,
            "personal_data_found": personal_data,
            "reason": gate.reason,
        },
        gate.reason,
    )


def cost_drift_check_spec(key: dg.AssetKey) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(
        COST_DRIFT,
        asset=key,
        description="Tokens and cost per item stay within budget.drift_factor of the trailing "
        "median of the last budget.history_window partitions (WARN).",
    )


def cost_drift_check(drift: Drift) -> dg.AssetCheckResult:
    """Passes with a `not_compared` sentence when there is no history to compare with."""
    rows = [
        {
            "metric": name,
            "this partition": f"{value:.6g}",
            "trailing median": f"{drift.median[name]:.6g}" if name in drift.median else "",
            "ratio": f"{drift.ratio[name]:.3f}" if name in drift.ratio else "",
        }
        for name, value in drift.current.items()
    ]
    if not drift.current:
        why = {"not_compared": "no succeeded items on this day to compare"}
    elif not drift.history:
        why = {
            "not_compared": f"no earlier days to compare with: none of the last {drift.window} "
            "partition(s) has succeeded items"
        }
    else:
        why = {}
    return _result(
        COST_DRIFT,
        not drift.drifted,
        dg.AssetCheckSeverity.WARN,
        {
            **why,
            # Left out when nothing drifted, as every key with nothing to say.
            **({"drifted": ", ".join(drift.drifted)} if drift.drifted else {}),
            "history_partitions": drift.history,
            "drift_factor": drift.factor,
            **{f"ratio_{name}": rate(ratio) for name, ratio in drift.ratio.items()},
            "comparison": dg.MetadataValue.md(case_table(rows)),
        },
        f"{', '.join(drift.drifted)} moved more than {drift.factor}x from the trailing "
        f"median of {drift.history} partition(s)",
    )
