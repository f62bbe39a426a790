"""Pipeline specs: one YAML file describes one pipeline, parsed into pydantic models.

What one field's validator can say is said here; the rules across fields and against the
world (providers, prices, residency, the pandera model) are checks that `load.py` runs on
every parsed spec; the model imports none of them.
"""

import datetime as dt
import hashlib
import json
import re
import string
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from llm_assets.compliance.spec import DEFAULT_PII, ComplianceSpec, RetentionSpec
from llm_assets.evaluation.spec import EvalSpec, VariantName, VariantSpec
from llm_assets.util import column_sizes
from llm_assets.util.secrecy import holds_a_secret

FIELD_TYPES = ("str", "int", "float", "bool", "list[str]", "list[float]")
PIPELINE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceSpec(_Strict):
    kind: Literal["jsonl", "csv", "parquet"]
    uri: str = Field(description="Relative to LLM_ASSETS_HOME, absolute, or s3://; globs allowed.")
    id_field: str
    date_field: str
    fields: list[str] = Field(min_length=1)
    required_fields: list[str] | None = Field(
        default=None, description="Fields that must be non-blank; default: every field."
    )
    max_line_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        description="A JSONL or CSV line longer than this is an input dead letter; it is read "
        "past, never held in memory.",
    )

    @property
    def non_blank_fields(self) -> list[str]:
        return self.required_fields if self.required_fields is not None else self.fields


class CacheSpec(_Strict):
    """The provider's prompt cache for `prompt.system`, the prefix every request shares
    (instructions, few-shot examples, a shared document)."""

    ttl: Literal["5m", "1h"] = Field(
        default="5m",
        description="How long Anthropic keeps the cached prefix after its last use; a write "
        "costs 1.25 times plain input for 5m, twice for 1h. Providers that cache by themselves "
        "(openai, gemini) take only 5m, which leaves the lifetime to them.",
    )
    prime: bool = Field(
        default=False,
        description="Send a small priming batch of `prime_items` items first and submit the "
        "rest of the day once it has ended, so the rest read the prefix from the cache "
        "instead of each writing it.",
    )
    prime_items: int = Field(
        default=5, ge=1, le=1000, description="Items in the priming batch (prime: true)."
    )


class PromptSpec(_Strict):
    version: str = Field(
        min_length=1,
        max_length=column_sizes.PROMPT_VERSION,
        description="Part of the job key, kept in the ledger's prompt_version column.",
    )
    system: str = ""
    template: str = Field(min_length=1)
    truncate_to_context: bool = Field(
        default=False,
        description="Cut a prompt that is over the context window instead of dead-lettering it.",
    )
    cache: CacheSpec | None = Field(
        default=None,
        description="Cache `system`, the prefix every request shares, at the provider; reads "
        "cost a tenth of plain input on Anthropic.",
    )

    @model_validator(mode="after")
    def _cache_needs_a_prefix(self) -> "PromptSpec":
        if self.cache is not None and not self.system.strip():
            raise ValueError(
                "cache caches the system prompt, the prefix every request shares; this "
                "prompt has none: give prompt.system or leave cache out"
            )
        return self

    @property
    def placeholders(self) -> list[str]:
        return [
            name for _, name, _, _ in string.Formatter().parse(self.template) if name is not None
        ]


class ModelSpec(_Strict):
    provider: str
    name: str = Field(max_length=column_sizes.MODEL_NAME)
    max_output_tokens: int = Field(default=512, gt=0)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    options: dict[str, Any] = Field(default_factory=dict)


