"""Residency: where a pipeline's prompts go and its artifacts rest, against the spec's
`compliance.allowed_regions`.

The places of a pipeline:

- its provider: the Bedrock region (the resource's `region_name`, else boto3's own default
  from AWS_DEFAULT_REGION or the AWS config file; boto3 does not read AWS_REGION) and, for a
  cross-region inference profile (`eu.anthropic...`), every region of the profile's
  geography, or none at all for a `global.` profile; the OpenAI endpoint (the resource's base
  URL, else OPENAI_BASE_URL, else https://api.openai.com/v1) and the online endpoint (the
  spec's `online.base_url`, else the resource's, else OPENAI_BASE_URL): `api.openai.com` is
  in the us, `eu.api.openai.com` (OpenAI's EU data residency) in the eu, any other host
  where `compliance.endpoint_regions` says, else unknown (a proxy on this machine forwards
  anywhere, so loopback hosts are no exception); the Anthropic API and the Gemini Developer
  API make no regional guarantee; the local provider stays on this machine;
- Bedrock's staging bucket (`staging_uri`) and the artifact storage: a local folder is on this
  machine, an S3 bucket where GetBucketLocation says (looked up once per bucket and process).

Under `allowed_regions`, every place must be on this machine or in a region allowed: an
exact region (`eu-central-1`) allows that region only; a jurisdiction (`eu`) allows every
region of it (JURISDICTION_PREFIXES). A place known only by its jurisdiction (OpenAI's EU
endpoint, a Bedrock `eu.` profile) is allowed by the jurisdiction, never by one region of it.
A place with no regional guarantee, or whose region is unknown, is refused. The ledger holds
ids, counts and results; where it rests is the deployment's choice, not checked here.
"""

import os
import threading
import urllib.parse
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from llm_assets.resources.storage import ArtifactStorage
    from llm_assets.spec import PipelineSpec

JURISDICTION_PREFIXES: tuple[tuple[str, str], ...] = (
    ("us-", "us"),  # AWS us-east-1, us-gov-west-1; Google us-central1
    ("eu-", "eu"),  # AWS eu-central-1 ... (eu-west-2 London and eu-central-2 Zurich too)
    ("europe-", "eu"),  # Google europe-west4
    ("ca-", "ca"),  # AWS ca-central-1
    ("northamerica-northeast", "ca"),  # Google Montréal, Toronto
    ("mx-", "mx"),  # AWS mx-central-1
    ("northamerica-south", "mx"),  # Google Querétaro
    ("sa-", "sa"),  # AWS sa-east-1
    ("southamerica-", "sa"),  # Google
    ("ap-", "ap"),  # AWS Asia Pacific
    ("asia-", "ap"),  # Google
    ("australia-", "ap"),  # Google
    ("me-", "me"),  # AWS, Google Middle East
    ("il-", "il"),  # AWS Tel Aviv
    ("af-", "af"),  # AWS Cape Town
    ("africa-", "af"),  # Google Johannesburg
)
"""A region's jurisdiction by the start of its name, AWS's and Google Cloud's spellings."""
JURISDICTIONS = frozenset(j for _, j in JURISDICTION_PREFIXES)

OPENAI_HOSTS = {"api.openai.com": "us", "eu.api.openai.com": "eu"}
"""OpenAI's API hosts and where they keep data: the EU host is its EU data residency."""
OPENAI_DEFAULT_URL = "https://api.openai.com/v1"
BEDROCK_PROFILES = {
    "us": "us",
    "us-gov": "us",
    "eu": "eu",
    "apac": "ap",
    "jp": "ap",
    "au": "ap",
    "ca": "ca",
}
"""Bedrock cross-region inference profiles (the model id's first part) and the jurisdiction
whose regions they route to; `global.` routes anywhere."""
NO_GUARANTEE_PROVIDERS = {
    "anthropic": "Anthropic Message Batches API",
    "gemini": "Gemini Developer API batch mode",
}
"""Providers that say nothing about the region a request is processed in."""

Status = Literal["region", "this_machine", "no_guarantee", "unknown"]


class Place(BaseModel):
    """Somewhere a pipeline's data goes or rests."""

    model_config = ConfigDict(frozen=True)

    what: str
    status: Status
    region: str | None = None
    """An exact region (eu-central-1) or, where only that is known, a jurisdiction (eu)."""
    hint: str = ""
    """For an unknown region: how to make it known."""
    spec_field: str = ""
    """The spec field that decides the place, where the spec alone does."""

    def allowed_by(self, allowed: list[str]) -> bool:
        if self.status == "this_machine":
            return True
        if self.status != "region" or self.region is None:
            return False
        return region_allowed(self.region, allowed)

    @property
    def where(self) -> str:
        if self.status == "this_machine":
            return "this machine"
        if self.status == "no_guarantee":
            return "no regional guarantee"
        if self.status == "unknown" or self.region is None:
            return "region unknown" + (f": {self.hint}" if self.hint else "")
        return jurisdiction_of(self.region) or f"unknown jurisdiction of {self.region}"

    def describe(self) -> str:
        return f"{self.what} ({self.where})"


