"""Places and regions: where a pipeline's data goes or rests, the jurisdictions regions belong
to, and the endpoints whose host names say where they are.

The spelling of regions: AWS's (eu-central-1), Google Cloud's (europe-west4) and Azure's
(swedencentral, which names no jurisdiction and is looked up in AZURE_REGIONS). A jurisdiction
(`eu`, `us`, ...) holds all its regions. residency.py judges a pipeline's places against its
spec; this module knows nothing of specs or providers.
"""

import re
import urllib.parse
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

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

OPENAI_HOSTS = {
    "api.openai.com": "us",
    "us.api.openai.com": "us",
    "eu.api.openai.com": "eu",
    "au.api.openai.com": "ap",
    "in.api.openai.com": "ap",
    "jp.api.openai.com": "ap",
}
"""OpenAI's API hosts and where they keep and process data: the regional hosts are the ones
OpenAI's data-residency guide names as processing in their region (a project created with
that residency). Other regional hosts (ae.api.openai.com) are unknown until named."""
AWS_BEDROCK_HOST = re.compile(
    r"^(?:vpce-[a-z0-9-]+\.)?bedrock(?:-runtime|-mantle)?(?:-fips)?"
    r"\.(?P<region>[a-z]{2}(?:-[a-z]+)+-\d+)\.(?:vpce\.)?(?:amazonaws\.com(?:\.cn)?|api\.aws)$"
)
"""AWS's Bedrock hosts (control plane, runtime, the OpenAI-compatible Mantle, FIPS, dual-stack
and VPC endpoints), which name their region."""
NO_GUARANTEE_HOSTS = {
    "api.anthropic.com": "Anthropic API",
    "generativelanguage.googleapis.com": "Gemini Developer API",
}
"""API hosts whose provider says nothing about the region a request is processed in."""
AZURE_HOST_SUFFIXES = (
    ".openai.azure.com",
    ".cognitiveservices.azure.com",
    ".services.ai.azure.com",
)
"""Azure OpenAI and AI Foundry hosts: the resource's name, not its region or a deployment's."""


AZURE_REGIONS: dict[str, str] = {
    **dict.fromkeys(
        (
            "eastus",
            "eastus2",
            "centralus",
            "northcentralus",
            "southcentralus",
            "westcentralus",
            "westus",
            "westus2",
            "westus3",
        ),
        "us",
    ),
    **dict.fromkeys(
        (
            "francecentral",
            "germanywestcentral",
            "italynorth",
            "northeurope",
            "polandcentral",
            "spaincentral",
            "swedencentral",
            "westeurope",
            "norwayeast",
            "switzerlandnorth",
            "switzerlandwest",
            "uksouth",
            "ukwest",
        ),
        "eu",
    ),
    **dict.fromkeys(("canadaeast", "canadacentral"), "ca"),
    **dict.fromkeys(("brazilsouth",), "sa"),
    **dict.fromkeys(("mexicocentral",), "mx"),
    **dict.fromkeys(
        (
            "australiaeast",
            "japaneast",
            "japanwest",
            "koreacentral",
            "southindia",
            "centralindia",
            "southeastasia",
            "eastasia",
        ),
        "ap",
    ),
    **dict.fromkeys(("uaenorth", "qatarcentral"), "me"),
    **dict.fromkeys(("southafricanorth",), "af"),
}
"""Azure regions with Azure OpenAI, by jurisdiction. As with AWS's eu-west-2 (London) and
eu-central-2 (Zurich), `eu` holds Europe's regions, the United Kingdom, Switzerland and
Norway among them; Azure's EU data zone is narrower (EU member states only)."""

Status = Literal["region", "this_machine", "no_guarantee", "unknown"]


