"""The spec's `retention` applied: a shard's files at the provider deleted once its results are
imported here; the expiry of finished days (artifacts, ledger payloads, eval data) in
expiry.py. Every deletion is logged with what and why, on this module's logger.

Where a prompt, an answer, a reference or a pseudonym is kept, and the rule that deletes it
("expires": the day's every item is terminal, every batch imported, and
`retention.artifacts_days` have passed since its last item became terminal; see expiry.py):

- The provider's copy of a shard (files, the batch, Bedrock's S3 objects; prompts and
  answers): `provider_files: delete_after_import` (the default) deletes it once the shard is
  imported.
- `snapshots/`, `shards/`, `qa/` under `<pipeline>/<day>` (source rows with references,
  rendered prompts, sampled answers): deleted when the day expires (the default
  `retention.artifacts`).
- `outputs/`, `published/`, `dead_letters/` (answers with their values restored, quoted
  answers): the pipeline's product, kept unless named in `retention.artifacts`, then deleted
  when the day expires. `gate/` and `reports/` hold no item's text: the same.
- The ledger's `llm_batch_pseudonym` rows, `llm_batch_output` rows, `llm_batch_result.
  result_json` and quality dead letters' messages (pseudonyms, answers): deleted when the day
  expires (ledger/retention.py); ids, states, counts and costs stay.
- An eval pipeline's days (`<kind>/<pipeline>__<variant>__<digest>/<day>` and its jobs: the
  sample's rows, prompts, answers): expire by the evaluated pipeline's retention, every kind.
- An eval's sample (`eval/<pipeline>/<eval_id>/sample.jsonl`: source rows and references):
  deleted once every day it holds has expired, for the pipeline and for its evals.
- Eval reports (`eval/<pipeline>/reports/`: scores, counts, costs): kept.

Nothing the ledger still needs is deleted: provider files only after the shard is recorded
`imported` (retry rounds read their request lines from our shard files, never the
provider's), a day's data only once nothing of it is open and its dead letters have had
`artifacts_days` to be requeued.
"""

import dataclasses
import logging
from collections.abc import Callable, Iterable

from llm_assets.resources.ledger import LedgerResource, ShardRecord
from llm_assets.resources.providers.base import ONLINE_BATCH_PREFIX, BatchProvider, ShardFiles
from llm_assets.spec.model import PipelineSpec

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
            say(
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
            say(warn, message, logging.WARNING)
            done.failed[shard.shard_id] = message
            continue
        ledger.mark_provider_files_deleted(shard.shard_id)
        done.deleted[shard.shard_id] = deleted
        if deleted:
            say(
                info,
                f"deleted at {spec.model.provider} for batch {shard.provider_batch_id}: "
                f"{', '.join(deleted)} ({reason})",
            )
    return done


def say(to: Say | None, message: str, level: int = logging.INFO) -> None:
    """To the caller's log (Dagster's) when it gives one, always to Python logging."""
    _logger.log(level, message)
    if to is not None:
        to(message)
