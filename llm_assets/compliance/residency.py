"""Residency: where a pipeline's prompts go and its artifacts rest, against the spec's
`compliance.allowed_regions`.

The places of a pipeline:

- its provider's endpoint, judged by host wherever a provider takes one: the OpenAI endpoint
  (the resource's base URL, else OPENAI_BASE_URL, else https://api.openai.com/v1), the
  online endpoint (the spec's `online.base_url`, else the resource's, else OPENAI_BASE_URL),
  the Anthropic and Gemini endpoints (the resource's base URL, else ANTHROPIC_BASE_URL /
  GOOGLE_GEMINI_BASE_URL), Bedrock's control-plane and runtime endpoints (the resource's
  `endpoint_url` / `runtime_endpoint_url`, else what boto3 reads from AWS_ENDPOINT_URL_BEDROCK,
  AWS_ENDPOINT_URL_BEDROCK_RUNTIME, AWS_ENDPOINT_URL or the AWS config file). A host named in
  `compliance.endpoint_regions` is where it says; OpenAI's data-residency hosts and AWS's
  regional Bedrock hosts (bedrock-runtime.eu-west-1.amazonaws.com) are where their names say;
  Anthropic's and Google's own API hosts make no regional guarantee; any other host (an
  Azure OpenAI resource, a proxy, loopback: a proxy on this machine forwards anywhere) is of
  unknown region. With no endpoint configured: the Bedrock region (the resource's
  `region_name`, else boto3's default from AWS_DEFAULT_REGION or the AWS config file; boto3
  does not read AWS_REGION), and no regional guarantee from Anthropic or the Gemini API;
- the Bedrock model id (also behind any Bedrock host): a cross-region inference profile
  (`eu.anthropic...`) routes among the regions of its geography, a `global.` one to any
  commercial region; an ARN is called in its own region, an inference-profile ARN routes as
  its profile id says, and an application inference profile is taken to run in its ARN's
  region (its routing is not in its id) unless `compliance.endpoint_regions` names the ARN;
- an Azure OpenAI batch deployment (compliance/azure_places.py): a global one processes in
  any Azure region, a data-zone one within its zone; the Azure resource's endpoint, where
  its files rest, is judged by host like any other;
- the local provider stays on this machine;
- Bedrock's staging bucket (`staging_uri`) and the artifact storage: a local folder is on this
  machine, an S3 bucket where GetBucketLocation says (looked up once per bucket and process).

Under `allowed_regions`, every place must be on this machine or in a region allowed: an
exact region (`eu-central-1`) allows that region only; a jurisdiction (`eu`) allows every
region of it (places.py: JURISDICTION_PREFIXES, AZURE_REGIONS). A place known only by its
jurisdiction (OpenAI's EU endpoint, a Bedrock `eu.` profile, an Azure EU data zone) is
allowed by the jurisdiction, never by one region of it;
a place that spans several (an `apac.` profile also routes to me-central-1) needs them all.
A place with no regional guarantee, or whose region is unknown, is refused. The ledger holds
ids, counts and results; where it rests is the deployment's choice, not checked here.
"""

import os
import threading
from typing import TYPE_CHECKING, Any, NamedTuple

from llm_assets.compliance.azure_places import azure_places
from llm_assets.compliance.places import (
    Place,
    endpoint_place,
    is_bedrock_host,
    named_region,
    setting_value,
    unknown_region_problem,
)

if TYPE_CHECKING:
    from llm_assets.resources.storage import ArtifactStorage
    from llm_assets.spec.model import PipelineSpec

OPENAI_DEFAULT_URL = "https://api.openai.com/v1"


class Geography(NamedTuple):
    """Where a Bedrock cross-region inference profile may route a request."""

    label: str
    routes: tuple[str, ...]
    """Jurisdictions (or regions) it routes among; every one of them must be allowed."""


BEDROCK_GEOGRAPHIES = {
    "us": Geography("US", ("us",)),
    "us-gov": Geography("GovCloud (US)", ("us",)),
    "eu": Geography("EU", ("eu",)),
    "apac": Geography("APAC", ("ap", "me-central-1")),
    "jp": Geography("Japan", ("ap",)),
    "au": Geography("Australia", ("ap",)),
    "ca": Geography("Canada", ("ca",)),
}
"""Bedrock cross-region inference profiles by the model id's first part. AWS's lists: US
among us-east-1, us-east-2, us-west-2 ...; EU among eu-central-1, eu-west-1, eu-west-3,
eu-north-1, eu-south-1 ... (London and Zurich for some models); APAC among the ap-* regions
and me-central-1 (UAE); JP Tokyo and Osaka; AU Sydney and Melbourne. A `global.` profile
routes to any commercial region."""
NO_GUARANTEE_PROVIDERS = {
    "anthropic": "Anthropic Message Batches API",
    "gemini": "Gemini Developer API batch mode",
}
"""Providers that say nothing about the region a request is processed in."""