class Place(BaseModel):
    """Somewhere a pipeline's data goes or rests."""

    model_config = ConfigDict(frozen=True)

    what: str
    status: Status
    region: str | None = None
    """An exact region (eu-central-1) or, where only that is known, a jurisdiction (eu)."""
    also: tuple[str, ...] = ()
    """Further regions or jurisdictions the data may go to (an APAC profile's me-central-1, the
    geography an inference-profile ARN routes among); each must be allowed too."""
    hint: str = ""
    """For an unknown region: how to make it known."""
    spec_field: str = ""
    """The spec field that decides the place, where the spec alone does."""

    def allowed_by(self, allowed: list[str]) -> bool:
        if self.status == "this_machine":
            return True
        if self.status != "region" or self.region is None:
            return False
        return all(region_allowed(r, allowed) for r in (self.region, *self.also))

    @property
    def where(self) -> str:
        if self.status == "this_machine":
            return "this machine"
        if self.status == "no_guarantee":
            return "no regional guarantee"
        if self.status == "unknown" or self.region is None:
            return "region unknown" + (f": {self.hint}" if self.hint else "")
        names = (
            jurisdiction_of(r) or f"unknown jurisdiction of {r}" for r in (self.region, *self.also)
        )
        return ", ".join(dict.fromkeys(names))

    def describe(self) -> str:
        return f"{self.what} ({self.where})"


def jurisdiction_of(region: str) -> str | None:
    """The jurisdiction of a region (eu-central-1 → eu), or of a jurisdiction itself."""
    region = region.strip().lower()
    if region in JURISDICTIONS:
        return region
    if region in AZURE_REGIONS:
        return AZURE_REGIONS[region]
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
        "region of one (eu-central-1, europe-west4, swedencentral, us-east-1, ...)"
    )


def named_region(endpoint_regions: dict[str, str], key: str) -> str | None:
    """The region `compliance.endpoint_regions` gives a host (or an ARN), case aside."""
    mapped = {k.strip().lower(): r.strip().lower() for k, r in endpoint_regions.items()}
    return mapped.get(key.strip().lower())


def endpoint_host(url: str) -> str:
    """The host a URL sends to, lower-cased."""
    return (urllib.parse.urlsplit(url).hostname or "").lower()


def endpoint_place(name: str, url: str, endpoint_regions: dict[str, str]) -> Place:
    """An endpoint, its region by host: the spec's `endpoint_regions` first (they may name
    any host), then the hosts whose names say where they are; the URL is shown without user
    info or query."""
    parts = urllib.parse.urlsplit(url)
    host = endpoint_host(url)
    shown = f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")
    what = f"{name} endpoint {shown}{parts.path.rstrip('/')}"
    region = named_region(endpoint_regions, host) or _region_of_host(host)
    if region is not None:
        if region not in JURISDICTIONS:
            what += f" in {region}"
        return Place(what=what, status="region", region=region)
    if host in NO_GUARANTEE_HOSTS:
        return Place(what=what, status="no_guarantee")
    hint = f"name its region under compliance.endpoint_regions ({host}: <region>)"
    if host.endswith(AZURE_HOST_SUFFIXES):
        hint = (
            "an Azure host does not say where its deployments process (a Global or Data Zone "
            f"deployment leaves the resource's region); {hint}"
        )
    return Place(what=what, status="unknown", hint=hint)


def _region_of_host(host: str) -> str | None:
    """The region a host's own name gives: OpenAI's data-residency hosts, AWS's Bedrock
    hosts."""
    if host in OPENAI_HOSTS:
        return OPENAI_HOSTS[host]
    match = AWS_BEDROCK_HOST.match(host)
    return match["region"] if match else None


def is_bedrock_host(url: str) -> bool:
    """Whether a URL is one of AWS's Bedrock endpoints, where a model id may be a profile."""
    return AWS_BEDROCK_HOST.match(endpoint_host(url)) is not None


def setting_value(value: Any) -> str | None:
    """A resource setting that may be a dg.EnvVar, as its value."""
    if value is None:
        return None
    get_value = getattr(value, "get_value", None)
    return get_value() if callable(get_value) else str(value)
