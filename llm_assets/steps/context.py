"""What every step works on (one frozen StepContext), and the lookups the steps share.

A step runs for one pipeline and one day against the ledger, the artifact storage and, for
the steps that talk to a provider, the provider resource. Assets, the CLI, the sensors and
the benchmarks build a StepContext once and hand it to the step functions.
"""

import contextlib
import dataclasses
import datetime as dt
import logging
from collections.abc import Callable

from llm_assets.items import ids
from llm_assets.resources.ledger import JobRecord, LedgerResource
from llm_assets.resources.ledger.locks import holder_name
from llm_assets.resources.pricing import ModelPrice, load_price_table
from llm_assets.resources.providers.base import BatchProvider
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec

_logger = logging.getLogger(__name__)


class GateBlocked(Exception):
    """A gate refused to let the step go on; `gate` names it, the message says why."""

    def __init__(self, gate: str, reason: str) -> None:
        self.gate = gate
        self.reason = reason
        super().__init__(f"{gate} gate: {reason}")


class MissingPrerequisite(Exception):
    """An upstream step has not run for this partition yet."""


class DayExpired(MissingPrerequisite):
    """Retention expired the day: its snapshot, answers and pseudonyms may be gone, so no step
    builds, sends, requeues, validates or exports anything of it again (what it would make
    from what is left would replace the day's outputs with less)."""

    def __init__(self, spec: PipelineSpec, job: JobRecord) -> None:
        at = job.retention_expired_at
        assert at is not None
        days = spec.retention.artifacts_days
        rule = f"retention.artifacts_days: {days}" if days is not None else "retention"
        again = (
            "evaluate other days or another variant configuration (a new eval pipeline)"
            if job.parent_pipeline is not None
            else "its ids, states, counts and costs stay in the ledger (`llm-assets status`)"
        )
        super().__init__(
            f"retention expired {spec.name} {job.partition_date} on {at:%Y-%m-%d %H:%M} UTC "
            f"({rule} after its last item became terminal): its answers and pseudonyms are "
            f"gone from the ledger and its {', '.join(spec.retention.artifacts)} from the "
            f"artifacts, so nothing more is done with the day; {again}"
        )


def refuse_expired(spec: PipelineSpec, job: JobRecord | None) -> None:
    """Raise DayExpired when retention expired the job's day."""
    if job is not None and job.retention_expired_at is not None:
        raise DayExpired(spec, job)


def price_for(spec: PipelineSpec) -> ModelPrice:
    """The spec's model price from the price table, looked up by provider and model name, with
    cache writes at the rate of the spec's cache lifetime."""
    price = load_price_table().get(spec.model.provider, spec.model.name)
    return price.for_cache_ttl(spec.prompt.cache.ttl if spec.prompt.cache else None)


def artifact_key(*parts: str) -> str:
    """A storage key from its path parts."""
    return "/".join(parts)


def snapshot_dir(spec: PipelineSpec, day: dt.date) -> str:
    return artifact_key("snapshots", spec.name, day.isoformat())


def current_snapshot_uri(spec: PipelineSpec, day: dt.date, storage: ArtifactStorage) -> str:
    """The day's snapshot, as the CURRENT pointer the snapshot step writes names it."""
    pointer = storage.uri(artifact_key(snapshot_dir(spec, day), "CURRENT"))
    if not storage.exists(pointer):
        raise MissingPrerequisite(
            f"no input snapshot for {spec.name} on {day}; materialize input_snapshot first"
        )
    return storage.read_bytes(pointer).decode()


def job_id_of(spec: PipelineSpec, day: dt.date) -> str:
    """The id of the job of (pipeline, date, prompt version, model)."""
    return ids.job_id(spec.name, day, spec.prompt.version, spec.model.provider, spec.model.name)


def job_for(
    spec: PipelineSpec, day: dt.date, ledger: LedgerResource, created_by: str = "dagster"
) -> JobRecord:
    """The job of (pipeline, date, prompt version, model); created on first use."""
    return ledger.get_or_create_job(
        job_id=job_id_of(spec, day),
        pipeline=spec.name,
        partition_date=day,
        task_type=spec.output.format,
        provider=spec.model.provider,
        model_name=spec.model.name,
        prompt_version=spec.prompt.version,
        code_version=spec.prompt_code_version,
        created_by=created_by,
        parent_pipeline=spec.parent,
    )


def existing_job(spec: PipelineSpec, day: dt.date, ledger: LedgerResource) -> JobRecord:
    """The day's job, which request_shards creates; MissingPrerequisite before that."""
    job = ledger.get_job(job_id_of(spec, day))
    if job is None:
        raise MissingPrerequisite(
            f"no job for {spec.name} on {day} with prompt {spec.prompt.version} and "
            f"{spec.model.provider}/{spec.model.name}; materialize request_shards first"
        )
    return job


@dataclasses.dataclass(frozen=True)
class StepContext:
    """One pipeline's day, and the resources its steps use.

    `provider` is None where a step needs none (snapshot, validation, reports); `created_by`
    is written on the job when request_shards creates it. `run_id` and `created_by` name the
    run to another one that waits for its day; `log` hears about such waits.
    """

    spec: PipelineSpec
    day: dt.date
    ledger: LedgerResource
    storage: ArtifactStorage
    provider: BatchProvider | None = None
    created_by: str = "dagster"
    run_id: str | None = None
    log: Callable[[str], None] | None = None

    @property
    def batch_provider(self) -> BatchProvider:
        """The provider, for the steps that send, poll or price requests."""
        if self.provider is None:
            raise TypeError(
                f"this step of {self.spec.name} talks to its provider: build its StepContext "
                "with provider=..."
            )
        return self.provider

    @property
    def job_id(self) -> str:
        return job_id_of(self.spec, self.day)

    def job(self) -> JobRecord:
        """The day's job, or MissingPrerequisite when request_shards has not run."""
        return existing_job(self.spec, self.day, self.ledger)

    def job_or_create(self) -> JobRecord:
        """The day's job, created (by `created_by`) on first use."""
        return job_for(self.spec, self.day, self.ledger, self.created_by)

    def snapshot_uri(self) -> str:
        """The day's input snapshot, or MissingPrerequisite when none was taken; DayExpired
        when retention expired the day (whatever is left of it is not worked on again)."""
        refuse_expired(self.spec, self.ledger.get_job(self.job_id))
        return current_snapshot_uri(self.spec, self.day, self.storage)

    def price(self) -> ModelPrice:
        return price_for(self.spec)

    def holder(self) -> str:
        """How this step names itself to a run that waits for a lock it holds."""
        return holder_name(self.created_by + (f", run {self.run_id}" if self.run_id else ""))

    def day_lock(self) -> contextlib.AbstractContextManager[None]:
        """Hold the day for this step's writes; another run writing it is waited for."""
        return self.ledger.day_lock(
            self.job_id, holder=self.holder(), log=self.log or _logger.warning
        )
