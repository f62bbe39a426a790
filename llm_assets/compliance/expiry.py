"""The expiry of finished days: a day's artifacts, its ledger payloads and its evals' data go
`retention.artifacts_days` after it finished, and the report says, day by day and kind by
kind, what went, what stayed and why.

A day expires when every item of each of its jobs is terminal, every batch is imported, and
`artifacts_days` have passed since its last item became terminal (for a cancelled day: since
the cancel made its items dead letters). Until then the day keeps everything a `requeue`
and the validation after it need (its snapshot, answers and pseudonyms), so its dead letters
can be sent again. At expiry, holding the day's lock, its jobs are marked expired and their
answers, outputs and pseudonyms deleted from the ledger in one transaction (ledger/
retention.py says what each table loses), then the `retention.artifacts` kinds of the day are
deleted. No step works on an expired day again (`steps.DayExpired` says why), so nothing is
ever rebuilt from the payloads that are gone.

An eval's data follows the evaluated pipeline's retention: each eval pipeline's day expires
by the same rule, with every artifact kind (nothing of an eval is published; its report
keeps the scores), and an eval's sample goes once every day it holds has finished
`artifacts_days` ago, for the pipeline and for each of its eval pipelines.
"""

import contextlib
import dataclasses
import datetime as dt
import zoneinfo
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import get_args

import orjson

from llm_assets.compliance.retention import Say, say
from llm_assets.compliance.spec import ArtifactKind
from llm_assets.items.source import parse_date
from llm_assets.resources.ledger import DayBusy, LedgerResource, utcnow
from llm_assets.resources.ledger.retention import DayState, PayloadPurge
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.words import plural

ALL_KINDS: tuple[str, ...] = get_args(ArtifactKind)
"""Every kind of a day's artifacts, each under `<kind>/<pipeline>/<day>`."""
LEDGER = "ledger"
"""The report's name for the day's payloads in the ledger (answers, outputs, pseudonyms)."""
LOCK_WAIT_SECONDS = 60.0
"""How long a retention round waits for a run writing a day before it leaves the day to the
next round."""
HOLDER = "retention"


@dataclasses.dataclass
class DayRetention:
    """What one retention round did with one day of one pipeline (or eval pipeline)."""

    pipeline: str
    day: dt.date
    expired: bool
    why: str
    """Why the day expired, or why it is kept."""
    deleted: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    """Artifact kind -> the URIs deleted (in a dry run: that would be)."""
    kept: dict[str, str] = dataclasses.field(default_factory=dict)
    """Artifact kind (or LEDGER) -> why it stays."""
    purged: PayloadPurge | None = None
    """What left the ledger (None: nothing was asked of it, as in a dry run)."""

    @property
    def uris(self) -> int:
        return sum(len(uris) for uris in self.deleted.values())

    def line(self, dry_run: bool = False) -> str:
        """The day in one line, for the CLI and the run's log."""
        head = f"{self.pipeline} {self.day}"
        if not self.expired:
            return f"{head}: kept ({self.why})"
        verb = "would delete" if dry_run else "deleted"
        gone = [f"{kind} ({len(uris)})" for kind, uris in sorted(self.deleted.items()) if uris]
        if self.purged is not None and self.purged.deleted_anything:
            gone.append(f"ledger ({ledger_words(self.purged)})")
        elif dry_run:
            gone.append("ledger (answers, outputs and pseudonyms of its jobs)")
        kept = "; ".join(f"kept {kind} ({why})" for kind, why in sorted(self.kept.items()))
        return (
            f"{head}: {'would expire' if dry_run else 'expired'} ({self.why}); "
            f"{verb} {', '.join(gone) or 'nothing left'}" + (f"; {kept}" if kept else "")
        )


@dataclasses.dataclass
class SampleRetention:
    """What one retention round did with one eval's sample."""

    uri: str
    days: list[dt.date]
    expired: bool
    why: str

    def line(self, dry_run: bool = False) -> str:
        if not self.expired:
            return f"eval sample {self.uri}: kept ({self.why})"
        return f"{'would delete' if dry_run else 'deleted'} {self.uri} ({self.why})"


