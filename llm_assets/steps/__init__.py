"""What each asset does, as plain functions over the ledger, storage and a provider.

Assets (defs/factory.py), the CLI, the sensors and the benchmarks call these with one
StepContext (pipeline spec, day, ledger, storage, provider). Keeping them free of Dagster
makes each step's idempotency easy to see and to test: every step can run again at any point
and converges on the same ledger state. One module per stage:

- context: StepContext, the job and snapshot lookups, the gate and prerequisite errors
- snapshot: input_snapshot
- build: request_shards, the day's shards built in one step or in slices and joined
- shards: the shard writing and the estimator the build, retry and requeue rounds share
- submit: provider_batches
- admission: a shard admitted under the provider's quota, what refusals teach, the wait
- quota: the pure rules by which a provider's quota is learned
- stuck: batches that wait to start far longer than the model's recent ones
- budget: the budget gates of a submission, and the hold a refusing gate puts on shards
- compliance: the day's share of items the personal-data policy blocked, as a gate
- residency: the residency gate (compliance.allowed_regions) of the steps that write or send
- pause: a paused pipeline, which provider_batches refuses to submit for
- online: the online worker that provider_batches runs for shards sent one by one
- imports: batch_results (poll, import, retry planning) and the requeue of dead letters
- day_model: a day's state as the lifecycle reads it, and its decision (plain values)
- lifecycle: what happens next to a day, decided from the ledger's state (pure)
- executor: the day's state read from the ledger, the lifecycle's actions carried out, the
  one loop that drives days and waits between rounds
- polling: status polls of in-flight batches, several at a time, within a deadline on a path
  that must answer in time
- in_process: the lifecycle's heavy actions run as step calls in this process (evals)
- cancel: an operator's cancel of a day or of some of its shards
- line_ids: request lines read back from shard files by custom_id
- validate: validated_outputs, in one step or in slices and joined
- judge: the quality gate's judgment of results (pydantic per row, pandera per frame)
- gate: the publication gate's record (what the latest validation blocked)
- reports: dead_letter, cost_report, published_outputs, qa_sample

The names below are importable from the package (`steps.build_shards`); each is loaded from
its module on first use, so a command that reads one step's result does not import pandas,
pandera and boto3 with the others.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_assets.steps.budget import (
        BudgetGate,
        budget_gate,
        hold_for_gate,
    )
    from llm_assets.steps.build import (
        build_shards,
        build_slice,
        join_slices,
    )
    from llm_assets.steps.cancel import (
        CancelResult,
        cancel_day,
    )
    from llm_assets.steps.compliance import (
        ComplianceGate,
        compliance_gate,
    )
    from llm_assets.steps.context import (
        DayExpired,
        GateBlocked,
        MissingPrerequisite,
        StepContext,
        current_snapshot_uri,
        existing_job,
        job_for,
        job_id_of,
        price_for,
        refuse_expired,
    )
    from llm_assets.steps.day_model import (
        Action,
        DayState,
        Decision,
        Step,
    )
    from llm_assets.steps.estimate import Estimate, Estimator, ShardEstimate
    from llm_assets.steps.executor import (
        DayDriver,
        StepRuns,
        drive,
        load_state,
    )
    from llm_assets.steps.gate import (
        UNFINISHED,
        GateRecord,
        gate_record,
        publication_block,
        record_gate,
        settled_block,
    )
    from llm_assets.steps.imports import (
        ImportResult,
        RequeueResult,
        import_results,
        plan_retries,
        requeue_dead_letters,
        retry_backoff,
    )
    from llm_assets.steps.lifecycle import decide
    from llm_assets.steps.line_ids import (
        line_custom_id,
        lines_with_ids,
        request_lines,
    )
    from llm_assets.steps.online import (
        OnlineInterrupted,
        ledger_row,
        run_online_shard,
    )
    from llm_assets.steps.pause import (
        PAUSED,
        PipelinePaused,
        pause_reason,
        pause_words,
        paused_text,
        refuse_if_paused,
        resume_words,
    )
    from llm_assets.steps.polling import poll_shards
    from llm_assets.steps.reports import (
        CostReport,
        DeadLetterResult,
        Drift,
        PublishResult,
        SampleResult,
        cost_drift,
        cost_report,
        export_dead_letters,
        publish_outputs,
        published_frame_failures,
        qa_sample,
        validated_uri,
    )
    from llm_assets.steps.residency import (
        RESIDENCY,
        refuse_outside_regions,
        residency_places,
    )
    from llm_assets.steps.shards import (
        ShardsResult,
        line_offsets,
        shards_for,
    )
    from llm_assets.steps.snapshot import (
        SnapshotResult,
        no_source_rows,
        no_source_rows_reason,
        snapshot_sources,
        take_snapshot,
    )
    from llm_assets.steps.submit import (
        SubmitResult,
        submit_shards,
    )
    from llm_assets.steps.validate import (
        ValidateResult,
        forget_slice,
        join_validation,
        validate_outputs,
        validate_slice,
    )

_EXPORTS: dict[str, tuple[str, ...]] = {
    "budget": ("BudgetGate", "budget_gate", "hold_for_gate"),
    "cancel": ("CancelResult", "cancel_day"),
    "compliance": ("ComplianceGate", "compliance_gate"),
    "context": (
        "DayExpired",
        "GateBlocked",
        "MissingPrerequisite",
        "StepContext",
        "current_snapshot_uri",
        "existing_job",
        "job_for",
        "job_id_of",
        "price_for",
        "refuse_expired",
    ),
    "executor": ("DayDriver", "StepRuns", "drive", "load_state"),
    "polling": ("poll_shards",),
    "gate": (
        "UNFINISHED",
        "GateRecord",
        "gate_record",
        "publication_block",
        "record_gate",
        "settled_block",
    ),
    "imports": (
        "ImportResult",
        "RequeueResult",
        "import_results",
        "plan_retries",
        "requeue_dead_letters",
        "retry_backoff",
    ),
    "day_model": ("Action", "DayState", "Decision", "Step"),
    "lifecycle": ("decide",),
    "line_ids": ("line_custom_id", "lines_with_ids", "request_lines"),
    "online": ("OnlineInterrupted", "ledger_row", "run_online_shard"),
    "pause": (
        "PAUSED",
        "PipelinePaused",
        "pause_reason",
        "pause_words",
        "paused_text",
        "refuse_if_paused",
        "resume_words",
    ),
    "reports": (
        "CostReport",
        "DeadLetterResult",
        "Drift",
        "PublishResult",
        "SampleResult",
        "cost_drift",
        "cost_report",
        "export_dead_letters",
        "publish_outputs",
        "published_frame_failures",
        "qa_sample",
        "validated_uri",
    ),
    "residency": ("RESIDENCY", "refuse_outside_regions", "residency_places"),
    "estimate": ("Estimate", "Estimator", "ShardEstimate"),
    "shards": (
        "ShardsResult",
        "line_offsets",
        "shards_for",
    ),
    "build": ("build_shards", "build_slice", "join_slices"),
    "snapshot": (
        "SnapshotResult",
        "no_source_rows",
        "no_source_rows_reason",
        "snapshot_sources",
        "take_snapshot",
    ),
    "submit": ("SubmitResult", "submit_shards"),
    "validate": (
        "ValidateResult",
        "forget_slice",
        "join_validation",
        "validate_outputs",
        "validate_slice",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
