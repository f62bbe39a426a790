"""The spec's `retention` applied: a shard's files at the provider deleted once its results are
imported, and the artifacts of days finished long enough ago deleted from the artifact storage.

What the ledger still needs is never deleted. Provider files go only after the shard is
recorded `imported` (its results are in the ledger; retry rounds read their request lines from
our shard files, never the provider's). Artifacts go only for days whose every item is terminal
and whose every batch is imported, `artifacts_days` after the last item became terminal; the
kinds not named in `retention.artifacts` (by default validated outputs, published tables, dead
letters, gate decisions and reports) stay. Every deletion is logged with what and why.
"""

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from llm_assets.resources.ledger import LedgerResource, ShardRecord, utcnow
from llm_assets.resources.ledger.retention import DayState
from llm_assets.resources.providers.base import ONLINE_BATCH_PREFIX, BatchProvider, ShardFiles
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec import PipelineSpec

_logger = logging.getLogger(__name__)
Say = Callable[[str], None]


@dataclasses.dataclass
class ProviderFileDeletions:
    """What one round of provider-file deletions did."""

    deleted: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    """shard_id -> what was deleted at the provider (file ids, object keys, the batch id)."""
    failed: dict[str, str] = dataclasses.field(default_factory=dict)
    """shard_id -> why its deletion failed; it is asked for again later."""

    @property
    def shards(self) -> int:
        return len(self.deleted)


def provider_files_reason(shard_id: str) -> str:
    return f"retention.provider_files: delete_after_import, shard {shard_id} imported"


def delete_provider_files(
    spec: PipelineSpec,
    ledger: LedgerResource,
    provider: BatchProvider,
    shards: Iterable[ShardRecord],
    *,
    info: Say | None = None,
    warn: Say | None = None,
    dry_run: bool = False,
) -> ProviderFileDeletions:
    """Delete the files at the provider of imported shards and record it on each shard. A
    failure is logged as a warning and leaves the shard to the next round (the day's next
    import, the retention job); it never fails the caller. Nothing happens when the spec keeps
    provider files."""
    done = ProviderFileDeletions()
    if spec.retention.provider_files != "delete_after_import":
        return done
    for shard in shards:
        if shard.status != "imported" or not shard.provider_batch_id:
            continue  # its results are not in the ledger: the provider's copy is still needed
        reason = provider_files_reason(shard.shard_id)
        if dry_run:
            _say(
                info,
                f"would delete the provider files of batch {shard.provider_batch_id} ({reason})",
            )
            done.deleted[shard.shard_id] = []
            continue
        try:
            deleted = (
                []
                if shard.provider_batch_id.startswith(ONLINE_BATCH_PREFIX)  # sent in a step
                else provider.delete_files(
                    ShardFiles(
                        shard_id=shard.shard_id,
                        provider_batch_id=shard.provider_batch_id,
                        input_uri=shard.input_uri,
                    )
                )
            )
        except Exception as exc:
            message = (
                f"could not delete the {spec.model.provider} files of shard {shard.shard_id} "
                f"(batch {shard.provider_batch_id}): {type(exc).__name__}: {exc}; the import "
                "stands, and the deletion is tried again by the day's next import and the "
                "retention job"
            )
            _say(warn, message, logging.WARNING)
            done.failed[shard.shard_id] = message
            continue
        ledger.mark_provider_files_deleted(shard.shard_id)
        done.deleted[shard.shard_id] = deleted
        if deleted:
            _say(
                info,
                f"deleted at {spec.model.provider} for batch {shard.provider_batch_id}: "
                f"{', '.join(deleted)} ({reason})",
            )
    return done


@dataclasses.dataclass
class ArtifactDeletions:
    """What one retention run did to the artifact storage."""

    deleted: dict[dt.date, list[str]] = dataclasses.field(default_factory=dict)
    kept: dict[dt.date, str] = dataclasses.field(default_factory=dict)
    """Days with artifacts of the configured kinds that were kept, and why."""

    @property
    def uris(self) -> int:
        return sum(len(uris) for uris in self.deleted.values())