@dataclasses.dataclass
class Expiry:
    """One retention round's expiry of days and eval samples."""

    days: list[DayRetention] = dataclasses.field(default_factory=list)
    samples: list[SampleRetention] = dataclasses.field(default_factory=list)
    unset: str | None = None
    """Why nothing expires at all (artifacts_days unset)."""

    @property
    def expired(self) -> list[DayRetention]:
        return [d for d in self.days if d.expired]

    @property
    def kept(self) -> list[DayRetention]:
        return [d for d in self.days if not d.expired]

    @property
    def uris(self) -> int:
        """Artifacts deleted: the days' and the samples'."""
        return sum(d.uris for d in self.days) + sum(1 for s in self.samples if s.expired)

    def day(self, pipeline: str, day: dt.date) -> DayRetention:
        return next(d for d in self.days if d.pipeline == pipeline and d.day == day)


def ledger_words(purged: PayloadPurge) -> str:
    parts = [
        plural(purged.answers, "answer"),
        plural(purged.outputs, "output"),
        plural(purged.pseudonyms, "pseudonym mapping"),
    ]
    if purged.quality_messages:
        parts.append(plural(purged.quality_messages, "quality message"))
    return ", ".join(parts)


def artifacts_by_day(
    storage: ArtifactStorage, pipeline: str, kinds: Iterable[str] = ALL_KINDS
) -> dict[dt.date, dict[str, list[str]]]:
    """A pipeline's artifacts by day and kind: keys are `<kind>/<pipeline>/<day>/...` or
    `<kind>/<pipeline>/<day>.<ext>`."""
    found: dict[dt.date, dict[str, list[str]]] = {}
    for kind in kinds:
        folder = f"{kind}/{pipeline}"
        root = storage.uri(folder).rstrip("/") + "/"
        for uri in storage.list_uris(folder):
            if not uri.startswith(root):
                continue
            first = uri[len(root) :].split("/", 1)[0]
            try:
                day = dt.date.fromisoformat(first.split(".", 1)[0])
            except ValueError:
                continue  # not a day's artifact
            found.setdefault(day, {}).setdefault(kind, []).append(uri)
    return found


@dataclasses.dataclass(frozen=True)
class _Round:
    """What every day of one retention round shares."""

    ledger: LedgerResource
    storage: ArtifactStorage
    days: int
    now: dt.datetime
    info: Say | None
    dry_run: bool

    @property
    def cutoff(self) -> dt.datetime:
        return self.now - dt.timedelta(days=self.days)


def expire_days(
    spec: PipelineSpec,
    ledger: LedgerResource,
    storage: ArtifactStorage,
    *,
    now: dt.datetime | None = None,
    info: Say | None = None,
    dry_run: bool = False,
) -> Expiry:
    """Expire the pipeline's days, its eval pipelines' days and its evals' samples that
    finished more than `retention.artifacts_days` ago; nothing when artifacts_days is unset."""
    days = spec.retention.artifacts_days
    if days is None:
        unset = (
            "retention.artifacts_days is not set: its days' artifacts, answers, outputs and "
            "pseudonyms, and its evals' data, are kept"
        )
        say(info, f"{spec.name}: {unset}")
        return Expiry(unset=unset)
    round_ = _Round(ledger, storage, days, now or utcnow(), info, dry_run)
    expiry = Expiry()
    expiry.days += _expire_pipeline(round_, spec.name, spec.retention.artifacts)
    for eval_pipeline in ledger.eval_pipelines(spec.name):
        expiry.days += _expire_pipeline(round_, eval_pipeline, ALL_KINDS)
    expiry.samples = _expire_samples(round_, spec)
    return expiry


def _expire_pipeline(round_: _Round, pipeline: str, kinds: Iterable[str]) -> list[DayRetention]:
    """Each day of `pipeline` that has artifacts or a job not expired yet."""
    found = artifacts_by_day(round_.storage, pipeline)
    days = set(found) | set(round_.ledger.unexpired_days(pipeline))
    states = round_.ledger.day_states(pipeline, days)
    done = [
        _expire_day(round_, pipeline, day, states.get(day), found.get(day, {}), set(kinds))
        for day in sorted(days)
        if not _expired_before(states.get(day), found.get(day, {}), kinds)
    ]
    if not round_.storage.is_s3 and not round_.dry_run:
        roots = {Path(round_.storage.uri(f"{kind}/{pipeline}")) for kind in ALL_KINDS}
        _remove_empty_folders([u for d in done for uris in d.deleted.values() for u in uris], roots)
    return done