class FieldSpec(_Strict):
    type: Literal["str", "int", "float", "bool", "list[str]", "list[float]"]
    description: str = ""
    nullable: bool = False
    isin: list[str | int] | None = None
    min_length: int | None = Field(default=None, ge=0)
    max_length: int | None = Field(default=None, ge=1)
    ge: float | None = None
    le: float | None = None
    gt: float | None = None
    lt: float | None = None

    @model_validator(mode="after")
    def _constraints_fit_the_type(self) -> "FieldSpec":
        numeric = self.type in ("int", "float")
        sized = self.type in ("str", "list[str]", "list[float]")
        if self.isin is not None:
            if self.type not in ("str", "int"):
                raise ValueError(f"isin is only allowed on str or int fields, not {self.type}")
            if not self.isin:
                raise ValueError("isin must list at least one value")
            if len(set(map(str, self.isin))) != len(self.isin):
                raise ValueError("isin lists a value twice")
            wanted = str if self.type == "str" else int
            wrong = [v for v in self.isin if type(v) is not wanted]
            if wrong:
                raise ValueError(f"isin values {wrong} are not of the field's type {self.type}")
        if (self.min_length is not None or self.max_length is not None) and not sized:
            raise ValueError(f"min_length/max_length apply to str and list fields, not {self.type}")
        if (
            self.min_length is not None
            and self.max_length is not None
            and self.min_length > self.max_length
        ):
            raise ValueError(f"min_length {self.min_length} > max_length {self.max_length}")
        bounds = {"ge": self.ge, "le": self.le, "gt": self.gt, "lt": self.lt}
        if any(v is not None for v in bounds.values()) and not numeric:
            raise ValueError(f"ge/le/gt/lt apply to int and float fields, not {self.type}")
        lower = self.ge if self.ge is not None else self.gt
        upper = self.le if self.le is not None else self.lt
        exclusive = self.gt is not None or self.lt is not None
        if (
            lower is not None
            and upper is not None
            and (lower > upper or (exclusive and lower >= upper))
        ):
            raise ValueError(f"no value fits between lower bound {lower} and upper bound {upper}")
        return self


class OutputSpec(_Strict):
    format: Literal["json", "text"] = "json"
    output_schema: dict[str, FieldSpec] = Field(default_factory=dict, alias="schema")
    pandera_model: str | None = Field(
        default=None,
        description="`package.module:Class` of a pandera DataFrameModel with extra frame rules.",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _schema_matches_format(self) -> "OutputSpec":
        if self.format == "json" and not self.output_schema:
            raise ValueError("format json needs a schema with at least one field")
        if self.format == "text" and set(self.output_schema) - {"text"}:
            raise ValueError("format text takes at most one schema field, named 'text'")
        return self


class QualitySpec(_Strict):
    max_failure_rate: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="The quality gate: when quality dead letters / items validated exceed this, "
        "the gate check quality_failure_rate fails and the day is not published. Not the "
        "notification alert (automation.notify.max_dead_letter_rate).",
    )
    min_confidence: float | None = Field(default=None, ge=0.0, le=1.0)
    max_low_confidence_share: float = Field(
        default=0.2, ge=0.0, le=1.0, description="WARN above this share below min_confidence."
    )
    max_label_shift: float = Field(
        default=0.3,
        ge=0.0,
        le=1.0,
        description="WARN when the label distribution moves more than this (total variation).",
    )
    shift_window: int = Field(default=7, ge=1, description="Recent partitions compared.")
    qa_sample_size: int = Field(default=20, ge=0)


class ShardingSpec(_Strict):
    max_requests_per_shard: int = Field(default=50_000, gt=0)
    max_bytes_per_shard: int = Field(default=100 * 1024 * 1024, gt=1024)
    slices: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Slices a day's shard building and validation are split into: each a "
        "step of its own, run on any worker (the Celery executor spreads them over machines), "
        "joined before submission and before publication. 1 runs each in one step.",
    )


class QuotaSpec(_Strict):
    """The provider's quota for this model, kept by submission so nothing is refused: shards
    beyond it wait in the ledger and go as earlier batches of the model end (any pipeline's)."""

    max_active_batches: int | None = Field(
        default=None, ge=1, description="Batches of this provider and model in flight at once."
    )
    max_enqueued_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Estimated prompt tokens of this provider and model in flight at once "
        "(OpenAI's enqueued-token limit).",
    )


