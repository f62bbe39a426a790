"""Provider adapters, looked up by the spec's `model.provider` in `registry.ADAPTERS`.

Nothing is imported here: an import's worker processes load
`providers.openai_lines`, which runs this file first, and must stay free of Dagster and
the SDKs.
"""


def provider_resource_key(provider: str) -> str:
    """The Dagster resource key an adapter is bound to: `<provider>_provider`."""
    return f"{provider}_provider"
