"""A batch provider held in memory, driven by the test rather than by time: for property tests
that try hundreds of interleavings in one process, where a fake HTTP server per example would
cost more than the interleavings themselves.

Batches are created by `submit` (reconciled from an intent like the real adapters: a batch
created for the shard since its intent is returned instead of a new one), stay `in_progress`
until the test ends them (`end`: completed, partial, expired, failed or cancelled by the
provider), and answer only what they ran. The fake is also the witness: `created` lists every
batch with its custom_ids, `answered` counts each custom_id's successful answers, and
`on_create` is called before a batch is made, so a test can assert what may be sent then.
"""

import dataclasses
import datetime as dt
import json
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pydantic import PrivateAttr

from llm_assets.resources.providers.base import (
    BatchProvider,
    BatchStatus,
    ItemResult,
    RequestItem,
    ShardState,
    ShardSubmission,
)
from llm_assets.resources.providers.retrying import QuotaRefused

if TYPE_CHECKING:
    from llm_assets.resources.storage import ArtifactStorage
    from llm_assets.spec.model import PipelineSpec

LIVE = (ShardState.SUBMITTED, ShardState.RUNNING)
OUTCOMES = ("completed", "partial", "expired", "failed", "cancelled")


@dataclasses.dataclass
class MemoryBatch:
    id: str
    shard_id: str
    custom_ids: list[str]
    created_at: dt.datetime
    state: ShardState = ShardState.RUNNING
    raw_status: str = "in_progress"
    ran: list[str] = dataclasses.field(default_factory=list)
    """The custom_ids it answered, in order."""
    input_tokens: int = 40


class MemoryProvider(BatchProvider):
    """See the module docstring; knobs are attributes the test sets between steps."""

    quota_wait_seconds: float = 0.0
    _batches: dict[str, MemoryBatch] = PrivateAttr(default_factory=dict)
    _answered: Counter[str] = PrivateAttr(default_factory=Counter)
    _refuse_next: bool = PrivateAttr(default=False)
    _input_tokens: int = PrivateAttr(default=40)
    _on_create: Callable[[ShardSubmission, list[str]], None] | None = PrivateAttr(default=None)

    @property
    def batches(self) -> dict[str, MemoryBatch]:
        return self._batches

    @property
    def answered(self) -> Counter[str]:
        return self._answered

    def live(self) -> list[MemoryBatch]:
        return [b for b in self._batches.values() if b.state in LIVE]

    def refuse_next_create(self) -> None:
        self._refuse_next = True

    def bill_input_tokens(self, tokens: int) -> None:
        """What each answer of batches ended from now on bills for its input."""
        self._input_tokens = tokens

    def watch_creates(self, on_create: Callable[[ShardSubmission, list[str]], None]) -> None:
        self._on_create = on_create

    def request_line(self, spec: "PipelineSpec", item: RequestItem) -> dict[str, Any]:
        return {
            "custom_id": item.custom_id,
            "body": {"system": item.system, "user": item.user},
        }

    def find_submitted(self, shard: ShardSubmission) -> str | None:
        since = shard.intent_at or dt.datetime.min.replace(tzinfo=dt.UTC)
        found = [
            b.id
            for b in self._batches.values()
            if b.shard_id == shard.shard_id and b.created_at >= since - dt.timedelta(minutes=5)
        ]
        return found[-1] if found else None

    def submit(self, shard: ShardSubmission, storage: "ArtifactStorage") -> str:
        existing = self.find_submitted(shard) if shard.intent_at is not None else None
        if existing is not None:
            return existing
        if self._refuse_next:
            self._refuse_next = False
            raise QuotaRefused("too many batches in flight", retry_after_seconds=0.0)
        custom_ids = [
            str(json.loads(line)["custom_id"]) for line in storage.open_lines(shard.input_uri)
        ]
        if self._on_create is not None:
            self._on_create(shard, custom_ids)
        batch = MemoryBatch(
            id=f"mem-{len(self._batches):04d}",
            shard_id=shard.shard_id,
            custom_ids=custom_ids,
            created_at=dt.datetime.now(dt.UTC),
        )
        self._batches[batch.id] = batch
        return batch.id

    def end(self, batch_id: str, outcome: str) -> None:
        """End a live batch: `completed` answers every line, `partial` completes with half
        of them missing, `expired` and `cancelled` answer the first half, `failed` none."""
        batch = self._batches[batch_id]
        half = batch.custom_ids[: len(batch.custom_ids) // 2]
        ran = {"completed": batch.custom_ids, "failed": []}.get(outcome, half)
        state = {
            "completed": ShardState.COMPLETED,
            "partial": ShardState.COMPLETED,
            "expired": ShardState.EXPIRED,
            "failed": ShardState.FAILED,
            "cancelled": ShardState.CANCELLED,
        }[outcome]
        self._finish(batch, state, "completed" if outcome == "partial" else outcome, ran)

    def _finish(self, batch: MemoryBatch, state: ShardState, raw: str, ran: list[str]) -> None:
        batch.state, batch.raw_status, batch.ran = state, raw, list(ran)
        batch.input_tokens = self._input_tokens
        self._answered.update(ran)

    def poll(self, provider_batch_id: str) -> BatchStatus:
        batch = self._batches[provider_batch_id]
        return BatchStatus(
            provider_batch_id=batch.id,
            state=batch.state,
            raw_status=batch.raw_status,
            total=len(batch.custom_ids),
            completed=len(batch.ran),
        )

    def cancel(self, provider_batch_id: str) -> BatchStatus:
        batch = self._batches[provider_batch_id]
        if batch.state in LIVE:
            self._finish(batch, ShardState.CANCELLED, "cancelled", [])
        return self.poll(provider_batch_id)

    def results(self, provider_batch_id: str) -> Iterator[ItemResult]:
        batch = self._batches[provider_batch_id]
        for custom_id in batch.ran:
            yield ItemResult(
                custom_id=custom_id,
                succeeded=True,
                output_text=json.dumps({"label": "positive", "summary": "fine"}),
                finish_reason="stop",
                status_code=200,
                input_tokens=batch.input_tokens,
                output_tokens=10,
            )