class RetrySpec(_Strict):
    max_attempts: int = Field(default=3, ge=1, le=20)
    backoff_seconds: float = Field(
        default=60.0, ge=0.0, description="Wait before retry round n: backoff × 2^(n-1), jittered."
    )
    max_backoff_seconds: float = Field(default=3600.0, ge=0.0)


class BudgetSpec(_Strict):
    max_usd_per_partition: float | None = Field(
        default=None,
        ge=0.0,
        description="A day's upper bound above this blocks submission until approved.",
    )
    max_usd_per_day: float | None = Field(
        default=None,
        ge=0.0,
        description="Pipeline cap on what all partitions together spend per UTC calendar day.",
    )
    max_usd_per_month: float | None = Field(
        default=None, ge=0.0, description="Pipeline cap per UTC calendar month."
    )
    history_window: int = Field(
        default=7,
        ge=1,
        description="Earlier partitions the output estimate and the drift check learn from.",
    )
    drift_factor: float = Field(
        default=1.5,
        gt=1.0,
        description="WARN when tokens or cost per item move more than this factor from the "
        "trailing median.",
    )
    breaker_factor: float = Field(
        default=1.2,
        gt=1.0,
        description="Cancel the day when its billed cost plus the expected cost of what is "
        "still open passes max_usd_per_partition (or the month's cap) times this.",
    )


class OnlineSpec(_Strict):
    """How the online provider calls its endpoint (ignored by batch providers)."""

    base_url: str | None = Field(
        default=None,
        description="The endpoint, e.g. http://vllm:8000/v1; default from "
        "LLM_ASSETS_ONLINE_BASE_URL.",
    )
    concurrency: int = Field(default=8, ge=1, le=512, description="Requests in flight.")
    rpm: int | None = Field(default=None, gt=0, description="Requests per minute allowed.")
    tpm: int | None = Field(
        default=None,
        gt=0,
        description="Tokens per minute allowed (input as counted plus max_output_tokens).",
    )
    checkpoint_every: int = Field(
        default=25, ge=1, description="Results written to the ledger after this many."
    )
    timeout_seconds: float = Field(default=60.0, gt=0)
    max_tries: int = Field(
        default=4, ge=1, le=20, description="Tries per item within a run for transient errors."
    )


class BedrockSpec(_Strict):
    """Bedrock batch inference specifics (ignored by other providers)."""

    min_records_per_job: int = Field(
        default=100,
        ge=1,
        description="Bedrock refuses smaller jobs; a small last shard is "
        "merged into the one before it, or topped up from it.",
    )
    below_minimum: Literal["online", "merge"] = Field(
        default="online",
        description="A shard that merging cannot bring to min_records_per_job (a small day, a "
        "retry round): `online` sends its items one by one through bedrock-runtime (InvokeModel "
        "or Converse) at on-demand prices, paced by the `online:` section; `merge` only merges, "
        "and such a shard's items become dead letters (below_minimum), never paid at on-demand "
        "prices, to be requeued later.",
    )


OLD_DEAD_LETTER_RATE = "max_error_rate"
"""The deprecated name of automation.notify.max_dead_letter_rate."""


