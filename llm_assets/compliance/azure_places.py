"""Where an Azure OpenAI batch pipeline's data goes: the resource's endpoint, where its files
and results rest, and the batch deployment, where its requests are processed.

The deployment's type is the spec's (resources/providers/azure_deployment.py): a global
batch deployment processes in any Azure region (no regional guarantee); a data-zone one
within its zone (`eu` or `us`), which an allowed jurisdiction of that name allows, and an
exact region never does. The endpoint (the resource's `azure_endpoint` or base URL, else
AZURE_OPENAI_ENDPOINT) is judged by host: an Azure host does not name its region, so the
spec names it under `compliance.endpoint_regions` (`acme.openai.azure.com: swedencentral`).
"""

import os
from typing import TYPE_CHECKING, Any

from llm_assets.compliance.places import Place, endpoint_host, endpoint_place, setting_value
from llm_assets.resources.providers.azure_deployment import AzureDeployment, azure_deployment

if TYPE_CHECKING:
    from llm_assets.spec.model import PipelineSpec

ENDPOINT_VARIABLE = "AZURE_OPENAI_ENDPOINT"
"""Where the openai SDK's Azure client reads the endpoint when it is given none."""


def azure_places(spec: "PipelineSpec", provider: Any | None) -> list[Place]:
    """The deployment's place (the spec's alone); with the provider resource (job start),
    the endpoint's place first."""
    deployment = deployment_place(azure_deployment(spec))
    if provider is None:
        return [deployment]
    url = (
        setting_value(getattr(provider, "base_url", None))
        or setting_value(getattr(provider, "azure_endpoint", None))
        or os.environ.get(ENDPOINT_VARIABLE)
    )
    if not url:
        endpoint = Place(
            what="Azure OpenAI endpoint",
            status="unknown",
            hint=f"set {ENDPOINT_VARIABLE}",
        )
    else:
        endpoint = endpoint_place("Azure OpenAI", url, spec.compliance.endpoint_regions)
        if endpoint.status == "unknown":
            host = endpoint_host(url)
            endpoint = endpoint.model_copy(
                update={
                    "hint": "its files rest in the Azure resource's region, which its host "
                    "does not say; name it under compliance.endpoint_regions "
                    f"({host}: <region>, e.g. swedencentral)"
                }
            )
    return [endpoint, deployment]


def deployment_place(deployment: AzureDeployment) -> Place:
    """Where a batch deployment processes requests, by its type."""
    if deployment.type == "global":
        return Place(
            what=f"Azure OpenAI global batch deployment {deployment.name}, processed in any "
            "Azure region",
            status="no_guarantee",
            spec_field="model.options.deployment_type",
        )
    if deployment.data_zone is None:
        return Place(
            what=f"Azure OpenAI data zone batch deployment {deployment.name}",
            status="unknown",
            hint="name its zone under model.options.data_zone (eu or us)",
            spec_field="model.options.data_zone",
        )
    return Place(
        what=f"Azure OpenAI {deployment.data_zone.upper()} data zone batch deployment "
        f"{deployment.name}, processed within the zone",
        status="region",
        region=deployment.data_zone,
        spec_field="model.options.data_zone",
    )