def jurisdiction_of(region: str) -> str | None:
    """The jurisdiction of a region (eu-central-1 → eu), or of a jurisdiction itself."""
    region = region.strip().lower()
    if region in JURISDICTIONS:
        return region
    for prefix, jurisdiction in JURISDICTION_PREFIXES:
        if region.startswith(prefix) and len(region) > len(prefix):
            return jurisdiction
    return None


def region_allowed(region: str, allowed: list[str]) -> bool:
    """Whether a place in `region` is allowed: an allowed jurisdiction holds all its regions,
    an allowed region only itself."""
    region = region.strip().lower()
    jurisdiction = jurisdiction_of(region)
    for entry in allowed:
        if entry in JURISDICTIONS:
            if jurisdiction == entry:
                return True
        elif entry == region:
            return True
    return False


def unknown_region_problem(value: str) -> str | None:
    """Why a region or jurisdiction named in a spec is not understood, else None."""
    if jurisdiction_of(value) is not None:
        return None
    return (
        f"{value!r} is neither a jurisdiction ({', '.join(sorted(JURISDICTIONS))}) nor a "
        "region of one (eu-central-1, europe-west4, us-east-1, ...)"
    )


def endpoint_place(name: str, url: str, endpoint_regions: dict[str, str]) -> Place:
    """An OpenAI-compatible endpoint, its region by host: the spec's `endpoint_regions` first
    (they may name any host), then OpenAI's own hosts; the URL is shown without user info
    or query."""
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "").lower()
    shown = f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")
    shown += parts.path.rstrip("/")
    mapped = {h.lower(): r.strip().lower() for h, r in endpoint_regions.items()}
    region = mapped.get(host) or OPENAI_HOSTS.get(host)
    what = f"{name} endpoint {shown}"
    if region is None:
        return Place(
            what=what,
            status="unknown",
            hint=f"name its region under compliance.endpoint_regions ({host}: <region>)",
        )
    if region not in JURISDICTIONS:
        what += f" in {region}"
    return Place(what=what, status="region", region=region)


def bedrock_profile_place(model: str) -> Place | None:
    """The place of a Bedrock cross-region inference profile, from the model id alone; None
    for a model invoked in the client's own region."""
    prefix, dot, _ = model.partition(".")
    if not dot:
        return None
    if prefix == "global":
        return Place(
            what=f"Bedrock global inference profile {model}",
            status="no_guarantee",
            spec_field="model.name",
        )
    jurisdiction = BEDROCK_PROFILES.get(prefix)
    if jurisdiction is None:
        return None
    return Place(
        what=f"Bedrock cross-region inference profile {model}",
        status="region",
        region=jurisdiction,
        spec_field="model.name",
    )


def provider_places(spec: "PipelineSpec", provider: Any | None) -> list[Place]:
    """Where the spec's provider sends prompts. Without the provider resource, only what the
    spec decides alone (validate-spec); with it, also what its settings and the environment
    decide (job start)."""
    name = spec.model.provider
    regions = spec.compliance.endpoint_regions
    if name == "local":
        return [Place(what="local provider", status="this_machine")]
    if name in NO_GUARANTEE_PROVIDERS:
        return [
            Place(
                what=NO_GUARANTEE_PROVIDERS[name],
                status="no_guarantee",
                spec_field="model.provider",
            )
        ]
    if name == "online":
        if spec.online.base_url is not None:
            place = endpoint_place("online", spec.online.base_url, regions)
            return [place.model_copy(update={"spec_field": "online.base_url"})]
        if provider is None:
            return []
        url = _resolved(getattr(provider, "base_url", None)) or _openai_env_url()
        return [endpoint_place("online", url, regions)]
    if name == "openai":
        if provider is None:
            return []
        url = _resolved(getattr(provider, "base_url", None)) or _openai_env_url()
        return [endpoint_place("OpenAI", url, regions)]
    if name == "bedrock":
        places = [p for p in [bedrock_profile_place(spec.model.name)] if p is not None]
        if provider is None:
            return places
        places.insert(0, _bedrock_region_place(getattr(provider, "region_name", None)))
        staging = getattr(provider, "staging_uri", None)
        if staging:
            places.append(bucket_place("Bedrock staging bucket", staging))
        return places
    return [Place(what=f"provider {name}", status="unknown", hint="its region is not known")]