class NotifySpec(_Strict):
    webhook_env: str = Field(
        default="LLM_ASSETS_WEBHOOK_URL",
        description="Environment variable holding a Slack-compatible webhook URL (https, or "
        "http to 127.0.0.1, ::1 or localhost); unset: log only.",
    )
    max_dead_letter_rate: float | None = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description="Alert (the day's summary starts with ALERT) when all dead letters, of "
        "every class, / items exceed this; blocks nothing. Not the quality gate "
        "(quality.max_failure_rate). `max_error_rate` is its deprecated old name.",
    )
    max_cost_usd: float | None = Field(
        default=None, ge=0.0, description="Alert when a partition costs more than this."
    )

    @model_validator(mode="before")
    @classmethod
    def _old_name(cls, data: Any) -> Any:
        """`max_error_rate` still loads, as max_dead_letter_rate, with a FutureWarning."""
        if not isinstance(data, dict) or OLD_DEAD_LETTER_RATE not in data:
            return data
        if "max_dead_letter_rate" in data:
            raise ValueError(
                f"give max_dead_letter_rate only; {OLD_DEAD_LETTER_RATE} is its old name"
            )
        warnings.warn(
            f"automation.notify.{OLD_DEAD_LETTER_RATE} is deprecated: rename it to "
            "max_dead_letter_rate (the dead-letter rate alert, not the quality gate)",
            FutureWarning,
            stacklevel=2,
        )
        data = dict(data)
        data["max_dead_letter_rate"] = data.pop(OLD_DEAD_LETTER_RATE)
        return data

    @field_validator("webhook_env")
    @classmethod
    def _not_a_secret_variable(cls, variable: str) -> str:
        if holds_a_secret(variable):
            raise ValueError(
                f"{variable} holds the ledger's URL, a key or a password, never a webhook URL; "
                "name a variable that holds only the webhook's URL"
            )
        return variable


class AutomationSpec(_Strict):
    new_data_sensor: bool = Field(
        default=True, description="Watch the source files and submit the days they touch."
    )
    schedule: str | None = Field(
        default=None,
        description="Cron (in partitions.timezone) submitting the latest complete day, e.g. "
        "'0 6 * * *' for a source that is filled nightly.",
    )
    notify: NotifySpec = NotifySpec()


class PartitionSpec(_Strict):
    start_date: dt.date
    timezone: str = "UTC"
    end_offset: int = Field(default=0, ge=0, description="Days after today to allow, usually 0.")


class PipelineSpec(_Strict):
    name: Annotated[str, Field(pattern=PIPELINE_NAME.pattern)]
    description: str = ""
    owner: str = ""
    source: SourceSpec
    prompt: PromptSpec
    model: ModelSpec
    output: OutputSpec
    quality: QualitySpec = QualitySpec()
    sharding: ShardingSpec = ShardingSpec()
    retry: RetrySpec = RetrySpec()
    quota: QuotaSpec = QuotaSpec()
    budget: BudgetSpec = BudgetSpec()
    online: OnlineSpec = OnlineSpec()
    bedrock: BedrockSpec = BedrockSpec()
    automation: AutomationSpec = AutomationSpec()
    compliance: ComplianceSpec = ComplianceSpec()
    retention: RetentionSpec = RetentionSpec()
    variants: dict[VariantName, VariantSpec] = Field(
        default_factory=dict, description="Alternatives to model and prompt an eval replays."
    )
    eval: EvalSpec = EvalSpec()
    partitions: PartitionSpec
    tags: dict[str, str] = Field(default_factory=dict)

    path: Path | None = Field(default=None, exclude=True)
    parent: str | None = Field(default=None, exclude=True)
    """Set on an eval pipeline (evaluation/replay.py), never in a spec file: the pipeline it
    evaluates, whose budget caps, spend breaker, pause and cancel it runs under."""

    @property
    def governing_pipeline(self) -> str:
        """The pipeline whose pause, caps and month's spend this one runs under."""
        return self.parent or self.name

    @property
    def prompt_code_version(self) -> str:
        """Changes whenever what is sent to the model changes, so Dagster marks it stale."""
        # A prompt without a cache dumps as it did before caching existed: its version stays.
        uncached = {"cache"} if self.prompt.cache is None else None
        payload = {
            "prompt": self.prompt.model_dump(exclude=uncached),
            "model": self.model.model_dump(),
            "output": self.output.model_dump(by_alias=True),
            "fields": self.source.fields,
        }
        if self.compliance.pii != DEFAULT_PII:
            payload["pii"] = self.compliance.pii
        digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
        return f"{self.prompt.version}-{digest[:12]}"
