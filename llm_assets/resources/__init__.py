"""The one place that maps the environment to resources."""

from typing import Any

from llm_assets.settings import Settings


def build_resources(settings: Settings) -> dict[str, Any]:
    from llm_assets.resources.ledger import LedgerResource
    from llm_assets.resources.providers.local import LocalProvider
    from llm_assets.resources.storage import ArtifactStorage

    return {
        "ledger": LedgerResource(database_url=settings.database_url),
        "storage": ArtifactStorage(base_url=settings.storage_url),
        "local_provider": LocalProvider(state_dir=str(settings.home / "local_provider")),
    }