class SdkEndpoint(NamedTuple):
    """Where a provider's SDK sends requests when its resource names no base URL."""

    label: str
    variable: str
    default_url: str | None
    """None: its default host makes no regional guarantee (NO_GUARANTEE_PROVIDERS)."""


SDK_ENDPOINTS = {
    "openai": SdkEndpoint("OpenAI", "OPENAI_BASE_URL", OPENAI_DEFAULT_URL),
    "anthropic": SdkEndpoint("Anthropic", "ANTHROPIC_BASE_URL", None),
    "gemini": SdkEndpoint("Gemini", "GOOGLE_GEMINI_BASE_URL", None),
}


def _split_arn(model: str) -> tuple[str, str, str] | None:
    """An ARN's region, resource type and resource id; None for a plain model id."""
    parts = model.split(":", 5)
    if len(parts) != 6 or parts[0] != "arn":
        return None
    kind, _, resource = parts[5].partition("/")
    return parts[3].lower(), kind, resource


def bedrock_model_place(model: str, endpoint_regions: dict[str, str]) -> Place | None:
    """Where a Bedrock model id sends prompts, from the id alone: a cross-region inference
    profile's geography, an ARN's region; None for a model invoked in the client's own
    region."""
    arn = _split_arn(model)
    if arn is None:
        return _profile_place(model, model, called_in=None)
    region, kind, resource = arn
    if not region:
        return Place(
            what=f"Bedrock model {model}",
            status="unknown",
            hint="its ARN names no region",
            spec_field="model.name",
        )
    if kind == "inference-profile":
        place = _profile_place(model, resource, called_in=region)
        if place is not None:
            return place
    if kind == "application-inference-profile":
        return _application_profile_place(model, region, endpoint_regions)
    return Place(
        what=f"Bedrock model {model} in {region}",
        status="region",
        region=region,
        spec_field="model.name",
    )


def _profile_place(shown: str, profile_id: str, called_in: str | None) -> Place | None:
    """A system-defined cross-region inference profile, routed among its geography's regions
    (and first sent to `called_in`, an ARN's region); None when the id has no geography."""
    prefix, dot, _ = profile_id.partition(".")
    if not dot:
        return None
    called = f" called in {called_in}" if called_in else ""
    if prefix == "global":
        return Place(
            what=f"Bedrock global cross-region inference profile {shown}{called}, routed to "
            "any commercial AWS region",
            status="no_guarantee",
            spec_field="model.name",
        )
    geography = BEDROCK_GEOGRAPHIES.get(prefix)
    if geography is None:
        return None
    routes = (called_in, *geography.routes) if called_in else geography.routes
    return Place(
        what=f"Bedrock {geography.label} cross-region inference profile {shown}{called}",
        status="region",
        region=routes[0],
        also=tuple(routes[1:]),
        spec_field="model.name",
    )


def _application_profile_place(arn: str, region: str, endpoint_regions: dict[str, str]) -> Place:
    """An application inference profile: its id does not say whether it copies a model
    (one region) or a cross-region profile (a geography), so it is taken to run in its ARN's
    region unless `compliance.endpoint_regions` names the ARN."""
    named = named_region(endpoint_regions, arn)
    if named is not None:
        return Place(
            what=f"Bedrock application inference profile {arn}, routed in {named} as "
            "compliance.endpoint_regions says",
            status="region",
            region=named,
            also=(region,),
            spec_field="compliance.endpoint_regions",
        )
    return Place(
        what=f"Bedrock application inference profile {arn}, taken to run in {region} (if it "
        "copies a cross-region profile, name where it routes under compliance.endpoint_regions)",
        status="region",
        region=region,
        spec_field="model.name",
    )


def provider_places(spec: "PipelineSpec", provider: Any | None) -> list[Place]:
    """Where the spec's provider sends prompts. Without the provider resource, only what the
    spec decides alone (validate-spec); with it, also what its settings and the environment
    decide (job start)."""
    name = spec.model.provider
    if name == "local":
        return [Place(what="local provider", status="this_machine")]
    if name == "bedrock":
        return _bedrock_places(spec, provider)
    if name == "online":
        return _online_places(spec, provider)
    if name == "azure_openai":
        return azure_places(spec, provider)
    if name in SDK_ENDPOINTS:
        return _sdk_places(spec, provider, SDK_ENDPOINTS[name])
    return [Place(what=f"provider {name}", status="unknown", hint="its region is not known")]


