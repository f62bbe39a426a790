"""How the provider contract suite drives each batch adapter: one kit per adapter, saying how
to point it at its fake server and how to inject each kind of fault into that fake.

A new batch adapter joins the contract suite (tests/test_provider_contract.py) by adding a
kit here; a case the kit has no entry for (no fake to inject faults into, no quota to meet)
is not generated for it.
"""

import dataclasses
import json
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from llm_assets.resources.ledger import TERMINAL
from llm_assets.resources.providers.azure_openai import AzureOpenAIBatchProvider
from llm_assets.resources.providers.base import BatchProvider
from llm_assets.resources.providers.bedrock import BedrockBatchProvider
from llm_assets.resources.providers.local import LocalProvider
from llm_assets.resources.storage import ArtifactStorage
from tests.harness import POSITIVE, provider_for

JSON = dict[str, Any]

BEDROCK_ROLE = "arn:aws:iam::123456789012:role/BedrockBatchInference"
BEDROCK_MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
AZURE_DEPLOYMENT = "reviews-4o-mini"
"""The Azure deployment the review pipeline's lines name; it serves gpt-4o-mini."""


def dead_letters(rows: dict[str, JSON], *fields: str) -> list[tuple[Any, ...]]:
    """(source_id, error_class, *fields) of each dead letter among a day's result rows (as
    `Harness.rows()` gives them), once every row has settled: an open row fails the test."""
    assert all(row["status"] in TERMINAL for row in rows.values())
    return [
        (row["source_id"], row["error_class"], *(row[name] for name in fields))
        for row in rows.values()
        if row["status"] == "dead_letter"
    ]


def truthful(body: JSON) -> str:
    """Answers a request of any provider's wire format like a good model: the label the
    review's words imply (the prompt itself holds none of them)."""
    label = "positive" if any(word in json.dumps(body).lower() for word in POSITIVE) else "negative"
    return json.dumps({"label": label, "summary": "A customer review."})


@dataclass(frozen=True)
class Ending:
    """A way for a batch to end before all its requests ran."""

    outcome: str
    """What the fake's outcome knob answers for it."""
    raw_status: str
    """The provider's status of a batch that ended so."""
    keeps_answers: bool
    """Whether the requests answered before the end come back."""


@dataclass(frozen=True)
class ProviderKit:
    """One batch adapter and its fake: the provider name, the model and spec sections a day
    uses, and the fake's knobs for each contract case."""

    name: str
    """The provider, and the `fake_server` kind of its fake."""
    model: str
    adapter: Callable[[Any, Path], BatchProvider] = lambda fake, state_dir: provider_for(fake)
    """(fake, state dir) -> the adapter pointed at it, with short retries and waits."""
    in_process: bool = False
    """The adapter runs in process: no fake server, nothing to inject."""
    knobs: JSON = field(default_factory=lambda: {"responder": truthful})
    spec: JSON = field(default_factory=dict)
    """Sections of the review spec (tests/harness.py review_spec) this provider needs."""
    on_s3: bool = False
    """The artifact storage must be S3 (the moto server)."""
    fault_knob: str = ""
    """The fake's per-request fault knob: (custom_id, request body) -> fault kind."""
    transient: tuple[str, ...] = ()
    """Per-request faults whose requests are retried."""
    permanent: dict[str, str] = field(default_factory=dict)
    """Per-request faults that dead-letter their request, with the error_code it gets."""
    unanswered: tuple[str, ...] = ()
    """Per-request faults after which a request has no answer (missing, expired), retried."""
    duplicate: str | None = None
    """The per-request fault that answers a request twice."""
    outcome_knob: str = ""
    """The fake's knob deciding how a batch ends: (batch) -> outcome."""
    completes: str = ""
    """The outcome of a batch that runs to its end."""
    endings: dict[str, Ending] = field(default_factory=dict)
    create: tuple[str, str] = ("", "")
    """(method, path substring) of the call that creates a batch."""
    control: tuple[tuple[str, str], ...] = ()
    """The other control-plane calls of a batch's life: upload, poll, download."""
    busy_status: int = 503
    """What the control plane answers when it is overloaded."""
    throttled_create_is_quota: bool = True
    """Whether a 429 on create is a quota refusal (else a throttle, retried at once)."""
    quota: JSON = field(default_factory=dict)
    """Knobs that let one batch at a time in; empty: no quota to meet."""
    running: str = "in_progress"
    """The provider's status of a batch whose requests are running (cancel then keeps some)."""
    cancelling: str = "cancelled"
    """The provider's status of a running batch right after it was cancelled."""
    counts_requests: bool = True
    """The batch status counts its requests (Gemini's batch view does not)."""
    reconciles_by_listing: bool = False
    """A lost create is found by listing batches (no idempotency key)."""
    cancel_settles_ambiguity: bool = False
    """Of two batches that could be a shard's, cancelling one makes the other its batch."""
    batches: Callable[[Any], list[str]] = lambda fake: []
    """The batch ids the fake holds."""
    held_files: Callable[[Any], list[str]] = lambda fake: []
    """What the fake still holds of its batches' data: files, batches, objects."""
    files_per_batch: int = 0
    """How many of those a batch without failed requests leaves behind."""

    @property
    def fake_kind(self) -> str | None:
        return None if self.in_process else self.name

    def submitted(self, fake: Any) -> Counter[str]:
        """How often the fake was sent each custom_id."""
        return Counter(fake.submitted_custom_ids())

    def strike(self, fake: Any, faults: Callable[[str, str], str | None]) -> None:
        """Set the fake's per-request fault to `faults(custom_id, request as JSON text)`."""
        setattr(fake, self.fault_knob, lambda custom_id, body: faults(custom_id, json.dumps(body)))

    def end_first_batch(self, fake: Any, outcome: str) -> list[str]:
        """The first batch to be decided ends with `outcome`, the rest complete; returns the
        list the first batch's id is put in."""
        first: list[str] = []

        def decide(batch: JSON) -> str:
            if not first:
                first.append(str(batch.get("id") or batch.get("name") or batch.get("jobArn")))
                return outcome
            return self.completes

        setattr(fake, self.outcome_knob, decide)
        return first