def _expired_before(
    state: DayState | None, artifacts: dict[str, list[str]], kinds: Iterable[str]
) -> bool:
    """A day expired by an earlier round with nothing left to delete: not reported again
    (what stays of it is what the spec keeps)."""
    return state is not None and state.expired_at is not None and not set(artifacts) & set(kinds)


def _expire_day(
    round_: _Round,
    pipeline: str,
    day: dt.date,
    state: DayState | None,
    artifacts: dict[str, list[str]],
    kinds: set[str],
) -> DayRetention:
    why_kept = why_kept_day(state, round_.cutoff, round_.days)
    if why_kept is not None:
        return _kept(round_, pipeline, day, why_kept, artifacts)
    assert state is not None
    if round_.dry_run:
        return _expired(round_, pipeline, day, state, artifacts, kinds, None)
    try:
        with _holding(round_.ledger, state.job_ids):
            # Read again under the lock: a requeue may have reopened the day meanwhile.
            state = round_.ledger.day_states(pipeline, [day]).get(day)
            why_kept = why_kept_day(state, round_.cutoff, round_.days)
            if why_kept is not None:
                return _kept(round_, pipeline, day, why_kept, artifacts)
            assert state is not None
            purged = round_.ledger.expire_jobs(state.job_ids, at=round_.now)
            return _expired(round_, pipeline, day, state, artifacts, kinds, purged)
    except DayBusy:
        why = "another run is writing the day; the next retention round looks again"
        return _kept(round_, pipeline, day, why, artifacts)


@contextlib.contextmanager
def _holding(ledger: LedgerResource, job_ids: Iterable[str]) -> Iterator[None]:
    """The day's lock of each of its jobs, so no requeue or import writes it meanwhile."""
    with contextlib.ExitStack() as stack:
        for job_id in sorted(job_ids):
            stack.enter_context(
                ledger.day_lock(job_id, holder=HOLDER, wait_seconds=LOCK_WAIT_SECONDS)
            )
        yield


def _kept(
    round_: _Round, pipeline: str, day: dt.date, why: str, artifacts: dict[str, list[str]]
) -> DayRetention:
    kept = {kind: why for kind in artifacts}
    done = DayRetention(pipeline=pipeline, day=day, expired=False, why=why, kept=kept)
    say(round_.info, done.line(round_.dry_run))
    return done


def _expired(
    round_: _Round,
    pipeline: str,
    day: dt.date,
    state: DayState,
    artifacts: dict[str, list[str]],
    kinds: set[str],
    purged: PayloadPurge | None,
) -> DayRetention:
    """Delete the day's artifacts of `kinds` (its ledger payloads went already) and say so."""
    why = expiry_reason(pipeline, state, round_.days)
    done = DayRetention(pipeline=pipeline, day=day, expired=True, why=why, purged=purged)
    verb = "would delete" if round_.dry_run else "deleted"
    for kind, uris in sorted(artifacts.items()):
        if kind not in kinds:
            done.kept[kind] = "not named in retention.artifacts"
            continue
        for uri in uris:
            if not round_.dry_run:
                round_.storage.delete(uri)
            say(round_.info, f"{verb} {uri} ({why}; kind {kind})")
        done.deleted[kind] = uris
    say(round_.info, done.line(round_.dry_run))
    return done


def expiry_reason(pipeline: str, state: DayState, days: int) -> str:
    assert state.finished_at is not None
    why = (
        f"retention.artifacts_days: {days}, {pipeline} {state.partition_date} finished "
        f"{state.finished_at:%Y-%m-%d %H:%M} UTC with every item terminal"
    )
    if state.expired_at is not None:
        return f"{why}; expired {state.expired_at:%Y-%m-%d %H:%M} UTC"
    if state.dead_letters:
        why += f"; its {plural(state.dead_letters, 'dead letter')} can no longer be requeued"
    return why