def url_places(name: str, url: str, spec: "PipelineSpec") -> list[Place]:
    """An endpoint and, behind one of AWS's Bedrock hosts, where the model id routes."""
    regions = spec.compliance.endpoint_regions
    places = [endpoint_place(name, url, regions)]
    if is_bedrock_host(url):
        places.extend(p for p in [bedrock_model_place(spec.model.name, regions)] if p)
    return places


def _online_places(spec: "PipelineSpec", provider: Any | None) -> list[Place]:
    """The spec's `online.base_url` (decided by the spec alone), else the resource's, else
    where the openai SDK goes."""
    if spec.online.base_url is not None:
        places = url_places("online", spec.online.base_url, spec)
        return [p.model_copy(update={"spec_field": "online.base_url"}) for p in places]
    if provider is None:
        return []
    url = setting_value(getattr(provider, "base_url", None)) or _openai_env_url()
    return url_places("online", url, spec)


def _sdk_places(spec: "PipelineSpec", provider: Any | None, sdk: SdkEndpoint) -> list[Place]:
    """A batch API reached through its SDK: the resource's base URL, else the SDK's variable,
    else its default host. Without the resource (validate-spec) an endpoint is the
    deployment's, judged at job start; only a default host without a guarantee is judged."""
    env_url = os.environ.get(sdk.variable) or None
    if provider is None:
        return [] if env_url or sdk.default_url else [_no_guarantee_default(spec)]
    url = setting_value(getattr(provider, "base_url", None)) or env_url or sdk.default_url
    if url is None:
        return [_no_guarantee_default(spec)]
    return url_places(sdk.label, url, spec)


def _no_guarantee_default(spec: "PipelineSpec") -> Place:
    """The provider's own API, reached with no endpoint configured."""
    what = NO_GUARANTEE_PROVIDERS[spec.model.provider]
    return Place(what=what, status="no_guarantee", spec_field="model.provider")


def _bedrock_places(spec: "PipelineSpec", provider: Any | None) -> list[Place]:
    """Bedrock: the model id's routing (the spec's alone); with the resource, also the
    control plane that runs batch jobs, the runtime that serves shards below the job minimum
    (`bedrock.below_minimum: online`), and the staging bucket."""
    regions = spec.compliance.endpoint_regions
    model = [p for p in [bedrock_model_place(spec.model.name, regions)] if p is not None]
    if provider is None:
        return model
    region_name = getattr(provider, "region_name", None)
    control_url = getattr(provider, "endpoint_url", None)
    places = [_aws_place("Bedrock", "bedrock", control_url, region_name, regions)]
    if spec.bedrock.below_minimum == "online":
        runtime_url = getattr(provider, "runtime_endpoint_url", None)
        places.append(
            _aws_place("Bedrock runtime", "bedrock-runtime", runtime_url, region_name, regions)
        )
    places = list(dict.fromkeys(places)) + model
    staging = getattr(provider, "staging_uri", None)
    if staging:
        places.append(bucket_place("Bedrock staging bucket", staging))
    return places


def _aws_place(
    name: str,
    service: str,
    endpoint_url: str | None,
    region_name: str | None,
    endpoint_regions: dict[str, str],
) -> Place:
    """Where a boto3 client of `service` sends requests: an endpoint set on the resource or
    configured for boto3 (judged by host), else the client's region."""
    url = endpoint_url or _aws_configured_endpoint(service)
    if url:
        return endpoint_place(name, url, endpoint_regions)
    return _bedrock_region_place(region_name)


def _aws_configured_endpoint(service: str) -> str | None:
    """The endpoint boto3 gives a client of `service` when none is passed (botocore's own
    lookup: AWS_ENDPOINT_URL_<SERVICE>, AWS_ENDPOINT_URL, the config file), unless
    configured endpoints are ignored."""
    import botocore.session
    from botocore.configprovider import ConfiguredEndpointProvider

    session = botocore.session.get_session()
    if session.get_config_variable("ignore_configured_endpoint_urls"):
        return None
    return ConfiguredEndpointProvider(
        full_config=session.full_config,
        scoped_config=session.get_scoped_config(),
        client_name=service,
    ).provide()


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
