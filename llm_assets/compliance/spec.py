"""The spec's `compliance` and `retention` sections."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Entity = Literal["email", "phone", "card", "iban", "national_id", "ip_address", "credential"]
ENTITIES: tuple[Entity, ...] = (
    "email",
    "phone",
    "card",
    "iban",
    "national_id",
    "ip_address",
    "credential",
)
Action = Literal["allow", "redact", "pseudonymize", "block"]

DEFAULT_PII: dict[Entity, Action] = {
    "email": "redact",
    "phone": "redact",
    "ip_address": "redact",
    "iban": "redact",
    "national_id": "redact",
    "card": "block",
    "credential": "block",
}
"""Contact data and identifiers are replaced by placeholders; cards and credentials never
leave. A spec's `compliance.pii` overrides these per entity type."""

PHONE_REGIONS = ("GB", "DE", "FR", "ES", "IT", "NL", "AU", "JP")
"""Where a phone number written in national format (0...) is looked up by default; North
American and +country numbers are found whatever the regions."""

MAX_SCANNED_CHARS = 8 * 1024 * 1024
"""The longest prompt scanned by default: 8 Mi characters, twice a million-token context."""

ArtifactKind = Literal[
    "snapshots", "shards", "qa", "gate", "outputs", "published", "dead_letters", "reports"
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ComplianceSpec(_Strict):
    pii: dict[Entity, Action] = Field(
        default_factory=lambda: dict(DEFAULT_PII),
        description="Action per entity type found in a rendered prompt: allow, redact "
        "(typed placeholder such as <EMAIL_1>), pseudonymize (placeholder sent, the value "
        "restored in the validated output) or block (a `compliance` dead letter). Types not "
        "named keep the default policy.",
    )
    phone_regions: list[str] = Field(
        default_factory=lambda: list(PHONE_REGIONS),
        description="Regions (ISO 3166 codes) whose national phone formats (020 7946 0958) "
        "are looked for; [] for +country and North American numbers only.",
    )
    max_scanned_chars: int = Field(
        default=MAX_SCANNED_CHARS,
        ge=1,
        description="A rendered prompt longer than this is not scanned for personal data but "
        "blocked (a `compliance` dead letter saying so): scanning is linear, but a pasted "
        "export of hundreds of MB is not a prompt.",
    )
    max_blocked_rate: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="The `compliance` check fails, and holds submission, when blocked items / "
        "items exceed this.",
    )
    allowed_regions: list[str] | None = Field(
        default=None,
        description="Where prompts may go and artifacts may rest: jurisdictions (eu, us, ...) "
        "or exact regions (eu-central-1). Unset: anywhere.",
    )
    endpoint_regions: dict[str, str] = Field(
        default_factory=dict,
        description="Region of a self-hosted or proxied endpoint, by host name, or of a "
        "Bedrock application inference profile, by its ARN, for the residency check.",
    )

    @field_validator("pii", mode="after")
    @classmethod
    def _over_defaults(cls, pii: dict[Entity, Action]) -> dict[Entity, Action]:
        return {**DEFAULT_PII, **pii}

    @field_validator("allowed_regions", mode="after")
    @classmethod
    def _lower(cls, regions: list[str] | None) -> list[str] | None:
        if regions is None:
            return None
        if not regions:
            raise ValueError("name at least one region, or leave allowed_regions out")
        return [r.strip().lower() for r in regions]


class RetentionSpec(_Strict):
    provider_files: Literal["delete_after_import", "keep"] = Field(
        default="delete_after_import",
        description="Delete a shard's files at the provider (inputs, outputs, error files, "
        "Bedrock's S3 objects) once its results are imported; the ledger keeps ids and counts.",
    )
    artifacts_days: int | None = Field(
        default=None,
        ge=1,
        description="The retention schedule deletes the `artifacts` of days finished longer "
        "ago than this. Unset: kept.",
    )
    artifacts: list[ArtifactKind] = Field(
        default_factory=lambda: list[ArtifactKind](("snapshots", "shards", "qa")),
        description="What artifacts_days deletes; validated outputs, dead letters and cost "
        "reports are kept unless named.",
    )