def _bedrock_objects(fake: Any) -> list[str]:
    """The S3 objects under the output folders of the fake's jobs."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=fake.s3_endpoint_url)
    held: list[str] = []
    for job in fake.jobs():
        bucket, _, prefix = fake.output_uri(job["jobArn"])[len("s3://") :].partition("/")
        listing = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)
        held += [item["Key"] for item in listing.get("Contents", [])]
    return held


def _bedrock(fake: Any, state_dir: Path) -> BatchProvider:
    return BedrockBatchProvider(
        role_arn=BEDROCK_ROLE,
        endpoint_url=fake.endpoint_url,
        retry_base_seconds=0.01,
        retry_cap_seconds=0.05,
        quota_wait_seconds=0.05,
    )


def _azure(fake: Any, state_dir: Path) -> BatchProvider:
    return AzureOpenAIBatchProvider(
        api_key="test-key",
        azure_endpoint=fake.base_url,
        api_version="2024-10-21",
        timeout_seconds=5.0,
        retry_base_seconds=0.01,
        retry_cap_seconds=0.05,
        max_retry_after_seconds=0.05,
        quota_wait_seconds=0.05,
    )


def _local(fake: Any, state_dir: Path) -> BatchProvider:
    return LocalProvider(state_dir=str(state_dir), work_budget_seconds=0.0, chunk_size=4)


_OPENAI = ProviderKit(
    name="openai",
    model="gpt-4o-mini",
    # The error file of a batch without failed lines as "", one of the API's answers.
    knobs={"responder": truthful, "error_file_when_clean": "empty_string"},
    fault_knob="line_fault",
    transient=("5xx", "429"),
    permanent={"4xx": "invalid_value"},
    unanswered=("missing", "expire"),
    duplicate="duplicate",
    outcome_knob="batch_outcome",
    completes="completed",
    endings={
        "expired": Ending("expired_after_partial", "expired", keeps_answers=True),
        "cancelled": Ending("cancelled_after_partial", "cancelled", keeps_answers=True),
    },
    create=("POST", "/v1/batches"),
    control=(("POST", "/v1/files"), ("GET", "/v1/batches/"), ("GET", "/v1/files/")),
    quota={"enqueued_token_limit": 500},
    cancelling="cancelling",
    reconciles_by_listing=True,
    batches=lambda fake: [b["id"] for b in fake.store.all_batches()],
    held_files=lambda fake: [f["id"] for f in fake.store.all_files()],
    files_per_batch=2,
)


KITS = [
    _OPENAI,
    # Azure OpenAI is OpenAI's Batch API behind Azure's paths, api-version and deployments.
    dataclasses.replace(
        _OPENAI,
        name="azure_openai",
        adapter=_azure,
        knobs={"responder": truthful, "deployments": {AZURE_DEPLOYMENT: "gpt-4o-mini"}},
        spec={"model": {"options": {"deployment": AZURE_DEPLOYMENT}}},
        create=("POST", "/openai/batches"),
        control=(
            ("POST", "/openai/files"),
            ("GET", "/openai/batches/"),
            ("GET", "/openai/files/"),
        ),
    ),
    ProviderKit(
        name="anthropic",
        model="claude-haiku-4-5",
        fault_knob="item_fault",
        transient=("api_error", "overloaded"),
        permanent={"invalid_request": "invalid_request_error"},
        unanswered=("missing", "expired", "canceled"),
        duplicate="duplicate",
        outcome_knob="batch_outcome",
        completes="ended",
        endings={"expired": Ending("expired", "ended", keeps_answers=True)},
        create=("POST", "/v1/messages/batches"),
        control=(("GET", "/v1/messages/batches/"),),
        busy_status=529,
        quota={"max_processing_batches": 1, "quota_retry_after": 0},
        cancelling="canceling",
        reconciles_by_listing=True,
        cancel_settles_ambiguity=True,
        batches=lambda fake: fake.batch_ids(),
        held_files=lambda fake: fake.held_batch_ids(),
        files_per_batch=1,
    ),
    ProviderKit(
        name="gemini",
        model="gemini-2.5-flash",
        fault_knob="line_fault",
        transient=("429", "500"),
        permanent={
            "invalid_argument": "INVALID_ARGUMENT",
            "safety": "finish_SAFETY",
            "prompt_blocked": "prompt_blocked_SAFETY",
        },
        unanswered=("missing",),
        duplicate="duplicate",
        outcome_knob="batch_outcome",
        completes="succeeded",
        endings={
            "expired": Ending("expired", "expired", keeps_answers=True),
            "cancelled": Ending("cancelled_after_partial", "cancelled", keeps_answers=True),
            "failed": Ending("failed", "failed", keeps_answers=False),
        },
        create=("POST", ":batchGenerateContent"),
        control=(
            ("POST", "/upload/v1beta/files"),
            ("GET", "/v1beta/batches/"),
            ("GET", ":download"),
        ),
        quota={"max_active_batches": 1},
        running="running",
        counts_requests=False,
        reconciles_by_listing=True,
        cancel_settles_ambiguity=True,
        batches=lambda fake: list(fake.batches),
        held_files=lambda fake: list(fake.files),
        files_per_batch=2,
    ),
    ProviderKit(
        name="bedrock",
        model=BEDROCK_MODEL,
        adapter=_bedrock,
        knobs={"responder": truthful, "min_records": 1},
        spec={"bedrock": {"min_records_per_job": 1}},
        on_s3=True,
        fault_knob="record_fault",
        transient=("throttled", "server_error"),
        permanent={"error": "400"},
        unanswered=("skip",),
        outcome_knob="job_outcome",
        completes="Completed",
        endings={
            "expired": Ending("Expired", "Expired", keeps_answers=False),
            "partially_completed": Ending(
                "PartiallyCompleted", "PartiallyCompleted", keeps_answers=True
            ),
            "failed": Ending("Failed", "Failed", keeps_answers=False),
        },
        create=("POST", "/model-invocation-job"),
        control=(("GET", "/model-invocation-job/"),),
        throttled_create_is_quota=False,
        quota={"max_active_jobs": 1},
        running="InProgress",
        cancelling="Stopping",
        batches=lambda fake: [job["jobArn"] for job in fake.jobs()],
        held_files=_bedrock_objects,
        files_per_batch=2,
    ),
    ProviderKit(name="local", model="all-MiniLM-L6-v2", adapter=_local, in_process=True),
]


def kits(where: Callable[[ProviderKit], bool] = lambda kit: True) -> list[Any]:
    """The kits a case applies to, as parameters with the provider's name as id."""
    return [pytest.param(kit, id=kit.name) for kit in KITS if where(kit)]


def kit_cases(
    cases: Callable[[ProviderKit], dict[str, Any]], where: Callable[[ProviderKit], bool]
) -> list[Any]:
    """(kit, case) parameters over each kit's named cases, ids like `gemini-expired`."""
    return [
        pytest.param(kit, case, id=f"{kit.name}-{name}")
        for kit in KITS
        if where(kit)
        for name, case in cases(kit).items()
    ]


def storage_for(
    kit: ProviderKit, request: pytest.FixtureRequest, tmp_path: Path
) -> ArtifactStorage:
    """Artifact storage the kit's adapter can read shards from: S3 when it needs it."""
    if kit.on_s3:
        moto_s3 = request.getfixturevalue("moto_s3")
        return ArtifactStorage(base_url=f"s3://{moto_s3.bucket}/{uuid.uuid4().hex}")
    return ArtifactStorage(base_url=str(tmp_path / "artifacts"))
