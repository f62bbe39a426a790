"""Azure OpenAI Batch API through the official `openai` SDK's Azure client: Files + Batches.

Everything but the addressing is OpenAI's (openai_batch.py): the same JSONL lines, batch
metadata that finds a batch created just before a crash, statuses, result lines, quota
refusals (a batch over the enqueued-token quota fails `token_limit_exceeded`) and file
deletion. What differs:

- the client: `AzureOpenAI(azure_endpoint, api_version)`, which sends every call to
  `{endpoint}/openai/...?api-version=...`; the endpoint from the resource or
  AZURE_OPENAI_ENDPOINT, the api-version from the resource, else OPENAI_API_VERSION, else
  DEFAULT_API_VERSION;
- the key: an API key (`api-key` header; the resource's, else AZURE_OPENAI_API_KEY), a
  Microsoft Entra ID token (AZURE_OPENAI_AD_TOKEN), or an Entra ID token provider
  (`azure_ad_token_provider`, a function the SDK calls for a fresh token);
- request lines name the deployment (`model.options.deployment`, default the model's name)
  as their model, and Azure's endpoint paths (`/chat/completions`, without `/v1`).
"""

import functools
import importlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import pydantic

from llm_assets.resources.providers.azure_deployment import (
    OPTIONS as DEPLOYMENT_OPTIONS,
)
from llm_assets.resources.providers.azure_deployment import (
    azure_deployment,
    deployment_problems,
)
from llm_assets.resources.providers.openai_batch import (
    OPTIONS,
    OpenAIBatchProvider,
    endpoint_of,
    openai_spec_problems,
)
from llm_assets.util.secrecy import mask_url

if TYPE_CHECKING:
    from llm_assets.spec.model import PipelineSpec

ENDPOINTS = ("/chat/completions", "/embeddings")
"""What Azure's Batch API runs, as its request lines name them; the first is the default."""
MAX_REQUESTS = 100_000
"""Requests per batch input file."""
DEFAULT_API_VERSION = "2024-10-21"
"""The first generally available api-version with the Batch API."""
TOKEN_SCOPE = "https://cognitiveservices.azure.com/.default"
"""The Entra ID scope of Azure OpenAI's data plane."""


class AzureOpenAIBatchProvider(OpenAIBatchProvider):
    """OpenAI's batch adapter, addressed the Azure way."""

    console_url_template: ClassVar[str | None] = None
    label: ClassVar[str] = "Azure OpenAI"

    azure_endpoint: str | None = pydantic.Field(
        default=None,
        description="The resource's endpoint, https://<resource>.openai.azure.com; unset: "
        "the SDK reads AZURE_OPENAI_ENDPOINT. `base_url` (a proxy's full URL to `/openai`) "
        "replaces it.",
    )
    api_version: str | None = pydantic.Field(
        default=None,
        description=f"Unset: OPENAI_API_VERSION, else {DEFAULT_API_VERSION}.",
    )
    azure_ad_token_provider: str | None = pydantic.Field(
        default=None,
        description="`package.module:function` returning a Microsoft Entra ID token, called "
        "by the SDK before each request; instead of an API key. "
        "`llm_assets.resources.providers.azure_openai:default_credential_token` uses "
        "azure-identity's DefaultAzureCredential.",
    )

    def make_client(self, api_key: str | None) -> Any:
        import openai

        provider = self._token_provider()
        if provider is not None and api_key is not None:
            raise ValueError(
                "the azure_openai provider has an API key and an Entra ID token provider; "
                "unset one (AZURE_OPENAI_API_KEY or LLM_ASSETS_AZURE_AD_TOKEN_PROVIDER)"
            )
        location: dict[str, Any] = (
            {"base_url": self.base_url}
            if self.base_url
            else {"azure_endpoint": self.azure_endpoint}
        )
        return openai.AzureOpenAI(
            **location,
            api_key=api_key,
            azure_ad_token_provider=provider,
            api_version=self.resolved_api_version(),
            timeout=self.timeout_seconds,
            max_retries=0,
        )

    def resolved_api_version(self) -> str:
        """The api-version every call carries."""
        return self.api_version or os.environ.get("OPENAI_API_VERSION") or DEFAULT_API_VERSION

    def _token_provider(self) -> Callable[[], str] | None:
        """The function named by `azure_ad_token_provider`, imported."""
        if not self.azure_ad_token_provider:
            return None
        module, _, name = self.azure_ad_token_provider.partition(":")
        try:
            found = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ValueError(
                f"azure_ad_token_provider {self.azure_ad_token_provider!r} names no function "
                f"(package.module:function): {exc}"
            ) from exc
        if not callable(found):
            raise ValueError(
                f"azure_ad_token_provider {self.azure_ad_token_provider!r} is no function"
            )
        provider: Callable[[], str] = found
        return provider

    def quota_account(self) -> str:
        """The endpoint: Azure counts enqueued tokens per subscription, region and model."""
        url = self.base_url or self.azure_endpoint or os.environ.get("AZURE_OPENAI_ENDPOINT")
        return mask_url(url)[:256] if url else "default"

    def spec_problems(self, spec: "PipelineSpec") -> list[tuple[str, str]]:
        return [
            *openai_spec_problems(
                spec,
                label="Azure OpenAI",
                endpoints=ENDPOINTS,
                options=OPTIONS | DEPLOYMENT_OPTIONS,
                max_requests=MAX_REQUESTS,
            ),
            *deployment_problems(spec),
        ]

    def endpoint(self, spec: "PipelineSpec") -> str:
        return endpoint_of(spec, ENDPOINTS[0])

    def line_model(self, spec: "PipelineSpec") -> str:
        return azure_deployment(spec).name


def default_credential_token() -> str:
    """A token of azure-identity's DefaultAzureCredential (environment, workload or managed
    identity, Azure CLI login) for Azure OpenAI, for `azure_ad_token_provider`. The
    credential caches and refreshes its tokens; azure-identity is not a dependency of
    llm-assets: install it where this is used."""
    return str(_default_credential().get_token(TOKEN_SCOPE).token)


@functools.cache
def _default_credential() -> Any:
    try:
        from azure.identity import DefaultAzureCredential  # type: ignore[import-not-found]
    except ImportError as exc:
        raise ImportError(
            "default_credential_token needs azure-identity: pip install azure-identity"
        ) from exc
    return DefaultAzureCredential()
