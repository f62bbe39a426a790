"""The provider interface every adapter implements, and the normalized shapes it speaks.

Adapters translate between the ledger's world (shards of requests keyed by custom_id) and a
provider's batch API; nothing outside `resources/providers/` talks to a provider SDK.
"""

import datetime as dt
import json
import urllib.parse
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import dagster as dg
import pydantic
from pydantic import BaseModel, ConfigDict, field_validator

from llm_assets.items.prepare import TemplateEncoder
from llm_assets.results.rows import Answered, ItemResult, block_lines, ledger_text
from llm_assets.util import column_sizes

if TYPE_CHECKING:
    from llm_assets.resources.providers.realtime import OnlineStats, OnlineWork
    from llm_assets.resources.storage import ArtifactStorage
    from llm_assets.spec.model import PipelineSpec


ONLINE_BATCH_PREFIX = "online-"
"""The provider batch id of a shard the provider_batches step sent request by request."""


class ShardState(StrEnum):
    CREATED = "created"
    UPLOADED = "uploaded"
    SUBMITTED = "submitted"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    IMPORTED = "imported"


IN_FLIGHT_STATES = frozenset({ShardState.SUBMITTED, ShardState.RUNNING})
ENDED_STATES = frozenset(
    {ShardState.COMPLETED, ShardState.FAILED, ShardState.EXPIRED, ShardState.CANCELLED}
)


class RequestItem(BaseModel):
    """One rendered request, before it takes a provider's wire format."""

    model_config = ConfigDict(frozen=True)

    custom_id: str
    system: str
    user: str


class ShardSubmission(BaseModel):
    """What a provider needs to submit a shard.

    `intent_at` is set when an earlier attempt recorded its intent to submit but not a
    provider batch id: that attempt may have created a batch before it crashed, so the
    adapter must look for it before creating another.
    """

    model_config = ConfigDict(frozen=True)

    shard_id: str
    job_id: str
    pipeline: str
    input_uri: str
    item_count: int
    intent_at: dt.datetime | None = None
    known_batch_ids: frozenset[str] = frozenset()
    """Provider batches the ledger already gave to other shards: never this shard's."""
    model: str = ""
    """The spec's model name (Bedrock names it per job, not per request line)."""
    format: str = ""
    """The request lines' format where a provider has several (Bedrock: anthropic, converse)."""


class ShardFiles(BaseModel):
    """An imported shard's batch, for deleting what the provider holds of it."""

    model_config = ConfigDict(frozen=True)

    shard_id: str
    provider_batch_id: str
    input_uri: str
    """The shard file in the artifact storage. It is ours, not the provider's: retry rounds
    read their request lines from it, so it is never deleted with the provider's files (even
    where the provider reads it in place, as Bedrock does when artifacts are on S3)."""


WAITING_FOR_QUOTA = "waiting_for_quota"
"""The raw_status of a shard not yet submitted because the provider's quota has no room."""


class AmbiguousSubmission(Exception):
    """More than one provider batch could belong to a shard; an operator must decide."""


class BatchStatus(BaseModel):
    """A provider batch's state, mapped onto shard states; raw_status keeps the provider's word."""

    model_config = ConfigDict(frozen=True)

    provider_batch_id: str
    state: ShardState
    raw_status: str
    total: int = 0
    completed: int = 0
    failed: int = 0
    message: str | None = None

    @field_validator("raw_status")
    @classmethod
    def _raw_status_fits(cls, value: str) -> str:
        """Kept in the shard's raw_status column, whatever the provider said."""
        return ledger_text(value, column_sizes.RAW_STATUS) or ""

    @field_validator("message")
    @classmethod
    def _message_fits(cls, value: str | None) -> str | None:
        return ledger_text(value)

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES


def resolve_secret(value: str | None) -> str | None:
    """A key given as dg.EnvVar, read when a client is made (also outside a Dagster run)."""
    if isinstance(value, dg.EnvVar):
        return value.get_value()
    return value