def _resolved(value: Any) -> str | None:
    """A setting that may be a dg.EnvVar, as its value."""
    if value is None:
        return None
    get_value = getattr(value, "get_value", None)
    return get_value() if callable(get_value) else str(value)


def _openai_env_url() -> str:
    """Where the openai SDK sends requests when given no base URL."""
    return os.environ.get("OPENAI_BASE_URL") or OPENAI_DEFAULT_URL


def _bedrock_region_place(region_name: str | None) -> Place:
    """The region boto3 sends Bedrock calls to: the resource's, else boto3's default."""
    region = region_name
    if not region:
        import boto3

        region = boto3.session.Session().region_name
    if not region:
        return Place(
            what="Bedrock",
            status="unknown",
            hint="set the bedrock resource's region_name or AWS_DEFAULT_REGION",
        )
    return Place(what=f"Bedrock region {region}", status="region", region=region.lower())


def storage_places(storage: "ArtifactStorage") -> list[Place]:
    """Where artifacts rest: this machine, or the S3 bucket's region."""
    if not storage.is_s3:
        return [Place(what="artifact storage (a local folder)", status="this_machine")]
    return [bucket_place("artifact bucket", storage.base_url)]


_bucket_regions: dict[tuple[str, str], str] = {}
_bucket_lock = threading.Lock()


def bucket_place(what: str, uri: str) -> Place:
    """An S3 bucket, in the region GetBucketLocation gives: asked once per bucket (and S3
    endpoint) in a process. A bucket whose region cannot be read is of unknown region."""
    bucket = uri.removeprefix("s3://").partition("/")[0]
    label = f"{what} {bucket}"
    try:
        region = bucket_region(bucket)
    except Exception as exc:  # any failure leaves the region unknown, never assumed
        code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
        denied = code in ("403", "AccessDenied", "Forbidden")
        return Place(
            what=label,
            status="unknown",
            hint=f"GetBucketLocation failed: {exc}"
            + ("; grant s3:GetBucketLocation on the bucket" if denied else ""),
        )
    return Place(what=f"{label} in {region}", status="region", region=region)


def bucket_region(bucket: str) -> str:
    """The bucket's region (a LocationConstraint of None is us-east-1, the legacy `EU` is
    eu-west-1), cached per bucket and S3 endpoint for the life of the process."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    key = (bucket, endpoint)
    with _bucket_lock:
        known = _bucket_regions.get(key)
    if known is not None:
        return known
    import boto3

    answer = boto3.client("s3").get_bucket_location(Bucket=bucket)
    constraint = answer.get("LocationConstraint") or "us-east-1"
    region = "eu-west-1" if constraint == "EU" else str(constraint).lower()
    with _bucket_lock:
        _bucket_regions[key] = region
    return region


def forget_bucket_regions() -> None:
    """Drop the cached bucket regions (a bucket recreated elsewhere under the same name)."""
    with _bucket_lock:
        _bucket_regions.clear()


def refused_places(spec: "PipelineSpec", places: list[Place]) -> list[Place]:
    """The places outside the spec's allowed regions; none when it restricts no region."""
    allowed = spec.compliance.allowed_regions
    if allowed is None:
        return []
    return [p for p in places if not p.allowed_by(allowed)]


def refusal(spec: "PipelineSpec", places: list[Place]) -> str | None:
    """The sentence that names every place outside `compliance.allowed_regions`, e.g.
    "compliance.allowed_regions [eu] refuses: Bedrock region us-east-1 (us); OpenAI endpoint
    https://api.openai.com/v1 (us)"; None when the spec allows them all."""
    refused = refused_places(spec, places)
    if not refused:
        return None
    return _refuses(spec) + "; ".join(p.describe() for p in refused)


def _refuses(spec: "PipelineSpec") -> str:
    return (
        f"compliance.allowed_regions [{', '.join(spec.compliance.allowed_regions or [])}] refuses: "
    )


def residency_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    """The residency problems a spec shows alone: regions that mean nothing, and a provider
    (or an endpoint the spec names) outside its allowed regions."""
    problems: list[tuple[str, str]] = []
    compliance = spec.compliance
    for value in compliance.allowed_regions or []:
        problem = unknown_region_problem(value)
        if problem:
            problems.append(("compliance.allowed_regions", problem))
    for host, value in compliance.endpoint_regions.items():
        problem = unknown_region_problem(value)
        if problem:
            problems.append((f"compliance.endpoint_regions.{host}", problem))
    if problems:
        return problems
    for place in refused_places(spec, provider_places(spec, None)):
        problems.append(
            (place.spec_field or "compliance.allowed_regions", _refuses(spec) + place.describe())
        )
    return problems
