"""LedgerResource: the one Dagster resource over the ledger, a thin front to its modules.

Almost every method is a function of one module of this package, one module per concern,
called on the resource's engine: jobs, items, results, shards, locks, budget (where a budget
is reserved), reporting, retention, notifications, quotas, pauses, pseudonyms, outputs. Look
there for what a method does; what is written out here adds only the resource's own config.
"""

import contextlib
import datetime as dt
import functools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Concatenate, ParamSpec, TypeVar

import dagster as dg
from pydantic import PrivateAttr
from sqlalchemy.engine import Connection, Engine

from llm_assets.items import ids
from llm_assets.resources.ledger import (
    budget,
    id_keys,
    items,
    jobs,
    locks,
    notifications,
    outputs,
    pauses,
    pseudonyms,
    quotas,
    reporting,
    results,
    retention,
    schema,
)
from llm_assets.resources.ledger import shards as shard_rows
from llm_assets.resources.ledger.bulk import BackgroundWriter
from llm_assets.resources.ledger.records import UpsertStats
from llm_assets.resources.ledger.tables import REQUEUE_SHARD, RETRY_SHARD, result_table
from llm_assets.results.rows import DEAD_LETTER, RETRY, SUBMITTED, ResultStager

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _on_engine(
    fn: Callable[Concatenate[Engine, _P], _R],
) -> Callable[Concatenate["LedgerResource", _P], _R]:
    """A resource method that calls a ledger module's function on the resource's engine,
    with the function's own signature and docstring. Assigned as `name: ClassVar = ...`:
    a class attribute, not a config field, to pydantic and its type checker plugin."""

    @functools.wraps(fn)
    def method(self: "LedgerResource", *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return fn(self.engine, *args, **kwargs)

    return method


class LedgerResource(dg.ConfigurableResource):
    """Typed access to the ledger tables; creates them on first use."""

    database_url: str
    """The ledger's URL; given as dg.EnvVar("LLM_ASSETS_DATABASE_URL") so that Dagster shows
    the variable's name, never the password."""
    day_lock_wait_seconds: float = locks.DAY_LOCK_WAIT_SECONDS
    """How long a run waits for another run writing the same day before it fails with
    DayBusy (it changed nothing then, and can simply run again)."""
    connect_timeout_seconds: int = schema.DEFAULT_LIMITS.connect_timeout_seconds
    """PostgreSQL: how long opening a connection may take."""
    statement_timeout_seconds: float = schema.DEFAULT_LIMITS.statement_timeout_seconds
    """PostgreSQL: how long one statement may run before the server cancels it (0: no
    limit); far above what a million-item day's bulk statements take."""
    keepalives_idle_seconds: int = schema.DEFAULT_LIMITS.keepalives_idle_seconds
    """PostgreSQL: silence on a connection before TCP keepalive probes start."""
    keepalives_interval_seconds: int = schema.DEFAULT_LIMITS.keepalives_interval_seconds
    keepalives_count: int = schema.DEFAULT_LIMITS.keepalives_count
    """PostgreSQL: unanswered probes after which the connection counts as dead."""
    id_key: str | None = None
    """The key custom_ids are derived with (llm_assets/items/ids.py); given as
    dg.EnvVar("LLM_ASSETS_ID_KEY"), so Dagster shows the variable's name, never the key.
    Unset: LLM_ASSETS_ID_KEY when the environment has it (as the SDKs read their keys), else
    the key this ledger made at random on first use."""

    _ready: bool = PrivateAttr(default=False)
    _item_id_key: bytes | None = PrivateAttr(default=None)

    @property
    def url(self) -> str:
        """The database URL, read from its variable when the resource holds a dg.EnvVar
        (outside a Dagster run nothing resolves it)."""
        if isinstance(self.database_url, dg.EnvVar):
            value = self.database_url.get_value()
            if not value:
                raise ValueError(f"{self.database_url.env_var_name} is not set")
            return value
        return self.database_url

    @property
    def limits(self) -> schema.ConnectionLimits:
        return schema.ConnectionLimits(
            connect_timeout_seconds=self.connect_timeout_seconds,
            statement_timeout_seconds=self.statement_timeout_seconds,
            keepalives_idle_seconds=self.keepalives_idle_seconds,
            keepalives_interval_seconds=self.keepalives_interval_seconds,
            keepalives_count=self.keepalives_count,
        )

    @property
    def engine(self) -> Engine:
        if not self._ready:
            schema.ensure_schema(self.url, self.limits)
            self._ready = True
        return schema.get_engine(self.url, self.limits)

    def begin(self) -> contextlib.AbstractContextManager[Connection]:
        return self.engine.begin()

    def item_id_key(self) -> bytes:
        """The key of the custom_ids this process derives: the configured one (id_key, else
        LLM_ASSETS_ID_KEY), else the ledger's own. Read once per resource."""
        if self._item_id_key is None:
            configured = self.id_key
            if isinstance(configured, dg.EnvVar):
                configured = configured.get_value()
            configured = configured or os.environ.get(ids.ID_KEY_VARIABLE)
            if configured:
                problem = ids.id_key_problem(configured, ids.ID_KEY_VARIABLE)
                if problem:
                    raise ValueError(problem)
                self._item_id_key = configured.encode()
            else:
                self._item_id_key = id_keys.ledger_id_key(self.engine).encode()
        return self._item_id_key

    # Jobs

    get_or_create_job: ClassVar = _on_engine(jobs.get_or_create_job)

    get_job: ClassVar = _on_engine(jobs.get_job)

    jobs_for_partition: ClassVar = _on_engine(jobs.jobs_for_partition)

    update_job: ClassVar = _on_engine(jobs.update_job)

    refresh_job: ClassVar = _on_engine(jobs.refresh_job)

    earlier_jobs: ClassVar = _on_engine(jobs.earlier_jobs)

    add_personal_data: ClassVar = _on_engine(jobs.add_personal_data)

    # Items

    known_items: ClassVar = _on_engine(items.known_items)
    custom_ids_by_source: ClassVar = _on_engine(items.custom_ids_by_source)

    add_items: ClassVar = _on_engine(items.add_items)

    analyze: ClassVar = _on_engine(items.analyze)

    set_item_errors: ClassVar = _on_engine(items.set_item_errors)

    iter_items: ClassVar = _on_engine(items.iter_items)

    counts: ClassVar = _on_engine(items.counts)

    def reassign_items_to_shard(
        self, job_id: str, shard: dict[str, Any], lines: Sequence[tuple[str, int]]
    ) -> int:
        """Record a retry shard and move its items (from `retry`) into it, atomically; `lines`
        are (custom_id, request_offset in the new shard's file)."""
        shard = {**shard, "kind": RETRY_SHARD}
        return items.move_into_shard(self.engine, job_id, shard, lines, RETRY)

    def requeue_into_shard(
        self,
        job_id: str,
        shard: dict[str, Any],
        lines: Sequence[tuple[str, int]],
        pseudonyms: Mapping[str, Mapping[str, str]],
    ) -> int:
        """Send dead letters back: a new shard, the items pending in it and the mappings of
        their lines rendered anew (replacing their earlier ones), atomically."""
        shard = {**shard, "kind": REQUEUE_SHARD}
        return items.move_into_shard(self.engine, job_id, shard, lines, DEAD_LETTER, pseudonyms)

    def count_new_attempt(self, shard_id: str) -> int:
        """A shard's items still `submitted` take one more attempt (a worker that died with
        them open may have sent some)."""
        return items.set_shard_items(
            self.engine, shard_id, from_status=[SUBMITTED], attempts=result_table.c.attempts + 1
        )

    # Results

    def result_stager(self) -> ResultStager:
        """Turns result rows into this ledger's bulk format; picklable, for worker processes."""
        return ResultStager(binary_copy=self.engine.dialect.name == "postgresql")

    def upsert_results(
        self,
        job_id: str,
        rows: Iterable[dict[str, Any]],
        *,
        writer: BackgroundWriter | None = None,
        shard_id: str | None = None,
    ) -> UpsertStats:
        """Apply normalized results (dicts of custom_id and RESULT_COLUMNS) by custom_id;
        see upsert_staged."""
        staged = results.stage_results(self.result_stager(), rows)
        return self.upsert_staged(job_id, staged, writer=writer, shard_id=shard_id)

    upsert_staged: ClassVar = _on_engine(results.upsert_staged)

    # Shards

    def add_shard_with_items(
        self,
        shard: dict[str, Any],
        items: Sequence[dict[str, Any]],
        pseudonyms: Mapping[str, Mapping[str, str]] | None = None,
        *,
        stale_pseudonyms: bool = False,
    ) -> int:
        """Record a new shard, its items and their pseudonyms in one transaction; returns
        items inserted."""
        return shard_rows.add_shard_with_items(
            self.engine, shard, items, pseudonyms, stale_pseudonyms=stale_pseudonyms
        )

    shards: ClassVar = _on_engine(shard_rows.shards)

    get_shard: ClassVar = _on_engine(shard_rows.get_shard)

    next_round: ClassVar = _on_engine(shard_rows.next_round)

    update_shard: ClassVar = _on_engine(shard_rows.update_shard)

    mark_started: ClassVar = _on_engine(shard_rows.mark_started)

    submission_lock: ClassVar = _on_engine(locks.submission_lock)

    quota_lock: ClassVar = _on_engine(locks.quota_lock)

    submissions_held: ClassVar = _on_engine(locks.held)

    @contextlib.contextmanager
    def day_lock(
        self,
        job_id: str,
        *,
        holder: str,
        log: Callable[[str], None] | None = None,
        wait_seconds: float | None = None,
    ) -> Iterator[None]:
        """Hold the right to write a job's day, waiting up to `wait_seconds` (default
        `day_lock_wait_seconds`) for another run that holds it (see locks.day_lock)."""
        with locks.day_lock(
            self.engine,
            job_id,
            holder=holder,
            wait_seconds=self.day_lock_wait_seconds if wait_seconds is None else wait_seconds,
            log=log,
        ):
            yield

    @contextlib.contextmanager
    def slice_lock(
        self, job_id: str, slice_name: str, *, holder: str, log: Callable[[str], None] | None = None
    ) -> Iterator[None]:
        """Hold the right to build one slice of a job's day, waiting as `day_lock` does (see
        locks.slice_lock)."""
        with locks.slice_lock(
            self.engine,
            job_id,
            slice_name,
            holder=holder,
            wait_seconds=self.day_lock_wait_seconds,
            log=log,
        ):
            yield

    count_pending: ClassVar = _on_engine(shard_rows.count_pending)

    pending_offsets: ClassVar = _on_engine(shard_rows.pending_offsets)

    narrow_shard: ClassVar = _on_engine(shard_rows.narrow_shard)

    record_submit_intent: ClassVar = _on_engine(shard_rows.record_submit_intent)

    mark_submitted: ClassVar = _on_engine(shard_rows.mark_submitted)

    close_shard: ClassVar = _on_engine(shard_rows.close_shard)

    # Budget

    reserve_budget: ClassVar = _on_engine(budget.reserve_budget)

    def spent_since(self, pipeline: str, since: dt.date) -> float:
        """A pipeline's spend since a date: settled costs, and the reserved bounds of shards
        not settled yet."""
        with self.engine.connect() as conn:
            return budget.spent_since(conn, pipeline, since)

    committed_cost: ClassVar = _on_engine(budget.committed_cost)

    # Reporting

    shard_report: ClassVar = _on_engine(reporting.shard_report)

    output_tokens_per_billed_item: ClassVar = _on_engine(reporting.output_tokens_per_billed_item)
    cache_usage: ClassVar = _on_engine(reporting.cache_usage)

    job_cost_rows: ClassVar = _on_engine(reporting.job_cost_rows)

    pipeline_shards: ClassVar = _on_engine(reporting.pipeline_shards)

    finished_jobs: ClassVar = _on_engine(reporting.finished_jobs)

    active_jobs: ClassVar = _on_engine(reporting.active_jobs)

    recent_provider_batch_ids: ClassVar = _on_engine(reporting.recent_provider_batch_ids)

    missing_results: ClassVar = _on_engine(reporting.missing_results)

    iter_dead_letters: ClassVar = _on_engine(reporting.iter_dead_letters)

    # Retention

    provider_files_to_delete: ClassVar = _on_engine(retention.provider_files_to_delete)
    mark_provider_files_deleted: ClassVar = _on_engine(retention.mark_provider_files_deleted)
    day_states: ClassVar = _on_engine(retention.day_states)
    unexpired_days: ClassVar = _on_engine(retention.unexpired_days)
    eval_pipelines: ClassVar = _on_engine(retention.eval_pipelines)
    expire_jobs: ClassVar = _on_engine(retention.expire_jobs)

    # Notifications

    claim_notification: ClassVar = _on_engine(notifications.claim_notification)
    record_delivery: ClassVar = _on_engine(notifications.record_delivery)
    sent_notifications: ClassVar = _on_engine(notifications.sent_notifications)

    # Quotas

    quota_record: ClassVar = _on_engine(quotas.quota_record)
    learn_quota: ClassVar = _on_engine(quotas.learn_quota)
    quota_records: ClassVar = _on_engine(quotas.quota_records)
    reset_quotas: ClassVar = _on_engine(quotas.reset_quotas)
    in_flight_load: ClassVar = _on_engine(quotas.in_flight_load)
    model_freed_at: ClassVar = _on_engine(quotas.model_freed_at)
    batch_history: ClassVar = _on_engine(quotas.batch_history)
    older_waiting: ClassVar = _on_engine(quotas.older_waiting)

    # Pauses

    pipeline_pause: ClassVar = _on_engine(pauses.pipeline_pause)
    pause_pipeline: ClassVar = _on_engine(pauses.pause_pipeline)
    resume_pipeline: ClassVar = _on_engine(pauses.resume_pipeline)

    # Compliance

    has_pseudonyms: ClassVar = _on_engine(pseudonyms.has_pseudonyms)
    pseudonyms_of: ClassVar = _on_engine(pseudonyms.pseudonyms)
    compliance_counts: ClassVar = _on_engine(pseudonyms.compliance_counts)

    # Outputs

    replacing_outputs: ClassVar = _on_engine(outputs.replacing_outputs)

    recent_outputs: ClassVar = _on_engine(outputs.recent_outputs)

    job_outputs: ClassVar = _on_engine(outputs.job_outputs)
