"""Provider adapters, looked up by the spec's `model.provider`."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llm_assets.spec import PipelineSpec

IMPLEMENTED = ("local",)


def provider_resource_key(provider: str) -> str:
    return f"{provider}_provider"


def provider_spec_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    """Spec problems that only the chosen provider can see (e.g. outputs it cannot produce)."""
    provider = spec.model.provider
    if provider == "local":
        from llm_assets.resources.providers.local import local_spec_problems

        return local_spec_problems(spec)
    if provider not in IMPLEMENTED:
        return [
            (
                "model.provider",
                f"provider {provider!r} is not available in this version yet; "
                f"implemented: {', '.join(IMPLEMENTED)}",
            )
        ]
    return []
