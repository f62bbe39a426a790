"""The one place that maps the environment to resources.

Nothing heavy is imported here: importing a module of this package (a worker process that
parses results with `providers.openai_lines`) runs this file first.
"""

import os
from typing import TYPE_CHECKING, Any

from llm_assets.resources.providers import provider_resource_key

if TYPE_CHECKING:
    from llm_assets.util.settings import Settings


def _secret(name: str) -> Any:
    """Keys (and URLs that may carry credentials) reach resources only through dg.EnvVar;
    unset, the SDK reports what is missing."""
    import dagster as dg

    return dg.EnvVar(name) if os.environ.get(name) else None


LEDGER_LIMIT_VARIABLES: dict[str, tuple[str, type[int] | type[float]]] = {
    "connect_timeout_seconds": ("LLM_ASSETS_LEDGER_CONNECT_TIMEOUT_SECONDS", int),
    "statement_timeout_seconds": ("LLM_ASSETS_LEDGER_STATEMENT_TIMEOUT_SECONDS", float),
}
"""LedgerResource settings taken from the environment when set (PostgreSQL ledgers)."""


def _ledger_settings(settings: "Settings") -> dict[str, Any]:
    """The ledger's URL, as dg.EnvVar when it is LLM_ASSETS_DATABASE_URL's value (the UI then
    shows the variable's name, never a password; the default SQLite URL stays a value), the
    id key (LLM_ASSETS_ID_KEY, as dg.EnvVar) and the connection limits set in the
    environment."""
    import dagster as dg

    url: Any = settings.database_url
    if os.environ.get("LLM_ASSETS_DATABASE_URL") == url:
        url = dg.EnvVar("LLM_ASSETS_DATABASE_URL")
    # The key of custom_ids; unset, the ledger's own (LedgerResource.item_id_key).
    configured: dict[str, Any] = {"database_url": url, "id_key": _secret("LLM_ASSETS_ID_KEY")}
    for field, (variable, kind) in LEDGER_LIMIT_VARIABLES.items():
        value = os.environ.get(variable)
        if value:
            try:
                configured[field] = kind(value)
            except ValueError:
                raise ValueError(f"{variable}={value!r} is not a number of seconds") from None
    return configured


def _provider_settings(settings: "Settings") -> dict[str, dict[str, Any]]:
    """Each provider's settings from the environment; a provider left out takes its defaults."""
    return {
        "local": {"state_dir": str(settings.home / "local_provider")},
        # Base URLs stay unset here so the SDKs read OPENAI_BASE_URL / ANTHROPIC_BASE_URL /
        # GOOGLE_GEMINI_BASE_URL.
        "openai": {"api_key": _secret("OPENAI_API_KEY")},
        "anthropic": {"api_key": _secret("ANTHROPIC_API_KEY")},
        # The key as google-genai reads it: GOOGLE_API_KEY, else GEMINI_API_KEY.
        "gemini": {"api_key": _secret("GOOGLE_API_KEY") or _secret("GEMINI_API_KEY")},
        # The Azure client reads AZURE_OPENAI_ENDPOINT, OPENAI_API_VERSION and, with no key,
        # AZURE_OPENAI_AD_TOKEN itself.
        "azure_openai": {
            "api_key": _secret("AZURE_OPENAI_API_KEY"),
            "azure_ad_token_provider": os.environ.get("LLM_ASSETS_AZURE_AD_TOKEN_PROVIDER") or None,
        },
        # boto3 reads credentials, region and AWS_ENDPOINT_URL from the environment itself.
        "bedrock": {
            "role_arn": os.environ.get("LLM_ASSETS_BEDROCK_ROLE_ARN") or None,
            "staging_uri": os.environ.get("LLM_ASSETS_BEDROCK_S3_URI") or None,
        },
        "online": {
            "base_url": _secret("LLM_ASSETS_ONLINE_BASE_URL"),
            "api_key": _secret("LLM_ASSETS_ONLINE_API_KEY"),
        },
    }


def build_resources(settings: "Settings") -> dict[str, Any]:
    """The ledger, the artifact storage and one resource per registered provider."""
    from llm_assets.resources.ledger import LedgerResource
    from llm_assets.resources.providers.registry import ADAPTERS, adapter_class
    from llm_assets.resources.storage import ArtifactStorage

    configured = _provider_settings(settings)
    return {
        "ledger": LedgerResource(**_ledger_settings(settings)),
        "storage": ArtifactStorage(base_url=settings.storage_url),
        **{
            provider_resource_key(name): adapter_class(name)(**configured.get(name, {}))
            for name in ADAPTERS
        },
    }