class BatchProvider(dg.ConfigurableResource):
    """Build request lines, submit a shard, poll it, stream its results, cancel it."""

    priced_as_batch: ClassVar[bool] = True
    """Whether the price table's batch discount applies to what this provider runs."""
    runs_in_step: ClassVar[bool] = False
    """True when provider_batches itself does the work (online): nothing to poll."""
    ends_when_polled: ClassVar[bool] = False
    """True when polling does the work (the local provider runs batches as they are polled):
    whoever waits for a batch then polls again at once instead of sleeping between polls."""
    line_id_field: ClassVar[str] = "custom_id"
    """The key under which this provider's request lines carry the custom_id; each line
    starts with it, so retry rounds read a line's id without parsing the line."""

    quota_kind: ClassVar[str] = "batches"
    """What the provider's quota on creating batches counts: "batches" in progress, or
    "tokens" (prompt tokens enqueued). Submission learns its limit (steps/quota.py)."""
    refuses_after_create: ClassVar[bool] = False
    """True when a batch over the quota is created and then refused (OpenAI fails it while
    validating): its admission shows at a poll, not at the create."""
    prompt_cache: ClassVar[Literal["marked", "automatic"] | None] = None
    """How the provider caches the prefix a spec's `prompt.cache` names: "marked" (the request
    lines mark it, with the spec's TTL), "automatic" (the provider caches a long prefix that
    is the same byte for byte by itself), None (it cannot be asked to)."""
    console_url_template: ClassVar[str | None] = None
    """Where the provider's web console shows one batch, `{batch_id}` standing for its
    provider batch id; None when the provider has no such page (see `console_url`)."""

    quota_wait_seconds: float = pydantic.Field(
        default=60.0,
        ge=0,
        description="How long a shard refused for quota waits before it is submitted again, "
        "when the provider gives no Retry-After.",
    )

    stuck_after_seconds: float = pydantic.Field(
        default=3600.0,
        ge=0,
        description="The least time a batch created but not started counts as stuck (it "
        "must also wait four times the longest start of the model's recent batches).",
    )

    def console_url(self, provider_batch_id: str) -> str | None:
        """The provider console's page of a batch, for the operator's link in the UI; None
        where there is none: the provider has no console page, or the shard was sent request
        by request (an `online-` id names no provider batch)."""
        template = self.console_url_template
        if template is None or provider_batch_id.startswith(ONLINE_BATCH_PREFIX):
            return None
        return template.format(batch_id=urllib.parse.quote(provider_batch_id, safe=""))

    def quota_account(self) -> str:
        """Whose quota the batches count against: the endpoint or account (no secret)."""
        return "default"

    def ended_for_quota(self, raw_status: str | None, message: str | None) -> bool:
        """Whether a batch that ended (as the ledger recorded it) was refused for a quota after
        it was created, its requests never run: OpenAI fails a batch over the enqueued-token
        limit that way. Its items are sent again without counting an attempt."""
        return False

    def request_format(self, spec: "PipelineSpec") -> str:
        """The format of the spec's request lines where the provider takes several, for
        `ShardSubmission.format`; empty when it takes one."""
        return ""

    def min_records_per_shard(self, spec: "PipelineSpec") -> int:
        """The fewest requests a shard should have: sharding merges smaller remainders."""
        return 1

    def below_minimum_reason(
        self, spec: "PipelineSpec", shard_id: str, item_count: int
    ) -> str | None:
        """Why a shard of `item_count` items is not sent (its items become dead letters that
        say so), or None to submit it."""
        minimum = self.min_records_per_shard(spec)
        if item_count >= minimum:
            return None
        return (
            f"{shard_id} has {item_count} item(s), below {spec.model.provider}'s minimum of "
            f"{minimum} requests per batch"
        )

    def runs_shard_in_step(
        self, spec: "PipelineSpec", item_count: int, provider_batch_id: str | None
    ) -> bool:
        """Whether provider_batches sends this shard's items itself, request by request at
        realtime prices, instead of submitting it as a batch."""
        return self.runs_in_step

    def run(self, spec: "PipelineSpec", work: "OnlineWork") -> "OnlineStats":
        """Send a shard's requests one by one, for the shards `runs_shard_in_step` names."""
        raise NotImplementedError

    def encode_request(self, spec: "PipelineSpec", item: RequestItem) -> bytes:
        """`request_line` as one line of JSON. What is the same for every item of a spec (the
        model, the system prompt, the output schema) is serialized once: only the custom_id
        and the user text are encoded per item."""
        template = _line_template(self, spec)
        if template is None or item.system != spec.prompt.system:
            line = json.dumps(self.request_line(spec, item), ensure_ascii=False)
            return line.encode()
        return TemplateEncoder(*template)(item.custom_id, item.user)

    def line_encoder(self, spec: "PipelineSpec") -> Callable[[str, str], bytes]:
        """(custom_id, user text) → request line for items with the spec's system prompt: a
        TemplateEncoder (it pickles, so worker processes can encode) when the provider's
        line can be templated, else a call of `encode_request` per item."""
        template = _line_template(self, spec)
        if template is not None:
            return TemplateEncoder(*template)
        system = spec.prompt.system
        return lambda custom_id, user: self.encode_request(
            spec, RequestItem(custom_id=custom_id, system=system, user=user)
        )

    def realtime_request(self, line: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """A shard line as (custom_id, request body) for a realtime call."""
        return str(line[self.line_id_field]), line["body"]

    def spec_problems(self, spec: "PipelineSpec") -> list[tuple[str, str]]:
        """What in a spec this provider cannot serve, as (field, reason)."""
        return []

    def request_line(self, spec: "PipelineSpec", item: RequestItem) -> dict[str, Any]:
        raise NotImplementedError

    def submit(self, shard: ShardSubmission, storage: "ArtifactStorage") -> str:
        """Submit once; the same shard submitted again returns the same provider batch id."""
        raise NotImplementedError

    def find_submitted(self, shard: ShardSubmission) -> str | None:
        """The batch an earlier attempt created for the shard (it recorded its intent, then
        stopped before recording the batch), looked up without creating one: what is
        reconciled before a shard that may not be sent (cancelled, paused) is closed. None
        when the provider has none."""
        raise NotImplementedError

    def poll(self, provider_batch_id: str) -> BatchStatus:
        raise NotImplementedError

    def poll_briefly(self, provider_batch_id: str, timeout_seconds: float) -> BatchStatus:
        """`poll` as one call bounded by `timeout_seconds` and never retried or waited out,
        for a sensor tick (its next tick asks again). Providers whose `poll` can take longer
        override this."""
        return self.poll(provider_batch_id)

    def results(self, provider_batch_id: str) -> Iterator[ItemResult]:
        """The batch's results, one per line, read with the parser of `result_blocks`;
        providers whose results are not lines override this."""
        blocks = self.result_blocks(provider_batch_id)
        if blocks is None:
            raise NotImplementedError
        raw, parse = blocks
        for line in block_lines(raw):
            read = parse(line)
            if read is not None:
                yield read.result() if isinstance(read, Answered) else read

    def result_blocks(
        self, provider_batch_id: str
    ) -> tuple[Iterator[bytes], Callable[[bytes], Answered | ItemResult | None]] | None:
        """For a provider whose results are lines: the batch's raw lines (what `results`
        reads), in blocks of whole lines (blank lines are skipped), and the module-level
        function that reads one line, so that a large import can hand blocks to worker
        processes as they are, and parse them there. The function gives what `results` would
        (None: no result), except that a plain success may come as an Answered, made into a
        ledger row without an ItemResult. None: use `results`."""
        return None

    def cancel(self, provider_batch_id: str) -> BatchStatus:
        raise NotImplementedError

    def delete_files(self, shard: ShardFiles) -> list[str]:
        """Delete what the provider holds of an imported shard: its uploaded input, its output
        and error files, the batch itself where the API deletes batches. Returns what was
        deleted, named as the provider names it; what is gone already is skipped, so a
        deletion cut short is simply asked for again. Providers that keep nothing (local,
        online) delete nothing."""
        return []


_ID_MARK = "\ue000llm-assets:custom_id\ue000"
_USER_MARK = "\ue000llm-assets:user\ue000"
_templates: dict[str, tuple[Any, "PipelineSpec", tuple[str, str, str, bool] | None]] = {}


def _line_template(
    provider: BatchProvider, spec: "PipelineSpec"
) -> tuple[str, str, str, bool] | None:
    """A spec's request line split around its custom_id and user text, or None when the
    provider does not carry both as plain JSON strings (then every line is serialized)."""
    key = spec.name
    cached = _templates.get(key)
    if cached is not None and cached[0] is provider and cached[1] is spec:
        return cached[2]
    probe = RequestItem(custom_id=_ID_MARK, system=spec.prompt.system, user=_USER_MARK)
    try:
        text = json.dumps(provider.request_line(spec, probe), ensure_ascii=False)
    except ValueError:  # the provider checks custom_ids itself: it sees every item
        _templates[key] = (provider, spec, None)
        return None
    marks = json.dumps(_ID_MARK, ensure_ascii=False), json.dumps(_USER_MARK, ensure_ascii=False)
    template: tuple[str, str, str, bool] | None = None
    if text.count(marks[0]) == 1 and text.count(marks[1]) == 1:
        id_first = text.index(marks[0]) < text.index(marks[1])
        first, second = marks if id_first else marks[::-1]
        head, rest = text.split(first)
        middle, tail = rest.split(second)
        template = (head, middle, tail, id_first)
    _templates[key] = (provider, spec, template)
    return template
