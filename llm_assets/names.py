"""Every name that ties the parts together: a pipeline's assets, jobs, ops, sensors and
schedules, the run keys its sensors and schedule give, and the run tags everything reads.

The Dagster wiring (defs/), the command line, the replay and the steps' messages all name
things through here, so that no part imports another to learn a name. Plain strings: no
Dagster import and no import of ours, so even the steps can name a job in a message.
"""

import hashlib

# A pipeline's assets (key `[pipeline, asset]`), in the order a day goes through them.
INPUT_SNAPSHOT = "input_snapshot"
REQUEST_SHARDS = "request_shards"
PROVIDER_BATCHES = "provider_batches"
BATCH_RESULTS = "batch_results"
VALIDATED_OUTPUTS = "validated_outputs"
PUBLISHED_OUTPUTS = "published_outputs"
QA_SAMPLE = "qa_sample"
DEAD_LETTER = "dead_letter"
COST_REPORT = "cost_report"
EVAL_REPORT = "eval_report"
ASSETS = (
    INPUT_SNAPSHOT,
    REQUEST_SHARDS,
    PROVIDER_BATCHES,
    BATCH_RESULTS,
    VALIDATED_OUTPUTS,
    PUBLISHED_OUTPUTS,
    QA_SAMPLE,
    DEAD_LETTER,
    COST_REPORT,
)
"""A day's assets; the eval report is the pipeline's, not a day's."""
SUBMIT_ASSETS = (INPUT_SNAPSHOT, REQUEST_SHARDS, PROVIDER_BATCHES)
IMPORT_ASSETS = (BATCH_RESULTS,)
GATED_ASSETS = (VALIDATED_OUTPUTS, PUBLISHED_OUTPUTS, QA_SAMPLE)
REPORT_ASSETS = (DEAD_LETTER, COST_REPORT)


def asset_path(pipeline: str, asset: str) -> list[str]:
    """The asset key's path: `[pipeline, asset]`."""
    return [pipeline, asset]


def asset_op(pipeline: str, asset: str) -> str:
    return f"{pipeline}__{asset}"


# Jobs and their ops, one set per pipeline.
LIFECYCLE_JOBS = {
    "build": "submit",
    "submit": "send",
    "import": "import",
    "validate": "finish",
    "report": "report",
}
"""The job of each of the lifecycle's heavy actions (steps.Step's values), after the pipeline."""


def lifecycle_job(pipeline: str, action: str) -> str:
    """The job that carries out a lifecycle action for one of the pipeline's days:
    `<pipeline>__submit` (snapshot, shards, submission), `__send` (shards due again),
    `__import` (import, then finish the day when nothing is open), `__finish` (validate,
    publish, report), `__report`."""
    return f"{pipeline}__{LIFECYCLE_JOBS[action]}"


def submit_job(pipeline: str) -> str:
    """Snapshot, shard and submit a day (the schedule's and a backfill's job)."""
    return lifecycle_job(pipeline, "build")


def cancel_job(pipeline: str) -> str:
    return f"{pipeline}__cancel"


def cancel_op(pipeline: str) -> str:
    return f"{pipeline}__cancel_day"


def pause_job(pipeline: str) -> str:
    return f"{pipeline}__pause"


def pause_op(pipeline: str) -> str:
    return f"pause_{pipeline}"


def resume_job(pipeline: str) -> str:
    return f"{pipeline}__resume"


def resume_op(pipeline: str) -> str:
    return f"resume_{pipeline}"


def eval_job(pipeline: str) -> str:
    return f"{pipeline}__eval"


def eval_op(pipeline: str) -> str:
    return f"{pipeline}__eval_replay"


def evals(pipeline: str) -> str:
    """The eval report's group and its partitions (one partition an eval)."""
    return f"{pipeline}__evals"


def retention_job(pipeline: str) -> str:
    return f"{pipeline}__retention"


def retention_op(pipeline: str) -> str:
    return f"{pipeline}__apply_retention"


# Schedules and sensors.
def submit_schedule(pipeline: str) -> str:
    return f"{pipeline}__schedule"


def retention_schedule(pipeline: str) -> str:
    return f"{pipeline}__retention_schedule"


def batch_status_sensor(pipeline: str) -> str:
    return f"{pipeline}__batch_status"


def new_data_sensor(pipeline: str) -> str:
    return f"{pipeline}__new_data"


def outcome_sensor(outcome: str) -> str:
    """The code location's sensor announcing days that `finished` or `failed`."""
    return f"llm_assets__partition_{outcome}"


# Run keys: a sensor or schedule asks for a run once per key.
def scheduled_run_key(day: str) -> str:
    return f"schedule:{day}"


def new_file_run_key(uri: str, version: str, day: str) -> str:
    """A source file's version and one of its days: a changed file asks again."""
    return f"{uri}@{version}:{day}"


def lifecycle_run_key(key: str) -> str:
    """The batch-status sensor's key of a lifecycle action: the key itself while short,
    else its kind and hash."""
    if len(key) <= 200:
        return key
    return f"{key.split(':', 1)[0]}-set:{hashlib.sha256(key.encode()).hexdigest()[:32]}"


# Run tags.
APPROVE_BUDGET_TAG = "llm_assets/approve_budget"
"""`true` on a run: a day over its budget's upper bound is approved."""
CREATED_BY_TAG = "llm_assets/created_by"
"""Who started the run (`cli:<user>`, `sensor`, ...), for the ledger."""
SOURCE_FILE_TAG = "llm_assets/source_file"
"""The source file whose new rows the new-data sensor's run submits (its last 200 chars)."""
PROVIDER_BATCHES_TAG = "llm_assets/provider_batches"
"""The lifecycle action a batch-status sensor's run carries out (its first 200 chars)."""
DAY_STATE_TAG = "llm_assets/day_state"
"""On the batch-status sensor's observation of a day: its state (steps/day_state.py), with
underscores for spaces (`waiting_for_quota`)."""
OPERATOR_TAG = "llm_assets/operator"
"""An operator's job: `cancel`, `eval` or `retention`."""
WILL_RETRY_TAG = "dagster/will_retry"
"""Dagster's own: a failed run that run retries will launch again."""
