"""Provider adapters, looked up by the spec's `model.provider`."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llm_assets.spec import PipelineSpec

IMPLEMENTED = ("local", "openai", "anthropic", "online", "bedrock")


def provider_resource_key(provider: str) -> str:
    return f"{provider}_provider"


def provider_spec_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    """Spec problems that only the chosen provider can see (e.g. outputs it cannot produce)."""
    provider = spec.model.provider
    if provider == "local":
        from llm_assets.resources.providers.local import local_spec_problems

        return local_spec_problems(spec)
    if provider == "openai":
        from llm_assets.resources.providers.openai_batch import openai_spec_problems

        return openai_spec_problems(spec)
    if provider == "bedrock":
        from llm_assets.resources.providers.bedrock import bedrock_spec_problems

        return bedrock_spec_problems(spec)
    if provider == "online":
        from llm_assets.resources.providers.online import online_spec_problems

        return online_spec_problems(spec)
    if provider == "anthropic":
        from llm_assets.resources.providers.anthropic_batch import anthropic_spec_problems

        return anthropic_spec_problems(spec)
    return [
        (
            "model.provider",
            f"provider {provider!r} is not available in this version yet; "
            f"implemented: {', '.join(IMPLEMENTED)}",
        )
    ]