def why_kept_day(state: DayState | None, cutoff: dt.datetime, days: int) -> str | None:
    """Why a day stays this round, or None when it expires."""
    if state is None:
        return "no job in the ledger for this day"
    if state.open:
        return (
            f"open work: {state.open_items} open item(s), {state.unimported_shards} batch(es) "
            "not imported"
        )
    assert state.finished_at is not None
    if state.finished_at <= cutoff:
        return None
    until = state.finished_at + dt.timedelta(days=days)
    why = f"finished {state.finished_at:%Y-%m-%d %H:%M} UTC, within {days} day(s)"
    if state.cancelled:
        why = f"cancelled, {why}"
    if state.dead_letters:
        why += (
            f"; its {plural(state.dead_letters, 'dead letter')} can be requeued until "
            f"{until:%Y-%m-%d %H:%M} UTC"
        )
    return why


def _expire_samples(round_: _Round, spec: PipelineSpec) -> list[SampleRetention]:
    """Each eval sample of the pipeline (`eval/<pipeline>/<eval_id>/sample.jsonl`)."""
    folder = f"eval/{spec.name}"
    root = round_.storage.uri(folder).rstrip("/") + "/"
    pipelines = [spec.name, *round_.ledger.eval_pipelines(spec.name)]
    done = []
    for uri in round_.storage.list_uris(folder):
        parts = uri[len(root) :].split("/") if uri.startswith(root) else []
        if len(parts) != 2 or parts[1] != "sample.jsonl":
            continue  # a saved report: scores only, kept
        days = sample_days(spec, round_.storage, uri)
        why_kept = _why_kept_sample(round_, pipelines, days)
        expired = why_kept is None
        why = why_kept or (
            f"retention.artifacts_days: {round_.days}, every day it holds "
            f"({', '.join(map(str, days))}) finished more than {round_.days} day(s) ago for "
            f"{spec.name} and its evals"
        )
        if expired and not round_.dry_run:
            round_.storage.delete(uri)
        sample = SampleRetention(uri=uri, days=days, expired=expired, why=why)
        say(round_.info, sample.line(round_.dry_run))
        done.append(sample)
    if done and not round_.storage.is_s3 and not round_.dry_run:
        gone = [s.uri for s in done if s.expired]
        _remove_empty_folders(gone, {Path(round_.storage.uri(folder))})
    return done


def sample_days(spec: PipelineSpec, storage: ArtifactStorage, uri: str) -> list[dt.date]:
    """The days an eval's sample holds rows of (its records' own dates)."""
    tz = zoneinfo.ZoneInfo(spec.partitions.timezone)
    days: set[dt.date] = set()
    for line in storage.open_lines(uri):
        if not line.strip():
            continue
        record = orjson.loads(line)
        day = (
            parse_date(record.get(spec.source.date_field), tz) if isinstance(record, dict) else None
        )
        if day is not None:
            days.add(day)
    return sorted(days)


def _why_kept_sample(round_: _Round, pipelines: list[str], days: list[dt.date]) -> str | None:
    """Why a sample stays: a day it holds is open or finished within artifacts_days for the
    pipeline or one of its evals; None when every one finished long enough ago."""
    if not days:
        return "it holds no rows"
    states = [s for p in pipelines for s in round_.ledger.day_states(p, days).values()]
    if not states:
        return "no job in the ledger for the days it holds"
    for state in states:
        why = why_kept_day(state, round_.cutoff, round_.days)
        if why is not None:
            return f"{state.partition_date}: {why}"
    return None


def _remove_empty_folders(uris: list[str], roots: set[Path]) -> None:
    """On local storage, the day folders the deleted files leave empty (S3 has no folders)."""
    for folder in sorted({Path(uri).parent for uri in uris}, key=lambda p: -len(p.parts)):
        while folder not in roots and any(folder.is_relative_to(r) for r in roots):
            try:
                folder.rmdir()
            except OSError:  # not empty, or gone already
                break
            folder = folder.parent
