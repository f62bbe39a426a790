"""Why a Dagster run of a day failed, said the same way on every path: the CLI's runs
(`StepFailed`, `failure_of`), the sensors' view of the code location's runs (`failure_reason`,
`day_busy`) and the day summary a cost report carries (`reported_summary`)."""

from collections.abc import Sequence

import dagster as dg
from dagster._core.execution.execution_result import ExecutionResult

from llm_assets.defs.checks import CHECK_GATES
from llm_assets.defs.metadata import DAY_SUMMARY_JSON
from llm_assets.steps import notify


class StepFailed(Exception):
    """The day cannot go on: a Dagster run of it failed (`run_id`), or a pause or a gate
    stopped it between runs. `gate` is set when a gate blocked it (CLI exit code 2)."""

    def __init__(
        self,
        message: str,
        gate: str | None = None,
        *,
        run_id: str | None = None,
        reason: str | None = None,
        day_busy: bool = False,
    ) -> None:
        self.gate = gate
        self.run_id = run_id
        self.reason = reason or message
        """What went wrong as the day's failed summary says it (`failure_reason`)."""
        self.day_busy = day_busy
        """Every failed step found the day held by another run: that run's outcome is the
        day's, not this failure."""
        super().__init__(message)


def failure_of(result: ExecutionResult) -> StepFailed:
    gate: str | None
    failed_checks = [
        e
        for e in result.get_asset_check_evaluations()
        if not e.passed and e.severity == dg.AssetCheckSeverity.ERROR
    ]
    step_failures = [event for event in result.all_events if event.is_step_failure]
    run_failure = next(
        (e.message for e in result.all_events if e.event_type == dg.DagsterEventType.RUN_FAILURE),
        None,
    )
    reason = failure_reason(failed_checks, step_failures, run_failure)
    busy = day_busy(step_failures)

    def failed(message: str, gate: str | None = None) -> StepFailed:
        return StepFailed(message, gate, run_id=result.run_id, reason=reason, day_busy=busy)

    if failed_checks:
        gate = next(
            (CHECK_GATES[e.check_name] for e in failed_checks if e.check_name in CHECK_GATES),
            "quality",
        )
        reasons = "; ".join(
            f"{e.asset_key.to_user_string()} check {e.check_name} failed"
            + (f": {e.description}" if e.description else "")
            for e in failed_checks
        )
        return failed(f"{gate} gate: {reasons}", gate)
    for event in step_failures:
        gate_value = failure_metadata(event).get("gate")
        gate = gate_value if isinstance(gate_value, str) else None
        return failed(f"{event.step_key}: {step_failure_reason(event)}", gate)
    return failed(f"run {result.run_id} failed")


def failure_reason(
    failed_checks: Sequence[dg.AssetCheckEvaluation],
    step_failures: Sequence[dg.DagsterEvent],
    run_failure: str | None = None,
) -> str | None:
    """Why a run failed, as a day's failed summary says it on every path: the failed checks
    and what they said, else the failed steps and why, else the run's own failure message."""
    if failed_checks:
        return "; ".join(
            f"{e.asset_key.to_user_string()} check {e.check_name} failed"
            + (f": {e.description[:300]}" if e.description else "")
            for e in failed_checks
        )
    if step_failures:
        return "; ".join(f"{e.step_key}: {step_failure_reason(e)[:300]}" for e in step_failures)
    return run_failure


def failure_metadata(event: dg.DagsterEvent) -> dict[str, object]:
    """The metadata a failed step's dg.Failure carried (empty for an error)."""
    data = event.step_failure_data
    if data is None or data.user_failure_data is None:
        return {}
    return {
        name: getattr(value, "value", value)
        for name, value in data.user_failure_data.metadata.items()
    }


def day_busy(step_failures: Sequence[dg.DagsterEvent]) -> bool:
    """Whether every failed step found the day held by another run (`day_busy`): that run's
    outcome is the day's, not this failure."""
    return bool(step_failures) and all(
        failure_metadata(event).get("day_busy") for event in step_failures
    )


def reported_summary(record: dg.EventLogRecord) -> notify.PartitionSummary | None:
    """The day's summary a cost report carries as metadata (None for a report without)."""
    materialization = record.asset_materialization
    value = materialization.metadata.get(DAY_SUMMARY_JSON) if materialization else None
    if value is None:
        return None
    return notify.PartitionSummary.model_validate(value.value)


def step_failure_reason(event: dg.DagsterEvent) -> str:
    """What a failed step says went wrong: our Failure's description, else the real error."""
    data = event.step_failure_data
    if data.user_failure_data is not None and data.user_failure_data.description:
        return data.user_failure_data.description
    if data.error is not None:
        # The step error wraps the real one; the cause says what went wrong.
        return (data.error.cause or data.error).message.strip()
    return event.message or "failed"