def artifacts_by_day(spec: PipelineSpec, storage: ArtifactStorage) -> dict[dt.date, list[str]]:
    """The pipeline's artifacts of the kinds `retention.artifacts` names, by their day: keys
    are `<kind>/<pipeline>/<day>/...` or `<kind>/<pipeline>/<day>.<ext>`."""
    found: dict[dt.date, list[str]] = {}
    for kind in spec.retention.artifacts:
        folder = f"{kind}/{spec.name}"
        root = storage.uri(folder).rstrip("/") + "/"
        for uri in storage.list_uris(folder):
            if not uri.startswith(root):
                continue
            first = uri[len(root) :].split("/", 1)[0]
            try:
                day = dt.date.fromisoformat(first.split(".", 1)[0])
            except ValueError:
                continue  # not a day's artifact
            found.setdefault(day, []).append(uri)
    return found


def expire_artifacts(
    spec: PipelineSpec,
    ledger: LedgerResource,
    storage: ArtifactStorage,
    *,
    now: dt.datetime | None = None,
    info: Say | None = None,
    dry_run: bool = False,
) -> ArtifactDeletions:
    """Delete the `retention.artifacts` kinds of every day that finished more than
    `retention.artifacts_days` ago; nothing when artifacts_days is unset."""
    done = ArtifactDeletions()
    days = spec.retention.artifacts_days
    if days is None:
        return done
    now = now or utcnow()
    cutoff = now - dt.timedelta(days=days)
    by_day = artifacts_by_day(spec, storage)
    states = ledger.day_states(spec.name, by_day)
    for day, uris in sorted(by_day.items()):
        why_kept = _why_kept(states.get(day), cutoff, days)
        if why_kept is not None:
            done.kept[day] = why_kept
            continue
        state = states[day]
        assert state.finished_at is not None
        reason = (
            f"retention.artifacts_days: {days}, {spec.name} {day} finished "
            f"{state.finished_at:%Y-%m-%d %H:%M} UTC with every item terminal; kinds "
            f"{', '.join(spec.retention.artifacts)}"
        )
        for uri in uris:
            if not dry_run:
                storage.delete(uri)
            _say(info, f"{'would delete' if dry_run else 'deleted'} {uri} ({reason})")
        done.deleted[day] = uris
    if not storage.is_s3 and not dry_run:
        roots = {Path(storage.uri(f"{kind}/{spec.name}")) for kind in spec.retention.artifacts}
        _remove_empty_folders([uri for uris in done.deleted.values() for uri in uris], roots)
    return done


def _remove_empty_folders(uris: list[str], roots: set[Path]) -> None:
    """On local storage, the day folders the deleted files leave empty (S3 has no folders)."""
    for folder in sorted({Path(uri).parent for uri in uris}, key=lambda p: -len(p.parts)):
        while folder not in roots and any(folder.is_relative_to(r) for r in roots):
            try:
                folder.rmdir()
            except OSError:  # not empty, or gone already
                break
            folder = folder.parent


def _why_kept(state: DayState | None, cutoff: dt.datetime, days: int) -> str | None:
    if state is None:
        return "no job in the ledger for this day"
    if state.open:
        return (
            f"open work: {state.open_items} open item(s), {state.unimported_shards} batch(es) "
            "not imported"
        )
    assert state.finished_at is not None
    if state.finished_at > cutoff:
        return f"finished {state.finished_at:%Y-%m-%d %H:%M} UTC, within {days} day(s)"
    return None


def _say(to: Say | None, message: str, level: int = logging.INFO) -> None:
    """To the caller's log (Dagster's) when it gives one, always to Python logging."""
    _logger.log(level, message)
    if to is not None:
        to(message)
