"""Everything Dagster sees: the asset factory, asset checks, sensors, schedules, the jobs an
operator launches, and the runner the CLI drives a day's assets with.

`factory` builds a pipeline's assets over the plain functions in `llm_assets.steps`, with
the names `llm_assets.names` gives every asset, job, run key and tag; `checks` and
`metadata` say what a step's result means in the UI; `sensors`, `new_data_sensor` and
`schedules` start runs; `cancel_job`, `pause_jobs`, `retention_jobs` and `eval_jobs` are the
operator's jobs; `runner` materializes a day's assets in process for the CLI.
`llm_assets.definitions` merges them into the code location's one `Definitions`.
"""
