"""The one place that maps the environment to resources.

Nothing heavy is imported here: importing a module of this package (a worker process that
parses results with `providers.openai_lines`) runs this file first.
"""

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_assets.settings import Settings


def _secret(name: str) -> Any:
    """Keys reach resources only through dg.EnvVar; unset, the SDK reports what is missing."""
    import dagster as dg

    return dg.EnvVar(name) if os.environ.get(name) else None


def build_resources(settings: "Settings") -> dict[str, Any]:
    from llm_assets.resources.ledger import LedgerResource
    from llm_assets.resources.providers.anthropic_batch import AnthropicBatchProvider
    from llm_assets.resources.providers.bedrock import BedrockBatchProvider
    from llm_assets.resources.providers.local import LocalProvider
    from llm_assets.resources.providers.online import OnlineProvider
    from llm_assets.resources.providers.openai_batch import OpenAIBatchProvider
    from llm_assets.resources.storage import ArtifactStorage

    return {
        "ledger": LedgerResource(database_url=settings.database_url),
        "storage": ArtifactStorage(base_url=settings.storage_url),
        "local_provider": LocalProvider(state_dir=str(settings.home / "local_provider")),
        # Base URLs stay unset here so the SDKs read OPENAI_BASE_URL / ANTHROPIC_BASE_URL.
        "openai_provider": OpenAIBatchProvider(api_key=_secret("OPENAI_API_KEY")),
        "anthropic_provider": AnthropicBatchProvider(api_key=_secret("ANTHROPIC_API_KEY")),
        # boto3 reads credentials, region and AWS_ENDPOINT_URL from the environment itself.
        "bedrock_provider": BedrockBatchProvider(
            role_arn=os.environ.get("LLM_ASSETS_BEDROCK_ROLE_ARN") or None,
            staging_uri=os.environ.get("LLM_ASSETS_BEDROCK_S3_URI") or None,
        ),
        "online_provider": OnlineProvider(
            base_url=os.environ.get("LLM_ASSETS_ONLINE_BASE_URL") or None,
            api_key=_secret("LLM_ASSETS_ONLINE_API_KEY"),
        ),
    }
